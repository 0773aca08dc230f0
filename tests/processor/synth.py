"""Synthetic OTLP traces in the agent's span schema (docs/span-schema.md), for processor tests and benchmarks.

A ring collective over ``n`` ranks and ``nch`` channels (rank r sends to r+1 and
receives from r-1 on every channel), with the per-flow counters and wait states
each fault leaves behind. Encoded as real ``ExportTraceServiceRequest`` protobufs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.resource.v1 import resource_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from mycroft_otel import ids
from mycroft_otel import semconv as sc

JOB = "synth-job"


_MAX_ARRAY = 4096  # longer attribute arrays are cut, as the processor cuts them


def any_value(v: Any) -> Any:
    """Python value of an OTLP AnyValue read through protobuf (arrays become lists; kvlists dicts)."""
    which = v.WhichOneof("value")
    if which == "int_value":
        return v.int_value
    if which == "string_value":
        return v.string_value
    if which == "double_value":
        return v.double_value
    if which == "bool_value":
        return v.bool_value
    if which == "array_value":
        out = []
        for i, x in enumerate(v.array_value.values):
            if i >= _MAX_ARRAY:
                break
            w = x.WhichOneof("value")
            out.append(getattr(x, w) if w in ("int_value", "string_value", "double_value", "bool_value") else None)
        return out
    if which == "bytes_value":
        return v.bytes_value
    if which == "kvlist_value":
        return {kv.key: None for kv in v.kvlist_value.values}
    return None


def attributes(kvs: Any, keys: frozenset[str] | None = None) -> dict[str, Any]:
    """Attributes as a dict; only ``keys`` when given."""
    out: dict[str, Any] = {}
    for kv in kvs:
        k = kv.key
        if keys is None or k in keys:
            out[k] = any_value(kv.value)
    return out


def _av(v) -> common_pb2.AnyValue:
    if isinstance(v, bool):
        return common_pb2.AnyValue(bool_value=v)
    if isinstance(v, int):
        return common_pb2.AnyValue(int_value=v)
    if isinstance(v, float):
        return common_pb2.AnyValue(double_value=v)
    if isinstance(v, str):
        return common_pb2.AnyValue(string_value=v)
    if isinstance(v, (list, tuple)):
        return common_pb2.AnyValue(array_value=common_pb2.ArrayValue(values=[_av(x) for x in v]))
    raise TypeError(type(v))


def kvs(d: dict) -> list:
    return [common_pb2.KeyValue(key=k, value=_av(v)) for k, v in d.items()]


@dataclass
class F:
    """One flow of a rank."""
    channel: int
    send: bool
    peer: int
    steps: int = 16
    posted: int = 16
    ready: int = 16
    transmitted: int = 16
    done: int = 16
    wait: str = ""
    start: int = 0
    end: int = 0
    last: int = 0
    since: int = 0
    gpu_wait: int = 0
    net_wait: int = 0
    peer_wait: int = 0  # a send flow's time with a step waiting for credit (mycroft.flow.peer_busy_ns)


@dataclass
class R:
    """What one rank says about the collective."""
    rank: int
    kind: str = "op"          # op | inflight | not_entered | process_exited | none
    flows: list[F] = field(default_factory=list)
    start: int = 0
    end: int = 0
    last_progress: int = 0
    func: str = "AllReduce"
    count: int = 1 << 20
    datatype: str = "ncclFloat32"
    anomaly: str = ""
    baseline: int = 0
    recent: int = 0
    snapshot: int = 0
    stopped: bool = False
    host: str = ""
    global_rank: int = -1
    pid: int = 1000
    job: str = JOB
    kernel_channels: tuple[int, int] | None = None  # KernelCh (started, stopped); None: not reported
    step_index: object = None  # mycroft.coll.step_index (any value: hostile ones too); None: not sent


def default_host(rank: int) -> str:
    """One GPU per host unless a test says otherwise: every flow of a synthetic ring crosses the network, as
    NCCL's ProxySteps do (a ring inside one host runs over NVLink, with none)."""
    return f"node-{rank}"


