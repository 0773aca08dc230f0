"""Collective performance metrics from the agent's completion records (OpenTelemetry metrics).

Every completed operation the agent drains from a ring (all of them, not only the sampled ones
that become spans) is aggregated here, per batch, with numpy: no per-record SDK call, so the
cost grows with the number of batches and series, not with the collective rate. The aggregates
are exported by the OpenTelemetry SDK's ``MeterProvider`` and its OTLP metric exporter (built in
:mod:`.meter`), configured by the standard variables (``OTEL_METRICS_EXPORTER``, ``OTEL_EXPORTER_OTLP_METRICS_*`` /
``OTEL_EXPORTER_OTLP_*``, ``OTEL_METRIC_EXPORT_INTERVAL``):

=================================  =========  ==========  =======================================================
instrument                         type       unit        attributes
=================================  =========  ==========  =======================================================
``mycroft.collective.duration``    histogram  ``s``       comm, func, size bucket
``mycroft.collective.bus_bandwidth`` histogram ``By/s``   comm, func, size bucket (NCCL's busBw)
``mycroft.network.wait.time``      counter    ``s``       comm, peer rank, direction (send | recv)
``mycroft.collective.in_flight``   gauge      ``{operation}`` comm, rank
``mycroft.collective.last_sequence`` gauge    ``{collective}`` comm, rank, host (the lag gauge)
=================================  =========  ==========  =======================================================

"comm" is the communicator's identity on every series: ``mycroft.comm.hash``, ``mycroft.job.id`` (the
ring's job, when it has one) and ``mycroft.comm.kind`` (``intra_node`` when NCCL counts one node in the
communicator, ``inter_node`` when more; absent when the plugin could not tell). The job is a data point
attribute, not a resource attribute, because one node agent serves every job on its node; none of the
three adds series (a communicator belongs to one job and has one node count). The node is the resource:
``host.name`` and ``service.instance.id`` (the ``instance`` label in Prometheus).

The histograms are cumulative explicit-bucket histograms (whatever temporality the exporter
prefers) aggregated here and handed to the
exporter beside the SDK's own instruments (:class:`MergingExporter`), because the SDK's
``Histogram.record`` costs microseconds per value; the counter and gauges are SDK observable
instruments reading plain integers.

The duration histogram's exemplars are the operations the agent exported as spans (trace id and
op span id, the latest per bucket): a link from a bucket to a trace the backend holds, where a
trace-id label would make a series per collective.

Cardinality is bounded per agent (one node): at most ``MAX_COMMS`` communicators, ``MAX_RANKS``
(communicator, rank) pairs for the gauges and ``MAX_PEERS`` peers per communicator. What is over a
cap is counted in one overflow series carrying only ``otel.metric.overflow = true``, as the SDK
does for its own cardinality limit. Worst case per agent: duration and bus bandwidth 64 × 12
functions (NCCL's 11 and "Unknown") × 13 size buckets series each (in practice a communicator runs a few functions at
a few sizes), network wait 64 × 64 × 2, the gauges 512 each.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

from mycroft_otel import ids
from mycroft_otel import semconv as sc
from mycroft_otel.agent import spans as sp
from mycroft_otel.agent.source import RingSource
from mycroft_otel.native import ring_ops

SCOPE_NAME = "mycroft_otel.agent.collectives"

DURATION = "mycroft.collective.duration"
BUS_BANDWIDTH = "mycroft.collective.bus_bandwidth"
NETWORK_WAIT = "mycroft.network.wait.time"
IN_FLIGHT = "mycroft.collective.in_flight"
LAST_SEQUENCE = "mycroft.collective.last_sequence"

# attribute keys (data point attributes; comm hash, func and rank are those of the span schema)
ATTR_COMM = sc.COMM_HASH
ATTR_FUNC = sc.COLL_FUNC
ATTR_RANK = sc.RANK
ATTR_HOST = sc.HOST_NAME
ATTR_SIZE = "mycroft.coll.size_bucket"
ATTR_PEER = sc.FLOW_PEER
ATTR_DIRECTION = sc.FLOW_DIRECTION
ATTR_OVERFLOW = "otel.metric.overflow"
ATTR_JOB = sc.JOB_ID
ATTR_KIND = sc.COMM_KIND

MAX_COMMS = 64
MAX_RANKS = 512
MAX_PEERS = 64

# Seconds, 1 µs .. 10 min: a small LL all-reduce inside a node takes ~10 µs, a multi-GB
# all-gather across nodes seconds, a collective that waits on a stalled rank minutes.
DURATION_BOUNDS: tuple[float, ...] = (
    1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2,
    0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
# Bytes per second, 1 MB/s .. 1 TB/s: a socket transport on loopback to NVLink 5.
BANDWIDTH_BOUNDS: tuple[float, ...] = tuple(float(m * 10 ** e) for e in range(6, 12) for m in (1, 2, 5)) + (1e12,)

# Size buckets: powers of 4 bytes, labelled by their upper bound ("(256KiB, 1MiB]" is "1MiB");
# under 1 KiB is "1KiB", over 4 GiB is "inf".
_SIZE_EDGES = np.array([1 << (10 + 2 * i) for i in range(12)], dtype=np.uint64)  # 1KiB .. 4GiB
SIZE_LABELS: tuple[str, ...] = tuple(
    (f"{e >> 30}GiB" if e >= 1 << 30 else f"{e >> 20}MiB" if e >= 1 << 20 else f"{e >> 10}KiB")
    for e in _SIZE_EDGES.tolist()) + ("inf",)

_DUR_EDGES = np.asarray(DURATION_BOUNDS)
_BW_EDGES = np.asarray(BANDWIDTH_BOUNDS)
_NFUNC = 256
_DIRS = sp.DIR_NAMES
_OVERFLOW_ATTRS = {ATTR_OVERFLOW: True}
_UNKNOWN_FUNC = 255
_BINCOUNT_MAX = 1 << 16  # (peer, direction) keys below this are counted with bincount
#: completions a communicator's batches hold before they are folded into its histograms (~40 KB of op records)
FOLD_RECORDS = 256


def comm_kind(nnodes: int) -> str | None:
    """``intra_node`` / ``inter_node`` from NCCL's node count of the communicator; None when unknown (<= 0)."""
    if nnodes <= 0:
        return None
    return sc.COMM_KIND_INTRA_NODE if nnodes == 1 else sc.COMM_KIND_INTER_NODE


