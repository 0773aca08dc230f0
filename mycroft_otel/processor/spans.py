"""OTLP protobuf spans -> what the analysis needs, decoded as lazily as possible.

Ingest walks the payload's wire bytes natively (``_native.SpanDecoder``): it checks each span's
shape and builds its :class:`SpanRef` with a handful of key attributes, stopping at the flow
arrays (the agent writes them last); spans that do not have our shape are counted, not kept.
Each SpanRef keeps the payload and its span's byte range. The flow arrays are decoded from
those bytes when a trace is analysed, as one int64 table for numpy (:func:`flow_table`,
``_native.FlowDecoder``) or as :class:`Flow` objects for the hang walk (:func:`flows_by_span`);
the few other attributes the analysis reads by :func:`evidence_attributes`. Decoding costs
less than protobuf's own parse (benchmarks/processor).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import islice
from typing import Any, NamedTuple, Sequence

import numpy as np

from mycroft_otel import _native
from mycroft_otel import semconv as sc

# Span kinds as the processor sees them.
OP, INFLIGHT, STATUS, SUMMARY = "op", "inflight", "status", "summary"

MAX_STEP_INDEX = 64  # places of a training step told apart (the agent learns steps up to 16 collectives long)
# SpanRef.step besides a place 0 <= step < MAX_STEP_INDEX, as the native decoder writes them: no int value
# (absent, or another type: bool is not int); an int outside the places (hostile: it must not multiply the
# detector's keys); not read at ingest (a value only a full decode can judge: keys.step_of reads the span).
STEP_NONE, STEP_BEYOND, STEP_UNREAD = -1, -2, -3


@dataclass(slots=True, frozen=True)
class Resource:
    """Who sent a span: one object per process, shared by its spans."""

    host: str = ""
    pid: int = -1
    job: str = ""
    shard: int = -1  # JOB_SHARD: the block of the job's global ranks this process is in (-1: unsharded job)


class SpanRef(NamedTuple):
    """One received span, with the key attributes decoded and its wire bytes kept for later. Built by the
    native decoder (a tuple: no Python call per span); never changed afterwards."""

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
    step: int = STEP_NONE   # COLL_STEP_INDEX of the span itself: its place in the training step, or STEP_*
    raw: tuple[bytes, int, int] | None = None  # (payload, offset, length) of the span

    @property
    def duration_ns(self) -> int:
        return max(0, self.end_ns - self.start_ns)

    def __repr__(self) -> str:  # without the payload
        return (f"SpanRef({self.kind} {self.name} rank {self.rank}/{self.nranks} comm {self.comm} seq {self.seq} "
                f"span {self.span_id.hex()})")


# The span attributes read at ingest, in the native decoder's order.
_ATTR_KEYS = (sc.RANK, sc.COMM_NRANKS, sc.COMM_HASH, sc.COLL_SEQ, sc.COLL_FUNC, sc.OP_STATE, sc.SNAPSHOT_SEQ,
              sc.STATUS_KIND, sc.ANOMALY, sc.BASELINE_NS, sc.GLOBAL_RANK, sc.COLL_BYTES, sc.TIME_LAST_PROGRESS,
              sc.PROCESS_STOPPED, sc.COLL_COUNT, sc.COLL_DATATYPE, sc.ANOMALY_RECENT)
_RES_KEYS = (sc.HOST_NAME, sc.PROCESS_PID, sc.JOB_ID, sc.JOB_SHARD)
assert SpanRef._fields == _native.SpanDecoder.fields, "SpanRef and the native SpanDecoder disagree on the fields"
_DECODER = _native.SpanDecoder(
    SpanRef, Resource, _ATTR_KEYS, _RES_KEYS, kinds=(OP, INFLIGHT, STATUS, SUMMARY),
    names=(sc.OP_SPAN_PREFIX, sc.INFLIGHT_SPAN, sc.STATUS_SPAN, sc.SUMMARY_SPAN, sc.ROOT_CAUSE_SPAN),
    status_kinds=sc.STATUS_KINDS, in_flight=sc.OP_STATE_IN_FLIGHT, flow_prefix="mycroft.flow.",
    recent_max=sc.RECENT_WINDOW, step_key=sc.COLL_STEP_INDEX, step_max=MAX_STEP_INDEX)


@dataclass(slots=True)
class Decoded:
    """One ExportTraceServiceRequest as ingest sees it."""

    seen: int                   # spans in the payload
    refs: list[SpanRef]         # those with our shape
    ignored: int                # root-cause spans (ours, written back by a processor)
    rejected: int               # spans of unknown shape


def decode(data: bytes) -> Decoded:
    """Spans of one ExportTraceServiceRequest payload; raises ValueError when it is malformed."""
    return Decoded(*_DECODER(data))


def detach(refs: list[SpanRef], payload_bytes: int) -> list[SpanRef]:
    """The spans of one request, copied out of its buffer when they are less than half of it (so keeping
    them does not keep the request)."""
    kept = sum(r.raw[2] for r in refs if r.raw is not None)
    if 2 * kept >= payload_bytes:
        return refs
    out = []
    for r in refs:
        if r.raw is not None:
            data, off, n = r.raw
            r = r._replace(raw=(data[off:off + n], 0, n))
        out.append(r)
    return out


# --- flows and evidence, decoded when a trace is analysed ---------------------------------

# The flow table's columns (FlowDecoder), all of them: direction reads 1 for "send"; wait_state reads its
# index in sc.WAIT_STATE_NAMES ("" is 0; any other string reads len(WAIT_STATE_NAMES)).
FLOW_COLUMNS = (sc.FLOW_CHANNEL, sc.FLOW_DIRECTION, sc.FLOW_PEER, sc.FLOW_STEPS, sc.FLOW_POSTED, sc.FLOW_READY,
                sc.FLOW_TRANSMITTED, sc.FLOW_DONE, sc.FLOW_BYTES, sc.FLOW_START, sc.FLOW_END,
                sc.FLOW_LAST_PROGRESS, sc.FLOW_WAIT_STATE, sc.FLOW_WAIT_SINCE, sc.FLOW_GPU_WAIT, sc.FLOW_NET_WAIT)
_FLOW_NAMES = {sc.FLOW_DIRECTION: ("recv", "send"), sc.FLOW_WAIT_STATE: sc.WAIT_STATE_NAMES}
_WAIT_NAMES = sc.WAIT_STATE_NAMES + ("unknown",)
_flow_decoders: dict[tuple[str, ...], Any] = {}


def flow_table(refs: Sequence[SpanRef], columns: tuple[str, ...] = FLOW_COLUMNS) -> tuple[np.ndarray, np.ndarray]:
    """The flows of these spans as one int64 table -- a row per flow, a column per key in ``columns``
    (the first gives the row count; only these keys are decoded); a span's rows are contiguous, in
    ``refs`` order -- and the number of rows of each span."""
    dec = _flow_decoders.get(columns)
    if dec is None:  # (an array the agent left out as equal to another reads as that one: it must be a column too)
        same_as = {k: v for k, v in sc.FLOW_SAME_AS.items() if k in columns}
        dec = _flow_decoders[columns] = _native.FlowDecoder(
            columns, _FLOW_NAMES, same_as, sc.FLOW_OFFSETS, {k: v for k, v in sc.FLOW_ABSOLUTE.items() if k in columns})
    data, counts = dec.table(refs)
    return np.frombuffer(data, dtype=np.int64).reshape(-1, len(columns)), np.frombuffer(counts, dtype=np.int64)


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

    @property
    def finished(self) -> bool:
        return self.steps > 0 and self.done >= self.steps and not self.wait_state


def flows_by_span(refs: Sequence[SpanRef]) -> list[list[Flow]]:
    """The spans' flows as objects (the hang walk follows them one by one), decoded in one pass."""
    table, counts = flow_table(refs)
    rows = iter(table.tolist())
    last = len(_WAIT_NAMES) - 1
    return [[Flow(ch, send == 1, pe, st, po, rd, tx, dn, by, s0, e0, lp, _WAIT_NAMES[min(ws, last)], wsn, gw, nw)
             for ch, send, pe, st, po, rd, tx, dn, by, s0, e0, lp, ws, wsn, gw, nw in islice(rows, n)]
            for n in counts.tolist()]


