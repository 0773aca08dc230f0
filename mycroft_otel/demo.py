"""``mycroft-otel demo``: the whole pipeline in one process, no external services.

A simulated training job (``nodes x gpus`` ranks, TP inside a node, DP across nodes) drives the
real NCCL profiler plugin in real time; a fault strikes a few seconds in. The node agent reads the
shared-memory rings and exports spans over OTLP/gRPC on loopback to the analysis processor, whose
verdict -- what, where, evidence, detection time -- is printed at the end, and a self-contained
HTML report of the run (``report.html`` in the working directory; ``mycroft-otel report``'s
page: the verdict, the communicator with the culprit and the blocked flow, a heat map of the
ranks' wait states, per-flow transfer times) is written and its path printed::

    mycroft-otel demo                        # 64 ranks, a NIC goes down
    mycroft-otel demo --fault gpu_stalled --seed 3
    mycroft-otel demo --fault late_rank --nodes 4 --gpus 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import shutil
import sys
import tempfile
import threading
import time

from mycroft_otel import semconv as sc
from mycroft_otel.cli import command

DEFAULT_FAULT = "nic_down"
REPORT_NAME = "report.html"
#: Collective traces the demo's report draws (the verdicts' first).
REPORT_TRACES = 6


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fault", default=DEFAULT_FAULT,
                   help="fault to inject, NAME[:k=v,...] as for `mycroft-otel sim` (default %(default)s); "
                        "healthy for none")
    p.add_argument("--nodes", type=int, default=8, help="simulated hosts (default %(default)s)")
    p.add_argument("--gpus", type=int, default=8, help="GPUs per host (default %(default)s)")
    p.add_argument("--seed", type=int, default=1, help="picks the victim and the jitter (default %(default)s)")
    p.add_argument("--at", type=float, default=3.0, help="seconds into the run the fault strikes (default 3)")
    p.add_argument("--record", metavar="FILE", help="also record the OTLP the processor receives (for replay)")
    p.add_argument("--report", metavar="FILE", default=REPORT_NAME,
                   help="HTML report to write (default: %(default)s in the working directory); '' for none")
    p.add_argument("--duration", type=float, default=None,
                   help="seconds the job runs (default: enough for the fault to be detected)")


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fmt_ns(ns: int) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ns / 1e9)) + f".{ns % 1_000_000_000 // 1_000_000:03d}"


def run(args: argparse.Namespace) -> int:
    from mycroft_otel.sim.faults import CATALOGUE, FaultError, with_onset

    try:
        fault = with_onset(args.fault, args.at)
    except FaultError as exc:
        print(f"mycroft-otel demo: {exc}", file=sys.stderr)
        return 2
    name = fault.split(":", 1)[0].strip()
    kind = CATALOGUE[name][1]
    stall_ms = 3000
    # generous: a loaded machine makes the simulated job lag behind wall-clock time
    duration = args.duration or (args.at + stall_ms / 1000 + 9.0 if kind == "hang" else args.at + 14.0)
    work = tempfile.mkdtemp(prefix="mycroft-demo-")
    ring_dir = os.path.join(work, "rings")
    os.makedirs(ring_dir, mode=0o700)
    # Everything stays on loopback: point this process's OTLP exporters at our own receiver.
    port = _free_port()
    os.environ.update({"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                       "OTEL_EXPORTER_OTLP_INSECURE": "true", "MYCROFT_RING_DIR": ring_dir})
    for k in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
              "OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_CERTIFICATE"):
        os.environ.pop(k, None)

    from mycroft_otel.agent.agent import Agent
    from mycroft_otel.agent.settings import AgentSettings
    from mycroft_otel.processor import Processor
    from mycroft_otel.processor.receiver import Receiver

    import logging
    logging.getLogger("mycroft_otel").setLevel(logging.ERROR)  # the verdict is printed below, once
    topo = f"nodes={args.nodes},gpus={args.gpus},tp={args.gpus},dp={args.nodes}"
    world = args.nodes * args.gpus
    print(f"mycroft-otel demo: {world} simulated ranks ({topo}), fault {fault}, seed {args.seed}, "
          f"{duration:.0f} s of real time", file=sys.stderr)
    verdicts = []
    processor = Processor(env={"MYCROFT_STALL_MS": str(stall_ms)}, exporter=None)
    processor.listeners.append(verdicts.append)
    # the report is drawn from what the processor received: record it (where asked, else in the work dir)
    recording = args.record or (os.path.join(work, "otlp.rec") if args.report else None)
    receiver = Receiver(processor, bind="127.0.0.1", grpc_port=port, http_port=None, record=recording)
    agent = None
    stop = threading.Event()
    result: dict = {}
    t0 = time.monotonic()
    try:
        receiver.start()
        processor.start()
        agent = Agent(AgentSettings.from_env(ring_dir=ring_dir, state_dir=os.path.join(work, "state")))
        agent_thread = threading.Thread(target=agent.run, args=(stop,), name="demo-agent", daemon=True)
        agent_thread.start()
        # the training job is its own process, as in production (and off this process's GIL)
        sim_argv = command("sim", "--topology", topo, "--seed", str(args.seed),
                           "--realtime", "--duration", f"{duration:g}", "--ring-dir", ring_dir,
                           "--job-id", f"demo-{args.seed}", "--no-progress",
                           "--light" if world >= 32 else "--slow-steps")
        if name != "healthy":
            sim_argv += ["--fault", fault]
        sim_proc = subprocess.Popen(sim_argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    env=dict(os.environ, PYTHONUNBUFFERED="1"))

        def simulate():
            out, err = sim_proc.communicate()
            if sim_proc.returncode != 0:
                result["error"] = err.strip()[-800:] or f"exit status {sim_proc.returncode}"
                return
            try:
                result["out"] = json.loads(out)
            except ValueError as exc:
                result["error"] = f"unreadable ground truth: {exc}"

        sim_thread = threading.Thread(target=simulate, name="demo-sim", daemon=True)
        sim_thread.start()
        tty = sys.stderr.isatty()
        while sim_thread.is_alive():
            sim_thread.join(0.5)
            el = time.monotonic() - t0
            line = (f"  {el:5.1f}s / {duration:.0f}s  spans received {processor.counts['spans']:7d}  "
                    f"traces {len(processor.store):5d}  verdicts {len(verdicts)}")
            if tty:
                sys.stderr.write("\r" + line + "   ")
            elif int(el * 2) % 4 == 0:
                sys.stderr.write(line + "\n")
            sys.stderr.flush()
        if tty:
            sys.stderr.write("\n")
        time.sleep(1.0)  # the last spans through the agent's batcher and one more detection tick
        _shut_down(stop, agent, processor, receiver)   # the recording is complete once the receiver is closed
        if "error" in result:
            print(f"mycroft-otel demo: the simulation failed: {result['error']}", file=sys.stderr)
            return 1
        truth = (result.get("out") or {}).get("faults") or []
        rc = _print_verdicts(verdicts, truth[0] if truth else None, time.monotonic() - t0)
        source = f"mycroft-otel demo: {world} simulated ranks, fault {fault}, seed {args.seed}"
        if args.report and recording and not _write_report(args.report, recording, verdicts, work, source):
            rc = rc or 1
        return rc
    finally:
        _shut_down(stop, agent, processor, receiver)
        shutil.rmtree(work, ignore_errors=True)


def _shut_down(stop: threading.Event, agent, processor, receiver) -> None:
    """Stop the agent, processor and receiver, once (a second call does nothing)."""
    if stop.is_set():
        return
    stop.set()
    if agent is not None:
        agent.close(flush_timeout_s=2.0)
    processor.shutdown()
    receiver.shutdown()


def _write_report(out: str, recording: str, verdicts: list, work: str, source: str) -> bool:
    """The run's HTML report at ``out``: the spans the processor received and its verdicts."""
    from mycroft_otel.processor.exporter import root_cause_span
    from mycroft_otel.report import render_report
    from mycroft_otel.report.otlp_json import OtlpJsonWriter

    inputs = [recording]
    if verdicts:
        inputs.append(os.path.join(work, "verdicts.jsonl"))
        w = OtlpJsonWriter(inputs[-1])
        try:
            w.write_spans([root_cause_span(v) for v in verdicts])
        finally:
            w.close()
    html, run_, problems = render_report(inputs, max_traces=REPORT_TRACES, source=source)
    for p in problems[:5]:
        print(f"mycroft-otel demo: report input: {p}", file=sys.stderr)
    try:
        with open(out, "w", encoding="utf-8") as f:
            f.write(html)
    except OSError as exc:
        print(f"mycroft-otel demo: cannot write the report {out}: {exc.strerror or exc}", file=sys.stderr)
        return False
    print(f"report     {os.path.abspath(out)} ({len(run_.verdicts)} verdict(s), {run_.spans} spans)")
    return True


