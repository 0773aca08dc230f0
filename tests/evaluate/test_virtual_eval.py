"""mycroft-otel eval --virtual: the catalogue on virtual time, in one process, deterministic for a seed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mycroft_otel.evaluate import scenarios, virtual

STALL_MS = 3000
CATALOGUE = {s.name: s for s in scenarios.builtin(STALL_MS)}
HANGS = ["rank_absent", "gpu_stalled", "nic_down", "flow_stall", "coll_mismatch"]


@pytest.fixture(scope="module")
def plugin() -> str:
    try:
        from mycroft_otel.sim.runner import find_plugin

        return find_plugin()
    except (ImportError, FileNotFoundError) as exc:
        pytest.skip(f"native build missing: {exc}")


def _run(name: str, plugin: str) -> dict:
    return virtual.score(virtual.run_scenario(CATALOGUE[name], STALL_MS, plugin=plugin))


def test_same_seed_same_verdicts_at_the_same_simulated_times(plugin):
    a, b = _run("nic_down", plugin), _run("nic_down", plugin)
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
