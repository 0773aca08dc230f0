"""Running one scenario on virtual time, in one process: ``mycroft-otel eval --virtual``.

    sim (VirtualJob: the real plugin on the ABI driver's clock) -> rings -> Agent (its clock is the
    job's virtual CLOCK_MONOTONIC; polled every MYCROFT_POLL_MS of simulated time; its OTLP requests,
    encoded as for the network, kept in memory) -> Processor.ingest_payload (its clocks are the job's
    virtual realtime and monotonic time; ticked every tick_s of simulated time) -> verdicts

Every component is the one a user runs, only the clock and the wire are replaced: nothing waits on
the machine, so a scenario gives the same verdicts at the same simulated times on any machine, under
any load, as fast as the CPU computes it. Scored like the real-time eval (harness.score), plus the
time from onset to verdict in simulated seconds and in collectives of the faulty communicator.
Process faults (``process_exited``, ``sigstop``) need real processes to kill and stop: they stay in
the real-time eval.
"""

from __future__ import annotations

import math
import shutil
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from mycroft_otel.agent.agent import Agent
from mycroft_otel.agent.exporter import Transport
from mycroft_otel.agent.settings import AgentSettings
from mycroft_otel.evaluate import harness
from mycroft_otel.evaluate.harness import Outcome
from mycroft_otel.evaluate.routing import BY_JOB, HashRing, Routing, split
from mycroft_otel.evaluate.scenarios import Scenario
from mycroft_otel.evaluate.sink import Verdict
from mycroft_otel.processor.pipeline import Processor
from mycroft_otel.processor.receiver import write_record
from mycroft_otel.sim.faults import parse_fault
from mycroft_otel.sim.model import TimingModel, eval_model
from mycroft_otel.sim.runner import RunConfig
from mycroft_otel.sim.simulation import Simulation
from mycroft_otel.sim.topology import parse_topology
from mycroft_otel.sim.virtual import VirtualJob

#: CLOCK_REALTIME at simulated time 0 of every virtual scenario (2026-01-01T00:00:00Z): fixed, so a
#: scenario's spans, verdicts and their timestamps are the same on every run.
REALTIME_EPOCH_NS = 1_767_225_600_000_000_000
GRACE_S = 1.5  # as the real-time eval: the pipeline keeps running this long after the job's end
TICK_S = 0.2   # the processor's detection timer (its default tick)


