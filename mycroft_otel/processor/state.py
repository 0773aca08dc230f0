"""Per-trace state: everything every rank said about one collective, bounded.

One :class:`TraceState` per trace id (= one collective instance or p2p transfer): per rank its completed op
span, its latest in-flight snapshot and its status evidence. :class:`TraceStore` keeps them in LRU order with a
TTL after the last span (MYCROFT_TRACE_TTL_S), a count cap (MYCROFT_MAX_TRACES) and a byte budget
(MYCROFT_MAX_TRACE_BYTES); evictions, and the spans they drop, are counted.

Bytes: a kept span holds its wire bytes for the analysis (``SpanRef.raw``). A span shares its request's buffer
(spans.detach) only while the request's kept spans are at least half of it; otherwise (one small span in a large
request) the span's bytes are copied out, so a kept span never pins more than twice its own size. Each kept span
is accounted at its wire size plus :data:`SPAN_OVERHEAD_BYTES`; over the budget the least recently updated
traces are evicted. A small per-process index (host + global rank, else host + pid) shows a rank missing from one
communicator's collective busy in another one's (hang propagation), and the ranks of a sharded job held here.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Iterator

from mycroft_otel.processor.spans import INFLIGHT, OP, STATUS, Resource, SpanRef
from mycroft_otel import semconv as sc

ProcKey = tuple  # (host, "g", global_rank, job) or (host, "p", pid, job)
NO_RESOURCE = Resource()  # a trace's before its first span
P2P = ("Send", "Recv")  # one trace per transfer: a p2p group's transfers share its number (not in trace_at)

DEFAULT_MAX_BYTES = 512 << 20   # MYCROFT_MAX_TRACE_BYTES: span bytes held, all traces (accounted as below)
SPAN_OVERHEAD_BYTES = 512       # a kept SpanRef's Python objects (tuple, ints, key strings), measured ~450
MAX_RANKS_PER_TRACE = 1 << 18   # ranks a trace keeps (more are dropped, counted): twice a 131,072-rank job

# why kept spans were let go (the mycroft_processor_spans_dropped reasons of the store)
DROP_EVICTED_BYTES = "evicted_bytes"
DROP_EVICTED_COUNT = "evicted_count"
DROP_RANK_CAP = "rank_cap"
DROP_OVER_BUDGET = "over_budget"
DROP_REASONS = (DROP_EVICTED_BYTES, DROP_EVICTED_COUNT, DROP_RANK_CAP, DROP_OVER_BUDGET)


def span_bytes(ref: SpanRef) -> int:
    """What one kept span is accounted at."""
    return SPAN_OVERHEAD_BYTES + (ref.raw[2] if ref.raw is not None else 0)


def proc_key(ref: SpanRef) -> ProcKey | None:
    """The GPU/process a span speaks for; the job keeps two jobs sharing a host apart."""
    host = ref.resource.host
    if ref.global_rank >= 0:
        return (host, "g", ref.global_rank, ref.resource.job)
    if ref.resource.pid >= 0:
        return (host, "p", ref.resource.pid, ref.resource.job)
    return None


@dataclass(slots=True)
class TraceState:
    trace_id: bytes
    comm: str = ""
    seq: int = -1
    func: str = ""
    nranks: int = 0
    created_mono: float = 0.0
    updated_mono: float = 0.0
    op: dict[int, SpanRef] = field(default_factory=dict)
    inflight: dict[int, SpanRef] = field(default_factory=dict)
    status: dict[int, SpanRef] = field(default_factory=dict)
    last_progress_ns: int = 0      # realtime ns of the last progress any evidence shows
    first_evidence_ns: int = 0     # earliest start among the ranks' spans
    anomalous: bool = False        # an op span carries ANOMALY
    slow_since_mono: float = 0.0   # first anomalous/slow op span seen (processor clock)
    verdict: object | None = None  # the Verdict emitted for this trace
    explained_by: bytes | None = None  # another trace whose incident explains this one
    elsewhere: bool = False        # its hang's waits all lead into another processor's shard (OTHER_SHARD)
    analysed_slow: bool = False
    spans: int = 0
    ranks_changed_mono: float = 0.0  # when a rank was last heard from for the first time in this trace
    indexed: bool = False          # filed in TraceStore.trace_at (or a p2p transfer, which is not)
    nbytes: int = 0                # accounted bytes of the spans kept (span_bytes)
    kept: int = 0                  # spans kept (a newer snapshot replaces an older one)
    step: int | None = None        # its place in the communicator's training step (keys.step_of; None: not read)

    @property
    def resource(self) -> Resource:
        """Who sent its spans: its first span's resource (a trace is one job's, and one shard's or none)."""
        return next((ref.resource for refs in (self.op, self.inflight, self.status) for ref in refs.values()),
                    NO_RESOURCE)

    job = property(lambda self: self.resource.job, doc="The job (``mycroft.job.id``) whose spans this trace holds.")

    def stalled_ranks(self) -> list[int]:
        """Ranks whose latest evidence is in flight (no completed span yet)."""
        return [r for r in self.inflight if r not in self.op]

    def waiters(self) -> Iterator[SpanRef]:
        """The latest snapshots of the ranks alive and waiting in this collective (in flight, not exited)."""
        for r, ref in self.inflight.items():
            if r in self.op:
                continue
            s = self.status.get(r)
            if s is None or s.status != sc.STATUS_PROCESS_EXITED:
                yield ref

    @property
    def stopped_ns(self) -> int:
        """Since when nothing of this collective moved: its last progress, or its first evidence if later."""
        return max(self.last_progress_ns, self.first_evidence_ns)

    def has_hang_evidence(self) -> bool:
        """Some rank that is alive waits in this collective (a dead or idle rank alone is no hang)."""
        return next(self.waiters(), None) is not None

    def heard_from(self) -> int:
        return len(set(self.op) | set(self.inflight) | set(self.status))

    def complete(self, ranks: int = 0) -> bool:
        """Every end has completed: a collective's ranks (``ranks`` of them: the shards.py ones it holds), or a
        p2p transfer's two (its trace is one transfer; ``nranks`` is its communicator's size), so a transfer is
        judged as soon as a collective would be, and a rank's lateness elsewhere is not before its transfer."""
        need = 2 if self.func in P2P else ranks or self.nranks
        return need > 0 and len(self.op) >= need

    def add(self, ref: SpanRef, now: float, size: int = -1) -> int:
        """File one span; returns the change of accounted bytes (a replaced span gives its bytes back).
        ``size``: its span_bytes, when the caller has them already (this runs once per span received)."""
        rank, kind = ref.rank, ref.kind
        if size < 0:
            size = span_bytes(ref)
        self.spans += 1
        self.updated_mono = now
        op = self.op
        if rank not in op and rank not in self.inflight and rank not in self.status:
            self.ranks_changed_mono = now
        if not self.comm and ref.comm:
            self.comm = ref.comm
        if self.seq < 0 <= ref.seq:
            self.seq = ref.seq
        if not self.func and ref.func:
            self.func = ref.func
        if ref.nranks > self.nranks:
            self.nranks = ref.nranks
        start = ref.start_ns
        if start and (not self.first_evidence_ns or start < self.first_evidence_ns):
            self.first_evidence_ns = start
        before = self.nbytes
        if kind == OP:
            self._keep(op, rank, ref, size)
            if ref.end_ns > self.last_progress_ns:
                self.last_progress_ns = ref.end_ns
            if ref.anomaly:
                self.anomalous = True
                if not self.slow_since_mono:
                    self.slow_since_mono = now
        elif kind == INFLIGHT:
            old = self.inflight.get(rank)
            if old is None or (ref.snapshot, ref.end_ns) >= (old.snapshot, old.end_ns):
                self._keep(self.inflight, rank, ref, size)
            progress = ref.last_progress_ns or ref.start_ns
            if progress > self.last_progress_ns:
                self.last_progress_ns = progress
        elif kind == STATUS:
            old = self.status.get(rank)
            # process_exited outranks not_entered; otherwise the newest wins
            if old is None or old.status != sc.STATUS_PROCESS_EXITED or ref.status == sc.STATUS_PROCESS_EXITED:
                self._keep(self.status, rank, ref, size)
        return self.nbytes - before

    def _keep(self, slot: dict[int, SpanRef], rank: int, ref: SpanRef, size: int) -> None:
        old = slot.get(rank)
        if old is not None:
            self.nbytes -= span_bytes(old)
            self.kept -= 1
        slot[rank] = ref
        self.nbytes += size
        self.kept += 1