def flows_of(ref: SpanRef) -> list[Flow]:
    return flows_by_span((ref,))[0]


# What the analysis reads besides the flows (status details, the arrival of a rank without flows, whether its
# GPU started the collective's kernel).
_EVIDENCE_KEYS = frozenset({sc.STATUS_LAST_STATE, sc.STATUS_LAST_SEQ, sc.TIME_API, sc.TIME_ENQUEUE, sc.TIME_LAUNCH,
                            sc.KERNEL_CHANNELS, sc.COLL_NCHANNELS})

_decoders: dict[frozenset[str], Any] = {}


def _decoder(keys: frozenset[str]) -> Any:
    d = _decoders.get(keys)
    if d is None:
        d = _decoders[keys] = _native.AttrDecoder(keys)
    return d


def evidence_attributes(ref: SpanRef) -> dict[str, Any]:
    """The scalar attributes the analysis reads besides the flows, decoded from the span's kept bytes."""
    return span_attributes(ref, _EVIDENCE_KEYS)


def span_attributes(ref: SpanRef, keys: frozenset[str]) -> dict[str, Any]:
    """Attributes among ``keys`` of a span, values as :func:`any_value` gives them."""
    if ref.raw is None:
        return {}
    data, off, length = ref.raw
    return _decoder(keys)(data, off, length)