class MemoryTransport(Transport):
    """The agent's export seam: each OTLP ExportTraceServiceRequest (protobuf bytes) kept for the caller."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._payloads: list[bytes] = []
        self.requests = 0
        self.bytes = 0

    def send(self, payload: bytes, n_spans: int) -> bool:
        with self._lock:
            self._payloads.append(bytes(payload))
            self.requests += 1
            self.bytes += len(payload)
        return True

    def take(self) -> list[bytes]:
        with self._lock:
            out, self._payloads = self._payloads, []
        return out


def needs_real_processes(sc: Scenario) -> bool:
    return sc.fault_name != "healthy" and parse_fault(sc.fault).needs_process


@dataclass
class VirtualOutcome(Outcome):
    sim_s: float = 0.0            # simulated seconds the pipeline ran (job + grace)
    events: int = 0               # profiler callbacks delivered
    world: int = 0
    collectives: dict = field(default_factory=dict)  # verdict trace id -> collectives of the faulty comm since onset
    agent_requests: int = 0
    agent_bytes: int = 0
    n_collectives: int = 0        # NCCL operations (collectives and p2p groups) the job issued, per communicator
    collectives_before_onset: int = 0  # of them, issued before the fault's onset (all of them on a healthy run)
    slowdown: float | None = None  # how much slower the faulty communicator's collectives ran after the onset
    noise_events: list = field(default_factory=list)  # healthy stragglers (Simulation.noise_events)


def scenario_env(sc: Scenario, stall_ms: int) -> dict:
    """The agent's and processor's configuration: defaults, the stall threshold, the scenario's own knobs
    (never this process's MYCROFT_*/OTEL_*: a run must not depend on the shell it was started from)."""
    env = {"MYCROFT_STALL_MS": str(stall_ms), "OTEL_SERVICE_NAME": "mycroft-eval-agent"}
    env.update({k: str(v) for k, v in sc.env.items()})
    return env


def collectives_since(sim: Simulation, truth: dict, t0_ns: float, t1_ns: float) -> int | None:
    """Collectives of the truth's communicator issued in [t0, t1] of simulated time (None: unknown)."""
    kind, name = truth.get("comm_kind"), truth.get("comm_name")
    if not sim.predict or not kind or kind not in sim.comms:
        return None
    idx = next((c.index for c in sim.comms[kind] if c.name == name), None)
    if idx is None:
        return None
    n = 0
    for e in sim.log:
        if e["kind"] == kind and e["comm"] == idx:
            first = min(e["issue"])
            if t0_ns <= first <= t1_ns:
                n += 1
    return n


def measured_slowdown(sim: Simulation, truth: dict) -> float | None:
    """The faulty communicator's mean collective time (first kernel start to last end) after the fault's
    onset over the mean before it, as this run's noise made them: what the fault really did to the job
    (the corpus sets a fault's parameter for its magnitude without noise, where NCCL's noise elsewhere may
    already be the collective's bottleneck, and the CPU's run-ahead may absorb a late call). The mean, not
    the median: a fault that acts on one op of each training step (a rank late into one of its TP group's
    four all-reduces) costs the job its share of the collectives and leaves the median where it was. None
    when unknown or either side is empty."""
    kind, name, onset = truth.get("comm_kind"), truth.get("comm_name"), truth.get("onset_sim_ns")
    idx = next((c.index for c in sim.comms.get(kind, ()) if c.name == name), None)
    if idx is None or onset is None:
        return None
    before, after = [], []
    for e in sim.log:
        if e["kind"] == kind and e["comm"] == idx and all(math.isfinite(t) for t in e["end"]):
            (after if min(e["issue"]) >= onset else before).append(max(e["end"]) - min(e["kstart"]))
    if not before or not after:
        return None
    return round(statistics.fmean(after) / max(statistics.fmean(before), 1.0), 3)


def run_scenario(sc: Scenario, stall_ms: int, plugin: str | None = None, log=lambda msg: None,
                 model: TimingModel | None = None, ring_records: int | None = None,
                 record: list | None = None, processors: int = 1, routing: Routing = BY_JOB,
                 recording: str | None = None) -> VirtualOutcome:
    """``record``: a list that receives the run's OTLP traffic as ExportTraceServiceRequest bytes, what the
    processor received and then its root-cause spans (the input of ``mycroft-otel report``). ``recording``: a
    file that receives what the processor received, in the format of ``mycroft-otel processor --record`` on
    the job's clock: ``mycroft-otel report --replay`` on it shows why the processor decided what it did about
    each collective (processor/replay.py gives the same verdicts). ``model``: the job's timing model (default the eval model under NCCL's noise; the corpus varies the
    noise and the DP algorithm). ``ring_records``: completions per ring (default the plugin's; a job of
    thousands of contexts needs fewer to fit /dev/shm). ``processors``: how many processors analyse the
    job, each agent request split among them as the gateway's load_balancing exporter does on ``routing``
    (routing.py)."""
    if needs_real_processes(sc):
        raise ValueError(f"scenario {sc.name}: {sc.fault_name} needs real processes (run it without --virtual)")
    out = VirtualOutcome(sc)
    t_wall = time.monotonic()
    work = tempfile.mkdtemp(prefix=f"mycroft-veval-{sc.name}-")
    env = scenario_env(sc, stall_ms)
    if routing.shard_ranks:  # the agents shard the job as this routing expects (routing.by_shard)
        env = dict(env, MYCROFT_SHARD_RANKS=str(routing.shard_ranks))
    faults = [] if sc.fault_name == "healthy" else [parse_fault(sc.fault)]
    topo = parse_topology(sc.topology)
    sim = Simulation(topo, model or eval_model(), faults, seed=sc.seed, duration_s=sc.duration_s,
                     predict=topo.world <= 256)
    cfg = RunConfig(ring_dir=f"{work}/rings", job_id=f"eval-{sc.name}", plugin=plugin,
                    realtime_epoch_ns=REALTIME_EPOCH_NS,
                    **({} if ring_records is None else {"ring_records": ring_records}))
    job = VirtualJob(sim, cfg)
    transport = MemoryTransport()
    agent = None
    rec = open(recording, "wb") if recording else None
    try:
        settings = AgentSettings.from_env(env, ring_dir=cfg.ring_dir, state_dir=f"{work}/state")
        agent = Agent(settings, transport=transport, resource_extra=[], clock=job.mono_ns)
        procs = [Processor(env=env, clock_ns=job.realtime_ns, mono_clock=lambda: job.mono_ns() / 1e9,
                           tick_s=TICK_S, stall_ms=stall_ms) for _ in range(processors)]
        deliver = _gateway(procs, routing)
        poll_ns = max(1, int(round(settings.poll_s * 1e9)))
        tick_ns = int(TICK_S * 1e9)
        end_ns = int((sc.duration_s + GRACE_S) * 1e9)
        next_poll, next_tick = poll_ns, tick_ns
        verdicts = []
        while True:
            t = min(next_poll, next_tick)
            if t > end_ns:
                break
            job.advance_to(t)
            if t == next_poll:
                with agent.queue.held():  # one poll's spans leave together: batching independent of thread timing
                    agent.poll_once()
                agent.queue.flush()  # the export thread hands its requests over before the processor looks
                for payload in transport.take():
                    deliver(payload)
                    if record is not None:
                        record.append(payload)
                    if rec is not None:
                        write_record(rec, payload, "application/x-protobuf", job.realtime_ns())
                next_poll += poll_ns
            if t == next_tick:
                for proc in procs:
                    verdicts += proc.tick()
                next_tick += tick_ns
        if record is not None and verdicts:
            record.append(_root_cause_request(verdicts))
        out.truth = (job.truths() or [{"fault": "healthy"}])[0]
        out.verdicts = [Verdict(v.detected_ns, v.trace_id.hex(), v.span_id.hex(), v.attributes()) for v in verdicts]
        if faults and out.truth.get("onset_sim_ns") is not None:
            for v in out.verdicts:
                t1 = v.received_ns - job.epoch_realtime_ns
                out.collectives[v.trace_id] = collectives_since(sim, out.truth, out.truth["onset_sim_ns"], t1)
        out.sim_stats = dict(job.stats)
        onset_sim = out.truth.get("onset_sim_ns") if faults else None
        out.n_collectives = len(sim.log)
        out.collectives_before_onset = (len(sim.log) if onset_sim is None else
                                        sum(1 for e in sim.log if min(e["issue"]) < onset_sim))
        out.noise_events = list(sim.noise_events)
        out.slowdown = measured_slowdown(sim, out.truth) if faults else None
        out.events = int(sim.n_rows)
        out.world = topo.world
        out.sim_s = end_ns / 1e9
        out.components = {"processor": "ok", "agent": "ok"}
        out.agent_requests, out.agent_bytes = transport.requests, transport.bytes
    finally:
        if rec is not None:
            rec.close()
        if agent is not None:
            agent.close(flush_timeout_s=1.0)
        job.close()
        shutil.rmtree(work, ignore_errors=True)
    out.wall_s = time.monotonic() - t_wall
    log(f"  {sc.name}: {len(out.verdicts)} verdict(s), {out.sim_s:.1f} s simulated in {out.wall_s:.1f} s")
    return out


def _gateway(procs: list[Processor], routing: Routing):
    """The agents' requests into ``procs``: all to the one, or split as the gateway's exporter splits them."""
    if len(procs) == 1:
        return procs[0].ingest_payload
    ring = HashRing([f"processor-{i}:4317" for i in range(len(procs))])
    by_endpoint = {f"processor-{i}:4317": p for i, p in enumerate(procs)}

    def deliver(payload: bytes) -> None:
        for endpoint, part in split(ExportTraceServiceRequest.FromString(payload), routing, ring).items():
            by_endpoint[endpoint].ingest_payload(part.SerializeToString())
    return deliver


def _root_cause_request(verdicts: list) -> bytes:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    from mycroft_otel.processor.exporter import root_cause_span
    return encode_spans([root_cause_span(v) for v in verdicts]).SerializeToString()


def score(o: VirtualOutcome) -> dict:
    """harness.score's row plus virtual time: latency in simulated seconds and in collectives, speed-up."""
    row = harness.score(o)
    row["sim_s"] = round(o.sim_s, 2)
    row["speedup"] = round(o.sim_s / o.wall_s, 2) if o.wall_s > 0 else None
    row["events"] = o.events
    row["world"] = o.world
    row["agent_requests"], row["agent_bytes"] = o.agent_requests, o.agent_bytes
    first = None
    if row.get("detected"):
        onset = (o.truth or {}).get("onset_ns") or 0
        first = next((v for v in o.verdicts if v.received_ns >= onset), None)
    row["latency_collectives"] = o.collectives.get(first.trace_id) if first is not None else None
    row["verdict_times_ns"] = [v.received_ns for v in o.verdicts]
    return row