def comm_hex(comm: int) -> str:
    return ids.comm_hash_hex(comm)


def rank_span(tid: int, nranks: int, comm: int, seq: int, r: R) -> trace_pb2.Span:
    a = {
        sc.COMM_HASH: comm_hex(comm), sc.COMM_NRANKS: nranks, sc.RANK: r.rank, sc.COLL_SEQ: seq,
        sc.COLL_FUNC: r.func, sc.OP_KIND: "coll", sc.HOST_NAME: r.host or default_host(r.rank),
    }
    if r.global_rank >= 0:
        a[sc.GLOBAL_RANK] = r.global_rank
    if r.step_index is not None:
        a[sc.COLL_STEP_INDEX] = r.step_index
    links = []
    flow_attrs: dict = {}  # the agent writes the flow arrays last
    if r.kind in ("op", "inflight"):
        a.update({sc.COLL_COUNT: r.count, sc.COLL_BYTES: r.count * 4, sc.COLL_DATATYPE: r.datatype,
                  sc.TIME_API: r.start, sc.TIME_ENQUEUE: r.start, sc.TIME_END: r.end if r.kind == "op" else 0,
                  sc.TIME_LAST_PROGRESS: r.last_progress or r.start,
                  sc.OP_STATE: "completed" if r.kind == "op" else "in_flight"})
        if r.kind == "op" and r.end > r.start:  # the synthetic collective's kernel runs for its whole span
            a[sc.KERNEL_DURATION] = r.end - r.start
        if r.kernel_channels is not None:
            a[sc.KERNEL_CHANNELS] = list(r.kernel_channels)
        if r.flows:
            fl = r.flows
            flow_attrs.update({
                sc.FLOW_CHANNEL: [f.channel for f in fl], sc.FLOW_DIRECTION: ["send" if f.send else "recv" for f in fl],
                sc.FLOW_PEER: [f.peer for f in fl], sc.FLOW_STEPS: [f.steps for f in fl],
                sc.FLOW_POSTED: [f.posted for f in fl], sc.FLOW_READY: [f.ready for f in fl],
                sc.FLOW_TRANSMITTED: [f.transmitted for f in fl], sc.FLOW_DONE: [f.done for f in fl],
                sc.FLOW_BYTES: [f.done * 65536 for f in fl],
                sc.FLOW_START: [sc.flow_offset(f.start or r.start, r.start) for f in fl],
                sc.FLOW_END: [sc.flow_offset(f.end, r.start) for f in fl],
                sc.FLOW_LAST_PROGRESS: [sc.flow_offset(f.last or r.last_progress, r.start) for f in fl],
                sc.FLOW_WAIT_STATE: [f.wait for f in fl], sc.FLOW_WAIT_STEP: [f.done for f in fl],
                sc.FLOW_WAIT_SINCE: [sc.flow_offset(f.since, r.start) for f in fl],
                sc.FLOW_GPU_WAIT: [f.gpu_wait for f in fl],
                sc.FLOW_NET_WAIT: [f.net_wait for f in fl], sc.FLOW_PEER_BUSY: [f.peer_wait for f in fl],
            })
            for send, peer in dict.fromkeys((f.send, f.peer) for f in fl):  # one link per peer and direction
                links.append(trace_pb2.Span.Link(
                    trace_id=tid.to_bytes(16, "big"), span_id=ids.span_id(tid, peer, sc.ROLE_OP).to_bytes(8, "big"),
                    attributes=kvs({sc.LINK_ROLE: sc.LINK_SEND_TO if send else sc.LINK_RECV_FROM,
                                    sc.LINK_PEER: peer})))
        if r.anomaly:
            a[sc.ANOMALY] = r.anomaly
        if r.baseline:
            a[sc.BASELINE_NS] = r.baseline
        if r.recent:
            a[sc.ANOMALY_RECENT] = r.recent
    if r.kind == "op":
        name, sid, start, end = sc.op_span_name(r.func), ids.span_id(tid, r.rank, sc.ROLE_OP), r.start, r.end
    elif r.kind == "inflight":
        a[sc.SNAPSHOT_SEQ] = r.snapshot
        if r.stopped:
            a[sc.PROCESS_STOPPED] = True
        name, sid, start, end = sc.INFLIGHT_SPAN, ids.span_id(tid, r.rank, sc.ROLE_INFLIGHT, r.snapshot), r.start, r.end
    else:
        a[sc.STATUS_KIND] = r.kind
        a[sc.STATUS_LAST_SEQ] = seq - 1
        if r.stopped:
            a[sc.PROCESS_STOPPED] = True
        idx = sc.STATUS_KINDS.index(r.kind)
        name, sid, start, end = sc.STATUS_SPAN, ids.span_id(tid, r.rank, sc.ROLE_STATUS, idx), r.start, r.end
    if r.kind != "op":
        links.insert(0, trace_pb2.Span.Link(
            trace_id=tid.to_bytes(16, "big"), span_id=ids.span_id(tid, r.rank, sc.ROLE_OP).to_bytes(8, "big"),
            attributes=kvs({sc.LINK_ROLE: sc.LINK_SNAPSHOT_OF})))
    a.update(flow_attrs)
    return trace_pb2.Span(trace_id=tid.to_bytes(16, "big"), span_id=sid.to_bytes(8, "big"), name=name,
                          kind=trace_pb2.Span.SPAN_KIND_INTERNAL, start_time_unix_nano=start,
                          end_time_unix_nano=max(end, start), attributes=kvs(a), links=links)