class TraceStore:
    """Traces in LRU order, bounded by TTL, count and bytes; evictions and the spans they drop counted."""

    def __init__(self, ttl_s: float = 120.0, max_traces: int = 20000, clock=time.monotonic,
                 max_bytes: int = DEFAULT_MAX_BYTES, max_ranks: int = MAX_RANKS_PER_TRACE,
                 on_drop: Callable[[str, int], None] | None = None):
        self.ttl_s = ttl_s
        self.max_traces = max_traces
        self.max_bytes = max_bytes
        self.max_ranks = max_ranks
        self.clock = clock
        self.on_drop = on_drop     # (reason, spans): the processor's metrics
        self.traces: OrderedDict[bytes, TraceState] = OrderedDict()
        self.bytes = 0             # accounted bytes of all kept spans
        self.evicted_ttl = 0
        self.evicted_size = 0
        self.evicted_bytes = 0
        self.dropped: dict[str, int] = {}  # reason -> spans
        # process -> {trace_id: None} where its latest evidence is in flight / not entered
        self.inflight_by_proc: dict[ProcKey, dict[bytes, None]] = {}
        self.proc_of: dict[tuple[str, int], ProcKey] = {}  # (comm, rank) -> process
        self.members: dict[str, tuple[int, float]] = {}  # comm -> (its ranks in proc_of, when that last grew)
        self.seq_of: dict[tuple[str, int], int] = {}  # (comm, rank) -> highest collective seq it has evidence in
        self.trace_at: dict[tuple[str, int], bytes] = {}  # (comm, seq) -> trace id (collectives only)
        self.inflight_seqs: dict[tuple[str, int], set] = {}  # (comm, rank) -> seqs whose latest evidence is in flight

    def __len__(self) -> int:
        return len(self.traces)

    def get(self, trace_id: bytes) -> TraceState | None:
        return self.traces.get(trace_id)

    def _count_drop(self, reason: str, spans: int) -> None:
        if spans > 0:
            self.dropped[reason] = self.dropped.get(reason, 0) + spans
            if self.on_drop is not None:
                self.on_drop(reason, spans)

    def add(self, ref: SpanRef, now: float) -> TraceState:
        """File the span under its trace (``now``: the store's clock, read once per payload)."""
        tid = ref.trace_id
        traces = self.traces
        st = traces.get(tid)
        if st is None:
            st = TraceState(trace_id=tid, created_mono=now)
            traces[tid] = st
            if len(traces) > self.max_traces:
                self._count_drop(DROP_EVICTED_COUNT, self._drop(next(iter(traces))))
                self.evicted_size += 1
        else:
            traces.move_to_end(tid)
        rank = ref.rank
        # (kept counts the spans of the three slots together: below the cap, none of them is full)
        if st.kept >= self.max_ranks and (len(st.op) >= self.max_ranks or len(st.inflight) >= self.max_ranks
                                          or len(st.status) >= self.max_ranks) \
                and rank not in st.op and rank not in st.inflight and rank not in st.status:
            self._count_drop(DROP_RANK_CAP, 1)
            return st
        size = span_bytes(ref)
        if st.nbytes + size > self.max_bytes:  # one trace alone may not take the whole budget
            self._count_drop(DROP_OVER_BUDGET, 1)
            return st
        self.bytes += st.add(ref, now, size)
        while self.bytes > self.max_bytes and len(traces) > 1:
            oldest = next(iter(traces))
            if oldest == tid:  # (the trace being filed is the most recent: never first while others exist)
                break
            self._count_drop(DROP_EVICTED_BYTES, self._drop(oldest))
            self.evicted_bytes += 1
        self._index(st, ref, tid, now)
        return st

    def _index(self, st: TraceState, ref: SpanRef, tid: bytes, now: float) -> None:
        """The store's indexes that a filed span moves: which collectives a rank is in flight in, its latest
        sequence number, a collective's trace, a rank's process, and the traces a process is in flight in."""
        kind, rank, comm, seq = ref.kind, ref.rank, ref.comm, ref.seq
        ck = (comm, rank)
        if kind != STATUS and seq >= 0 and comm:
            if kind == INFLIGHT and rank not in st.op:
                seqs = self.inflight_seqs.get(ck)
                if seqs is None:
                    if len(self.inflight_seqs) > 4 * self.max_traces + 65536:
                        self.inflight_seqs.clear()
                    seqs = self.inflight_seqs[ck] = set()
                seqs.add(seq)
            elif rank in st.inflight:  # (its seq is in that index only if it was in flight here)
                seqs = self.inflight_seqs.get(ck)
                if seqs is not None:
                    seqs.discard(seq)
                    if not seqs:
                        del self.inflight_seqs[ck]
            seq_of = self.seq_of
            if seq_of.get(ck, -1) < seq:
                if len(seq_of) > 4 * self.max_traces + 65536:
                    seq_of.clear()
                seq_of[ck] = seq
            if not st.indexed:  # once per trace (p2p transfers share their group's number: not indexed)
                st.indexed = True
                if ref.func not in P2P:
                    self.trace_at[(comm, seq)] = tid
        if ck not in self.proc_of:
            key = proc_key(ref)
            if key is not None:
                if len(self.proc_of) > 4 * self.max_traces + 65536:
                    self.proc_of.clear()
                    self.members.clear()
                self.proc_of[ck] = key
                self.members[comm] = (self.members.get(comm, (0,))[0] + 1, now)
        if kind == INFLIGHT and rank not in st.op:
            key = proc_key(ref)
            if key is not None:
                self.inflight_by_proc.setdefault(key, {})[tid] = None
        elif kind == OP and st.inflight:  # (only a trace with in-flight evidence is in that index)
            key = proc_key(ref)
            d = self.inflight_by_proc.get(key) if key is not None else None
            if d is not None:
                d.pop(tid, None)
                if not d:
                    del self.inflight_by_proc[key]

    def restore(self, proc_of: dict, seq_of: dict) -> None:
        """A checkpoint's process index (checkpoint.py), and the member counts it implies."""
        self.proc_of.update(proc_of)
        self.seq_of.update(seq_of)
        self.members = {comm: (n, 0.0) for comm, n in Counter(comm for comm, _ in self.proc_of).items()}

    def waiting(self, proc: ProcKey) -> list[tuple[str, int, int]]:
        """(communicator, start, last seen) of each collective the process is still seen in flight in."""
        out = []
        for tid in self.inflight_by_proc.get(proc, ()):
            st = self.traces.get(tid)
            if st is None:
                continue
            for r, ref in st.inflight.items():
                if r not in st.op and self.proc_of.get((st.comm, r)) == proc:
                    out.append((st.comm, ref.start_ns, ref.end_ns))
        return out

    def _drop(self, trace_id: bytes) -> int:
        """Forget one trace; returns how many spans it held."""
        st = self.traces.pop(trace_id, None)
        if st is None:
            return 0
        self.bytes -= st.nbytes
        if self.trace_at.get((st.comm, st.seq)) == trace_id:
            del self.trace_at[(st.comm, st.seq)]
        for r in st.inflight:
            seqs = self.inflight_seqs.get((st.comm, r))
            if seqs is not None:
                seqs.discard(st.seq)
                if not seqs:
                    del self.inflight_seqs[(st.comm, r)]
        for ref in st.inflight.values():
            key = proc_key(ref)
            d = self.inflight_by_proc.get(key) if key else None
            if d is not None:
                d.pop(trace_id, None)
                if not d:
                    del self.inflight_by_proc[key]
        return st.kept

    def expire(self) -> int:
        """Evict traces idle longer than the TTL; returns how many."""
        now = self.clock()
        n = 0
        while self.traces:
            tid, st = next(iter(self.traces.items()))
            if now - st.updated_mono < self.ttl_s:
                break
            self._drop(tid)
            n += 1
        self.evicted_ttl += n
        return n

    def runnable_ns(self, st: TraceState) -> int:
        """When this collective could start to move at its in-flight ranks: the latest of their completions
        of the communicator's previous collective (0 when unknown). NCCL runs a communicator's collectives in
        order, so a snapshot taken while the previous one ran shows no progress that is not a stall of this
        one (conformance gpu_stall_v5_16ch: a collective launched early read as stalled since its launch)."""
        if st.func in P2P:
            return 0
        o = self.traces.get(self.trace_at.get((st.comm, st.seq - 1), b""))
        if o is None:
            return 0
        return max((o.op[r].end_ns for r in st.inflight if r in o.op), default=0)

    def earlier(self, st: TraceState, k: int = 16) -> list[TraceState]:
        """The communicator's collectives before this one still held, up to ``k`` back (p2p: not indexed)."""
        return [o for s in range(st.seq - 1, max(st.seq - 1 - k, -1), -1)
                if (o := self.traces.get(self.trace_at.get((st.comm, s), b""))) is not None]

    def queued(self, st: TraceState) -> bool:
        """Whether this collective is queued behind an earlier one of its communicator (queued_behind)."""
        return self.queued_behind(st) is not None

    def queued_behind(self, st: TraceState) -> TraceState | None:
        """The earlier collective of the communicator that a waiting rank of this one is still in flight in:
        NCCL runs a communicator's collectives in order, so this one's lack of progress is that one's.

        (Not across communicators, although a GPU stream runs its kernels in launch order too: two traces whose
        ranks each have an older op in the other -- a killed rank's ring and pipeline peers -- would wait for
        each other forever. A TP collective behind a stuck DP one is named on its own, or by propagation.)"""
        for r in st.stalled_ranks():
            seqs = self.inflight_seqs.get((st.comm, r))
            if not seqs or min(seqs) >= st.seq:
                continue
            mine = st.inflight[r].end_ns
            for s in seqs:
                if s >= st.seq:
                    continue
                o = self.traces.get(self.trace_at.get((st.comm, s), b""))
                ref = o.inflight.get(r) if o is not None else None
                # only while the earlier one is still being reported (a completion we never saw leaves a
                # stale snapshot behind)
                if ref is not None and r not in o.op and ref.end_ns >= mine - 2_500_000_000:
                    return o
        return None

    def busy_elsewhere(self, key: ProcKey, trace_id: bytes) -> list[TraceState]:
        """Other traces where process ``key`` is in flight (latest evidence)."""
        return [st for tid in self.inflight_by_proc.get(key, ())
                if tid != trace_id and (st := self.traces.get(tid)) is not None]
