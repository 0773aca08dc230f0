"""OTLP protobuf spans -> what the analysis needs, decoded as lazily as possible.

Ingest walks the payload's wire bytes natively (``_native.ExportDecoder``) and reads only a
handful of key attributes per span (:class:`SpanRef`), stopping at the flow arrays (the agent
writes them last). Each SpanRef keeps the payload and its span's byte range: the flow arrays
and the rest are decoded by :func:`evidence_attributes` when a trace is actually analysed,
and then only for the latest evidence of each rank. The decoding itself costs what
protobuf's own parse does (benchmarks/processor). Spans that do not have our shape are
classified ``unknown`` and counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mycroft_otel import _native
from mycroft_otel import semconv as sc

# Span kinds as the processor sees them.
OP, INFLIGHT, STATUS, SUMMARY, ROOT_CAUSE, UNKNOWN = "op", "inflight", "status", "summary", "root_cause", "unknown"

_MAX_ARRAY = 4096  # longer attribute arrays are truncated (hostile input)


def any_value(v: Any) -> Any:
    """Python value of an OTLP AnyValue (arrays become lists; kvlists dicts)."""
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


_FLOW_PREFIX = "mycroft.flow."


_KEY_ATTRS = frozenset({
    sc.RANK, sc.COMM_NRANKS, sc.COMM_HASH, sc.COLL_SEQ, sc.COLL_FUNC, sc.OP_STATE, sc.SNAPSHOT_SEQ,
    sc.STATUS_KIND, sc.ANOMALY, sc.BASELINE_NS, sc.GLOBAL_RANK, sc.COLL_BYTES, sc.TIME_LAST_PROGRESS,
    sc.OP_KIND, sc.PROCESS_STOPPED, sc.COLL_COUNT, sc.COLL_DATATYPE, sc.ANOMALY_RECENT,
})


@dataclass(slots=True)
class Resource:
    host: str = ""
    pid: int = -1
    job: str = ""


@dataclass(slots=True)
class SpanRef:
    """One received span, with the key attributes decoded and its wire bytes kept for later."""

    kind: str
    trace_id: bytes
    span_id: bytes
    name: str
    start_ns: int
    end_ns: int
    rank: int
    nranks: int
    comm: str
    seq: int
    func: str
    snapshot: int           # SNAPSHOT_SEQ (in-flight), else -1
    status: str             # STATUS_KIND (status spans), else ""
    anomaly: str
    baseline_ns: int
    global_rank: int
    nbytes: int
    last_progress_ns: int
    resource: Resource
    stopped: bool = False   # PROCESS_STOPPED: the writer is SIGSTOPped
    flow_at: int = -1       # byte offset in the span of its first flow attribute (-1: none)
    count: int = -1
    datatype: str = ""
    recent: int = 0         # ANOMALY_RECENT: of the rank's last 8 collectives here, how many its rules flagged slow
    raw: tuple[bytes, int, int] | None = field(repr=False, default=None)  # (payload, offset, length) of the span

    @property
    def duration_ns(self) -> int:
        return max(0, self.end_ns - self.start_ns)


def classify(name: str) -> str:
    if name.startswith(sc.OP_SPAN_PREFIX):
        return OP
    if name == sc.INFLIGHT_SPAN:
        return INFLIGHT
    if name == sc.STATUS_SPAN:
        return STATUS
    if name == sc.SUMMARY_SPAN:
        return SUMMARY
    if name == sc.ROOT_CAUSE_SPAN:
        return ROOT_CAUSE
    return UNKNOWN


_KEYS = tuple(sorted(_KEY_ATTRS))  # the export decoder returns the values in this order
_RES_KEYS = (sc.HOST_NAME, sc.PROCESS_PID, sc.JOB_ID)
(_I_RANK, _I_NRANKS, _I_COMM, _I_SEQ, _I_FUNC, _I_STATE, _I_SNAPSHOT, _I_STATUS, _I_ANOMALY, _I_BASELINE, _I_GRANK,
 _I_BYTES, _I_PROGRESS, _I_STOPPED, _I_COUNT, _I_DTYPE, _I_RECENT) = (
    _KEYS.index(k) for k in (sc.RANK, sc.COMM_NRANKS, sc.COMM_HASH, sc.COLL_SEQ, sc.COLL_FUNC, sc.OP_STATE,
                             sc.SNAPSHOT_SEQ, sc.STATUS_KIND, sc.ANOMALY, sc.BASELINE_NS, sc.GLOBAL_RANK,
                             sc.COLL_BYTES, sc.TIME_LAST_PROGRESS, sc.PROCESS_STOPPED, sc.COLL_COUNT,
                             sc.COLL_DATATYPE, sc.ANOMALY_RECENT))


_EXPORT = _native.ExportDecoder(_KEYS, _RES_KEYS, _FLOW_PREFIX)


def _iv(v: Any, default: int = -1) -> int:
    return v if type(v) is int else default


def _sv(v: Any) -> str:
    return v if type(v) is str else ""


@dataclass(slots=True)
class Decoded:
    """One ExportTraceServiceRequest as ingest sees it."""

    seen: int                   # spans in the payload
    refs: list[SpanRef]         # those with our shape
    ignored: int                # root-cause spans (ours, written back by a processor)
    rejected: int               # spans of unknown shape


def decode(data: bytes) -> Decoded:
    """Spans of one ExportTraceServiceRequest payload; raises ValueError when it is malformed."""
    seen, resources, spans = _EXPORT(data)
    res = [Resource(host="" if host is None else str(host), pid=_iv(pid), job="" if job is None else str(job))
           for host, pid, job in resources]
    refs: list[SpanRef] = []
    ignored = rejected = 0
    for ri, tid, sid, name, start, end, a, flow_at, off, length in spans:
        ref = _span_ref(res[ri], tid, sid, name, start, end, a, flow_at, (data, off, length))
        if ref is not None:
            refs.append(ref)
        elif classify(name) == ROOT_CAUSE:
            ignored += 1
        else:
            rejected += 1
    return Decoded(seen=seen, refs=refs, ignored=ignored, rejected=rejected)


def _span_ref(resource: Resource, tid: bytes, sid: bytes, name: str, start: int, end: int, a: tuple, flow_at: int,
              raw: tuple[bytes, int, int]) -> SpanRef | None:
    """The SpanRef of one decoded span, or None when the span does not have our shape."""
    kind = classify(name)
    if kind in (UNKNOWN, ROOT_CAUSE) or len(tid) != 16 or len(sid) != 8:
        return None
    rank, nranks, comm = _iv(a[_I_RANK]), _iv(a[_I_NRANKS]), a[_I_COMM]
    if comm is None:
        comm = ""
    if type(comm) is not str:
        return None
    if kind != SUMMARY and (rank < 0 or nranks <= 0 or rank >= nranks or nranks > 1 << 20):
        return None
    if kind == OP and a[_I_STATE] == "in_flight":
        kind = INFLIGHT  # tolerate an op-named in-flight view
    status = _sv(a[_I_STATUS])
    if kind == STATUS and status not in sc.STATUS_KINDS:
        return None
    func = _sv(a[_I_FUNC])
    if not func and kind == OP:
        func = name[len(sc.OP_SPAN_PREFIX):]
    return SpanRef(
        kind=kind, trace_id=tid, span_id=sid, name=name, start_ns=start, end_ns=end,
        rank=rank, nranks=nranks, comm=comm, seq=_iv(a[_I_SEQ]), func=func, snapshot=_iv(a[_I_SNAPSHOT]),
        status=status, anomaly=_sv(a[_I_ANOMALY]), baseline_ns=_iv(a[_I_BASELINE], 0), global_rank=_iv(a[_I_GRANK]),
        nbytes=_iv(a[_I_BYTES], 0), last_progress_ns=_iv(a[_I_PROGRESS], 0), resource=resource,
        stopped=a[_I_STOPPED] is True, flow_at=flow_at, count=_iv(a[_I_COUNT]), datatype=_sv(a[_I_DTYPE]),
        recent=max(0, min(_iv(a[_I_RECENT], 0), sc.RECENT_WINDOW)), raw=raw,
    )


# --- full evidence, decoded when a trace is analysed -------------------------------------

_FLOW_KEYS = (sc.FLOW_CHANNEL, sc.FLOW_DIRECTION, sc.FLOW_PEER, sc.FLOW_STEPS, sc.FLOW_POSTED, sc.FLOW_READY,
              sc.FLOW_TRANSMITTED, sc.FLOW_DONE, sc.FLOW_BYTES, sc.FLOW_START, sc.FLOW_END, sc.FLOW_LAST_PROGRESS,
              sc.FLOW_WAIT_STATE, sc.FLOW_WAIT_STEP, sc.FLOW_WAIT_SINCE, sc.FLOW_GPU_WAIT, sc.FLOW_NET_WAIT,
              sc.FLOW_NIC)
_EVIDENCE_KEYS = frozenset(_FLOW_KEYS + (
    sc.COLL_COUNT, sc.COLL_DATATYPE, sc.COLL_BYTES, sc.COLL_FUNC, sc.TIME_API, sc.TIME_ENQUEUE, sc.TIME_LAUNCH,
    sc.TIME_END, sc.TIME_LAST_PROGRESS, sc.GLOBAL_RANK, sc.STATUS_LAST_STATE, sc.STATUS_IDLE_SINCE,
    sc.STATUS_LAST_SEQ, sc.KERNEL_CHANNELS, sc.PROXY_OPS, sc.COLL_ROOT, sc.P2P_PEER,
))


@dataclass(slots=True)
class Flow:
    """One (channel, direction) of a rank's operation: Mycroft's chunk counters."""

    channel: int
    send: bool
    peer: int
    steps: int
    posted: int
    ready: int
    transmitted: int
    done: int
    nbytes: int
    start_ns: int
    end_ns: int
    last_progress_ns: int
    wait_state: str
    wait_since_ns: int
    gpu_wait_ns: int
    net_wait_ns: int
    nic: str

    @property
    def finished(self) -> bool:
        return self.steps > 0 and self.done >= self.steps and not self.wait_state


_FLOW_DEFAULTS = tuple("" if k in (sc.FLOW_WAIT_STATE, sc.FLOW_DIRECTION, sc.FLOW_NIC) else 0 for k in _FLOW_KEYS)


def flows_of(a: dict) -> list[Flow]:
    ch = a.get(sc.FLOW_CHANNEL)
    if type(ch) is not list or not ch:
        return []
    n = len(ch)
    cols = []
    for k, default in zip(_FLOW_KEYS, _FLOW_DEFAULTS):
        v = a.get(k)
        if type(v) is not list:
            v = [default] * n
        elif len(v) != n:  # a hostile or truncated column: pad or cut to the channel column's length
            v = (v + [default] * n)[:n]
        cols.append(v)
    return [Flow(ch_, d == "send", pe, st, po, rd, tx, dn, by, s0, e0, lp, ws, wsn, gw, nw, str(nic))
            for (ch_, d, pe, st, po, rd, tx, dn, by, s0, e0, lp, ws, _wstep, wsn, gw, nw, nic) in zip(*cols)]


_STR_ARRAYS = frozenset({sc.FLOW_DIRECTION, sc.FLOW_WAIT_STATE, sc.FLOW_NIC})


# What the hang walk reads (a subset: decoding is the cost of analysing 16k ranks).
HANG_KEYS = frozenset({
    sc.FLOW_CHANNEL, sc.FLOW_DIRECTION, sc.FLOW_PEER, sc.FLOW_STEPS, sc.FLOW_POSTED, sc.FLOW_READY,
    sc.FLOW_TRANSMITTED, sc.FLOW_DONE, sc.FLOW_WAIT_STATE, sc.FLOW_WAIT_SINCE, sc.COLL_COUNT, sc.COLL_DATATYPE,
    sc.STATUS_LAST_STATE, sc.STATUS_LAST_SEQ, sc.TIME_LAST_PROGRESS})


_decoders: dict[tuple[frozenset[str], bool], Any] = {}


def _decoder(keys: frozenset[str], typed: bool) -> Any:
    d = _decoders.get((keys, typed))
    if d is None:
        d = _decoders[(keys, typed)] = _native.AttrDecoder(keys, _STR_ARRAYS if typed else None)
    return d


def evidence_attributes(ref: SpanRef, keys: frozenset[str] = _EVIDENCE_KEYS) -> dict[str, Any]:
    """The attributes the analysis reads, decoded from the span's kept wire bytes (typed arrays: an
    element of the wrong type reads as 0 / "")."""
    if ref.raw is None:
        return {}
    data, off, length = ref.raw
    if keys is HANG_KEYS and ref.kind != STATUS:
        # the scalars the walk needs were read at ingest; only the flow arrays are left to decode
        if ref.flow_at < 0:
            return {sc.COLL_COUNT: ref.count, sc.COLL_DATATYPE: ref.datatype}
        out = _decoder(keys, True)(data, off, length, ref.flow_at)
        out[sc.COLL_COUNT], out[sc.COLL_DATATYPE] = ref.count, ref.datatype
        return out
    return _decoder(keys, True)(data, off, length)


def span_attributes(ref: SpanRef, keys: frozenset[str]) -> dict[str, Any]:
    """Attributes among ``keys`` of a span, values as :func:`any_value` gives them."""
    if ref.raw is None:
        return {}
    data, off, length = ref.raw
    return _decoder(keys, False)(data, off, length)
