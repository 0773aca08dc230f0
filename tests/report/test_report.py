"""mycroft-otel report: rendering from synthetic OTLP/JSON runs, and what bad input does."""

from __future__ import annotations

import base64
import gzip
import html as html_mod
import json
import re

import pytest

from mycroft_otel import cli
from mycroft_otel.report import render_report
from mycroft_otel.report.otlp_json import OtlpJsonWriter, read_path

from report_synth import completed, request, ring_hang, root_cause, write_run

EXTERNAL = re.compile(r"(https?:)?//[a-z0-9]|\bsrc=|<script|@import|url\((?!#)", re.I)


def _run_dir(tmp_path, silent=None):
    tid, spans = ring_hang(silent=silent)
    tid2, spans2 = completed()
    write_run(tmp_path / "spans.jsonl", request(spans[: len(spans) // 2]), request(spans[len(spans) // 2:]),
              request(spans2))
    write_run(tmp_path / "root_causes.jsonl",
              request([root_cause(tid, "gpu_stalled", [3])], service="mycroft-otel-processor"))
    return tid, tid2


def test_report_renders_verdict_timeline_flows_and_walk(tmp_path):
    tid, tid2 = _run_dir(tmp_path)
    html, run, problems = render_report(str(tmp_path))
    assert problems == []
    assert len(run.verdicts) == 1 and len(run.traces) == 2
    assert "gpu_stalled" in html and "received data its GPU never consumed" in html
    assert "3.00 s" in html                                     # detection latency: detected - onset
    # one timeline per collective trace, plus flow bars and the wait chain for the hung one
    assert html.count('class="timeline"') == 2
    assert f'id="t-{tid:032x}"' in html and f'id="t-{tid2:032x}"' in html
    assert html.count('class="flows"') == 1 and html.count('class="walk"') == 1
    # the walk runs against the data flow to the culprit, whose own wait is its GPU
    assert "the walk stops at rank 3" in html and "RecvGpuWait" in html
    assert "the verdict's culprit" in html
    assert "rank 2 +50 ms" in html                               # the late arrival of the completed one
    assert not EXTERNAL.search(html), EXTERNAL.search(html)


def test_silent_rank_and_culprit_link_that_never_arrived(tmp_path):
    tid, spans = ring_hang(silent=3)
    write_run(tmp_path / "run.jsonl", request(spans + [root_cause(tid, "rank_absent", [3])]))
    html, run, problems = render_report(str(tmp_path / "run.jsonl"))
    assert not problems
    assert "no span from this rank (silent)" in html
    assert "culprit: rank 3 op span (never arrived)" in html


def test_cli_writes_file_and_exit_codes(tmp_path, capsys):
    _run_dir(tmp_path)
    out = tmp_path / "r.html"
    assert cli.main(["report", str(tmp_path), "-o", str(out)]) == 0
    assert "gpu_stalled" in out.read_text()
    assert cli.main(["report", str(tmp_path)]) == 0              # default: DIR/report.html
    assert (tmp_path / "report.html").exists()


def test_missing_input_is_named(tmp_path, capsys):
    rc = cli.main(["report", str(tmp_path / "nope"), "-o", str(tmp_path / "x.html")])
    err = capsys.readouterr().err
    assert rc == 2
    assert "nope: no such file or directory" in err


def test_bad_lines_are_reported_and_the_rest_rendered(tmp_path, capsys):
    tid, spans = ring_hang()
    good = json.dumps(request(spans + [root_cause(tid, "gpu_stalled", [3])]))
    bad_span = request([{"name": "x", "spanId": "zz"}])
    (tmp_path / "run.jsonl").write_text("\n".join([
        good, "{not json", json.dumps({"hello": 1}), json.dumps([1, 2]), json.dumps(bad_span)]) + "\n")
    (tmp_path / "empty.json").write_text("")
    out = tmp_path / "r.html"
    rc = cli.main(["report", str(tmp_path), "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 1
    assert "run.jsonl:2: invalid JSON" in err
    assert "run.jsonl:3: not an OTLP trace export: no 'resourceSpans' (found hello)" in err
    assert "run.jsonl:4: not an OTLP trace export" in err
    assert "run.jsonl:5: resourceSpans[0].scopeSpans[0].spans[0] (x): traceId missing" in err
    assert "empty.json: empty file" in err
    html = out.read_text()
    assert "Problems with the input (5)" in html
    assert "gpu_stalled" in html and 'class="timeline"' in html


def test_nothing_valid_still_renders_problems(tmp_path, capsys):
    (tmp_path / "x.json").write_text('{"resourceSpans": 3}')
    rc = cli.main(["report", str(tmp_path / "x.json"), "-o", str(tmp_path / "x.html")])
    assert rc == 2
    assert "'resourceSpans' is not a list" in html_mod.unescape((tmp_path / "x.html").read_text())


def _b64_ids(o):
    """protobuf's JSON mapping carries bytes (ids) as base64."""
    if isinstance(o, dict):
        return {k: (base64.b64encode(bytes.fromhex(v)).decode() if k in ("traceId", "spanId") else _b64_ids(v))
                for k, v in o.items()}
    if isinstance(o, list):
        return [_b64_ids(x) for x in o]
    return o


def test_reads_collector_variants_and_writer_roundtrip(tmp_path):
    """Pretty-printed single request, gzip, base64 ids (protobuf JSON), and what OtlpJsonWriter writes."""
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
    from google.protobuf import json_format

    tid, spans = ring_hang(n=4, culprit=1)
    (tmp_path / "a.json").write_text(json.dumps(request(spans[:4]), indent=2))
    with gzip.open(tmp_path / "b.jsonl.gz", "wt") as f:
        f.write(json.dumps(request(spans[4:8])) + "\n")
    req = json_format.ParseDict(_b64_ids(request(spans[8:])), trace_service_pb2.ExportTraceServiceRequest(),
                                ignore_unknown_fields=True)
    (tmp_path / "c.json").write_text(json_format.MessageToJson(req))  # base64 ids, camelCase
    w = OtlpJsonWriter(str(tmp_path / "d.jsonl"))
    w.write_request(req)
    w.close()
    problems = []
    got, files = read_path(str(tmp_path), problems)
    assert not problems, problems
    assert len(files) == 4
    assert len(got) == len(spans) + len(spans[8:])
    assert {s.trace_id for s in got} == {f"{tid:032x}"}


def test_root_cause_exporter_through_file_exporter(tmp_path):
    """What demo/eval can do: the processor's RootCauseExporter writing OTLP/JSON lines."""
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry import trace as api

    from mycroft_otel.report import OtlpJsonFileExporter

    exp = OtlpJsonFileExporter(str(tmp_path / "rc.jsonl"))
    ctx = api.SpanContext(0x1234, 0x55, is_remote=False)
    s = ReadableSpan(name="mycroft.root_cause", context=ctx, attributes={"mycroft.rca.category": "slow_nic",
                                                                          "mycroft.rca.culprit.ranks": [2]},
                     start_time=1, end_time=2)
    exp.export([s])
    exp.shutdown()
    html, run, problems = render_report(str(tmp_path))
    assert not problems and [v.category for v in run.verdicts] == ["slow_nic"]


# a recording's first bytes are its first payload's time (little-endian ns): any bytes, "{" or " [" too
@pytest.mark.parametrize("first_ns", [1, ord("{"), ord(" ") | ord("[") << 8], ids=["time", "brace", "space-bracket"])
def test_processor_recording_and_eval_json(tmp_path, first_ns):
    """A processor --record file (binary) and `mycroft-otel eval --json` output in the run directory."""
    import struct

    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    tid, spans = ring_hang(n=4, culprit=1)
    req = json_format.ParseDict(_b64_ids(request(spans)), trace_service_pb2.ExportTraceServiceRequest(),
                                ignore_unknown_fields=True)
    data = req.SerializeToString()
    with open(tmp_path / "received.rec", "wb") as f:
        f.write(struct.pack("<QBI", first_ns, 0, len(data)) + data)
        f.write(struct.pack("<QBI", 2, 0, 5) + b"\xff\xff\xff\xff\xff")  # a payload the processor rejected
    (tmp_path / "eval.json").write_text(json.dumps({
        "summary": {"faults": 1, "detection_rate": 1.0, "top1_culprit_accuracy": 1.0, "category_accuracy": 1.0,
                    "latency_median_s": 3.1, "latency_p90_s": 3.1, "healthy_false_positives": 0},
        "scenarios": [{"scenario": "gpu_stall", "expected": "gpu_stalled", "detected": True, "latency_s": 3.1,
                       "culprit_ok": True, "category_ok": True, "top": "gpu_stalled@g[1]"}]}))
    html, run, problems = render_report(str(tmp_path))
    assert len(run.traces) == 1 and len(run.traces[f"{tid:032x}"].ranks) == 4
    assert len(problems) == 1 and problems[0].what.startswith("undecodable OTLP payload")
    assert problems[0].where.endswith("received.rec: payload 1")
    assert "Evaluation runs" in html and "gpu_stall" in html and "gpu_stalled@g[1]" in html


def test_big_communicators_stay_readable(tmp_path):
    """Ranks without spans collapse into one row; a huge hang keeps its culprit within the drawn rows."""
    from report_synth import COMM, JOB, T0, span
    from mycroft_otel import ids
    from mycroft_otel import semconv as sc

    tid = ids.coll_trace_id(JOB, COMM, 99)
    few = [span(tid, ids.span_id(tid, r, sc.ROLE_OP), "nccl.AllReduce", T0, T0 + 1000,
                {sc.RANK: r, sc.COMM_NRANKS: 64, sc.COLL_SEQ: 99, sc.COLL_FUNC: "AllReduce"}) for r in range(4)]
    tid2, hang = ring_hang(n=200, culprit=150, seq=5)
    write_run(tmp_path / "run.jsonl", request(few), request(hang + [root_cause(tid2, "gpu_stalled", [150], seq=5)]))
    html, run, problems = render_report(str(tmp_path))
    assert not problems
    assert "ranks 4–63" in html and "no span exported" in html
    hung = html[html.index(f'id="t-{tid2:032x}"'):]
    assert "rank 150 (g150) node-37 ★" in hung
    assert "ranks not drawn" in hung


def test_replay_of_recorded_pipeline_traffic(tmp_path):
    """Real pipeline traffic (tests/processor/testdata: eval runs recorded by `processor --record`) replayed."""
    import os
    import shutil

    data = os.path.join(os.path.dirname(__file__), os.pardir, "processor", "testdata")
    src = os.path.join(data, "gpu_stalled.otlp.gz")
    if not os.path.exists(src):
        pytest.skip("no recorded traffic in tests/processor/testdata")
    truth = json.load(open(os.path.join(data, "truth.json")))["gpu_stalled"]
    shutil.copy(src, tmp_path)
    html, run, problems = render_report(str(tmp_path), replay=True)
    assert not problems, problems[:3]
    assert run.verdicts and run.verdicts[0].category == truth["category"]
    assert set(run.verdicts[0].a.get("mycroft.rca.culprit.global_ranks") or []) & set(truth["culprit_global_ranks"])
    assert 'class="timeline"' in html and 'class="flows"' in html
    # without --replay the same recording gives the evidence but no verdict
    html2, run2, _ = render_report(str(tmp_path))
    assert not run2.verdicts and run2.traces


def test_a_replayed_slowdown_shows_why_the_processor_was_silent_and_what_won(tmp_path):
    """--replay lists the processor's decisions (processor/outcome.py): the count per outcome and, for the
    culprit's communicator, the silences while its evidence gathered; the verdict card names the winning
    hypothesis, the runner-up and the margin."""
    import os
    import shutil

    data = os.path.join(os.path.dirname(__file__), os.pardir, "processor", "testdata")
    truth = json.load(open(os.path.join(data, "truth.json")))["slow_gpu"]
    shutil.copy(os.path.join(data, "slow_gpu.otlp.gz"), tmp_path)
    html, run, problems = render_report(str(tmp_path), replay=True)
    assert not problems, problems[:3]
    assert run.decision_counts.get("named") == 1 and run.decision_counts.get("below_bar", 0) > 0
    assert "<h2>Decisions</h2>" in html
    hypothesis = run.verdicts[0].a["mycroft.rca.hypothesis"]
    assert f"<td>{hypothesis}, ahead of " in html.replace("-&gt;", "->")
    mine = [d for d in run.decisions if d.comm == truth["comm_hash"] and d.outcome.value == "below_bar"
            and hypothesis in d.detail]
    assert mine, "the silences before the verdict name the evidence that was gathering"


def test_trace_ids_link_to_the_trace_ui_or_within_the_report(tmp_path, monkeypatch):
    tid, tid2 = _run_dir(tmp_path)
    monkeypatch.delenv("MYCROFT_TRACE_UI_URL", raising=False)
    html, _run, _problems = render_report(str(tmp_path))
    # no trace UI: the verdict's and each section's trace id link to the trace's section here
    assert html.count(f'<a class="mono trace-link" href="#t-{tid:032x}">{tid:032x}</a>') == 2
    assert f'<a class="mono trace-link" href="#t-{tid2:032x}">' in html
    assert not EXTERNAL.search(html)
    # Jaeger: a base URL gets /trace/<id>; any other UI: {trace_id} in the template (MYCROFT_TRACE_UI_URL)
    html, _run, _problems = render_report(str(tmp_path), trace_ui="http://jaeger:16686/")
    assert html.count(f'href="http://jaeger:16686/trace/{tid:032x}"') == 2
    monkeypatch.setenv("MYCROFT_TRACE_UI_URL", "https://grafana.example/explore?traceId={trace_id}&x=1")
    html, _run, _problems = render_report(str(tmp_path))
    assert f'href="https://grafana.example/explore?traceId={tid2:032x}&amp;x=1"' in html
    assert '<a class="mono trace-link" href="#t-' not in html   # the UI, wherever a trace id is shown
    out = tmp_path / "r.html"
    assert cli.main(["report", str(tmp_path), "-o", str(out), "--trace-ui", "http://jaeger:16686"]) == 0
    assert f'href="http://jaeger:16686/trace/{tid:032x}"' in out.read_text()
    monkeypatch.setenv("MYCROFT_TRACE_UI_URL", "jaeger:16686")
    assert cli.main(["report", str(tmp_path), "-o", str(out)]) == 2   # named, not linked to a bad address
