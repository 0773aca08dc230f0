"""Every decision the slowdown analysis takes is a named outcome (processor/outcome.py): replayed recordings of
real pipeline traffic say why the processor stayed silent before a fault and what it named after, and the
counts reach the processor's metrics."""

from __future__ import annotations

import json
import logging
import os
import re

import pytest
from prometheus_client import generate_latest

from mycroft_otel.processor import Processor
from mycroft_otel.processor.metrics import Metrics
from mycroft_otel.processor.outcome import Outcome
from mycroft_otel.processor.replay import replay
from mycroft_otel.processor.settings import Settings
from mycroft_otel.processor.views import build_views

DATA = os.path.join(os.path.dirname(__file__), "testdata")
TRUTH = json.load(open(os.path.join(DATA, "truth.json")))
SLOWDOWNS = sorted(n for n, t in TRUTH.items() if t.get("kind") == "slowdown")
SILENCES = {Outcome.WARMUP, Outcome.BELOW_BAR, Outcome.EXPLAINED, Outcome.NOT_SLOWER, Outcome.DEFERRED,
            Outcome.HELD_FOR_STALL, Outcome.SAME_INCIDENT}


def _replayed(name: str) -> tuple[Processor, list]:
    logging.disable(logging.WARNING)
    try:
        return replay(os.path.join(DATA, f"{name}.otlp.gz"))
    finally:
        logging.disable(logging.NOTSET)


def _receivers(proc: Processor, comm: str, seq: int, rank: int) -> set:
    """The ranks ``rank`` sends to in that collective of the replay (its flows' peers)."""
    st = next((s for s in proc.store.traces.values() if s.comm == comm and s.seq == seq), None)
    v = build_views(st).get(rank) if st is not None else None
    return {f.peer for f in v.flows if f.send} if v is not None else set()


def test_outcomes_name_verdicts_and_silences_apart():
    assert {o for o in Outcome if o.verdict} == {Outcome.NAMED, Outcome.STRAGGLER, Outcome.MISMATCH, Outcome.HANG}
    assert not SILENCES & {o for o in Outcome if o.verdict}


@pytest.mark.parametrize("name", SLOWDOWNS)
def test_a_recorded_slowdown_says_why_it_was_silent_before_and_what_it_named_after(name):
    """Before the fault's collective, the culprit's communicator is judged silent for a named reason; the
    verdict's decision names the culprit's hypothesis, and the evidence it gathered in between is the
    closest candidate of the silences just before it."""
    t = TRUTH[name]
    proc, verdicts = _replayed(name)
    assert verdicts, "the fault was not named"
    v = verdicts[0]
    mine = [d for d in proc.decisions if d.comm == t["comm_hash"]]
    before = [d for d in mine if d.seq < t["coll_seq"]]
    assert before and all(d.outcome in SILENCES for d in before), before[-3:]
    named = [d for d in mine if d.outcome.verdict]
    assert named and named[0].seq == v.seq >= t["coll_seq"]
    hypothesis = v.finding.hypothesis
    assert named[0].detail == hypothesis and str(v.finding.ranks[0]) in hypothesis
    # the margin is over the runner-up's evidence, or the whole evidence where no other place gathered any
    # (docs/span-schema.md: mycroft.rca.runner_up empty)
    assert v.finding.margin is not None and v.finding.margin > 0
    assert v.finding.runner_up or v.finding.margin >= Settings().cusum.h, v.finding
    # the silences between the onset and the verdict were the culprit's place gathering evidence: this
    # hypothesis, or a flow into or out of its rank that it explains (a NIC slow both ways gathers at the
    # flows of both its sides first)
    leading = [d for d in mine if t["coll_seq"] <= d.seq < v.seq and d.outcome == Outcome.BELOW_BAR]
    assert leading, mine[-3:]
    closest = re.search(r"closest: (\w+) (?:rank (\d+)|(\d+)->(\d+) ch\d+)", leading[-1].detail)
    assert closest, leading[-1].detail
    ends = {int(e) for e in closest.groups()[1:] if e is not None}
    if closest.group(1) == "nic_send":  # a sending NIC's path ends at its receivers too (a ring's: one)
        ends |= _receivers(proc, t["comm_hash"], leading[-1].seq, int(closest.group(2)))
    assert hypothesis in leading[-1].detail or v.finding.ranks[0] in ends, leading[-3:]


def test_a_healthy_recording_is_silent_for_named_reasons_and_the_metrics_count_them():
    metrics = Metrics()
    logging.disable(logging.WARNING)
    try:
        proc, verdicts = replay(os.path.join(DATA, "healthy.otlp.gz"), metrics=metrics)
    finally:
        logging.disable(logging.NOTSET)
    assert verdicts == []
    assert proc.decisions and all(d.outcome in SILENCES for d in proc.decisions)
    text = generate_latest(metrics.registry).decode()
    below = sum(d.outcome == Outcome.BELOW_BAR for d in proc.decisions)
    assert f'mycroft_processor_decisions_total{{outcome="below_bar"}} {float(below)}' in text
    assert 'mycroft_processor_decisions_total{outcome="named"} 0.0' in text


def test_a_verdict_carries_its_hypothesis_on_the_root_cause_span():
    _, verdicts = _replayed("slow_gpu")
    a = verdicts[0].attributes()
    assert a["mycroft.rca.hypothesis"].startswith("gpu rank ")
    assert a["mycroft.rca.runner_up"] and a["mycroft.rca.margin"] > 0


def test_every_root_cause_attribute_is_documented():
    from pathlib import Path

    schema = (Path(__file__).resolve().parents[2] / "docs" / "span-schema.md").read_text()
    section = schema.split("## `mycroft.root_cause`", 1)[1].split("\n## ", 1)[0]
    documented = set()
    for cell in (line.split("|")[1] for line in section.splitlines() if line.startswith("| `")):
        names = [n.strip("` ") for n in cell.split(",")]
        base = names[0].rsplit(".", 1)[0]
        documented |= {n if not n.startswith(".") else base + n for n in names}
    for name in ("slow_gpu", "gpu_stalled"):
        _, verdicts = _replayed(name)
        missing = set(verdicts[0].attributes()) - documented
        assert not missing, missing


@pytest.mark.parametrize("name", sorted(n for n, t in TRUTH.items() if t.get("kind") == "hang"))
def test_a_recorded_hang_is_a_decision_counted_with_the_others(name):
    """The hang walk's verdict is an outcome like a slowdown's: decided about the stalled collective, named
    by its category and culprit, and counted in the processor's decisions metric; a stalled collective whose
    ranks wait for another's culprit is counted as waiting on it, not as a second hang."""
    metrics = Metrics()
    logging.disable(logging.WARNING)
    try:
        proc, verdicts = replay(os.path.join(DATA, f"{name}.otlp.gz"), metrics=metrics)
    finally:
        logging.disable(logging.NOTSET)
    assert verdicts
    hangs = [d for d in proc.decisions if d.outcome == Outcome.HANG]
    assert len(hangs) == sum(v.finding.kind == "hang" for v in verdicts), (hangs, verdicts)
    v = next(v for v in verdicts if v.finding.kind == "hang")
    assert any(d.comm == v.comm and d.seq == v.seq and d.detail.startswith(v.category) for d in hangs), hangs
    text = generate_latest(metrics.registry).decode()
    assert f'mycroft_processor_decisions_total{{outcome="hang"}} {float(len(hangs))}' in text
    waits = sum(d.outcome == Outcome.WAITS_ON for d in proc.decisions)
    assert f'mycroft_processor_decisions_total{{outcome="waits_on"}} {float(waits)}' in text
