"""``mycroft-otel report``: a self-contained HTML report (inline SVG, no script, no network) of a run.

    mycroft-otel report RUN_DIR_OR_FILE [-o report.html]

Input: OTLP/JSON trace files (otlp_json.py: the Collector ``file`` exporter's format, one
ExportTraceServiceRequest per line) holding the rank spans of the collectives and the
processor's ``mycroft.root_cause`` spans; a directory is read file by file (``*.json``,
``*.jsonl``, ``*.ndjson``, ``.gz`` of those, processor recordings ``*.rec``, and the output of
``mycroft-otel eval --json``, shown as an evaluation table). ``--replay`` runs processor
recordings through the processor (virtual time, processor/replay.py) to add its verdicts, for
recordings that do not hold them.
Content (render.py): the verdicts (category, culprit, evidence, confidence, detection latency)
and per collective trace a timeline, the culprit's flow counters and the wait chain (model.py,
pictures.py); for a verdict's trace also the communicator as a ring or tree with the culprit and
its blocked flows, a ranks x time heat map of wait states and per-flow transfer times
(communicator.py). Spans with values the pictures cannot trust are named and left out (model.py).

Bad input never stops the report: what could not be read is listed (file, line, what is wrong)
at the top and on stderr, and everything valid is rendered. Exit status: 0 clean, 1 written
with input problems, 2 nothing readable (the report is still written, listing the problems).
"""

from __future__ import annotations

import argparse
import os
import sys

from mycroft_otel.report.model import Run, build
from mycroft_otel.report.otlp_json import (DEFAULT_MAX_INPUT_BYTES, OtlpJsonFileExporter, OtlpJsonWriter, Problem,
                                           read_path)
from mycroft_otel.report.render import page

__all__ = ["OtlpJsonFileExporter", "OtlpJsonWriter", "render_report", "trace_ui_url", "add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", help="a recorded run: OTLP/JSON file(s) (a file or a directory), or a processor "
                                 "recording (.rec)")
    p.add_argument("-o", "--output", default=None,
                   help="HTML file to write (default: INPUT_DIR/report.html, or INPUT.html for a file)")
    p.add_argument("--max-traces", type=int, default=20,
                   help="collective traces drawn, verdicts' traces first (default %(default)s)")
    p.add_argument("--max-input-mib", type=float, default=DEFAULT_MAX_INPUT_BYTES / (1 << 20),
                   help="read each input file only up to this many MiB, after gzip (default %(default)g: the "
                        "report holds about ten times its input as Python objects)")
    p.add_argument("--trace-ui", default=None, metavar="URL",
                   help="trace UI the report's trace ids link to: a base URL that /trace/<id> is appended to "
                        "(Jaeger), or a URL with {trace_id} (Grafana Explore); default MYCROFT_TRACE_UI_URL; "
                        "without one a trace id links to its section of the report")
    p.add_argument("--replay", action="store_true",
                   help="derive the verdicts by replaying processor recordings (.rec, .otlp[.gz]) through the "
                        "processor on virtual time, for recordings made without the processor's output")


def replayed_verdicts(recording: str, problems: list[Problem], decided: Run | None = None) -> list:
    """Root-cause spans (report Spans) the processor gives when ``recording`` is replayed through it; its
    decisions (processor/outcome.py) are added to ``decided``."""
    import logging

    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    from mycroft_otel.processor.exporter import root_cause_span
    from mycroft_otel.processor.replay import replay
    from mycroft_otel.report.otlp_json import request_to_json, spans_from_request

    # the replayed processor's verdict lines are the report's content, not news: quiet while it runs, and the
    # caller's level back after (a report rendered inside a larger program must not silence its logging)
    log = logging.getLogger("mycroft_otel")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        _proc, verdicts = replay(recording)
    except Exception as exc:  # noqa: BLE001 - reported, the rest of the report goes on
        problems.append(Problem(recording, f"replay failed: {type(exc).__name__}: {exc}"))
        return []
    finally:
        log.setLevel(level)
    if decided is not None:
        decided.decisions += list(_proc.decisions)
        for key, n in _proc.counts.items():
            if key.startswith("decision:"):
                outcome = key.split(":", 1)[1]
                decided.decision_counts[outcome] = decided.decision_counts.get(outcome, 0) + n
    if not verdicts:
        return []
    req = encode_spans([root_cause_span(v) for v in verdicts])
    return spans_from_request(request_to_json(req), f"{recording} (replayed)", problems)


