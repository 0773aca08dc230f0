"""Ring records and live slots → OTLP span bytes, per docs/span-schema.md.

One :class:`SpanBuilder` per source (rank context). It holds what never changes for
that context (its resource, which carries what all its spans share: sc.RESOURCE_SPAN_ATTRS) and builds:

* ``op_spans(records, ...)``: the completed ``nccl.<Func>`` spans of a batch of ring
  records, vectorised over the batch (numpy column encoders in :mod:`.otlp`);
* ``op_span_generic(...)``: the same span through the generic writer — the readable
  reference the fast path is tested against byte for byte, and the path for
  in-flight snapshots;
* ``inflight_span``, ``status_span``, ``summary_span``.

Ids come from :mod:`mycroft_otel.ids`; names and keys from :mod:`mycroft_otel.semconv`.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any, Sequence

import numpy as np

import mycroft_otel
from mycroft_otel import ids
from mycroft_otel import semconv as sc
from mycroft_otel.agent import otlp
from mycroft_otel.agent.source import RingSource

# Name tables of native/include/mycroft/shm_layout.h (ABI facts; tests compare with _native's).
FUNC_NAMES = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce", "SendRecv", "Send", "Recv",
              "AllToAll", "Gather", "Scatter")
DATATYPE_NAMES = ("ncclInt8", "ncclUint8", "ncclInt32", "ncclUint32", "ncclInt64", "ncclUint64", "ncclFloat16",
                  "ncclFloat32", "ncclFloat64", "ncclBfloat16", "ncclFloat8e4m3", "ncclFloat8e5m2")
ALGO_NAMES = ("Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT")
PROTO_NAMES = ("LL", "LL128", "Simple")
KIND_NAMES = ("none", "coll", "send", "recv")
DIR_NAMES = ("send", "recv")
KIND_COLL, KIND_SEND, KIND_RECV = 1, 2, 3
ROOTED_FUNCS = (0, 1, 9, 10)  # Broadcast, Reduce, Gather, Scatter
FLAG_KERNEL_TIMES = 1 << 1
FLAG_KERNEL_PHASES = 1 << 3
MAX_KERNEL_CHANNELS = 32  # shm_layout.h kMaxKernelChannels
STATUS_INDEX = {k: i for i, k in enumerate(sc.STATUS_KINDS)}

SCOPE = otlp.scope("mycroft_otel.agent", mycroft_otel.__version__)


def _name(table: Sequence[str], i: int, unknown: str | None = "unknown") -> str | None:
    return table[i] if 0 <= i < len(table) else unknown


def func_name(i: int) -> str:
    return _name(FUNC_NAMES, i, "Unknown")


def busbw_factor(func: int, nranks: int) -> float:
    n = max(nranks, 1)
    if func == 4:  # AllReduce
        return 2.0 * (n - 1) / n
    if func in (2, 3, 8):  # AllGather, ReduceScatter, AllToAll: bytes are per rank (nccl-tests: x n x (n-1)/n)
        return float(n - 1)
    return 1.0


# Flow array attributes: (key, Flow field); the times among them (sc.FLOW_OFFSETS) travel as offsets
_FLOW_INT_FIELDS = (
    (sc.FLOW_CHANNEL, "channel"),
    None,  # direction (string)
    (sc.FLOW_PEER, "peer"),
    (sc.FLOW_STEPS, "n_steps"),
    (sc.FLOW_POSTED, "posted"),
    (sc.FLOW_READY, "ready"),
    (sc.FLOW_TRANSMITTED, "transmitted"),
    (sc.FLOW_DONE, "done"),
    (sc.FLOW_BYTES, "bytes"),
    (sc.FLOW_START, "first_ns"),
    (sc.FLOW_END, "end_ns"),
    (sc.FLOW_LAST_PROGRESS, "last_progress_ns"),
    None,  # wait state (string)
    (sc.FLOW_WAIT_STEP, "wait_step"),
    (sc.FLOW_WAIT_SINCE, "wait_since_ns"),
    (sc.FLOW_GPU_WAIT, "gpu_wait_ns"),
    (sc.FLOW_NET_WAIT, "net_wait_ns"),
    (sc.FLOW_GPU_BUSY, "gpu_busy_ns"),
    (sc.FLOW_NET_BUSY, "net_busy_ns"),
    (sc.FLOW_PEER_BUSY, "peer_busy_ns"),
)
# Flow arrays sent even when every element is 0: the channel gives the row count, and a reader's default for a
# missing peer is -1 (unknown), not 0. An array of sc.FLOW_SAME_AS is left out when it equals the array named
# there; any other whose elements are all 0 (or all "") is left out: it reads as zeros (docs/span-schema.md) --
# on a completed op the wait state, step and since are always so.
_FLOW_ALWAYS = frozenset({sc.FLOW_CHANNEL, sc.FLOW_PEER})
_DIR_ELEM = [otlp.ld(1, otlp.any_value(n)) for n in DIR_NAMES]
_WAIT_ELEM = [otlp.ld(1, otlp.any_value(n)) for n in sc.WAIT_STATE_NAMES]
_KF = {}


def _has(obj: Any, key: str) -> bool:
    """Whether a record (numpy structured value, or a dict as tests and snapshots pass) has ``key``."""
    names = getattr(getattr(obj, "dtype", None), "names", None)
    if names is not None:
        return key in names
    return isinstance(obj, dict) and key in obj


def _gpu_span(start: int, end: int) -> int:
    """A GPU-timed interval in ns, -1 when NCCL did not report both ends."""
    return end - start if start and end and end >= start else -1


def user_tag_attribute(tag: int) -> list[tuple[str, Any]]:
    """The v7 userTag (0 = untagged: nothing); OTLP ints are signed, so the 64 bits wrap."""
    return [(sc.COLL_USER_TAG, tag - (1 << 64) if tag >= 1 << 63 else tag)] if tag else []


def kernel_attributes(op: Any, kch: np.ndarray | None) -> list[tuple[str, Any]]:
    """The v7 user tag and, where NCCL sent KernelPhase events, the per-channel kernel times (span-schema.md).

    Empty for an untagged op without phases: spans from v4..v6 (no tag, no phases), from v7 without
    KernelPhase in the mask, and from readers without these fields carry nothing new. (KernelCh alone
    gives every op channel times; they are not exported: the phases are what explains a wait.)
    """
    out = user_tag_attribute(int(op["user_tag"])) if _has(op, "user_tag") else []
    valid = int(op["kch_valid"]) if _has(op, "kch_valid") else 0
    if not valid or kch is None or not int(op["flags"]) & FLAG_KERNEL_PHASES:
        return out
    chans = [c for c in range(min(MAX_KERNEL_CHANNELS, len(kch))) if valid >> c & 1]
    if not chans:
        return out
    k = kch[chans]
    st, en = k["start_ns"].tolist(), k["end_ns"].tolist()
    out += [(sc.KERNEL_CH_CHANNEL, chans), (sc.KERNEL_CH_DURATION, [_gpu_span(a, b) for a, b in zip(st, en)])]
    ps, pe = k["phase_start_ns"].tolist(), k["phase_end_ns"].tolist()
    for i, key in enumerate((sc.KERNEL_INITIAL_SYNC, sc.KERNEL_COMPUTE, sc.KERNEL_FINAL_SYNC)):
        out.append((key, [_gpu_span(a[i], b[i]) for a, b in zip(ps, pe)]))
    return out


def _kf(key: str) -> bytes:
    b = _KF.get(key)
    if b is None:
        b = _KF[key] = otlp.key_field(key)
    return b


def _attr(key: str, value: Any) -> bytes:
    return otlp.ld(9, _kf(key) + otlp.ld(2, otlp.any_value(value)))


def _str_table(key: str, names: Sequence[str], unknown: str | None) -> list[bytes]:
    """Encoded attribute per index 0..255 (b'' where the attribute is absent)."""
    out = []
    for i in range(256):
        n = _name(names, i, unknown)
        out.append(b"" if n is None else _attr(key, n))
    return out


_FUNC_ATTR = _str_table(sc.COLL_FUNC, FUNC_NAMES, "Unknown")
_KIND_ATTR = _str_table(sc.OP_KIND, KIND_NAMES, "unknown")
_DT_ATTR = _str_table(sc.COLL_DATATYPE, DATATYPE_NAMES, "unknown")
_ALGO_ATTR = _str_table(sc.COLL_ALGO, ALGO_NAMES, None)
_PROTO_ATTR = _str_table(sc.COLL_PROTO, PROTO_NAMES, None)
_NAME_FIELD = [otlp.ld(5, sc.op_span_name(func_name(i)).encode()) for i in range(256)]
_STATE_ATTR = {s: _attr(sc.OP_STATE, s) for s in (sc.OP_STATE_COMPLETED, sc.OP_STATE_IN_FLIGHT)}


class SpanBuilder:
    def __init__(self, src: RingSource, service_name: str, resource_extra: Sequence[tuple[str, Any]] = (),
                 detail_chunk: bool = False, shard_ranks: int = 0):
        """``shard_ranks``: MYCROFT_SHARD_RANKS (0: the job is one shard). A rank whose global rank is unknown
        carries no shard: the gateway routes it with the job's unsharded spans."""
        self.src = src
        self.detail_chunk = detail_chunk
        res: list[tuple[str, Any]] = [
            (sc.SERVICE_NAME, service_name), (sc.HOST_NAME, src.host), (sc.PROCESS_PID, src.pid),
        ]
        if src.cuda_device >= 0:
            res.append((sc.HW_ID, str(src.cuda_device)))
        res += [(sc.HW_TYPE, "gpu"), (sc.JOB_ID, src.job_id)]
        if shard_ranks > 0 and src.global_rank >= 0:
            res.append((sc.JOB_SHARD, src.global_rank // shard_ranks))
        res += [(sc.PLUGIN_VERSION, src.plugin_version), (sc.NCCL_PROFILER_ABI, src.abi_version),
                (sc.COMM_HASH, src.comm_hex)]
        if src.comm_name:
            res.append((sc.COMM_NAME, src.comm_name))
        res += [(sc.COMM_NRANKS, src.nranks), (sc.COMM_NNODES, src.nnodes), (sc.RANK, src.rank)]
        if src.global_rank >= 0:
            res.append((sc.GLOBAL_RANK, src.global_rank))
        if src.local_rank >= 0:
            res.append((sc.LOCAL_RANK, src.local_rank))
        if src.provenance is not None:
            res += src.provenance.attributes()
        seen = {k for k, _ in res}
        res += [(k, v) for k, v in resource_extra if k not in seen]
        self.resource = otlp.resource(res)
        self.resource_attrs = res
        self._link_attr_cache: dict[tuple, bytes] = {}

    # --- ids ---------------------------------------------------------------------------
    def trace_id(self, kind: int, seq: int, peer: int) -> int:
        s = self.src
        if kind == KIND_SEND:
            return ids.p2p_trace_id(s.trace_job, s.comm_hash, s.rank, peer, seq)
        if kind == KIND_RECV:
            return ids.p2p_trace_id(s.trace_job, s.comm_hash, peer, s.rank, seq)
        return ids.coll_trace_id(s.trace_job, s.comm_hash, seq)

    def trace_ids(self, ops: np.ndarray) -> list[int]:
        return [self.trace_id(k, q, p) for k, q, p in
                zip(ops["kind"].tolist(), ops["seq"].tolist(), ops["root_or_peer"].tolist())]

    # --- links -------------------------------------------------------------------------
    def _link_attrs(self, role: str, peer: int) -> bytes:
        key = (role, peer)
        b = self._link_attr_cache.get(key)
        if b is None:
            if len(self._link_attr_cache) > 4096:
                self._link_attr_cache.clear()
            b = self._link_attr_cache[key] = otlp.attributes(4, [(sc.LINK_ROLE, role), (sc.LINK_PEER, peer)])
        return b

    def links(self, trace: int, kind: int, root_or_peer: int, chans: list, dirs: list, peers: list) -> list[bytes]:
        """One link per peer and direction: the peer's op span, which this rank feeds (send_to) or waits on
        (recv_from). A ring's channels all link the same two neighbours; which flow goes where is in the flow
        arrays, so a link per flow would only repeat them."""
        tb = trace.to_bytes(16, "big")
        if not chans and kind in (KIND_SEND, KIND_RECV) and root_or_peer >= 0:
            dirs, peers = [0 if kind == KIND_SEND else 1], [root_or_peer]
        out = []
        seen: set[tuple[int, int]] = set()
        for d, p in zip(dirs, peers):
            d &= 1
            if p < 0 or (d, p) in seen:
                continue
            seen.add((d, p))
            sid = ids.span_id(trace, p, sc.ROLE_OP).to_bytes(8, "big")
            role = sc.LINK_SEND_TO if d == 0 else sc.LINK_RECV_FROM
            out.append(otlp.ld(13, otlp.link(tb, sid, self._link_attrs(role, p))))
        return out

    def snapshot_of_link(self, trace: int) -> bytes:
        tb = trace.to_bytes(16, "big")
        own = ids.span_id(trace, self.src.rank, sc.ROLE_OP).to_bytes(8, "big")
        return otlp.ld(13, otlp.link(tb, own, otlp.attributes(4, [(sc.LINK_ROLE, sc.LINK_SNAPSHOT_OF)])))

    # --- attributes (generic, readable reference) -----------------------------------------
    def op_attributes(self, op: Any, flows: np.ndarray, state: str, span_end: int, *, anomaly: str | None = None,
                      baseline: int | None = None, gap: int | None = None, snapshot: int | None = None,
                      stopped: bool | None = None, recent: int | None = None,
                      kch: np.ndarray | None = None, step_index: int = -1) -> list[tuple[str, Any]]:
        s = self.src
        r = s.to_real
        span_start = self.start_end(op)[0]
        kind, func = int(op["kind"]), int(op["func"])
        peer = int(op["root_or_peer"])
        seq, nseq = int(op["seq"]), int(op["nccl_seq"])
        a: list[tuple[str, Any]] = [(sc.COLL_SEQ, seq)]
        if step_index >= 0:
            a.append((sc.COLL_STEP_INDEX, step_index))
        a += [(sc.COLL_FUNC, func_name(func)), (sc.OP_KIND, _name(KIND_NAMES, kind)), (sc.OP_STATE, state)]
        if nseq != seq:  # a missing one reads as the collective number
            a.append((sc.NCCL_SEQ, nseq))
        a += [(sc.COLL_COUNT, int(op["count"])), (sc.COLL_BYTES, int(op["bytes"])),
              (sc.COLL_DATATYPE, _name(DATATYPE_NAMES, int(op["datatype"])))]
        if kind == KIND_COLL and func in ROOTED_FUNCS:
            a.append((sc.COLL_ROOT, peer))
        a += [(sc.COLL_ALGO, _name(ALGO_NAMES, int(op["algo"]), None)),
              (sc.COLL_PROTO, _name(PROTO_NAMES, int(op["proto"]), None)),
              (sc.COLL_NCHANNELS, int(op["n_channels"]))]
        if kind in (KIND_SEND, KIND_RECV):
            src_, dst = (s.rank, peer) if kind == KIND_SEND else (peer, s.rank)
            a += [(sc.P2P_PEER, peer), (sc.P2P_SRC, src_), (sc.P2P_DST, dst)]
        start, end = int(op["start_ns"]), int(op["end_ns"])
        # times the span's own start and end already say are left out (docs/span-schema.md): the API call is
        # its start when known (sc.TIME_API is never sent), a completed op's end is its end
        a += [(sc.TIME_ENQUEUE, r(start)), (sc.TIME_LAUNCH, r(int(op["launch_ns"])))]
        a += [(k, t) for k, t in ((sc.TIME_END, r(end)), (sc.TIME_LAST_PROGRESS, r(int(op["last_progress_ns"]))))
              if t != span_end]
        ks, ke = int(op["kernel_start_ns"]), int(op["kernel_end_ns"])
        if int(op["flags"]) & FLAG_KERNEL_TIMES and ke > ks:
            a.append((sc.KERNEL_DURATION, ke - ks))
        if end > start:
            a.append((sc.BUS_BW, int(op["bytes"]) * busbw_factor(func, s.nranks) / (end - start)))
        n = min(int(op["n_flows"]), len(flows))
        for key, pair, whole in ((sc.PROXY_OPS, [int(op["proxy_ops_started"]), int(op["proxy_ops_stopped"])], n),
                                 (sc.KERNEL_CHANNELS, [int(op["kernel_ch_started"]), int(op["kernel_ch_stopped"])],
                                  int(op["n_channels"]))):
            if pair != [whole, whole]:  # a missing pair reads as the whole (semconv.PROXY_OPS)
                a.append((key, pair))
        a += kernel_attributes(op, kch)
        if snapshot is not None:
            a.append((sc.SNAPSHOT_SEQ, snapshot))
        if anomaly:
            a.append((sc.ANOMALY, anomaly))
            if baseline is not None:
                a.append((sc.BASELINE_NS, int(baseline)))
            if gap is not None:
                a.append((sc.GAP_NS, int(gap)))
            if recent:
                a.append((sc.ANOMALY_RECENT, int(recent)))
        if stopped is not None:
            a.append((sc.PROCESS_STOPPED, bool(stopped)))
        if n:
            f = flows[:n]
            cols: dict[str, list[int]] = {}
            waiting = [int(w) != 0 for w in f["wait_state"].tolist()]
            for spec in _FLOW_INT_FIELDS:
                if spec is None:
                    continue
                key, field = spec
                vals = cols[key] = [int(v) for v in f[field].tolist()]
                if key == sc.FLOW_WAIT_STEP:  # the step a flow waits on: none when it waits on nothing
                    vals = cols[key] = [v if w else 0 for v, w in zip(vals, waiting)]
                is_time = key in sc.FLOW_OFFSETS
                if is_time:
                    vals = cols[key] = [r(v) for v in vals]
                same = sc.FLOW_SAME_AS.get(key)
                if (vals != cols[same]) if same else (any(vals) or key in _FLOW_ALWAYS):
                    a.append((key, [sc.flow_offset(v, span_start) for v in vals] if is_time else vals))
                if key == sc.FLOW_CHANNEL:
                    a.append((sc.FLOW_DIRECTION, [DIR_NAMES[int(d) & 1] for d in f["dir"].tolist()]))
                elif key == sc.FLOW_LAST_PROGRESS:
                    waits = [_name(sc.WAIT_STATE_NAMES, int(w), "") for w in f["wait_state"].tolist()]
                    if any(waits):
                        a.append((sc.FLOW_WAIT_STATE, waits))
        return a

    def flow_events(self, op: Any, flows: np.ndarray) -> list[bytes]:
        """MYCROFT_DETAIL=chunk: per-flow start/wait/end events (see docs/span-schema.md)."""
        r = self.src.to_real
        out = []
        for f in flows[:int(op["n_flows"])]:
            attrs = [(sc.FLOW_CHANNEL, int(f["channel"])), (sc.FLOW_DIRECTION, DIR_NAMES[int(f["dir"]) & 1]),
                     (sc.FLOW_PEER, int(f["peer"])), (sc.FLOW_STEPS, int(f["n_steps"])),
                     (sc.FLOW_POSTED, int(f["posted"])), (sc.FLOW_READY, int(f["ready"])),
                     (sc.FLOW_TRANSMITTED, int(f["transmitted"])), (sc.FLOW_DONE, int(f["done"])),
                     (sc.FLOW_BYTES, int(f["bytes"])), (sc.FLOW_WAIT_STATE,
                                                       _name(sc.WAIT_STATE_NAMES, int(f["wait_state"]), "")),
                     (sc.FLOW_WAIT_STEP, int(f["wait_step"]))]
            if int(f["first_ns"]):
                out.append(otlp.ld(11, otlp.event(r(int(f["first_ns"])), "mycroft.flow.start", attrs)))
            if int(f["wait_state"]) and int(f["wait_since_ns"]):
                out.append(otlp.ld(11, otlp.event(r(int(f["wait_since_ns"])), "mycroft.flow.wait", attrs)))
            if int(f["end_ns"]):
                out.append(otlp.ld(11, otlp.event(r(int(f["end_ns"])), "mycroft.flow.end", attrs)))
        return out

    def start_end(self, op: Any) -> tuple[int, int]:
        """A completed op span's start (the API call when known, else the enqueue) and end, realtime ns."""
        api, start = int(op["api_ns"]), int(op["start_ns"])
        return self.src.to_real(api or start), self.src.to_real(int(op["end_ns"]))

    def op_span_generic(self, rec: Any, anomaly: str | None = None, baseline: int | None = None,
                        gap: int | None = None, recent: int | None = None, *, step_index: int = -1) -> bytes:
        """A completed op span, slow and readable (reference for :meth:`op_spans`)."""
        op, flows = rec["op"], rec["flows"]
        kind, peer = int(op["kind"]), int(op["root_or_peer"])
        trace = self.trace_id(kind, int(op["seq"]), peer)
        start, end = self.start_end(op)
        n = int(op["n_flows"])
        f = flows[:n]
        links = self.links(trace, kind, peer, f["channel"].tolist(), f["dir"].tolist(), f["peer"].tolist())
        attrs = self.op_attributes(op, flows, sc.OP_STATE_COMPLETED, end, anomaly=anomaly, baseline=baseline,
                                   gap=gap, recent=recent, kch=_kch_of(rec), step_index=step_index)
        events = self.flow_events(op, flows) if self.detail_chunk else []
        return otlp.span(trace.to_bytes(16, "big"), ids.span_id(trace, self.src.rank, sc.ROLE_OP).to_bytes(8, "big"),
                         sc.op_span_name(func_name(int(op["func"]))), start, end, attrs, links, events)

    # --- the hot path: a batch of completed records -------------------------------------
    def op_spans(self, recs: np.ndarray, traces: Sequence[int], anomalies: Sequence[tuple | None],
                 step_indices: Sequence[int] | None = None) -> list[bytes]:
        """Completed op spans of ``recs`` (RING_RECORD_DTYPE), vectorised; byte-identical to the generic path.

        ``traces``: trace id per record; ``anomalies``: (kind, baseline, gap[, recent]) or None per record;
        ``step_indices``: each collective's place in its training step (StepPattern; -1 or None: not known).
        """
        R = len(recs)
        if R == 0:
            return []
        s = self.src
        off = s.mono_to_real
        ops = recs["op"]
        kind = ops["kind"].astype(np.int64)
        func = ops["func"].astype(np.int64)
        peer = ops["root_or_peer"].astype(np.int64)
        start = ops["start_ns"].astype(np.int64)
        end = ops["end_ns"].astype(np.int64)
        api = ops["api_ns"].astype(np.int64)
        nbytes = ops["bytes"].astype(np.int64)

        def real(v: np.ndarray) -> np.ndarray:
            v = v.astype(np.int64)
            return np.where(v != 0, v + off, 0)

        def col(key: str, values: np.ndarray) -> list[bytes]:
            blob, ends = otlp.int_attr_column(key, values.astype(np.int64).view(np.uint64))
            return otlp.split(blob, ends, np.ones(R, dtype=np.int64))

        kl, fl, dl = kind.tolist(), func.tolist(), ops["datatype"].tolist()
        al, pl = ops["algo"].tolist(), ops["proto"].tolist()
        peer_l, api_l, start_l, end_l = peer.tolist(), api.tolist(), start.tolist(), end.tolist()
        nb_l = nbytes.tolist()
        c_seq = col(sc.COLL_SEQ, ops["seq"])
        c_nseq = col(sc.NCCL_SEQ, ops["nccl_seq"])
        nseq_new_l = (ops["nccl_seq"] != ops["seq"]).tolist()
        c_count = col(sc.COLL_COUNT, ops["count"])
        c_bytes = col(sc.COLL_BYTES, nbytes)
        c_nch = col(sc.COLL_NCHANNELS, ops["n_channels"])
        c_enq = col(sc.TIME_ENQUEUE, real(start))
        c_launch = col(sc.TIME_LAUNCH, real(ops["launch_ns"]))
        # (sc.TIME_API is the span's start and sc.TIME_END its end: left out, as op_attributes leaves them)
        lp = real(ops["last_progress_ns"])
        c_lp = col(sc.TIME_LAST_PROGRESS, lp)
        lp_new_l = (lp != real(end)).tolist()
        # [started, stopped] pairs, left out where both are the whole (semconv.PROXY_OPS)
        nflows = np.minimum(ops["n_flows"].astype(np.int64), recs["flows"].shape[1])
        pairs = []
        for key, a_, b_, whole in ((sc.PROXY_OPS, "proxy_ops_started", "proxy_ops_stopped", nflows),
                                   (sc.KERNEL_CHANNELS, "kernel_ch_started", "kernel_ch_stopped",
                                    ops["n_channels"].astype(np.int64))):
            started, stopped = ops[a_].astype(np.int64), ops[b_].astype(np.int64)
            m = np.stack([started, stopped], axis=1).reshape(-1)
            blob, ends = otlp.int_array_elements(m.view(np.uint64))
            kf = _kf(key)
            keep = ((started != whole) | (stopped != whole)).tolist()
            pairs.append([otlp.array_attr(kf, e) if k else b""
                          for e, k in zip(otlp.split(blob, ends, np.full(R, 2, dtype=np.int64)), keep)])
        flags_l = ops["flags"].tolist()
        ks_l, ke_l = ops["kernel_start_ns"].tolist(), ops["kernel_end_ns"].tolist()
        names = ops.dtype.names or ()
        kch_all = recs["kch"] if "kch" in (recs.dtype.names or ()) else [None] * R
        tags_l = ops["user_tag"].tolist() if "user_tag" in names else [0] * R
        phases_l = ((ops["flags"] & FLAG_KERNEL_PHASES) != 0).tolist()

        # flows
        fmask = np.arange(recs["flows"].shape[1])[None, :] < nflows[:, None]
        fl_all = recs["flows"][fmask]  # row-major: record by record
        flow_cols: list[list[bytes]] = []
        # record of each flow row, to tell per record whether a column has any non-zero element
        row_rec = np.repeat(np.arange(R), nflows)
        flow_t0 = real(np.where(api != 0, api, start))[row_rec]  # each flow's span start
        cols: dict[str, np.ndarray] = {}
        for spec in _FLOW_INT_FIELDS:
            if spec is None:
                continue
            key, field = spec
            v = cols[key] = fl_all[field].astype(np.int64)
            if key == sc.FLOW_WAIT_STEP:  # the step a flow waits on: none when it waits on nothing
                v = cols[key] = np.where(fl_all["wait_state"] != 0, v, 0)
            if key in sc.FLOW_OFFSETS:  # (semconv.flow_offset, by the array)
                v = cols[key] = np.where(v != 0, v + off, 0)
                wire = np.where(v != 0, np.maximum(v - flow_t0, 0), sc.FLOW_NOT_YET)
            else:
                wire = v
            blob, ends = otlp.int_array_elements(wire.view(np.uint64))
            kf = _kf(key)
            same = sc.FLOW_SAME_AS.get(key)
            if key in _FLOW_ALWAYS:
                send = nflows > 0
            else:  # a record keeps the array where one of its flows differs from what it reads as when left out
                send = np.bincount(row_rec[v != (cols[same] if same else 0)], minlength=R) > 0
            flow_cols.append([otlp.array_attr(kf, e) if keep else b""
                              for e, keep in zip(otlp.split(blob, ends, nflows), send.tolist())])
            if key == sc.FLOW_CHANNEL:
                flow_cols.append(self._str_flow_col(sc.FLOW_DIRECTION, fl_all["dir"].astype(np.int64) & 1,
                                                    _DIR_ELEM, nflows, nflows > 0))
            elif key == sc.FLOW_LAST_PROGRESS:
                w = fl_all["wait_state"].astype(np.int64)
                w = np.where(w < len(_WAIT_ELEM), w, 0)
                flow_cols.append(self._str_flow_col(sc.FLOW_WAIT_STATE, w, _WAIT_ELEM, nflows,
                                                    np.bincount(row_rec[w != 0], minlength=R) > 0))
        flow_bodies = [b"".join(parts) for parts in zip(*flow_cols)]
        nfl = nflows.tolist()
        ch_all = fl_all["channel"].tolist()
        dir_all = (fl_all["dir"].astype(np.int64) & 1).tolist()
        peer_all = fl_all["peer"].tolist()

        rank_b = s.rank
        completed = _STATE_ATTR[sc.OP_STATE_COMPLETED]
        out = []
        fo = 0
        for i in range(R):
            k, fn = kl[i], fl[i]
            trace = traces[i]
            tb = trace.to_bytes(16, "big")
            p = peer_l[i]
            parts = [c_seq[i]]
            if step_indices is not None and step_indices[i] >= 0:
                parts.append(_attr(sc.COLL_STEP_INDEX, step_indices[i]))
            parts += [_FUNC_ATTR[fn], _KIND_ATTR[k], completed, c_nseq[i] if nseq_new_l[i] else b"",
                      c_count[i], c_bytes[i], _DT_ATTR[dl[i]]]
            if k == KIND_COLL and fn in ROOTED_FUNCS:
                parts.append(_attr(sc.COLL_ROOT, p))
            parts += [_ALGO_ATTR[al[i]], _PROTO_ATTR[pl[i]], c_nch[i]]
            if k in (KIND_SEND, KIND_RECV):
                src_, dst = (rank_b, p) if k == KIND_SEND else (p, rank_b)
                parts += [_attr(sc.P2P_PEER, p), _attr(sc.P2P_SRC, src_), _attr(sc.P2P_DST, dst)]
            parts += [c_enq[i], c_launch[i]]
            if lp_new_l[i]:
                parts.append(c_lp[i])
            if flags_l[i] & FLAG_KERNEL_TIMES and ke_l[i] > ks_l[i]:
                parts.append(_attr(sc.KERNEL_DURATION, ke_l[i] - ks_l[i]))
            st, en = start_l[i], end_l[i]
            if en > st:
                parts.append(_attr(sc.BUS_BW, nb_l[i] * busbw_factor(fn, s.nranks) / (en - st)))
            parts += [pairs[0][i], pairs[1][i]]
            if phases_l[i]:
                parts += [_attr(key, v) for key, v in kernel_attributes(ops[i], kch_all[i])]
            elif tags_l[i]:
                parts += [_attr(key, v) for key, v in user_tag_attribute(tags_l[i])]
            an = anomalies[i]
            if an is not None and an[0]:
                parts.append(_attr(sc.ANOMALY, an[0]))
                if an[1] is not None:
                    parts.append(_attr(sc.BASELINE_NS, int(an[1])))
                if an[2] is not None:
                    parts.append(_attr(sc.GAP_NS, int(an[2])))
                if len(an) > 3 and an[3]:
                    parts.append(_attr(sc.ANOMALY_RECENT, int(an[3])))
            parts.append(flow_bodies[i])
            n = nfl[i]
            if self.detail_chunk:
                parts += self.flow_events(recs[i]["op"], recs[i]["flows"])
            parts += self.links(trace, k, p, ch_all[fo:fo + n], dir_all[fo:fo + n], peer_all[fo:fo + n])
            fo += n
            t0 = api_l[i] or st
            head = otlp.span_head(tb, ids.span_id(trace, rank_b, sc.ROLE_OP).to_bytes(8, "big"), _NAME_FIELD[fn],
                                  t0 + off if t0 else 0, en + off if en else 0)
            out.append(head + b"".join(parts))
        return out

    @staticmethod
    def _str_flow_col(key: str, codes: np.ndarray, table: list[bytes], nflows: np.ndarray,
                      send: np.ndarray) -> list[bytes]:
        elems = [table[c] for c in codes.tolist()]
        kf = _kf(key)
        out, o = [], 0
        for n, keep in zip(nflows.tolist(), send.tolist()):
            out.append(otlp.array_attr(kf, b"".join(elems[o:o + n])) if keep else b"")
            o += n
        return out

    # --- in-flight, status, summary ----------------------------------------------------------
    def inflight_span(self, slot: Any, k: int, now_real: int, anomaly: str, stopped: bool) -> bytes:
        op, flows = slot["op"], slot["flows"]
        kind, peer = int(op["kind"]), int(op["root_or_peer"])
        trace = self.trace_id(kind, int(op["seq"]), peer)
        start, _ = self.start_end(op)
        end = max(now_real, start)
        n = int(op["n_flows"])
        f = flows[:n]
        links = [self.snapshot_of_link(trace)] + self.links(
            trace, kind, peer, f["channel"].tolist(), f["dir"].tolist(), f["peer"].tolist())
        attrs = self.op_attributes(op, flows, sc.OP_STATE_IN_FLIGHT, end, anomaly=anomaly, snapshot=k,
                                   stopped=stopped)
        events = self.flow_events(op, flows) if self.detail_chunk else []
        return otlp.span(trace.to_bytes(16, "big"),
                         ids.span_id(trace, self.src.rank, sc.ROLE_INFLIGHT, k).to_bytes(8, "big"),
                         sc.INFLIGHT_SPAN, start, end, attrs, links, events)

    def status_span(self, kind: str, trace: int, seq: int, last_seq: int, idle_since_real: int, now_real: int,
                    last_state: str, stopped: bool, func: str | None = None) -> bytes:
        attrs = [(sc.COLL_SEQ, seq)]
        if func:
            attrs.append((sc.COLL_FUNC, func))
        attrs += [(sc.STATUS_KIND, kind), (sc.STATUS_LAST_SEQ, last_seq), (sc.STATUS_IDLE_SINCE, idle_since_real),
                  (sc.STATUS_LAST_STATE, last_state), (sc.PROCESS_STOPPED, stopped)]
        return otlp.span(trace.to_bytes(16, "big"),
                         ids.span_id(trace, self.src.rank, sc.ROLE_STATUS, STATUS_INDEX[kind]).to_bytes(8, "big"),
                         sc.STATUS_SPAN, idle_since_real, max(now_real, idle_since_real), attrs,
                         [self.snapshot_of_link(trace)])

    def summary_span(self, window_start_real: int, window_end_real: int, attrs: list[tuple[str, Any]]) -> bytes:
        s = self.src
        h = hashlib.blake2b(digest_size=24, person=b"mycroft-summ")
        h.update(struct.pack("<QiQ", s.comm_hash, s.rank, window_start_real))
        h.update(s.trace_job.encode())
        d = h.digest()
        trace = d[:16] if any(d[:16]) else b"\x00" * 15 + b"\x01"
        sid = d[16:] if any(d[16:]) else b"\x00" * 7 + b"\x01"
        try:
            plugin = bad_handle_attributes(s.reader.header())
        except (ValueError, AttributeError):  # reader closed, or a reader without a header
            plugin = []
        return otlp.span(trace, sid, sc.SUMMARY_SPAN, window_start_real, window_end_real,
                         [(sc.SUMMARY_WINDOW_START, window_start_real)] + attrs + plugin)


def _kch_of(rec: Any) -> np.ndarray | None:
    return rec["kch"] if _has(rec, "kch") else None


def bad_handle_attributes(header: dict) -> list[tuple[str, Any]]:
    """The plugin's cumulative bad-handle counts by callback kind (non-zero kinds only) and its
    kept late KernelCh stops, for the summary span; empty when there is nothing to report."""
    kinds = header.get("bad_handle_by_kind") or {}
    nz = [(k, int(v)) for k, v in kinds.items() if int(v)]
    out: list[tuple[str, Any]] = []
    if nz:
        out += [(sc.SUMMARY_BAD_HANDLE_KINDS, [k for k, _ in nz]), (sc.SUMMARY_BAD_HANDLES, [v for _, v in nz])]
    late = int(header.get("late_kernel_stops") or 0)
    if late:
        out.append((sc.SUMMARY_LATE_KERNEL_STOPS, late))
    return out


def last_state_text(op: Any, flows: np.ndarray) -> str:
    """One human line about where an in-flight op stands (mycroft.status.last_state)."""
    parts = []
    for f in flows[:int(op["n_flows"])]:
        w = int(f["wait_state"])
        wname = _name(sc.WAIT_STATE_NAMES, w, "?") or "idle"
        parts.append(f"ch{int(f['channel'])} {DIR_NAMES[int(f['dir']) & 1]}->{int(f['peer'])} "
                     f"{wname} step {int(f['wait_step'])} ({int(f['done'])}/{int(f['n_steps'])} done)")
    head = f"in {func_name(int(op['func']))} seq {int(op['seq'])}"
    return head + (": " + ", ".join(parts) if parts else ": no network flows")
