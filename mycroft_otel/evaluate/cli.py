"""``mycroft-otel eval``: the fault catalogue end to end; detection, top-1 culprit, category, latency.

Each scenario runs the real pipeline over loopback (see harness.py), or with ``--virtual`` in one
process on the simulator's virtual time (see virtual.py), and is scored against the simulator's
ground truth. Prints a table (or ``--json``); verdict columns say "no verdict" when
nothing came back, and a component that is missing or failed is named in the output.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from mycroft_otel import config
from mycroft_otel.evaluate import harness, scenarios, virtual
from mycroft_otel.evaluate.sink import Sink


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scenarios", default="builtin", help="builtin, or a YAML/JSON file of scenarios")
    p.add_argument("--only", nargs="+", default=None, metavar="NAME",
                   help="run only these scenarios (with --corpus: these runs of it, named as --list prints them)")
    p.add_argument("--json", action="store_true", help="machine-readable results on stdout")
    p.add_argument("--keep", action="store_true",
                   help="keep each scenario's rings, component logs and the processor's input (otlp.rec, for "
                        "processor.replay); with --corpus, each run's processor input, for mycroft-otel report "
                        "--replay (the processor's decision about each collective)")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    p.add_argument("--virtual", action="store_true",
                   help="one process on virtual time: deterministic, independent of the machine's load, faster "
                        "than real time (process faults need real processes and are left out)")
    p.add_argument("--topology", default=None, help="run every scenario on this topology instead of its own")
    p.add_argument("--corpus", nargs="?", const="small", default=None, metavar="SPEC",
                   help="the accuracy corpus on virtual time (implies --virtual): ci, small (the bare flag), full, "
                        "or a JSON file of evaluate.corpus.CorpusSpec fields; prints the detection curve, "
                        "accuracy, false verdicts per 10^6 healthy collectives, latency in collectives")
    p.add_argument("--jobs", type=int, default=1, help="--corpus: scenarios run in parallel (processes; default 1)")
    p.add_argument("--plot", default=None, metavar="FILE.svg", help="--corpus: draw the detection curve here")
    p.add_argument("--estimate-from", nargs="+", default=None, metavar="RUN.json",
                   help="--corpus: print how long SPEC would take on one core and its healthy collectives, "
                        "extrapolated from other corpora's --json output, instead of running it")


def table(rows: list[dict], summary: dict, virtual: bool = False) -> str:
    head = ["scenario", "expected", "detected", "latency", "culprit", "category", "verdict", "right later"]
    lines = []
    for r in rows:
        if r["detected"] is None:
            det = "-" if not r["false_positives"] else f"FP x{r['false_positives']}"
            vals = [r["scenario"], "(healthy)", det, "", "", "", r["top"] or "none (ok)", ""]
        else:
            ok = {True: "yes", False: "no", None: ""}
            vals = [r["scenario"], r["expected"], ok[r["detected"]],
                    f"{r['latency_s']:.1f}s" if r["latency_s"] is not None else "",
                    ok[r["culprit_ok"]] if r["detected"] else "", ok[r["category_ok"]] if r["detected"] else "",
                    r["top"] or "no verdict",
                    (f"yes ({r['any_right_latency_s']:.1f}s)" if r.get("any_right") else "no") if r["detected"] else ""]
        broken = [f"{k} {v}" for k, v in r["components"].items() if v != "ok" and k != "workdir"]
        if r["sim_error"]:
            broken.append(r["sim_error"])
        if broken:
            vals[-2] += "  [" + "; ".join(b[:90] for b in broken) + "]"
        lines.append(vals)
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
    fmt = lambda vals: "  ".join(str(v).ljust(w) for v, w in zip(vals, widths)).rstrip()  # noqa: E731
    out = [fmt(head), fmt(["-" * w for w in widths])] + [fmt(v) for v in lines]
    s = summary
    out.append("")
    out.append(f"detected {s['detected']}/{s['faults']} ({s['detection_rate']:.0%}), top-1 culprit "
               f"{s['top1_culprit_accuracy']:.0%}, category {s['category_accuracy']:.0%} (a right verdict at any "
               f"point: {s['any_verdict_right']:.0%}), latency median "
               f"{s['latency_median_s']}s p90 {s['latency_p90_s']}s; healthy runs {s['healthy_runs']} with "
               f"{s['healthy_false_positives']} false positive(s)")
    if virtual:
        out.append(f"virtual time: {s['sim_s']} s simulated in {s['wall_s']} s of wall time (speed-up "
                   f"{s['speedup']}x, load average {os.getloadavg()[0]:.1f}); onset to verdict in collectives of "
                   f"the faulty communicator: median {s['latency_median_collectives']}")
    else:
        out.append(f"simulated job's real-time delivery lag: max {s['sim_max_late_ms']} ms (load average "
                   f"{os.getloadavg()[0]:.1f})")
    if s["components_failed"]:
        out.append("components not working: " + "; ".join(c[:160] for c in s["components_failed"]))
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    stall_ms = config.get_int("MYCROFT_STALL_MS", lo=1)
    if args.corpus is not None:
        return _run_corpus(args, stall_ms)
    try:
        todo = scenarios.load(args.scenarios, stall_ms)
    except (OSError, ValueError) as exc:
        print(f"mycroft-otel eval: {exc}", file=sys.stderr)
        return 2
    if args.only:
        unknown = set(args.only) - {s.name for s in todo}
        if unknown:
            print(f"mycroft-otel eval: unknown scenario(s) {sorted(unknown)}", file=sys.stderr)
            return 2
        todo = [s for s in todo if s.name in args.only]
    if args.topology:
        todo = [dataclasses.replace(s, topology=args.topology) for s in todo]
    if args.virtual:
        left_out = [s.name for s in todo if virtual.needs_real_processes(s)]
        todo = [s for s in todo if not virtual.needs_real_processes(s)]
        if left_out:
            print(f"mycroft-otel eval --virtual: leaving out {', '.join(left_out)} (process faults need real "
                  "processes: run them without --virtual)", file=sys.stderr)
    if args.list:
        for s in todo:
            print(f"{s.name:16s} {s.fault:45s} {s.topology} {s.duration_s:.0f}s")
        return 0
    if args.virtual:
        return _run_virtual(args, todo, stall_ms)
    sink = Sink()
    sink.start()
    rows = []
    try:
        for i, sc in enumerate(todo):
            print(f"[{i + 1}/{len(todo)}] {sc.name}: {sc.fault} ({sc.duration_s:.0f}s)", file=sys.stderr)
            o = harness.run_scenario(sc, sink, stall_ms, keep_dir=args.keep,
                                     log=lambda m: print(m, file=sys.stderr))
            rows.append(harness.score(o))
            r = rows[-1]
            print(f"  -> {r['top'] or 'no verdict'}"
                  + (f" ({r['latency_s']}s)" if r.get("latency_s") is not None else ""), file=sys.stderr)
    finally:
        sink.stop()
    summary = harness.summarize(rows)
    if args.json:
        json.dump({"summary": summary, "scenarios": rows}, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        print(table(rows, summary))
    return 0


def summarize_virtual(rows: list[dict]) -> dict:
    """harness.summarize plus the virtual-time figures: simulated vs wall seconds, latency in collectives."""
    s = harness.summarize(rows)
    sim_s = sum(r["sim_s"] for r in rows)
    wall_s = sum(r["wall_s"] for r in rows)
    col = sorted(r["latency_collectives"] for r in rows if r.get("latency_collectives") is not None)
    s.update(sim_s=round(sim_s, 1), wall_s=round(wall_s, 1), speedup=round(sim_s / wall_s, 2) if wall_s else None,
             latency_median_collectives=col[len(col) // 2] if col else None,
             events=sum(r["events"] for r in rows))
    return s


def _run_virtual(args: argparse.Namespace, todo: list, stall_ms: int) -> int:
    rows = []
    for i, sc in enumerate(todo):
        print(f"[{i + 1}/{len(todo)}] {sc.name}: {sc.fault} ({sc.duration_s:.0f}s simulated, {sc.topology})",
              file=sys.stderr)
        rows.append(virtual.score(virtual.run_scenario(sc, stall_ms)))
        r = rows[-1]
        print(f"  -> {r['top'] or 'no verdict'}" + (f" ({r['latency_s']}s)" if r.get("latency_s") is not None else "")
              + f"  [{r['sim_s']} s simulated in {r['wall_s']} s, {r['speedup']}x]", file=sys.stderr)
    summary = summarize_virtual(rows)
    if args.json:
        json.dump({"summary": summary, "scenarios": rows}, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        print(table(rows, summary, virtual=True))
    return 0


def _run_corpus(args: argparse.Namespace, stall_ms: int) -> int:
    from mycroft_otel.evaluate import corpus

    if args.topology or args.scenarios != "builtin":
        print("mycroft-otel eval --corpus: --topology and --scenarios do not apply (the corpus names its own "
              "scenarios: write a corpus JSON file to choose them, --only to run some of them)", file=sys.stderr)
        return 2
    if args.jobs < 1:
        print(f"mycroft-otel eval --corpus: --jobs must be >= 1 (got {args.jobs})", file=sys.stderr)
        return 2
    try:
        rc, out = corpus.main_corpus(args.corpus, stall_ms, args.jobs, args.json, args.plot, args.estimate_from,
                                     args.list, log=lambda m: print(m, file=sys.stderr), only=args.only,
                                     keep=args.keep)
    except (OSError, ValueError) as exc:  # FaultError, TopologyError and a bad JSON file are ValueErrors
        print(f"mycroft-otel eval --corpus: {exc}", file=sys.stderr)
        return 2
    print(out)
    return rc