def trace_ui_url(value: str | None = None, env=None) -> str:
    """The trace UI the report links trace ids to: ``value``, else MYCROFT_TRACE_UI_URL ('' for none);
    config.ConfigError names a value that is not an http(s) URL."""
    from mycroft_otel import config
    name = "--trace-ui" if value is not None else "MYCROFT_TRACE_UI_URL"
    url = value if value is not None else config.get_str("MYCROFT_TRACE_UI_URL", env)
    if url and not url.startswith(("http://", "https://")):
        raise config.ConfigError(f"{name}={url!r} must be an http:// or https:// URL")
    return url


def render_report(path: str | list[str], max_traces: int = 20, replay: bool = False,
                  source: str | None = None, max_input_bytes: int = DEFAULT_MAX_INPUT_BYTES,
                  trace_ui: str | None = None) -> tuple[str, Run, list[Problem]]:
    """(html, run, problems) for a recorded run at ``path`` (a file or directory, or a list of them);
    ``source`` names the input on the page (default: the paths); ``trace_ui``: the trace UI trace ids
    link to (default MYCROFT_TRACE_UI_URL, see trace_ui_url)."""
    trace_ui = trace_ui_url(trace_ui)
    problems: list[Problem] = []
    evals: list = []
    recordings: list[str] = []
    spans, files = [], []
    for p in [path] if isinstance(path, str) else path:
        more, names = read_path(p, problems, evals, recordings, max_input_bytes)
        spans += more
        files += names
    decided = Run(0, {}, [], [])
    if replay:
        for rec in recordings:
            spans += replayed_verdicts(rec, problems, decided)
    run_ = build(spans, files, problems)
    run_.evals = evals
    run_.decisions, run_.decision_counts = decided.decisions, decided.decision_counts
    source = source or (path if isinstance(path, str) else ", ".join(path))
    return page(run_, problems, max_traces, source, trace_ui), run_, problems


def _default_output(path: str) -> str:
    if os.path.isdir(path):
        return os.path.join(path, "report.html")
    base = path
    for suf in (".gz", ".jsonl", ".ndjson", ".json", ".rec", ".otlp"):
        if base.endswith(suf):
            base = base[: -len(suf)]
    return base + ".html"


def run(args: argparse.Namespace) -> int:
    if args.max_traces < 0:
        print("mycroft-otel report: --max-traces must be >= 0", file=sys.stderr)
        return 2
    if not args.max_input_mib > 0:
        print("mycroft-otel report: --max-input-mib must be > 0", file=sys.stderr)
        return 2
    from mycroft_otel.config import ConfigError
    try:
        trace_ui = trace_ui_url(args.trace_ui)
    except ConfigError as exc:
        print(f"mycroft-otel report: {exc}", file=sys.stderr)
        return 2
    html, run_, problems = render_report(args.input, args.max_traces, replay=args.replay,
                                         max_input_bytes=int(args.max_input_mib * (1 << 20)), trace_ui=trace_ui)
    out = args.output or (_default_output(args.input) if os.path.exists(args.input) else "mycroft-report.html")
    for p in problems[:20]:
        print(f"mycroft-otel report: {p}", file=sys.stderr)
    if len(problems) > 20:
        print(f"mycroft-otel report: ... {len(problems) - 20} more problems (listed in the report)", file=sys.stderr)
    try:
        with open(out, "w", encoding="utf-8") as f:
            f.write(html)
    except OSError as exc:
        print(f"mycroft-otel report: cannot write {out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"mycroft-otel report: {out}: {len(run_.verdicts)} verdict(s), {len(run_.traces)} trace(s) from "
          f"{run_.spans} spans" + (f", {len(problems)} input problem(s)" if problems else ""), file=sys.stderr)
    if run_.spans == 0 and not run_.evals:
        return 2
    return 1 if problems else 0