def request(items: list[tuple[R, trace_pb2.Span]],
            shard: int | None = None) -> trace_service_pb2.ExportTraceServiceRequest:
    """One ResourceSpans per rank (as the agent sends: one resource per rank context); ``shard``: the block of
    global ranks a sharding agent (MYCROFT_SHARD_RANKS) puts them in."""
    req = trace_service_pb2.ExportTraceServiceRequest()
    for r, span in items:
        res = resource_pb2.Resource(attributes=kvs({
            sc.SERVICE_NAME: "mycroft-otel-agent", sc.HOST_NAME: r.host or default_host(r.rank),
            sc.PROCESS_PID: r.pid + r.rank, sc.JOB_ID: r.job, **({} if shard is None else {sc.JOB_SHARD: shard})}))
        rs = req.resource_spans.add(resource=res)
        rs.scope_spans.add().spans.append(span)
    return req


class Ring:
    """A ring collective's spans; mutate ``ranks`` to inject a fault, then :meth:`request`."""

    def __init__(self, n: int, nch: int = 2, comm: int = 0x5F3A9C0E12AB44D1, seq: int = 17,
                 t0: int | None = None, steps: int = 16, dur_ns: int = 5_000_000, global_base: int = 0,
                 job: str = JOB):
        self.n, self.nch, self.comm, self.seq, self.steps = n, nch, comm, seq, steps
        self.t0 = t0 if t0 is not None else time.time_ns() - 10_000_000_000
        self.dur = dur_ns
        self.tid = ids.coll_trace_id(job, comm, seq)
        self.ranks: dict[int, R] = {}
        for r in range(n):
            flows = []
            for c in range(nch):
                flows.append(F(c, True, (r + 1) % n, steps, start=self.t0, end=self.t0 + dur_ns,
                               last=self.t0 + dur_ns, gpu_wait=steps * 20_000, net_wait=steps * 100_000))
                flows.append(F(c, False, (r - 1) % n, steps, start=self.t0, end=self.t0 + dur_ns,
                               last=self.t0 + dur_ns, gpu_wait=steps * 20_000, net_wait=steps * 100_000))
            self.ranks[r] = R(r, "op", flows, start=self.t0, end=self.t0 + dur_ns, last_progress=self.t0 + dur_ns,
                              global_rank=global_base + r, job=job)

    # -- faults -------------------------------------------------------------------------------------
    def hang_all(self, k: int = 5, when: int | None = None, snap_time: int | None = None) -> None:
        """Every rank in flight, waiting on its upstream (recv RecvWait, send SendGpuWait)."""
        when = when if when is not None else self.t0 + 1_000_000
        snap_time = snap_time if snap_time is not None else when + 4_000_000_000
        for r, rv in self.ranks.items():
            rv.kind, rv.end, rv.last_progress, rv.snapshot = "inflight", snap_time, when, 3
            for f in rv.flows:
                f.end, f.last, f.since = 0, when, when
                if f.send:
                    f.ready = f.transmitted = f.done = k
                    f.wait = "SendGpuWait"
                else:
                    f.ready = f.transmitted = f.done = k
                    f.wait = "RecvWait"

    def drain_from(self, c: int, per_hop_ns: int = 2000) -> None:
        """Ranks further downstream of the fault stop progressing later (the pipeline drains)."""
        for r, rv in self.ranks.items():
            d = ((r - c) % self.n) * per_hop_ns
            rv.last_progress += d
            for f in rv.flows:
                f.last += d
                f.since += d

    def flows(self, r: int, send: bool, channel: int | None = None) -> list[F]:
        return [f for f in self.ranks[r].flows if f.send == send and (channel is None or f.channel == channel)]

    def gpu_stall(self, c: int, k: int = 5) -> None:
        self.hang_all(k)
        self.drain_from(c)
        for f in self.flows(c, False):
            f.ready = f.transmitted = k + 1
            f.wait = "RecvGpuWait"
        for f in self.flows((c - 1) % self.n, True):
            f.ready = k + 1
            f.wait = "SendPeerWait"

    def nvlink_hang(self, unstarted: list[int]) -> None:
        """A collective without network flows (NVLink/P2P) in flight on every rank: the GPUs of ``unstarted``
        never started its kernel (no KernelCh), the others' kernels run and wait inside."""
        self.hang_all()
        for r, rv in self.ranks.items():
            rv.flows = []
            rv.kernel_channels = (0, 0) if r in unstarted else (self.nch, 0)

    def net_send_stall(self, c: int, channel: int | None, k: int = 5) -> None:
        self.hang_all(k)
        self.drain_from(c)
        for f in self.flows(c, True, channel):
            f.ready = k + 2
            f.wait = "SendPeerWait"

    def net_delivery_stall(self, c: int, channel: int, k: int = 5) -> None:
        self.hang_all(k)
        self.drain_from(c)
        for f in self.flows(c, True, channel):
            f.ready = f.transmitted = k + 1
            f.wait = "SendWait"

    def absent(self, c: int, how: str = "not_entered") -> None:
        self.hang_all(0)
        rv = self.ranks[c]
        if how == "none":
            del self.ranks[c]
        elif how == "stopped":
            rv.stopped = True
        else:
            rv.kind = how
            rv.flows = []
            rv.start = self.t0 - 2_500_000_000
        # the upstream rank has no credit from c, the downstream waits for c's data
        for f in self.flows((c - 1) % self.n, True):
            f.ready = 1
            f.wait = "SendPeerWait"

    def mismatch(self, c: int) -> None:
        self.hang_all(2)
        self.ranks[c].count = self.ranks[c].count // 2

    def late(self, c: int, late_ns: int) -> None:
        for r, rv in self.ranks.items():
            if r == c:
                rv.start += late_ns
                rv.anomaly = "late"
                for f in rv.flows:
                    f.start += late_ns
            else:
                rv.end += late_ns
                rv.anomaly, rv.baseline = "slow", self.dur
                for f in rv.flows:
                    if not f.send:
                        f.net_wait += late_ns
        for f in self.flows((c + 1) % self.n, False):  # downstream waited for c's data
            f.net_wait += late_ns

    def stretch(self, extra_ns: int) -> None:
        """Every rank ends ``extra_ns`` later: a ring is paced by its slowest hop, so a slower GPU or link
        anywhere makes the whole collective take longer."""
        for rv in self.ranks.values():
            rv.end += extra_ns
            rv.last_progress = max(rv.last_progress, rv.end)
            for f in rv.flows:
                f.end += extra_ns
                f.last = max(f.last, f.end)

    def slow(self) -> None:
        for rv in self.ranks.values():
            rv.end += 4 * self.dur
            rv.anomaly, rv.baseline = "slow", self.dur

    def slow_flow(self, c: int, channel: int, factor: int = 80) -> None:
        self.slow()
        for f in self.flows(c, True, channel):
            f.net_wait *= factor

    def slow_nic(self, c: int, factor: int = 80) -> None:
        self.slow()
        for f in self.flows(c, True):
            f.net_wait *= factor

    def slow_gpu(self, c: int, factor: int = 100) -> None:
        self.slow()
        for f in self.flows(c, False):
            f.gpu_wait *= factor

    def slow_proxy(self, c: int, late_ns: int | None = None) -> None:
        """Rank c's proxy posts its ready steps ``late_ns`` late (default: 4 collective durations, and
        everybody's span is flagged slow): its send flows last that much longer with their steps ready,
        waiting for credit (SendPeerWait), while its receivers' buffers are posted and wait for the data
        (RecvWait)."""
        if late_ns is None:
            late_ns = 4 * self.dur
            self.slow()
        else:  # the ring waits for the chunks posted late: every rank ends that much later
            for rv in self.ranks.values():
                rv.end += late_ns
        for f in self.flows(c, True):
            f.end += late_ns
            f.peer_wait += late_ns
            for g in self.flows(f.peer, False, f.channel):
                if g.peer == c:
                    g.net_wait += late_ns
                    g.end += late_ns

    def request(self, ranks: list[int] | None = None,
                shard: int | None = None) -> trace_service_pb2.ExportTraceServiceRequest:
        rs = [self.ranks[r] for r in (ranks if ranks is not None else sorted(self.ranks)) if r in self.ranks]
        return request([(r, rank_span(self.tid, self.n, self.comm, self.seq, r)) for r in rs], shard)


