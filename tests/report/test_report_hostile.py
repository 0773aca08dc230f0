"""The report survives spans that lie: absurd communicator sizes and ranks, non-numbers where numbers belong.

Each case renders (the timeout would catch a hang: iterating a claimed 2^62 ranks never ends), names the
bad value among the input problems, and still draws everything that is valid.
"""

from __future__ import annotations

import html as html_mod

import pytest

from mycroft_otel import semconv as sc
from mycroft_otel.report import render_report
from mycroft_otel.report.model import MAX_RANKS

from report_synth import av, request, ring_hang, root_cause, write_run

pytestmark = pytest.mark.timeout(120)


def _set(span: dict, key: str, value) -> None:
    span["attributes"] = [kv for kv in span["attributes"] if kv["key"] != key] + [{"key": key, "value": av(value)}]


def _render(tmp_path, spans: list[dict]):
    write_run(tmp_path / "run.jsonl", request(spans))
    html, run, problems = render_report(str(tmp_path / "run.jsonl"))
    return html_mod.unescape(html), run, [str(p) for p in problems]


def test_huge_nranks_is_ignored_and_named(tmp_path):
    tid, spans = ring_hang()
    _set(spans[0], sc.COMM_NRANKS, 1 << 62)
    html, run, problems = _render(tmp_path, spans + [root_cause(tid, "gpu_stalled", [3])])
    assert any(f"{sc.COMM_NRANKS} = {1 << 62} is outside 0..{MAX_RANKS}" in p for p in problems), problems
    t = run.traces[f"{tid:032x}"]
    assert t.nranks == 8                              # the honest spans' claim stands
    assert "the walk stops at rank 3" in html         # the rest of the picture is intact
    assert f"{sc.COMM_NRANKS} = {1 << 62}" in html    # and the report lists the problem


def test_largest_believable_communicator_renders_bounded(tmp_path):
    """A claim of MAX_RANKS ranks is believed, but drawing it costs O(ranks reported), not O(claimed)."""
    tid, spans = ring_hang()
    for s in spans:
        _set(s, sc.COMM_NRANKS, MAX_RANKS)
    html, run, problems = _render(tmp_path, spans + [root_cause(tid, "gpu_stalled", [3])])
    assert problems == []
    assert run.traces[f"{tid:032x}"].nranks == MAX_RANKS
    assert f"ranks 8–{MAX_RANKS - 1}" in html          # the absent ranks collapse into one row


def test_huge_rank_and_culprit_are_dropped(tmp_path):
    tid, spans = ring_hang()
    _set(spans[5], sc.RANK, 10 ** 15)
    rc = root_cause(tid, "gpu_stalled", [3])
    _set(rc, sc.RCA_CULPRIT_RANKS, [10 ** 12, 3, -1])
    html, run, problems = _render(tmp_path, spans + [rc])
    assert any(f"{sc.RANK} = {10 ** 15} is outside" in p for p in problems), problems
    assert run.verdicts[0].ranks == [3]
    assert max(run.traces[f"{tid:032x}"].ranks) < 8


@pytest.mark.parametrize("value", ["abc", 1.5, True, ["1"]])
def test_non_numeric_snapshot_number(tmp_path, value):
    tid, spans = ring_hang()
    _set(spans[1], sc.SNAPSHOT_SEQ, value)
    html, run, problems = _render(tmp_path, spans + [root_cause(tid, "gpu_stalled", [3])])
    assert any(f"{sc.SNAPSHOT_SEQ} = " in p and "is not an integer; ignored" in p for p in problems), problems
    assert "the walk stops at rank 3" in html


def test_non_numeric_times_and_verdict_fields(tmp_path):
    tid, spans = ring_hang()
    rc = root_cause(tid, "gpu_stalled", [3])
    _set(rc, sc.RCA_ONSET, "soon")
    _set(rc, sc.RCA_DETECTED, "later")
    _set(rc, sc.RCA_CULPRIT_CHANNEL, "zero")
    _set(spans[2], sc.TIME_API, "noon")
    _set(spans[3], sc.COMM_NRANKS, "eight")
    html, run, problems = _render(tmp_path, spans + [rc])
    for key in (sc.RCA_ONSET, sc.RCA_DETECTED, sc.RCA_CULPRIT_CHANNEL, sc.TIME_API, sc.COMM_NRANKS):
        assert any(f"{key} = " in p and "not an integer" in p for p in problems), (key, problems)
    assert "gpu_stalled" in html and run.verdicts[0].latency_s is None


def test_times_beyond_64_bits(tmp_path):
    tid, spans = ring_hang()
    spans[0]["endTimeUnixNano"] = str(1 << 80)
    _set(spans[4], sc.TIME_API, -(1 << 70))
    html, run, problems = _render(tmp_path, spans)
    assert any("does not fit in 64 bits; span skipped" in p for p in problems), problems
    assert any(f"{sc.TIME_API} = {-(1 << 70)} does not fit in 64 bits" in p for p in problems), problems
    assert 'class="timeline"' in html