def _print_verdicts(verdicts: list, truth: dict | None, wall_s: float) -> int:
    print()
    if truth:
        where = f"global rank{'s' if len(truth['culprit_global_ranks']) > 1 else ''} " + \
            ", ".join(map(str, truth["culprit_global_ranks"]))
        extra = f", channel {truth['channel']}" if truth.get("channel") is not None else ""
        print(f"injected   {truth['fault']} ({truth['category']}) at {where} on {', '.join(truth['culprit_hosts'])}"
              f"{extra}, {truth['comm_kind']} communicator {truth['comm_hash']}, collective {truth['coll_seq']}, "
              f"onset {_fmt_ns(truth['onset_ns'])}")
    if not verdicts:
        print("verdict    none" + (" (as expected: a healthy run)" if not truth else " -- the fault was not found"))
        return 0 if not truth else 1
    onset = truth["onset_ns"] if truth else 0
    first = verdicts[0]
    for i, v in enumerate(verdicts[:3]):
        f = v.finding
        a = v.attributes()
        print(f"{'verdict' if i == 0 else 'also':10s} {f.kind}: {f.category}")
        where = f"rank{'s' if len(f.ranks) > 1 else ''} {', '.join(map(str, f.ranks))} of communicator {v.comm}"
        if f.global_ranks:
            where += f" (global rank{'s' if len(f.global_ranks) > 1 else ''} {', '.join(map(str, f.global_ranks))})"
        if f.hosts:
            where += f" on {', '.join(f.hosts)}"
        if f.channel is not None:
            where += f", channel {f.channel} towards rank {f.peer}"
        print(f"  where    {where}")
        print(f"  evidence {f.evidence}")
        print(f"  trace    {v.trace_id.hex()} ({v.func} #{v.seq}), root-cause span {v.span_id.hex()}, "
              f"confidence {a[sc.RCA_CONFIDENCE]:.2f}")
        det = f"  detected {_fmt_ns(v.detected_ns)}"
        if onset:
            det += f", {(v.detected_ns - onset) / 1e9:.1f} s after the fault's onset"
        print(det)
    if len(verdicts) > 3:
        print(f"(+{len(verdicts) - 3} more)")
    if truth:
        hit = bool(set(first.finding.global_ranks) & set(truth["culprit_global_ranks"])) or (
            first.comm == truth["comm_hash"] and set(first.finding.ranks) & set(truth["culprit_ranks"]))
        print(f"\n{'right' if hit and first.category == truth['category'] else 'MISSED'}: "
              f"culprit {'found' if hit else 'not found'}, category {first.category} vs {truth['category']} "
              f"({wall_s:.0f} s in all)")
    return 0
