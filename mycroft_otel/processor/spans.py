"""OTLP protobuf spans -> what the analysis needs, decoded as lazily as possible.

Ingest reads only a handful of key attributes per span (:class:`SpanRef`); the
flow arrays and the rest are decoded by :func:`rank_evidence` when a trace is
actually analysed, and then only for the latest evidence of each rank. That keeps
ingest close to the cost of protobuf parsing itself (benchmarks/processor).
Spans that do not have our shape are classified ``unknown`` and counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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


_SCALARS = ("int_value", "string_value", "double_value", "bool_value")


_FLOW_PREFIX = "mycroft.flow."


def scalar_attributes(kvs: Any, keys: frozenset[str], stop_at_flows: bool = False) -> dict[str, Any]:
    """Only the scalar attributes among ``keys`` (the ingest path: arrays are never needed there).
    ``stop_at_flows``: stop at the first flow array (the agent writes them last)."""
    out: dict[str, Any] = {}
    for i, kv in enumerate(kvs):
        k = kv.key
        if stop_at_flows and k.startswith(_FLOW_PREFIX):
            out[_FLOW_AT] = i
            break
        if k in keys:
            v = kv.value
            w = v.WhichOneof("value")
            if w in _SCALARS:
                out[k] = getattr(v, w)
    return out


_FLOW_AT = " flow_at"  # not an attribute key: where the flow arrays start


_KEY_ATTRS = frozenset({
    sc.RANK, sc.COMM_NRANKS, sc.COMM_HASH, sc.COLL_SEQ, sc.COLL_FUNC, sc.OP_STATE, sc.SNAPSHOT_SEQ,
    sc.STATUS_KIND, sc.ANOMALY, sc.BASELINE_NS, sc.GLOBAL_RANK, sc.COLL_BYTES, sc.TIME_LAST_PROGRESS,
    sc.OP_KIND, sc.PROCESS_STOPPED, sc.COLL_COUNT, sc.COLL_DATATYPE, sc.ANOMALY_RECENT,
})
_RES_ATTRS = frozenset({sc.HOST_NAME, sc.PROCESS_PID, sc.SERVICE_NAME, sc.JOB_ID})


@dataclass(slots=True)
class Resource:
    host: str = ""
    pid: int = -1
    job: str = ""


def resource_of(resource: Any) -> Resource:
    a = scalar_attributes(resource.attributes, _RES_ATTRS)
    pid = a.get(sc.PROCESS_PID, -1)
    return Resource(host=str(a.get(sc.HOST_NAME, "")), pid=pid if isinstance(pid, int) else -1,
                    job=str(a.get(sc.JOB_ID, "")))


@dataclass(slots=True)
class SpanRef:
    """One received span, with the key attributes decoded and the protobuf kept for later."""

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
    flow_at: int = -1       # index of the first flow attribute (-1: none seen before the end)
    count: int = -1
    datatype: str = ""
    recent: int = 0         # ANOMALY_RECENT: of the rank's last 8 collectives here, how many its rules flagged slow
    span: Any = field(repr=False, default=None)  # the protobuf Span

    @property
    def duration_ns(self) -> int:
        return max(0, self.end_ns - self.start_ns)


def _int(a: dict, key: str, default: int = -1) -> int:
    v = a.get(key, default)
    return v if isinstance(v, int) and not isinstance(v, bool) else default


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


def span_ref(span: Any, resource: Resource) -> SpanRef | None:
    """The SpanRef of an OTLP span, or None when the span does not have our shape."""
    kind = classify(span.name)
    if kind in (UNKNOWN, ROOT_CAUSE):
        return None
    tid, sid = span.trace_id, span.span_id
    if len(tid) != 16 or len(sid) != 8:
        return None
    a = scalar_attributes(span.attributes, _KEY_ATTRS, stop_at_flows=True)
    rank, nranks = _int(a, sc.RANK), _int(a, sc.COMM_NRANKS)
    comm = a.get(sc.COMM_HASH, "")
    if not isinstance(comm, str):
        return None
    if kind != SUMMARY and (rank < 0 or nranks <= 0 or rank >= nranks or nranks > 1 << 20):
        return None
    state = a.get(sc.OP_STATE, "")
    if kind == OP and state == "in_flight":
        kind = INFLIGHT  # tolerate an op-named in-flight view
    status = a.get(sc.STATUS_KIND, "")
    if kind == STATUS and status not in sc.STATUS_KINDS:
        return None
    func = a.get(sc.COLL_FUNC, "")
    if not func and kind == OP:
        func = span.name[len(sc.OP_SPAN_PREFIX):]
    anomaly = a.get(sc.ANOMALY, "")
    return SpanRef(
        kind=kind, trace_id=bytes(tid), span_id=bytes(sid), name=span.name,
        start_ns=int(span.start_time_unix_nano), end_ns=int(span.end_time_unix_nano),
        rank=rank, nranks=nranks, comm=comm, seq=_int(a, sc.COLL_SEQ), func=func if isinstance(func, str) else "",
        snapshot=_int(a, sc.SNAPSHOT_SEQ), status=status if isinstance(status, str) else "",
        anomaly=anomaly if isinstance(anomaly, str) else "", baseline_ns=_int(a, sc.BASELINE_NS, 0),
        global_rank=_int(a, sc.GLOBAL_RANK), nbytes=_int(a, sc.COLL_BYTES, 0),
        last_progress_ns=_int(a, sc.TIME_LAST_PROGRESS, 0), resource=resource, span=span,
        stopped=a.get(sc.PROCESS_STOPPED) is True, flow_at=a.get(_FLOW_AT, -1), count=_int(a, sc.COLL_COUNT),
        datatype=a.get(sc.COLL_DATATYPE) if isinstance(a.get(sc.COLL_DATATYPE), str) else "",
        recent=max(0, min(_int(a, sc.ANOMALY_RECENT, 0), sc.RECENT_WINDOW)),
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


def _col(a: dict, key: str, n: int, default: Any) -> list:
    v = a.get(key)
    if not isinstance(v, list):
        return [default] * n
    if len(v) >= n:
        return v[:n] if len(v) > n else v
    return v + [default] * (n - len(v))


def flows_of(a: dict) -> list[Flow]:
    ch = a.get(sc.FLOW_CHANNEL)
    if not isinstance(ch, list) or not ch:
        return []
    n = len(ch)
    zeros = [0] * n
    blanks = [""] * n
    c = [_col(a, k, n, "" if k in (sc.FLOW_WAIT_STATE, sc.FLOW_DIRECTION, sc.FLOW_NIC) else 0) if k in a
         else (blanks if k in (sc.FLOW_WAIT_STATE, sc.FLOW_DIRECTION, sc.FLOW_NIC) else zeros) for k in _FLOW_KEYS]
    return [Flow(ch_, d == "send", pe, st, po, rd, tx, dn, by, s0, e0, lp, ws if isinstance(ws, str) else "", wsn,
                 gw, nw, str(nic))
            for (ch_, d, pe, st, po, rd, tx, dn, by, s0, e0, lp, ws, _wstep, wsn, gw, nw, nic) in zip(*c)]


_STR_ARRAYS = frozenset({sc.FLOW_DIRECTION, sc.FLOW_WAIT_STATE, sc.FLOW_NIC})


# What the hang walk reads (a subset: decoding is the cost of analysing 16k ranks).
HANG_KEYS = frozenset({
    sc.FLOW_CHANNEL, sc.FLOW_DIRECTION, sc.FLOW_PEER, sc.FLOW_STEPS, sc.FLOW_POSTED, sc.FLOW_READY,
    sc.FLOW_TRANSMITTED, sc.FLOW_DONE, sc.FLOW_WAIT_STATE, sc.FLOW_WAIT_SINCE, sc.COLL_COUNT, sc.COLL_DATATYPE,
    sc.STATUS_LAST_STATE, sc.STATUS_LAST_SEQ, sc.TIME_LAST_PROGRESS})


def evidence_attributes(ref: SpanRef, keys: frozenset[str] = _EVIDENCE_KEYS) -> dict[str, Any]:
    """The attributes the analysis reads, decoded from the kept protobuf span (typed arrays: an element
    of the wrong type reads as 0 / "")."""
    if ref.span is None:
        return {}
    out: dict[str, Any] = {}
    kvs = ref.span.attributes
    if keys is HANG_KEYS:
        # the scalars the walk needs were read at ingest; only the flow arrays are left to decode
        if ref.flow_at < 0:
            if ref.kind not in ("status",):
                return {sc.COLL_COUNT: ref.count, sc.COLL_DATATYPE: ref.datatype}
        else:
            out[sc.COLL_COUNT], out[sc.COLL_DATATYPE] = ref.count, ref.datatype
            kvs = kvs[ref.flow_at:]
    for kv in kvs:
        k = kv.key
        if k not in keys:
            continue
        v = kv.value
        w = v.WhichOneof("value")
        if w == "array_value":
            vals = v.array_value.values
            if len(vals) > _MAX_ARRAY:
                vals = vals[:_MAX_ARRAY]
            if k in _STR_ARRAYS:
                out[k] = [x.string_value for x in vals]
            else:
                out[k] = [x.int_value for x in vals]
        elif w in _SCALARS:
            out[k] = getattr(v, w)
    return out
