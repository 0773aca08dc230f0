"""Agent export benchmark (issue 4 §5): spans/s per core from rings to a real OTLP receiver.

Three measurements in one run, against the same rings, the receiver in its own process:

1. **agent**: the agent's poll loop (ring read, classification, vectorised OTLP encoding, export
   thread over gRPC) with MYCROFT_SAMPLE_RATIO=1 so every completion becomes a span; CPU seconds
   of this process until the receiver has acknowledged every span.
2. **sdk**: the plain OpenTelemetry SDK path producing the same spans (same ids, names, times,
   attributes, links): ``tracer.start_span``/``end`` + BatchSpanProcessor + the OTLP gRPC
   exporter. Reported twice: including the attribute building from the records, and with the
   attributes handed to it ready-made (its most favourable reading; the ratio we quote).
3. **node load**: a writer process drives the real plugin (``_native.Driver``, paced replay) for
   8 ranks × 100 collectives/s; the agent runs with default settings; its CPU share of one core.
4. **collective metrics**: the same agent with its OpenTelemetry collective metrics on
   (mycroft_otel/agent/metrics.py, exported over OTLP to the same receiver process), against metrics
   off in this run: the throughput run twice each way, alternating, and the node load with the
   metrics exported every 1 s and every 60 s (the SDK's default); CPU ratios on/off printed.

usage: python benchmarks/agent_export/bench.py [--ranks 8] [--colls 400] [--seconds 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "agent"))

from agent_events import Rows, ring_allreduce  # noqa: E402  (tests/agent/events.py: ring all-reduce rows)

from mycroft_otel.native import NO_SLOT, Driver, EventType, Op, plugin_path  # noqa: E402

JOB = "bench-job"
# Bytes per op span before issue #29 (docs/span-schema.md "Volume, measured", eval traffic): the figure it halves.
LAST_WEEK_OP_SPAN_BYTES = 2400
COMM = 0x00C0FFEE12345678


# --- rings ----------------------------------------------------------------------------------------
def build_rows(ctxs: list[int], nranks: int, colls: int, rate_hz: float = 0.0, n_channels: int = 2) -> np.ndarray:
    """Ring all-reduces on every rank, tiled from one template per rank (fast for many collectives)."""
    templates = []
    for r, ctx in enumerate(ctxs):
        q = Rows()
        ring_allreduce(q, ctx, r, nranks, 0, n_channels=n_channels, steps=2 * (nranks - 1))
        templates.append((q.array(), q.next_slot))
    out, base = [], 0
    is_coll = None
    for s in range(colls):
        for r in range(nranks):
            t, nslots = templates[r]
            a = t.copy()
            a["slot"] += base
            has_parent = a["parent_slot"] != NO_SLOT
            a["parent_slot"][has_parent] += base
            is_coll = (a["op"] == int(Op.START)) & (a["type"] == int(EventType.Coll))
            a["seq"][is_coll] = s
            a["size"][is_coll & (a["size"] > 0)] += base
            if rate_hz:
                a["t_ns"] = int(s * 1e9 / rate_hz) + 1
            out.append(a)
            base += nslots
    return np.concatenate(out)


def make_rings(ring_dir: Path, nranks: int, colls: int, rate_hz: float = 0.0) -> tuple:
    d = Driver(plugin_path(), slots=1 << 22)
    ctxs = [d.init("dp", COMM, 1, nranks, r, env={"RANK": str(r), "LOCAL_RANK": str(r), "MYCROFT_RING_DIR":
                                                   str(ring_dir), "MYCROFT_JOB_ID": JOB,
                                                   "MYCROFT_RING_RECORDS": "65536"})
            for r in range(nranks)]
    return d, ctxs, build_rows(ctxs, nranks, colls, rate_hz)


def writer_main(ring_dir: str, nranks: int, seconds: float, rate: float) -> None:
    d, ctxs, rows = make_rings(Path(ring_dir), nranks, int(seconds * rate), rate_hz=rate)
    print("ready", flush=True)
    d.replay(rows, epoch_ns=time.monotonic_ns())
    print("done", flush=True)
    time.sleep(1.0)


# --- receiver ----------------------------------------------------------------------------------------
class Receiver:
    def __init__(self, tmp: Path):
        self.port_file = tmp / "sink.port"
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).parent / "sink.py"), str(self.port_file)])
        while not self.port_file.exists():
            time.sleep(0.05)
        self.endpoint = f"http://127.0.0.1:{self.port_file.read_text()}"

    def count(self) -> int:
        try:
            return int((Path(str(self.port_file) + ".count")).read_text())
        except (FileNotFoundError, ValueError):
            return 0

    def wait(self, n: int, timeout: float = 120) -> bool:
        deadline = time.monotonic() + timeout
        while self.count() < n and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.count() >= n

    def bytes(self) -> int:
        """Bytes of the trace requests received so far (OTLP protobuf before gzip)."""
        try:
            return int((Path(str(self.port_file) + ".bytes")).read_text())
        except (FileNotFoundError, ValueError):
            return 0

    def metric_points(self) -> int:
        try:
            return int((Path(str(self.port_file) + ".metrics")).read_text())
        except (FileNotFoundError, ValueError):
            return 0

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


# --- the two paths ---------------------------------------------------------------------------------------
class Metrics:
    """The agent's collective metrics as `mycroft-otel agent` runs them (OTEL_METRICS_EXPORTER=otlp)."""

    def __init__(self, service_name: str, interval_ms: int = 1000):
        from mycroft_otel.agent.meter import meter_provider, metrics_config
        from mycroft_otel.agent.metrics import CollectiveMetrics

        self.collective = CollectiveMetrics()
        cfg = metrics_config({"OTEL_METRICS_EXPORTER": "otlp", "OTEL_METRIC_EXPORT_INTERVAL": str(interval_ms)})
        self.provider = meter_provider(cfg, self.collective, [("service.name", service_name)])

    def register_health(self, health) -> None:
        from mycroft_otel.agent.health import register_otel_metrics

        register_otel_metrics(health, self.provider)

    def shutdown(self) -> None:
        self.provider.shutdown()


