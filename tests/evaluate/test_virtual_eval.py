"""mycroft-otel eval --virtual: the catalogue on virtual time, in one process, deterministic for a seed."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from mycroft_otel.evaluate import scenarios, virtual

STALL_MS = 3000
CATALOGUE = {s.name: s for s in scenarios.builtin(STALL_MS)}
HANGS = ["rank_absent", "gpu_stalled", "nic_down", "flow_stall", "coll_mismatch"]


def _run(name: str, plugin: str) -> dict:
    return virtual.score(virtual.run_scenario(CATALOGUE[name], STALL_MS, plugin=plugin))


@pytest.mark.parametrize("name", ["nic_down", "slow_flow"])
def test_same_seed_same_verdicts_at_the_same_simulated_times(plugin, name):
    a, b = _run(name, plugin), _run(name, plugin)
    assert (a["agent_requests"], a["agent_bytes"]) == (b["agent_requests"], b["agent_bytes"])  # same OTLP traffic
    assert a["verdicts"] >= 1
    assert a["verdict_list"] == b["verdict_list"]  # every attribute, trace id and (virtual) time
    assert a["verdict_times_ns"] == b["verdict_times_ns"] and a["latency_s"] == b["latency_s"]


@pytest.mark.parametrize("name", HANGS + ["slow_nic", "late_rank"])
def test_catalogue_named_right_on_virtual_time(plugin, name):
    r = _run(name, plugin)
    assert (r["detected"], r["culprit_ok"], r["category_ok"], r["false_positives"]) == (True, True, True, 0), r["top"]
    assert r["latency_collectives"] is not None and r["latency_collectives"] >= 0
    # a hang is named once the stall threshold has passed on the simulated clock, and soon after it
    if name in HANGS:
        assert STALL_MS / 1000 <= r["latency_s"] <= STALL_MS / 1000 + 1.0


def test_healthy_run_stays_silent(plugin):
    r = _run("healthy-a", plugin)
    assert r["verdicts"] == 0 and r["false_positives"] == 0


def test_process_faults_are_left_out_with_a_reason():
    with pytest.raises(ValueError, match="needs real processes"):
        virtual.run_scenario(CATALOGUE["process_exited"], STALL_MS)


def test_command_prints_speed_up_and_leaves_out_process_faults(plugin):
    r = subprocess.run([sys.executable, "-m", "mycroft_otel", "eval", "--virtual", "--only", "rank_absent",
                        "sigstop", "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "leaving out sigstop" in r.stderr
    out = json.loads(r.stdout)
    assert [s["scenario"] for s in out["scenarios"]] == ["rank_absent"]
    s = out["summary"]
    assert s["detected"] == 1 and s["sim_s"] == 12.5 and s["speedup"] > 0 and s["wall_s"] > 0


def test_a_held_export_queue_sends_what_was_queued_together():
    """The seam that makes the agent's requests independent of its export thread's timing."""
    from mycroft_otel.agent.exporter import ExportQueue, Transport
    from mycroft_otel.agent.health import Health

    sent: list[int] = []

    class Counting(Transport):
        def send(self, payload: bytes, n_spans: int) -> bool:
            sent.append(n_spans)
            return True

    q = ExportQueue(Counting(), Health(), batch=100)
    try:
        with q.held():
            for _ in range(5):
                q.put(b"", [b""] * 3)
            time.sleep(0.2)  # the export thread is awake (notified) but cannot take anything
            assert sent == []
        assert q.flush(5)
        assert sent == [15]
    finally:
        q.shutdown(1)
