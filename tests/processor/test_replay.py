"""Regression on real pipeline traffic: OTLP recorded from `mycroft-otel eval` runs (simulator -> plugin ->
agent -> processor, `processor --record`) and from real-time conformance runs (tests/conformance, ``conf_*``:
rank processes driving the plugin's ABI) that were once misnamed, replayed on virtual time; the first verdict
after the fault's onset must name the ground truth, and a healthy run must give none."""

from __future__ import annotations

import json
import logging
import os

import pytest

from mycroft_otel.processor.replay import replay

DATA = os.path.join(os.path.dirname(__file__), "testdata")
TRUTH = json.load(open(os.path.join(DATA, "truth.json")))


@pytest.mark.parametrize("name", sorted(TRUTH))
def test_recorded_scenario(name):
    logging.disable(logging.WARNING)
    try:
        _, verdicts = replay(os.path.join(DATA, f"{name}.otlp.gz"))
    finally:
        logging.disable(logging.NOTSET)
    t = TRUTH[name]
    if t.get("fault") in (None, "healthy"):
        assert verdicts == [], [v.summary() for v in verdicts]
        return
    onset = t["onset_ns"]
    assert all(v.detected_ns >= onset for v in verdicts), "a verdict before the fault is a false positive"
    assert verdicts, "the fault was not named"
    first = verdicts[0]
    f = first.finding
    assert first.category == t["category"], first.summary()
    if t["culprit_global_ranks"]:
        assert set(f.global_ranks) & set(t["culprit_global_ranks"]), first.summary()
    else:  # a job launched without RANK: its ranks are known only in the communicator
        assert first.comm == t["comm_hash"] and set(f.ranks) & set(t["culprit_ranks"]), first.summary()
    latency = (first.detected_ns - onset) / 1e9
    if t["kind"] == "hang" and "note" not in t:
        assert latency <= 3.0 + 3.0, latency  # stall threshold + 3 s
    if t.get("channel") is not None and first.category in ("net_delivery_stalled", "slow_flow"):
        assert f.channel == t["channel"]