def run_agent(ring_dir: Path, state_dir: Path, recv: Receiver, total: int, metrics: bool = False) -> float:
    """CPU seconds of the agent until every span is acknowledged (with metrics: and their last export)."""
    from mycroft_otel.agent.agent import Agent
    from mycroft_otel.agent.settings import AgentSettings

    env = dict(os.environ, MYCROFT_RING_DIR=str(ring_dir), MYCROFT_STATE_DIR=str(state_dir),
               MYCROFT_SAMPLE_RATIO="1", MYCROFT_EXPORT_QUEUE="1000000", MYCROFT_SUMMARY_MS="3600000",
               MYCROFT_INFLIGHT_AFTER_MS="3600000", MYCROFT_IDLE_AFTER_MS="86400000")
    c0 = time.process_time()
    m = Metrics("bench-agent") if metrics else None
    agent = Agent(AgentSettings.from_env(env), metrics=m.collective if m else None)
    if m:
        m.register_health(agent.health)
    base = recv.count()
    while agent.health.records_read < total:
        agent.poll_once()
    ok = recv.wait(base + total)
    if m:
        m.shutdown()
    cpu = time.process_time() - c0
    agent.close(5)
    assert ok, "receiver did not get every span"
    return cpu


def run_sdk(ring_dir: Path, recv: Receiver, total: int) -> tuple[float, float]:
    """(cpu incl. attribute building, cpu of the SDK part alone)."""
    from opentelemetry.context import Context
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.id_generator import IdGenerator
    from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags

    from mycroft_otel import ids
    from mycroft_otel import semconv as sc
    from mycroft_otel._native import RingReader
    from mycroft_otel.agent.source import RingSource
    from mycroft_otel.agent.spans import SpanBuilder, func_name

    class Ids(IdGenerator):
        def __init__(self):
            self.trace = self.span = 0

        def generate_trace_id(self) -> int:
            return self.trace

        def generate_span_id(self) -> int:
            return self.span

    def prepare(cpu_phase: bool):
        """Per source: (provider, tracer, ids, [(trace, span, name, start, end, attrs, links)])."""
        out = []
        for p in sorted(ring_dir.glob("*.mycroft")):
            src = RingSource(str(p), RingReader(str(p)))
            b = SpanBuilder(src, "bench")
            recs, _ = src.read(1 << 20)
            items = []
            for rec in recs:
                op, flows = rec["op"], rec["flows"]
                kind, peer = int(op["kind"]), int(op["root_or_peer"])
                trace = b.trace_id(kind, int(op["seq"]), peer)
                attrs = dict(b.op_attributes(op, flows, sc.OP_STATE_COMPLETED, b.start_end(op)[1]))
                attrs = {k: v for k, v in attrs.items() if v is not None}
                links = []
                n = int(op["n_flows"])
                # the agent's links: one per peer and direction
                for d, pr in dict.fromkeys((int(f["dir"]) & 1, int(f["peer"])) for f in flows[:n]):
                    role = sc.LINK_SEND_TO if d == 0 else sc.LINK_RECV_FROM
                    links.append(Link(SpanContext(trace, ids.span_id(trace, pr, sc.ROLE_OP), True,
                                                  TraceFlags(TraceFlags.SAMPLED)),
                                      {sc.LINK_ROLE: role, sc.LINK_PEER: pr}))
                start = src.to_real(int(op["api_ns"]) or int(op["start_ns"]))
                items.append((trace, ids.span_id(trace, src.rank, sc.ROLE_OP),
                              sc.op_span_name(func_name(int(op["func"]))), start, src.to_real(int(op["end_ns"])),
                              attrs, links))
            out.append((dict(b.resource_attrs), items))
            src.close()
        return out

    def emit(prepared) -> None:
        providers = []
        for res, items in prepared:
            gen = Ids()
            tp = TracerProvider(resource=Resource(res), id_generator=gen)
            tp.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(), max_queue_size=1 << 20,
                                                     max_export_batch_size=2048, schedule_delay_millis=100))
            tracer = tp.get_tracer("mycroft_otel.agent")
            for trace, sid, name, start, end, attrs, links in items:
                gen.trace, gen.span = trace, sid
                span = tracer.start_span(name, context=Context(), kind=SpanKind.INTERNAL, attributes=attrs,
                                         links=links, start_time=start)
                span.end(end_time=end)
            providers.append(tp)
        for tp in providers:
            tp.force_flush(60_000)
        for tp in providers:
            tp.shutdown()

    base = recv.count()
    c0 = time.process_time()
    prepared = prepare(True)
    c1 = time.process_time()
    emit(prepared)
    ok = recv.wait(base + total)
    c2 = time.process_time()
    assert ok, "receiver did not get every SDK span"
    return c2 - c0, c2 - c1


