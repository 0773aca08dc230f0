"""mycroft-otel sim: the command line, its ground-truth JSON and its errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

TRUTH_KEYS = {"fault", "category", "kind", "comm_kind", "comm_name", "comm_hash", "coll_seq", "coll_func", "step",
              "culprit_ranks", "culprit_global_ranks", "culprit_hosts", "channel", "peer", "onset_sim_ns",
              "onset_ns", "signal", "params"}


def sim(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "mycroft_otel", "sim", "--no-progress", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_sim_prints_the_ground_truth(tmp_path, plugin):
    r = sim("--topology", "nodes=4,gpus=2,tp=2,dp=4", "--fault", "flow_stall:rank=5,channel=1", "--seed", "4",
            "--steps", "3", "--ring-dir", str(tmp_path), "--plugin", plugin)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["world"] == 8 and out["contexts"] == 16 and out["hung"] and out["mode"] == "accelerated"
    t = out["faults"][0]
    assert set(t) >= TRUTH_KEYS
    assert (t["category"], t["kind"], t["culprit_global_ranks"], t["channel"]) == (
        "net_delivery_stalled", "hang", [5], 1)
    assert len(t["comm_hash"]) == 16 and t["culprit_hosts"] == ["sim-node002"]
    assert t["peer"] is not None and t["onset_ns"] > 1.6e18
    assert len(list(tmp_path.glob("*.mycroft"))) == 16


def test_sim_healthy_realtime_has_no_faults(tmp_path, plugin):
    r = sim("--topology", "nodes=2,gpus=1,tp=1,dp=2", "--realtime", "--duration", "0.5", "--ring-dir", str(tmp_path),
            "--plugin", plugin, "--light")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["faults"] == [] and out["mode"] == "realtime" and not out["hung"] and out["steps"] >= 1


@pytest.mark.parametrize("args,msg", [
    (["--fault", "no_such_fault"], "unknown fault"),
    (["--fault", "nic_down:rank=x"], "bad value"),
    (["--fault", "nic_down:bogus=1"], "unknown fault parameter"),
    (["--topology", "nodes=2,gpus=8,tp=3"], "tp"),
    (["--fault", "nic_down:rank=999", "--topology", "nodes=2,gpus=1,tp=1,dp=2"], "outside the job"),
    (["--multiprocess"], "--realtime"),
])
def test_sim_bad_arguments_are_named(tmp_path, args, msg):
    r = sim("--ring-dir", str(tmp_path), *args)
    assert r.returncode == 2 and msg in r.stderr, r.stderr
