"""Load and sizing of the real stack: 1,024 simulated ranks through agent → gateway → processors → trace store.

    python benchmarks/stack_load/run.py job [--duration 120] [--processors 2] [--sample-ratio 0.1] [--json FILE]
    python benchmarks/stack_load/run.py throughput [--seconds 20] [--recording FILE]
    python benchmarks/stack_load/run.py hang [--ranks 131072] [--shard-ranks 8192] [--processors 4]

``job``: a healthy real-time simulated job of 1,024 ranks (``nodes=128,gpus=8,tp=8,pp=16,dp=8``, 3,072 plugin
contexts = shared-memory files) with a large-model step (8 layers: 16 TP all-reduces, 1 DP all-reduce of 4 MiB,
PP send/recv of 512 KiB, ~3.4 s per step), read by one ``mycroft-otel agent`` that exports to the gateway of a
``LocalStack`` (gateway collector, 2 processors, Jaeger, Prometheus). Every 2 s it samples RSS and CPU time of
every process; at the end it compares the agent's own counters with the gateway's, the processors' and the trace
store's, and counts verdicts (a healthy job must have none). Prints one JSON document.

``throughput``: the capacity of one processor and of the gateway, measured by replaying real agent traffic (the
processor recording made by ``job``, trace and job ids renamed per round so nothing is a duplicate) as fast as one
sender can: spans/s accepted and CPU seconds per 1,000 spans of each process (the CPU figure is what transfers to
a dedicated machine; the wall-clock rate on this shared 2-core box is a lower bound).

``hang``: a world-size hang of issue #29's 131,072-rank job through the real gateway into N processors: the
in-flight snapshots of one ring all-reduce whose rank n/3 has a stalled GPU (synthesized: tests/processor/synth.py,
the simulator does not run a collective of that size here), each rank's carrying its block of global ranks as
agents with ``MYCROFT_SHARD_RANKS`` set it (the job id chosen so that the gateway spreads its blocks over every
processor), sent once through the gateway as fast as two senders go (agents send them within one snapshot period). Measured: seconds from the first span sent to the first verdict, verdicts in
all (one, the culprit's block's), spans received, each process's CPU seconds and the processors' peak RSS; and
what carries over: CPU per 1,000 spans of each component, from which the cores needed to name it in 5 s follow.

tests/e2e/test_load.py runs ``job`` (the same function) and checks the accounting.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from mycroft_otel.stack import LocalStack  # noqa: E402
from mycroft_otel.stack.runner import free_ports, http_ok  # noqa: E402

TOPOLOGY = "nodes=128,gpus=8,tp=8,pp=16,dp=8"
# Above the seconds by which the real-time replay's threads lag each other on a small machine (a late proxy
# thread's rows look like a stall); the detector's own hang threshold on this job is checked at the default
# MYCROFT_STALL_MS on virtual time (tests/evaluate/test_healthy_at_scale.py).
STALL_MS = 10_000
# One agent reads all 128 simulated nodes' rings here, where a real job runs one agent per node, each with its
# own export queue (MYCROFT_EXPORT_QUEUE, 20,000 spans by default). A step boundary hands it ~128 nodes' worth of
# spans at once while the processors and the simulator share the same 2 cores, and a default-sized queue then
# overflows: that measures the stand-in, not the pipeline. It gets the 128 queues' room (bounded by 64 MiB).
AGENT_EXPORT_QUEUE = 128 * 20_000
_AGENT_DROPS = ("dropped_ring", "dropped_export_queue", "dropped_export_failed")  # the agent's loss counters
CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- the simulated job (run in its own process: `run.py sim DURATION RING_DIR SEED HOST_S`) ---------------

HOST_S = 2.5  # the step's optimizer/host time: ~3.4 s steps, ~3,000 rank-collectives/s


def load_model(host_s: float = HOST_S):
    """The job's step model; ``host_s``: its optimizer/host time per step."""
    from mycroft_otel.sim.model import TimingModel

    return TimingModel().with_step(
        forward_ns=150_000_000, backward_ns=300_000_000, optimizer_ns=int(host_s * 1e9), layers=2,
        tp_bytes=8 << 20, pp_bytes=512 << 10, dp_buckets=1, dp_bucket_bytes=4 << 20, jitter=0.005,
        initial_broadcast=False,
        # no CPU run-ahead: with the simulator's default (2 calls outstanding, since 24c72db) this healthy job
        # gets thousands of hang verdicts (collectives queued behind another communicator's look stalled)
        max_outstanding=1,
    ).with_nccl(dp_channels=1, pp_channels=1)  # fmt: skip