def node_load(tmp: Path, recv: Receiver, nranks: int, seconds: float, rate: float, metrics: int = 0) -> dict:
    """The agent's CPU share under a paced job; ``metrics``: export interval in ms (0: metrics off)."""
    from mycroft_otel.agent.agent import Agent
    from mycroft_otel.agent.settings import AgentSettings

    ring_dir = tmp / (f"load-metrics-{metrics}" if metrics else "load")
    ring_dir.mkdir(parents=True)
    w = subprocess.Popen([sys.executable, __file__, "--writer", str(ring_dir), "--ranks", str(nranks),
                          "--seconds", str(seconds), "--rate", str(rate)], stdout=subprocess.PIPE, text=True)
    assert w.stdout.readline().strip() == "ready"
    env = dict(os.environ, MYCROFT_RING_DIR=str(ring_dir), MYCROFT_STATE_DIR=str(ring_dir / ".state"))
    c0, t0 = time.process_time(), time.monotonic()
    m = Metrics("bench-agent", metrics) if metrics else None
    agent = Agent(AgentSettings.from_env(env), metrics=m.collective if m else None)
    if m:
        m.register_health(agent.health)
    stop = threading.Event()
    prof = None
    if os.environ.get("BENCH_PROFILE"):
        import cProfile

        prof = cProfile.Profile()

    def loop() -> None:
        if prof:
            prof.enable()
        agent.run(stop)
        if prof:
            prof.disable()

    th = threading.Thread(target=loop, daemon=True)
    th.start()
    w.stdout.readline()  # "done"
    time.sleep(0.3)
    stop.set()
    th.join()
    if m:
        m.shutdown()
    cpu, wall = time.process_time() - c0, time.monotonic() - t0
    if prof:
        import pstats

        st = pstats.Stats(prof).sort_stats(os.environ.get("BENCH_PROFILE_SORT", "cumulative")); st.print_stats(30); os.environ.get("BENCH_PROFILE_CALLERS") and st.print_callers(os.environ["BENCH_PROFILE_CALLERS"])
    h = agent.health.snapshot()
    agent.close(5)
    w.wait(10)
    return {"cpu_share": cpu / wall, "wall_s": wall, "records": h["records_read"], "spans": h["spans_built"],
            "dropped_ring": h["dropped_ring"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--colls", type=int, default=400, help="collectives per rank for the throughput runs")
    ap.add_argument("--seconds", type=float, default=10.0, help="duration of the node-load run")
    ap.add_argument("--rate", type=float, default=100.0, help="collectives/s per rank in the node-load run")
    ap.add_argument("--rounds", type=int, default=3, help="node-load runs with metrics off and on, alternating")
    ap.add_argument("--writer", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.writer:
        writer_main(args.writer, args.ranks, args.seconds, args.rate)
        return
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        recv = Receiver(tmp)
        os.environ.update(OTEL_EXPORTER_OTLP_ENDPOINT=recv.endpoint, OTEL_EXPORTER_OTLP_INSECURE="true",
                          OTEL_EXPORTER_OTLP_PROTOCOL="grpc")
        try:
            ring_dir = tmp / "rings"
            ring_dir.mkdir()
            d, ctxs, rows = make_rings(ring_dir, args.ranks, args.colls)
            d.replay(rows)
            total = args.ranks * args.colls
            b0 = recv.bytes()
            agent_cpu = run_agent(ring_dir, tmp / "state", recv, total)
            op_span_bytes = (recv.bytes() - b0) / total
            sdk_cpu_all, sdk_cpu = run_sdk(ring_dir, recv, total)
            a, s_all, s = total / agent_cpu, total / sdk_cpu_all, total / sdk_cpu
            print(f"spans: {total} ({args.ranks} ranks x {args.colls} ring all-reduces, "
                  f"{2 * 2} flows/span, 2 links/span), receiver in its own process")
            print(f"agent          {a:10.0f} spans/s/core  ({agent_cpu:.3f} s CPU)")
            print(f"sdk (+attrs)   {s_all:10.0f} spans/s/core  ({sdk_cpu_all:.3f} s CPU)  ratio {a / s_all:.1f}x")
            print(f"sdk (attrs     {s:10.0f} spans/s/core  ({sdk_cpu:.3f} s CPU)  ratio {a / s:.1f}x"
                  f"  <- quoted (target >= 2x)")
            print("     given)")
            print(f"bytes per op span on the wire (OTLP protobuf before gzip, request overhead included): "
                  f"{op_span_bytes:.0f} B, {op_span_bytes / LAST_WEEK_OP_SPAN_BYTES:.2f}x last week's "
                  f"{LAST_WEEK_OP_SPAN_BYTES} B (target <= 0.5x)")
            # metrics on vs off, alternating after the first (warm-up) run above, each on fresh cursors
            on, off = [], []
            for i in range(2):
                on.append(run_agent(ring_dir, tmp / f"state-on{i}", recv, total, metrics=True))
                off.append(run_agent(ring_dir, tmp / f"state-off{i}", recv, total))
            print(f"agent + metrics{total / (sum(on) / 2):10.0f} spans/s/core  ({sum(on) / 2:.3f} s CPU, off "
                  f"{sum(off) / 2:.3f} s)  metrics on/off CPU ratio {sum(on) / sum(off):.2f}  "
                  f"({recv.metric_points()} metric points received)")
            # node load: metrics off and on (60 s export, the SDK's default) alternating, --rounds pairs; the
            # quoted figures are the medians (a 10 s run on a shared 2-core host moves by a point either way)
            off_loads, on_loads, load_bytes = [], [], 0
            for i in range(args.rounds):
                b0 = recv.bytes()
                off_loads.append(node_load(tmp / f"off{i}", recv, args.ranks, args.seconds, args.rate))
                load_bytes += recv.bytes() - b0
                on_loads.append(node_load(tmp / f"on{i}", recv, args.ranks, args.seconds, args.rate, metrics=60000))
            load = off_loads[0]
            off_share = statistics.median(x["cpu_share"] for x in off_loads)
            on_share = statistics.median(x["cpu_share"] for x in on_loads)

            def shares(xs: list) -> str:
                return " ".join(f"{100 * x['cpu_share']:.1f}" for x in xs)

            print(f"node load: {args.ranks} ranks x {args.rate:.0f} collectives/s for {load['wall_s']:.1f} s: "
                  f"agent CPU {100 * off_share:.1f}% of one core (median of {args.rounds}: {shares(off_loads)}; "
                  f"target <= 10%), {load['records']} records read, {load['spans']} spans, "
                  f"{load['dropped_ring']} lost in rings")
            spans = sum(x["spans"] for x in off_loads)
            wall = sum(x["wall_s"] for x in off_loads)
            print(f"node load export: {load_bytes / max(spans, 1):.0f} B per span on the wire, "
                  f"{load_bytes / wall / args.ranks:.0f} B per rank per second")
            print(f"node load + metrics (OTEL_METRIC_EXPORT_INTERVAL=60000): agent CPU {100 * on_share:.1f}% of one "
                  f"core (median of {args.rounds}: {shares(on_loads)})  <- quoted (target <= 5%: "
                  f"{'met' if on_share <= 0.05 else 'NOT met'}); metrics on/off CPU ratio {on_share / off_share:.2f}")
            points = recv.metric_points()
            mload = node_load(tmp / "on-1s", recv, args.ranks, args.seconds, args.rate, metrics=1000)
            print(f"node load + metrics (OTEL_METRIC_EXPORT_INTERVAL=1000): agent CPU "
                  f"{100 * mload['cpu_share']:.1f}% of one core (one run), {mload['records']} records read, "
                  f"{recv.metric_points() - points} metric points received")
            for c in ctxs:
                d.finalize(c)
        finally:
            recv.stop()


if __name__ == "__main__":
    main()
