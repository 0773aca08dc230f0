"""A process exit is evidence only while the collective is in flight and before the job itself ends: the
job's shutdown (every process exiting together at the end of the run) and exits after a rank completed
its collective are not drawn as "process exited"."""

from __future__ import annotations

import re

from mycroft_otel import ids
from mycroft_otel.report import render_report

from report_synth import COMM, JOB, T0, completed, exit_status, request, ring_hang, root_cause, write_run

END = T0 + 20_000_000_000   # the job ends here: every process exits at once


def _headers(html: str) -> dict[str, str]:
    return {tid: h for tid, h in re.findall(r'<section class="trace" id="t-([0-9a-f]+)">\s*<h3>([^<]*)</h3>', html)}


def test_job_shutdown_after_completed_collectives_is_no_exit(tmp_path):
    tid, spans = completed(n=4, seq=40)
    nxt = ids.coll_trace_id(JOB, COMM, 41)   # the agent files an idle exit under the next collective
    spans += [exit_status(tid, r, 40, END - 10**9, END, in_flight=True) for r in range(4)]   # late callback
    spans += [exit_status(nxt, r, 41, END - 10**9, END + r * 1000, in_flight=False) for r in range(4)]
    write_run(tmp_path / "run.jsonl", request(spans))
    html, run, problems = render_report(str(tmp_path / "run.jsonl"))
    assert not problems
    heads = _headers(html)
    assert "process exited" not in heads[f"{tid:032x}"] and "completed" in heads[f"{tid:032x}"]
    assert "process exited" not in " ".join(heads.values())
    assert run.traces[f"{nxt:032x}"].state == "never started: the job ended"
    assert 'fill="#7f0000"' not in html          # no exit bar drawn anywhere


def test_exit_in_flight_is_evidence_and_the_shutdown_after_it_is_not(tmp_path):
    tid, spans = ring_hang(n=8, culprit=3)
    spans += [exit_status(tid, 3, 17, T0, T0 + 1_500_000_000, in_flight=True)]      # rank 3 dies mid-collective
    spans += [exit_status(tid, r, 17, T0, END, in_flight=True) for r in range(8) if r != 3]   # then the job ends
    write_run(tmp_path / "run.jsonl", request(spans + [root_cause(tid, "process_exited", [3])]))
    html, run, problems = render_report(str(tmp_path / "run.jsonl"))
    assert not problems
    t = run.traces[f"{tid:032x}"]
    assert t.state == "process exited"
    assert [r for r, rv in sorted(t.ranks.items()) if rv.status_kind == "process_exited"] == [3]
    assert t.job_ended == 7 and "7 rank(s) ended with the job" in html
    assert t.stop_reason(3) == "process exited" and t.stop_reason(2) != "process exited"


def test_one_process_exiting_last_is_still_evidence(tmp_path):
    tid, spans = ring_hang(n=8, culprit=3)
    spans += [exit_status(tid, 3, 17, T0, END, in_flight=True)]   # alone: not a job's end
    write_run(tmp_path / "run.jsonl", request(spans))
    _html, run, _problems = render_report(str(tmp_path / "run.jsonl"))
    assert run.traces[f"{tid:032x}"].state == "process exited"