def run_sim(duration_s: float, ring_dir: str, seed: int, job_id: str, ring_records: int = 64,
            host_s: float = HOST_S) -> dict:
    from mycroft_otel.sim import runner
    from mycroft_otel.sim.runner import Progress, RunConfig
    from mycroft_otel.sim.simulation import Simulation
    from mycroft_otel.sim.topology import parse_topology

    topo = parse_topology(TOPOLOGY)
    sim = Simulation(topo, load_model(host_s), [], seed=seed, steps=None, duration_s=duration_s, predict=False)
    cfg = RunConfig(ring_dir=ring_dir, job_id=job_id, realtime=True, multiprocess=False, duration_s=duration_s,
                    plugin=None, abi_version=None, ring_records=ring_records, quantum_ns=20_000_000)  # fmt: skip
    t0 = time.monotonic()
    res = runner.run(sim, cfg, Progress("sim", enabled=False))
    return {"world": topo.world, "steps": res["steps"], "events": int(res["events"]), "contexts": res["contexts"],
            "wall_s": round(time.monotonic() - t0, 1), "sim_s": duration_s, "max_late_ms": round(res["stats"].get("max_late_ns", 0) / 1e6, 1),
            "epoch_realtime_ns": res.get("epoch_realtime_ns")}  # fmt: skip


# -- measuring -------------------------------------------------------------------------------------

def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 (loopback)
        return resp.read().decode()


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? ([0-9.eE+-]+|NaN|\+Inf)$")