def jitter(ring: Ring, rng, sigma: float) -> None:
    """Healthy spread: every flow's GPU and network waits times a log-normal factor of ``sigma`` (log units).
    sigma 0.15 gives what the H200 capture shows (tests/sim/fixtures/gpu_check.json: the slowest of a
    collective's flows waits ~1.5x the median flow per step); 0.6 a loaded 2-core host."""
    for rv in ring.ranks.values():
        for f in rv.flows:
            f.gpu_wait = int(f.gpu_wait * float(rng.lognormal(0.0, sigma)))
            f.net_wait = int(f.net_wait * float(rng.lognormal(0.0, sigma)))


def scaled(ring: Ring, fault: str, c: int, factor: float) -> None:
    """A mild fault at rank ``c``: its GPU waits (slow_gpu), one flow's network waits (slow_flow, channel 1),
    all its send flows' network waits (slow_nic) times ``factor``; or it starts late (late_rank), or its proxy
    leaves its ready send steps unposted (slow_proxy), by (factor - 1) x the collective's duration. The
    collective takes (factor - 1) x its duration longer."""
    if fault in ("slow_gpu", "slow_flow", "slow_nic"):
        ring.stretch(int((factor - 1) * ring.dur))
    if fault == "slow_gpu":
        for f in ring.flows(c, False):
            f.gpu_wait = int(f.gpu_wait * factor)
    elif fault == "slow_flow":
        for f in ring.flows(c, True, 1):
            f.net_wait = int(f.net_wait * factor)
    elif fault == "slow_nic":
        for f in ring.flows(c, True):
            f.net_wait = int(f.net_wait * factor)
    elif fault == "slow_proxy":
        ring.slow_proxy(c, int((factor - 1) * ring.dur))
    elif fault == "late_rank":
        ring.late(c, int((factor - 1) * ring.dur))
        for rv in ring.ranks.values():
            rv.anomaly = ""
    else:
        raise ValueError(fault)