def comm_attributes(src: RingSource) -> dict[str, Any]:
    """The communicator's identity on every series: hash, job id (if any), kind (if known)."""
    attrs: dict[str, Any] = {ATTR_COMM: src.comm_hex}
    if src.job_id:
        attrs[ATTR_JOB] = src.job_id
    kind = comm_kind(src.nnodes)
    if kind is not None:
        attrs[ATTR_KIND] = kind
    return attrs


def size_bucket(nbytes: int) -> str:
    """The size bucket label of a message of ``nbytes`` bytes."""
    return SIZE_LABELS[int(np.searchsorted(_SIZE_EDGES, np.uint64(max(nbytes, 0)), side="left"))]


@dataclass
class _Hist:
    """One cumulative explicit-bucket histogram series."""
    bounds: np.ndarray
    counts: np.ndarray = None  # type: ignore[assignment]
    total: float = 0.0
    lo: float = float("inf")
    hi: float = float("-inf")
    # bucket -> (value, unix ns, trace id, span id) of the last exported operation that fell in it (the SDK's
    # aligned-bucket exemplar reservoir: at most one exemplar per bucket, the latest)
    exemplars: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.counts is None:
            self.counts = np.zeros(len(self.bounds) + 1, dtype=np.int64)

    def add(self, values: np.ndarray) -> None:
        # explicit buckets are upper-inclusive: bucket i holds (bounds[i-1], bounds[i]]
        self.counts += np.bincount(np.searchsorted(self.bounds, values, side="left"),
                                   minlength=len(self.counts))
        self.total += float(values.sum())
        self.lo = min(self.lo, float(values.min()))
        self.hi = max(self.hi, float(values.max()))


@dataclass
class _Comm:
    """Per communicator: its histograms by (func, size bucket) and network wait by (peer, direction), and the
    completions recorded since they were last folded in (:meth:`CollectiveMetrics.record`)."""
    attrs: dict
    duration: dict = field(default_factory=dict)        # (func, size) -> _Hist
    bandwidth: dict = field(default_factory=dict)       # (func, size) -> _Hist
    net_wait_ns: dict = field(default_factory=dict)     # (peer, dir) -> int
    ops: dict = field(default_factory=dict)             # nranks -> [op records], not folded in yet
    waits: list = field(default_factory=list)           # [(peer * 2 + dir, wait ns)], not folded in yet
    pending: int = 0