def metric_sum(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` (with or without the ``_total`` suffix: collector v0.161's own metrics
    have none, older ones and Jaeger's have it) whose labels include ``labels``."""
    total = 0.0
    names = {name, name.removesuffix("_total"), name.removesuffix("_total") + "_total"}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m or m.group(1) not in names:
            continue
        lbl = m.group(2) or ""
        if all(f'{k}="{v}"' in lbl for k, v in labels.items()):
            total += float(m.group(3))
    return total


def proc_usage(pid: int) -> tuple[float, float] | None:
    """(private RSS MiB, CPU seconds user+system) of a process, None when it is gone.

    Private = RssAnon: the agent and the simulator map thousands of shared-memory rings, whose pages count in
    the plain RSS of every process that touched them but are the rings' memory, not the process's."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/status") as f:
            anon_kb = next(int(line.split()[1]) for line in f if line.startswith("RssAnon:"))
    except (OSError, IndexError, ValueError, StopIteration):
        return None
    return anon_kb / 1024, (int(parts[11]) + int(parts[12])) / CLK_TCK


@dataclass
class Sampler:
    """Samples RSS and CPU of named pids every ``period_s`` on a thread."""

    pids: dict[str, int]
    period_s: float = 2.0
    samples: dict[str, list[tuple[float, float, float]]] = field(default_factory=dict)  # name -> (t, rss, cpu)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "Sampler":
        self._thread.start()
        return self

    def _run(self) -> None:
        t0 = time.monotonic()
        while not self._stop.is_set():
            for name, pid in self.pids.items():
                u = proc_usage(pid)
                if u:
                    self.samples.setdefault(name, []).append((time.monotonic() - t0, *u))
            self._stop.wait(self.period_s)

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join(timeout=5)
        out = {}
        for name, s in self.samples.items():
            rss = [x[1] for x in s]
            half = len(rss) // 2
            out[name] = {"rss_max_mib": round(max(rss), 1), "rss_end_mib": round(rss[-1], 1),
                         "rss_max_first_half_mib": round(max(rss[: max(1, half)]), 1),
                         "rss_max_second_half_mib": round(max(rss[half:]), 1),
                         "cpu_s": round(s[-1][2] - s[0][2], 1)}  # fmt: skip
        return out


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MYCROFT_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env.update(extra)
    return env


def _stop(p: subprocess.Popen, sig=signal.SIGTERM, timeout: float = 20) -> None:
    if p.poll() is None:
        p.send_signal(sig)
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)


def run_job(run_dir: Path, duration_s: float = 120.0, processors: int = 2, sample_ratio: float = 0.01,
            seed: int = 5, bin_dir: Path | None = None, record: bool = True, log=print, host_s: float = HOST_S) -> dict:
    """The load job through a fresh LocalStack; returns the numbers (see the module docstring). ``host_s``:
    the step's host time (load_model); longer steps, fewer collectives per second at the same scale."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    ring_dir = Path("/dev/shm") / f"mycroft-stack-load-{os.getpid()}-{int(time.time())}"
    ring_dir.mkdir(mode=0o700)
    recording = run_dir / "processor-0.otlp"

    def proc_cmd(pp):
        from mycroft_otel.stack.runner import default_processor_command

        argv = default_processor_command(pp)
        return argv + (["--record", str(recording)] if record and pp.index == 0 else [])

    agent_port = free_ports(1)[0]
    stack = LocalStack(processors=processors, processor_command=proc_cmd, run_dir=run_dir / "stack",
                       bin_dir=bin_dir, trace_store="jaeger", agent_metrics_targets=[f"127.0.0.1:{agent_port}"],
                       processor_env={"MYCROFT_STALL_MS": str(STALL_MS)}, ready_timeout_s=120)  # fmt: skip
    result: dict = {"topology": TOPOLOGY, "duration_s": duration_s, "processors": processors,
                    "sample_ratio": sample_ratio}  # fmt: skip
    try:
        with stack:
            agent_url = f"http://127.0.0.1:{agent_port}/metrics"
            agent = subprocess.Popen(
                [sys.executable, "-m", "mycroft_otel", "agent", "--ring-dir", str(ring_dir), "--metrics-port",
                 str(agent_port)],
                env=_clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=stack.agent_otlp_grpc, OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
                               OTEL_SERVICE_NAME="mycroft-agent", MYCROFT_RING_DIR=str(ring_dir),
                               MYCROFT_SAMPLE_RATIO=str(sample_ratio), PYTHONUNBUFFERED="1",
                               MYCROFT_EXPORT_QUEUE=str(AGENT_EXPORT_QUEUE)),
                stdout=open(run_dir / "agent.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
            deadline = time.monotonic() + 30
            while not http_ok(agent_url) and time.monotonic() < deadline and agent.poll() is None:
                time.sleep(0.2)
            pids = {p.name: p.popen.pid for p in stack._procs}
            pids["agent"] = agent.pid
            sim = subprocess.Popen(
                [sys.executable, __file__, "sim", str(duration_s), str(ring_dir), str(seed), str(host_s)],
                env=_clean_env(), stdout=subprocess.PIPE, stderr=open(run_dir / "sim.log", "wb"),
                start_new_session=True,
            )  # fmt: skip
            pids["sim"] = sim.pid
            sampler = Sampler(pids).start()
            log(f"stack_load: {TOPOLOGY}, {duration_s:.0f} s real time, sample ratio {sample_ratio}; run dir {run_dir}")
            out, _ = sim.communicate(timeout=duration_s + 600)
            if sim.returncode != 0:
                raise RuntimeError(f"sim exited {sim.returncode}: {(run_dir / 'sim.log').read_text()[-2000:]}")
            result["sim"] = json.loads(out)

            # drain: the agent's queue empties, the gateway has sent everything it accepted
            gw_url = f"http://127.0.0.1:{stack.ports['gw_telemetry']}/metrics"
            store_url = f"http://127.0.0.1:{stack.ports['store_telemetry']}/metrics"

            def counts() -> dict:
                a, g, s = scrape(agent_url), scrape(gw_url), scrape(store_url)
                procs = [scrape(f"http://127.0.0.1:{pp.metrics}/metrics") for pp in stack.processor_ports]
                drops = {f"agent_{n}": metric_sum(a, f"mycroft_agent_{n}_total") for n in _AGENT_DROPS}
                return {
                    "agent_records_read": metric_sum(a, "mycroft_agent_records_read_total"),
                    "agent_spans_built": metric_sum(a, "mycroft_agent_spans_built_total"),
                    "agent_spans_exported": metric_sum(a, "mycroft_agent_spans_exported_total"),
                    "agent_queue_spans": metric_sum(a, "mycroft_agent_queue_spans"),
                    # each way the agent loses a span apart (a full ring, a full queue, a request that failed
                    # after its retries), then their sum
                    **drops,
                    "agent_dropped": sum(drops.values()),
                    "agent_export_errors": metric_sum(a, "mycroft_agent_export_errors_total"),
                    "gateway_accepted": metric_sum(g, "otelcol_receiver_accepted_spans_total", receiver="otlp"),
                    "gateway_refused": metric_sum(g, "otelcol_receiver_refused_spans_total"),
                    "gateway_sent_processors": metric_sum(g, "otelcol_exporter_sent_spans_total",
                                                          exporter="load_balancing/processors"),
                    "gateway_sent_store": metric_sum(g, "otelcol_exporter_sent_spans_total",
                                                     exporter="otlp_grpc/traces_backend"),
                    "gateway_send_failed": metric_sum(g, "otelcol_exporter_send_failed_spans_total"),
                    "processors_received": sum(metric_sum(p, "mycroft_processor_spans_received_total") for p in procs),
                    "processors_received_each": [metric_sum(p, "mycroft_processor_spans_received_total") for p in procs],
                    "store_accepted": metric_sum(s, "otelcol_receiver_accepted_spans_total", receiver="otlp"),
                    "verdicts": sum(metric_sum(p, "mycroft_root_causes_total") for p in procs),
                    "hang_verdicts": sum(metric_sum(p, "mycroft_root_causes_total", kind="hang") for p in procs),
                }  # fmt: skip

            prev: dict = {}
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                c = counts()
                if c == prev and c["agent_queue_spans"] == 0:
                    break
                prev = c
                time.sleep(3)
            result["counts"] = counts()
            by_cat: dict[str, float] = {}
            for pp in stack.processor_ports:
                for line in scrape(f"http://127.0.0.1:{pp.metrics}/metrics").splitlines():
                    m = re.match(r'^mycroft_root_causes_total\{.*category="([^"]+)".*\} ([0-9.]+)$', line)
                    if m:
                        by_cat[m.group(1)] = by_cat.get(m.group(1), 0) + float(m.group(2))
            result["verdicts_by_category"] = by_cat
            _stop(agent)
            result["usage"] = sampler.stop()
            result["run_dir"] = str(run_dir)
            result["recording"] = str(recording) if record else None
            c = result["counts"]
            result["rates"] = {
                "rank_ops_per_s": round(c["agent_records_read"] / duration_s),
                "spans_per_s_into_gateway": round(c["gateway_accepted"] / duration_s, 1),
            }
    finally:
        subprocess.run(["rm", "-rf", str(ring_dir)], check=False)
    return result


# -- throughput: replay a recording as fast as possible -------------------------------------------------

def _requests_from_recording(path: Path, limit: int = 400) -> list:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from mycroft_otel.processor.receiver import decode_export_request, read_records

    reqs = []
    for _, ctype, data in read_records(str(path)):
        req = decode_export_request(data, ctype)
        if isinstance(req, ExportTraceServiceRequest) and sum(
                len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans):
            reqs.append(req)
        if len(reqs) >= limit:
            break
    return reqs


def _renamed(req, round_no: int) -> bytes:
    """The request with every trace id (and link trace id) xored with the round number: new traces each round;
    and its job id suffixed with it: the gateway routes by job id, so the rounds spread over the processors
    as many jobs' traffic does."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    r = ExportTraceServiceRequest()
    r.CopyFrom(req)
    salt = round_no.to_bytes(4, "big")

    def ren(tid: bytes) -> bytes:
        return tid[:12] + bytes(a ^ b for a, b in zip(tid[12:], salt)) if len(tid) == 16 else tid

    for rs in r.resource_spans:
        for kv in rs.resource.attributes:
            if kv.key == "mycroft.job.id":
                kv.value.string_value = f"{kv.value.string_value}-r{round_no}"
        for ss in rs.scope_spans:
            for sp in ss.spans:
                sp.trace_id = ren(sp.trace_id)
                for lk in sp.links:
                    lk.trace_id = ren(lk.trace_id)
    return r.SerializeToString()


def blast(target: str, payloads: list[bytes], seconds: float | None, spans_per_payload: list[int],
          senders: int = 2) -> dict:
    """Send ``payloads`` over OTLP/gRPC to ``target`` (host:port) from ``senders`` threads: round-robin for
    ``seconds``, or each once (``seconds`` None)."""
    import grpc

    sent = [0] * senders
    errors = [0] * senders
    stop = time.monotonic() + (seconds or 0.0)

    def worker(k: int) -> None:
        ch = grpc.insecure_channel(target, options=[("grpc.max_send_message_length", 64 << 20)])
        call = ch.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                              request_serializer=lambda b: b, response_deserializer=lambda b: b)  # fmt: skip
        i = k
        while i < len(payloads) if seconds is None else time.monotonic() < stop:
            try:
                call(payloads[i % len(payloads)], timeout=30)
                sent[k] += spans_per_payload[i % len(payloads)]
            except grpc.RpcError:
                errors[k] += 1
                time.sleep(0.05)
            i += senders
        ch.close()

    ths = [threading.Thread(target=worker, args=(k,)) for k in range(senders)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    return {"spans_sent": sum(sent), "errors": sum(errors)}


def run_throughput(recording: Path, run_dir: Path, seconds: float = 20.0, bin_dir: Path | None = None,
                   log=print) -> dict:
    """Processor alone, then gateway → 2 processors + store: spans/s and CPU per 1,000 spans."""
    reqs = _requests_from_recording(recording)
    if not reqs:
        raise RuntimeError(f"no spans in {recording}")
    rounds = 64
    payloads, counts = [], []
    for rnd in range(rounds):
        for q in reqs[: max(1, 4000 // rounds)]:
            payloads.append(_renamed(q, rnd + 1))
            counts.append(sum(len(ss.spans) for rs in q.resource_spans for ss in rs.scope_spans))
    spans_per_req = sum(counts) / len(counts)
    result: dict = {"payloads": len(payloads), "spans_per_request": round(spans_per_req, 1)}
    stack = LocalStack(processors=2, run_dir=Path(run_dir) / "throughput", bin_dir=bin_dir, trace_store="jaeger",
                       with_prometheus=False, ready_timeout_s=120)  # fmt: skip
    with stack:
        pids = {p.name: p.popen.pid for p in stack._procs}

        def measure(target: str, label: str) -> dict:
            before = {n: proc_usage(pid) for n, pid in pids.items()}
            t0 = time.monotonic()
            out = blast(target, payloads, seconds, counts)
            # wait until the processors have taken everything in (queues drain)
            prev = -1.0
            for _ in range(40):
                got = sum(metric_sum(scrape(f"http://127.0.0.1:{pp.metrics}/metrics"),
                                     "mycroft_processor_spans_received_total") for pp in stack.processor_ports)
                if got == prev:
                    break
                prev = got
                time.sleep(1)
            wall = time.monotonic() - t0
            after = {n: proc_usage(pid) for n, pid in pids.items()}
            cpu = {n: round(after[n][1] - before[n][1], 2) for n in pids if after[n] and before[n]}
            out.update(wall_s=round(wall, 1), spans_per_s=round(out["spans_sent"] / seconds),
                       cpu_s=cpu, rss_mib={n: round(after[n][0]) for n in pids if after[n]})  # fmt: skip
            n_k = max(1, out["spans_sent"]) / 1000
            out["cpu_ms_per_1k_spans"] = {n: round(1000 * c / n_k, 1) for n, c in cpu.items()}
            log(f"  {label}: {json.dumps(out)}")
            return out

        result["processor_direct"] = measure(stack.processor_ports[0].otlp_grpc, "processor-0 direct")
        result["via_gateway"] = measure(f"127.0.0.1:{stack.ports['gw_otlp_grpc']}", "gateway → 2 processors + store")
    p = result["processor_direct"]["cpu_ms_per_1k_spans"].get("processor-0")
    g = result["via_gateway"]["cpu_ms_per_1k_spans"].get("otelcol-gateway")
    result["spans_per_cpu_second"] = {"processor": round(1e6 / p) if p else None,
                                      "gateway": round(1e6 / g) if g else None}  # fmt: skip
    return result


def _peak_rss_mib(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration, ValueError):
        return None


def _job_over_every_processor(stack, blocks: int, prefix: str) -> str:
    """A job id whose blocks the gateway spreads over as many processors as there are (or blocks): the first of
    ``prefix-k`` (evaluate/routing.py places them as the exporter does, the ports being the run's own)."""
    from mycroft_otel.evaluate.routing import BY_JOB, HashRing
    from mycroft_otel.semconv import JOB_ID, JOB_SHARD

    ring = HashRing([pp.otlp_grpc for pp in stack.processor_ports])
    want = min(blocks, len(stack.processor_ports))
    for k in range(1000):
        job = f"{prefix}-{k}"
        key = (lambda b: {JOB_ID: job, JOB_SHARD: str(b)}) if blocks > 1 else (lambda b: {JOB_ID: job})
        if len({ring.endpoint_for(BY_JOB.key_for(key(b))) for b in range(blocks)}) == want:
            return job
    raise RuntimeError(f"no job id spreads {blocks} blocks over {want} processors")


def run_hang(run_dir: Path, ranks: int = 131_072, shard_ranks: int = 8192, processors: int = 4,
             bin_dir: Path | None = None, log=print) -> dict:
    """A world-size hang's snapshots through the gateway into ``processors`` processors (see the module doc)."""
    sys.path.insert(0, str(REPO / "tests" / "processor"))
    from synth import Ring  # noqa: PLC0415 -- the synthesized ring the processor benchmark uses too

    culprit, block, n_spans = ranks // 3, shard_ranks or ranks, ranks
    stack = LocalStack(processors=processors, run_dir=Path(run_dir) / "hang", bin_dir=bin_dir, trace_store="jaeger",
                       with_prometheus=False, ready_timeout_s=120)  # fmt: skip
    with stack:
        job = _job_over_every_processor(stack, -(-ranks // block), f"hang-{ranks}")
        t0 = time.monotonic()
        ring = Ring(ranks, nch=2, comm=0xABC, seq=1, job=job)
        ring.gpu_stall(culprit)
        per_request = [list(range(r, min(ranks, b0 + block, r + 512)))  # an agent's batch: one block's ranks
                       for b0 in range(0, ranks, block) for r in range(b0, min(ranks, b0 + block), 512)]
        payloads = [ring.request(rs, rs[0] // block if shard_ranks else None).SerializeToString()
                    for rs in per_request]
        result: dict = {"ranks": ranks, "shard_ranks": shard_ranks, "processors": processors, "spans": n_spans,
                        "payload_mib": round(sum(map(len, payloads)) / 2**20, 1),
                        "synthesized_s": round(time.monotonic() - t0, 1)}
        pids = {p.name: p.popen.pid for p in stack._procs}
        before = {n: proc_usage(pid) for n, pid in pids.items()}
        metrics = [f"http://127.0.0.1:{pp.metrics}/metrics" for pp in stack.processor_ports]

        def counts() -> tuple[float, float, float]:
            texts = [scrape(u) for u in metrics]
            return (sum(metric_sum(t, "mycroft_processor_spans_received_total") for t in texts),
                    sum(metric_sum(t, "mycroft_processor_decisions_total", outcome="hang") for t in texts),
                    sum(metric_sum(t, "mycroft_processor_decisions_total", outcome="other_shard") for t in texts))

        t_send = time.monotonic()
        sent = blast(f"127.0.0.1:{stack.ports['gw_otlp_grpc']}", payloads, None, list(map(len, per_request)))
        result["send_s"] = round(time.monotonic() - t_send, 1)
        first = None
        deadline = t_send + 180
        while time.monotonic() < deadline:
            got, hangs, other = counts()
            if hangs and first is None:
                first = time.monotonic() - t_send
            if got >= n_spans and first is not None:
                break
            time.sleep(0.1)
        time.sleep(2)  # a second verdict, if some processor were to give one, has its ticks to show
        got, hangs, other = counts()
        after = {n: proc_usage(pid) for n, pid in pids.items()}
        cpu = {n: round(after[n][1] - before[n][1], 2) for n in pids if after[n] and before[n]}
        named = [line for pp in stack._procs if pp.name.startswith("processor")
                 for line in pp.log_path.read_text(errors="replace").splitlines() if "root cause:" in line]
        result.update(errors=sent["errors"], first_verdict_s=None if first is None else round(first, 2),
                      verdicts=int(hangs), other_shard=int(other), spans_received=int(got),
                      culprit_named=any(f"(global {culprit})" in line or f"rank {culprit} " in line for line in named),
                      verdict_lines=named[:3], cpu_s=cpu,
                      peak_rss_mib={n: round(r) for n, pid in pids.items() if n.startswith("processor")
                                    and (r := _peak_rss_mib(pid)) is not None},
                      cpu_ms_per_1k_spans={n: round(1e6 * c / n_spans, 1) for n, c in cpu.items()})
        log(f"  {json.dumps(result)}")
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "sim":  # internal: the simulated job in its own process
        print(json.dumps(run_sim(float(argv[1]), argv[2], int(argv[3]), job_id=f"load-{argv[3]}",
                                 host_s=float(argv[4]))))
        return 0
    ap = argparse.ArgumentParser(prog="benchmarks/stack_load/run.py", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    j, t, h = (sub.add_parser(cmd) for cmd in ("job", "throughput", "hang"))
    for p in (j, t, h):
        p.add_argument("--run-dir", type=Path, default=Path("/tmp/mycroft-stack-load"))
        p.add_argument("--json", type=Path)
    j.add_argument("--duration", type=float, default=120.0)
    j.add_argument("--processors", type=int, default=2)
    j.add_argument("--sample-ratio", type=float, default=0.01)
    t.add_argument("--recording", type=Path, default=Path("/tmp/mycroft-stack-load/processor-0.otlp"))
    t.add_argument("--seconds", type=float, default=20.0)
    h.add_argument("--ranks", type=int, default=131_072)
    h.add_argument("--shard-ranks", type=int, default=8192)
    h.add_argument("--processors", type=int, default=4)
    args = ap.parse_args(argv)
    if args.cmd == "hang":
        res = run_hang(args.run_dir, args.ranks, args.shard_ranks, args.processors,
                       log=lambda m: print(m, file=sys.stderr))
    elif args.cmd == "job":
        res = run_job(args.run_dir, args.duration, args.processors, args.sample_ratio,
                      log=lambda m: print(m, file=sys.stderr))  # fmt: skip
    else:
        res = run_throughput(args.recording, args.run_dir, args.seconds, log=lambda m: print(m, file=sys.stderr))
    text = json.dumps(res, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