class CollectiveMetrics:
    """Aggregates completion records into the instruments above; thread-safe against the exporter.

    ``record`` and ``in_flight`` are called by the agent's poll loop; the exporter thread reads
    the aggregates at each collection.
    """

    def __init__(self, meter_provider: Any = None, *, max_comms: int = MAX_COMMS, max_ranks: int = MAX_RANKS,
                 max_peers: int = MAX_PEERS):
        self.max_comms, self.max_ranks, self.max_peers = max_comms, max_ranks, max_peers
        self.start_ns = time.time_ns()
        self._lock = threading.Lock()
        self._comms: dict[str, _Comm] = {}
        self._overflow = _Comm(dict(_OVERFLOW_ATTRS))
        self._last_seq: dict[tuple[str, int], tuple[int, str]] = {}   # (comm, rank) -> (seq, host)
        self._inflight: dict[tuple[str, int], int] = {}
        self._rank_attrs: dict[tuple[str, int], dict[str, Any]] = {}  # (comm, rank) -> the gauges' attributes
        self.records = 0
        if meter_provider is not None:
            self.register(meter_provider)

    # --- the poll loop's side --------------------------------------------------------------
    def record(self, src: RingSource, recs: np.ndarray) -> None:
        """Take a batch of completion records of one ring (the agent calls this for every batch it reads).

        A poll reads a few records per ring, and folding them into the histograms costs a few dozen numpy
        calls whatever their number: so a batch only keeps its op records (144 B each, not the ring's 10 KB
        with the flow slots) and its flows' network waits, and a communicator's batches are folded in
        together once they hold :data:`FOLD_RECORDS` completions, or when the exporter collects.
        """
        n = len(recs)
        if not n:
            return
        ops = recs["op"]
        nflows = ops["n_flows"]
        waits = None
        width = min(int(nflows.max()), recs["flows"].shape[1])  # (a hostile count beyond the record's slots)
        if width:  # network wait per (peer, direction) of the valid flows (a peer < 0 is none: dropped at the fold)
            fl = recs["flows"][:, :width]
            if not (nflows == width).all():  # (usually every op of a batch has as many flows)
                fl = fl[np.arange(width)[None, :] < nflows.astype(np.int64)[:, None]]
            waits = ((fl["peer"].astype(np.int64) * 2 + (fl["dir"] & 1)).ravel(), fl["net_wait_ns"].ravel())
        coll = ops["kind"] == sp.KIND_COLL
        last = int(ops["seq"][coll].max()) if coll.any() else -1
        with self._lock:
            self.records += n
            c = self._comm(src)
            # by rank count: the overflow series mixes communicators, and bus bandwidth needs each batch's own
            c.ops.setdefault(src.nranks, []).append(ring_ops(recs))
            if waits is not None:
                c.waits.append(waits)
            c.pending += n
            if c.pending >= FOLD_RECORDS:
                self._fold(c)
            if last >= 0:
                rk = self._rank_key(src)
                if rk is not None and last > self._last_seq.get(rk, (-1, ""))[0]:
                    self._last_seq[rk] = (last, src.host)

    def _fold(self, c: _Comm) -> None:
        """Fold a communicator's pending completions into its histograms and waits (holding the lock)."""
        for nranks, batches in c.ops.items():
            # joined as bytes: concatenating structured records promotes them field by field, more than the fold costs
            self._fold_ops(c, np.concatenate([b.view(np.uint8) for b in batches]).view(batches[0].dtype), nranks)
        pk = np.concatenate([k for k, _ in c.waits]) if c.waits else np.empty(0, dtype=np.int64)
        has_peer = pk >= 0
        if has_peer.any():
            pk = pk[has_peer]
            w = np.concatenate([v for _, v in c.waits])[has_peer].astype(np.float64)
            if pk.max() < _BINCOUNT_MAX:  # the usual rank numbers: one pass, no sort
                present = np.flatnonzero(np.bincount(pk))
                sums = zip(present.tolist(), np.bincount(pk, weights=w)[present].tolist())
            else:  # a huge peer number (a big job, or a hostile ring) must not size an array
                uniq, inv = np.unique(pk, return_inverse=True)
                sums = zip(uniq.tolist(), np.bincount(inv, weights=w).tolist())
            for p, ns in sums:
                peer = (p // 2, p % 2) if c is not self._overflow else (-1, -1)
                if peer not in c.net_wait_ns and len(c.net_wait_ns) >= 2 * self.max_peers:
                    peer = (-1, -1)  # into the communicator's overflow series
                c.net_wait_ns[peer] = c.net_wait_ns.get(peer, 0) + int(ns)
        c.ops, c.waits, c.pending = {}, [], 0

    def _fold_ops(self, c: _Comm, ops: np.ndarray, nranks: int) -> None:
        begin = ops["start_ns"].astype(np.int64)
        end = ops["end_ns"].astype(np.int64)
        if not begin.all():  # no start seen: from the API call
            begin = np.where(begin > 0, begin, ops["api_ns"].astype(np.int64))
        ok = (begin > 0) & (end >= begin)
        dur = (end - begin) * 1e-9
        func = ops["func"].astype(np.int64)
        func[func >= len(sp.FUNC_NAMES)] = _UNKNOWN_FUNC  # one "Unknown" series, whatever the code
        nbytes = ops["bytes"].astype(np.float64)
        key = func * len(SIZE_LABELS) + np.searchsorted(_SIZE_EDGES, ops["bytes"], side="left")
        funcs = np.unique(func).tolist()
        if len(funcs) == 1:
            factor: Any = sp.busbw_factor(funcs[0], nranks)
        else:
            factor = np.ones(len(func))
            for f in funcs:
                factor[func == f] = sp.busbw_factor(f, nranks)
        bw_ok = ok & (dur > 0) & (nbytes > 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            bw = nbytes * factor / dur
        k0 = int(key[0])
        groups = [k0] if (key == k0).all() else np.unique(key[ok]).tolist()
        for k in groups:
            sel = ok if len(groups) == 1 else ok & (key == k)
            if not sel.any():
                continue
            # the overflow series is one series: no function or size in it
            fk = (k // len(SIZE_LABELS), k % len(SIZE_LABELS)) if c is not self._overflow else (-1, -1)
            h = c.duration.get(fk)
            if h is None:
                h = c.duration[fk] = _Hist(_DUR_EDGES)
            h.add(dur[sel])
            sel = sel & bw_ok
            if sel.any():
                b = c.bandwidth.get(fk)
                if b is None:
                    b = c.bandwidth[fk] = _Hist(_BW_EDGES)
                b.add(bw[sel])

    def _fold_all(self) -> None:
        for c in [*self._comms.values(), self._overflow]:
            if c.pending:
                self._fold(c)

    def exemplars(self, src: RingSource, recs: np.ndarray, traces: Sequence[int]) -> None:
        """Attach exported operations to the duration histogram as exemplars (their trace id and op span id).

        Only operations the agent exported as spans: an exemplar links to a trace the backend holds
        (a trace id as a label would make a series per collective; an exemplar costs nothing per series).
        Called after :meth:`record` of the same batch: a series its completions will fold into (not yet, while
        they are pending) is created here with no count.
        """
        if not len(recs):
            return
        ops = recs["op"]
        begin = ops["start_ns"].astype(np.int64)
        begin = np.where(begin > 0, begin, ops["api_ns"].astype(np.int64))
        end = ops["end_ns"].astype(np.int64)
        func = ops["func"].astype(np.int64)
        func[func >= len(sp.FUNC_NAMES)] = _UNKNOWN_FUNC
        size = np.searchsorted(_SIZE_EDGES, ops["bytes"], side="left")
        with self._lock:
            c = self._comms.get(src.comm_hex)
            if c is None:  # over the communicator cap: the overflow series carries no exemplars
                return
            for i in range(len(recs)):
                b, e = int(begin[i]), int(end[i])
                if b <= 0 or e < b:
                    continue
                h = c.duration.get(fk := (int(func[i]), int(size[i])))
                if h is None:
                    h = c.duration[fk] = _Hist(_DUR_EDGES)
                v = (e - b) * 1e-9
                bucket = int(np.searchsorted(h.bounds, v, side="left"))
                h.exemplars[bucket] = (v, src.to_real(e), int(traces[i]), ids.span_id(traces[i], src.rank, sc.ROLE_OP))

    def in_flight(self, src: RingSource, count: int) -> None:
        """Operations of this ring currently in flight (the live table's occupied slots)."""
        with self._lock:
            rk = self._rank_key(src)
            if rk is not None:
                self._inflight[rk] = int(count)

    def _comm(self, src: RingSource) -> _Comm:
        c = self._comms.get(src.comm_hex)
        if c is None:
            if len(self._comms) >= self.max_comms:
                return self._overflow
            c = self._comms[src.comm_hex] = _Comm(comm_attributes(src))
        return c

    def _rank_key(self, src: RingSource) -> tuple[str, int] | None:
        k = (src.comm_hex, src.rank)
        if k in self._rank_attrs:
            return k
        if len(self._rank_attrs) < self.max_ranks:
            self._rank_attrs[k] = {**comm_attributes(src), ATTR_RANK: src.rank}
            return k
        return None  # over the cap: not reported (a gauge cannot be summed into an overflow series)

    # --- the exporter's side -------------------------------------------------------------
    def register(self, meter_provider: Any) -> None:
        """The counter and the gauges as SDK observable instruments on ``meter_provider``."""
        from opentelemetry.metrics import Observation

        meter = meter_provider.get_meter(SCOPE_NAME)

        def waits(_options: Any) -> Iterable[Observation]:
            with self._lock:
                self._fold_all()
                out = []
                for c in [*self._comms.values(), self._overflow]:
                    for (peer, d), ns in c.net_wait_ns.items():
                        attrs = dict(c.attrs)
                        if peer < 0:
                            attrs[ATTR_OVERFLOW] = True
                        elif ATTR_OVERFLOW not in attrs:
                            attrs[ATTR_PEER] = peer
                            attrs[ATTR_DIRECTION] = _DIRS[d]
                        out.append(Observation(ns / 1e9, attrs))
                return out

        def inflight(_options: Any) -> Iterable[Observation]:
            with self._lock:
                return [Observation(v, self._rank_attrs[k]) for k, v in self._inflight.items()]

        def last_seq(_options: Any) -> Iterable[Observation]:
            with self._lock:
                return [Observation(s, {**self._rank_attrs[k], ATTR_HOST: h}) for k, (s, h) in self._last_seq.items()]

        meter.create_observable_counter(NETWORK_WAIT, [waits], unit="s",
                                        description="time flows waited on the network, per peer and direction")
        meter.create_observable_gauge(IN_FLIGHT, [inflight], unit="{operation}",
                                      description="NCCL operations in flight on a rank")
        meter.create_observable_gauge(LAST_SEQUENCE, [last_seq], unit="{collective}",
                                      description="sequence number of the last collective a rank completed")

    def histograms(self, now_ns: int | None = None) -> list:
        """The two histograms as SDK ``Metric`` objects (cumulative), for :class:`MergingExporter`."""
        from opentelemetry.sdk.metrics import Exemplar
        from opentelemetry.sdk.metrics.export import AggregationTemporality, Histogram, HistogramDataPoint, Metric

        now_ns = now_ns or time.time_ns()
        out = []
        for name, unit, what, desc in (
                (DURATION, "s", "duration", "duration of completed NCCL operations"),
                (BUS_BANDWIDTH, "By/s", "bandwidth", "bus bandwidth of completed NCCL operations (NCCL's busBw)")):
            points = []
            with self._lock:
                self._fold_all()
                for c in [*self._comms.values(), self._overflow]:
                    for (f, s), h in getattr(c, what).items():
                        attrs = dict(c.attrs)
                        if ATTR_OVERFLOW not in attrs:
                            attrs[ATTR_FUNC] = sp.func_name(f)
                            attrs[ATTR_SIZE] = SIZE_LABELS[s]
                        points.append(HistogramDataPoint(
                            attributes=attrs, start_time_unix_nano=self.start_ns, time_unix_nano=now_ns,
                            count=int(h.counts.sum()), sum=h.total, bucket_counts=h.counts.tolist(),
                            explicit_bounds=list(map(float, h.bounds)), min=h.lo, max=h.hi,
                            exemplars=[Exemplar({}, v, t, span_id=sid, trace_id=tid)
                                       for _, (v, t, tid, sid) in sorted(h.exemplars.items())]))
            if points:
                out.append(Metric(name=name, description=desc, unit=unit,
                                  data=Histogram(data_points=points,
                                                 aggregation_temporality=AggregationTemporality.CUMULATIVE)))
        return out
