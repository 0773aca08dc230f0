"""The processor proper: ingest -> per-trace state -> detection on a timer -> RCA -> verdicts.

:class:`Processor` is what the receiver feeds and what the CLI, the demo and the
tests drive. Incidents: one verdict per trace (its root-cause span id is
deterministic, so a replayed input cannot produce a second one), and one per
incident across traces:

- a hang whose walk ends at a rank that is busy (in flight) in another hung trace
  is a consequence of that trace (hang propagation across communicators, e.g. TP
  peers waiting for a rank stuck in its DP all-reduce): it waits for that trace's
  verdict and is then attributed to it instead of producing its own;
- a verdict with the same (kind, category, communicator, culprit, channel) as one
  emitted within the incident window (a hang re-reported, a persistent slowdown) is
  not emitted again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, NamedTuple

from mycroft_otel import config, ids
from mycroft_otel import semconv as sc
from mycroft_otel.processor import detect, rca, slowdown
from mycroft_otel.processor.spans import OP, SUMMARY, decode, span_attributes
from mycroft_otel.processor.state import P2P, TraceStore, detach, proc_key

log = logging.getLogger("mycroft_otel.processor")

INCIDENT_WINDOW_S = 120.0
MAX_VERDICTS = 4096    # verdicts kept in Processor.verdicts (the latest; each was published when made)
SLOW_CONFIRM = 3       # slow collectives naming the same culprit process before a slowdown verdict
STRONG_CONFIRM = 2     # ... when they are far beyond any jitter (slowdown.STRONG_RATIO); never one alone:
                       #     a descheduled proxy thread can hold one flow for tens of ms once
SOFT_CONFIRM = 5       # ... when they are milder outliers (slowdown.SOFT_RATIO), flagged by the culprit's agent
SOFT_WINDOW_S = 5.0    # ... within this window
SLOW_WINDOW_S = 30.0   # ... within this window
LOCAL_CONFIRM = 5      # ... or at the second strict one, when the culprit's agent flagged this many of its
                       #     last RECENT_WINDOW (8) collectives slow (mycroft.anomaly.recent)
LOCAL_CONFIRM_SOFT = 7 # ... or at the LOCAL_SOFT_VOTES-th milder one, when it flagged this many (behind trace-ID
LOCAL_SOFT_VOTES = 3   #     routing each processor sees only its share of a mild fault's collectives)
WEAK_CONFIRM = 8       # ... when they are weak outliers (slowdown.WEAK_RATIO): naming the culprit in this many of
WEAK_OF = 10           #     the communicator's latest collectives analysed here (a loaded host's healthy ranks: 6)

DENSE = 0.5            # ... and it named that culprit in at least this share of the collectives analysed since
                       #     (in each communicator it named it in): a fault slows most of its culprit's
                       #     collectives from its onset on, a loaded host's jitter picks a rank now and then
ANALYSED_KEPT = 256    # collectives kept per communicator for DENSE: (number, the ranks of a p2p transfer)
WARMUP_SEQ = 8         # a communicator's first collectives name no slowdown: NCCL connects peers and registers
                       #     buffers on first use, so they are slow by construction (and jitter against a short
                       #     history: conformance mismatch_func named a healthy rank's NIC at collective 10)

MEASURE_BATCH = 256    # completed collectives measured in one pass over their flows

_SUMMARY_KEYS = frozenset({sc.SUMMARY_FUNCS, sc.SUMMARY_FUNC_OPS, sc.SUMMARY_FUNC_DURATION_MEAN, sc.SUMMARY_BYTES,
                           sc.SUMMARY_OPS})


@dataclass
class Verdict:
    """One incident's root cause, as the root-cause span carries it."""

    trace_id: bytes
    span_id: bytes
    comm: str
    seq: int
    func: str
    finding: rca.Finding
    detected_ns: int
    analysis_s: float

    @property
    def kind(self) -> str:
        return self.finding.kind

    @property
    def category(self) -> str:
        return self.finding.category

    def attributes(self) -> dict:
        f = self.finding
        a = {
            sc.RCA_KIND: f.kind, sc.RCA_CATEGORY: f.category, sc.RCA_CULPRIT_RANKS: list(f.ranks),
            sc.RCA_CONFIDENCE: float(f.confidence), sc.RCA_EVIDENCE: f.evidence, sc.RCA_ONSET: int(f.onset_ns),
            sc.RCA_DETECTED: int(self.detected_ns), sc.COMM_HASH: self.comm, sc.COLL_SEQ: int(self.seq),
            sc.COLL_FUNC: self.func, sc.RCA_TRACE_ID: self.trace_id.hex(),
        }
        if f.global_ranks:
            a[sc.RCA_CULPRIT_GLOBAL_RANKS] = list(f.global_ranks)
        if f.hosts:
            a[sc.RCA_CULPRIT_HOSTS] = list(f.hosts)
        if f.channel is not None:
            a[sc.RCA_CULPRIT_CHANNEL] = int(f.channel)
        if f.peer is not None:
            a[sc.RCA_CULPRIT_PEER] = int(f.peer)
        return a

    def summary(self) -> str:
        f = self.finding
        where = f"rank{'s' if len(f.ranks) > 1 else ''} {', '.join(map(str, f.ranks))}"
        if f.hosts:
            where += f" on {', '.join(f.hosts)}"
        if f.channel is not None:
            where += f", channel {f.channel} -> peer {f.peer}"
        return (f"{f.kind}/{f.category} at {where} ({self.func} #{self.seq}, comm {self.comm}, "
                f"confidence {f.confidence:.2f}): {f.evidence}")


def _identity(f: rca.Finding) -> set:
    """The processes a hang verdict blames: (job, host, global rank); a dead process blames its whole host."""
    out = {(f.job, h, g) for g in f.global_ranks for h in (f.hosts or [""])}
    if f.category == "process_exited" or f.reason == "stopped":
        out |= {(f.job, h, "*") for h in f.hosts}
    return out


def _culprit(comm: str, global_ranks: list[int], ranks: list[int]) -> tuple:
    """Who a slowdown names, for its votes and incidents: its processes' global ranks, else the communicator's
    ranks (a slow GPU shows in all the communicators of its process)."""
    return tuple(global_ranks) or (comm, tuple(ranks))


class _HeldSlow(NamedTuple):
    """A slow collective analysed while a collective of its job stalled (Processor._analyse_slow)."""

    since: float        # monotonic seconds
    finding: rca.Finding
    analysis_s: float
    took: int           # ns, its ranks' first start to last end


class _Vote(NamedTuple):
    """One slow collective that named a culprit (a candidate slowdown)."""

    at: float           # monotonic seconds, when it was analysed
    trace_id: bytes
    onset_ns: int
    strength: int       # 0 milder outlier, 1 strict, 2 beyond any jitter (slowdown.STRONG_RATIO)
    stalled: tuple[int, int] | None  # a stall that recovered: (start, last in-flight snapshot) of its in-flight ranks
    comm: str
    seq: int
    inferred: bool      # its culprit inferred from the collective being slow as a whole (slowdown.WHOLE)
    rank: int           # the culprit's rank in ``comm``


def _distinct(votes: list[_Vote]) -> list[_Vote]:
    """The votes, less the stalls that recovered whose stall overlaps an earlier one's: collectives in flight
    together stall together when a process is descheduled once (conformance slow_flow on a loaded host: three
    collectives stalled 1 s in the same second, all waiting on one rank). One event, however many it held."""
    out, until = [], 0
    for v in sorted(votes, key=lambda v: v.stalled[0] if v.stalled else v.onset_ns):
        if v.stalled:
            if v.stalled[0] < until:
                continue
            until = v.stalled[1]
        out.append(v)
    return out


def _dense(votes: list[_Vote], analysed: dict[str, deque]) -> list[_Vote]:
    """The longest run of the latest votes that named their culprit in at least DENSE of the collectives it took
    part in that this processor analysed between the run's first and last vote, per communicator (by collective
    number: analysis order is completion order). A vote of long ago, before the fault, does not dilute the votes
    of a fault that started since; votes spread thinly over many healthy collectives fall. A p2p group's
    transfers share their number and each involves two ranks: the culprit's own transfers are what count
    (conformance healthy_jittery: two bystander p2p votes among a group's 8 transfers read as dense)."""
    span: dict[str, tuple[int, int, int]] = {}  # comm -> the run's lowest and highest number in it, the culprit
    best = votes[-1:]
    for k in range(len(votes) - 1, -1, -1):
        v = votes[k]
        first, last, _ = span.get(v.comm, (v.seq, v.seq, v.rank))
        span[v.comm] = (min(first, v.seq), max(last, v.seq), v.rank)
        total = sum(sum(a <= s <= b and (pair is None or r in pair) for s, pair in analysed.get(c, ()))
                    for c, (a, b, r) in span.items())
        if len(votes) - k >= DENSE * total:
            best = votes[k:]
    return best


class Processor:
    """Thread-safe: the receiver's threads call :meth:`ingest_request`; a timer calls :meth:`tick`."""

    def __init__(self, env=None, exporter=None, metrics=None, clock_ns: Callable[[], int] = time.time_ns,
                 tick_s: float = 0.2, settle_s: float = 1.0, stall_ms: float | None = None,
                 mono_clock: Callable[[], float] = time.monotonic):
        self.stall_ms = stall_ms if stall_ms is not None else config.get_int("MYCROFT_STALL_MS", env, lo=1)
        self.slow_factor = config.get_float("MYCROFT_SLOW_FACTOR", env, lo=1.0)
        self.store = TraceStore(ttl_s=config.get_float("MYCROFT_TRACE_TTL_S", env, lo=0.001),
                                max_traces=config.get_int("MYCROFT_MAX_TRACES", env, lo=1), clock=mono_clock,
                                max_bytes=config.get_int("MYCROFT_MAX_TRACE_BYTES", env, lo=1 << 20),
                                on_drop=metrics.spans_dropped if metrics is not None else None)
        self.mono = mono_clock
        self.baselines = detect.Baselines()
        self.exporter = exporter
        self.metrics = metrics
        self.clock_ns = clock_ns
        self.tick_s = tick_s
        self.settle_s = settle_s
        self.lock = threading.RLock()
        self.verdicts: deque[Verdict] = deque(maxlen=MAX_VERDICTS)
        self.listeners: list[Callable[[Verdict], None]] = []
        self._hang_cand: dict[bytes, None] = {}
        self._slow_cand: dict[bytes, float] = {}
        self._deferred: dict[bytes, float] = {}
        self._stalling: dict[str, int] | None = None  # job -> longest stall of its hang candidates, this tick
        self._slow_hosts: list[tuple] = []  # (mono, trace id, job, culprit hosts) of slowdown verdicts
        self._slow_comms: dict[tuple, tuple[float, bytes]] = {}  # (job, comm) -> (mono, trace id) of its slowdown verdict
        self._waits_on: dict[bytes, set] = {}  # deferred hang trace -> the hung traces it waits for
        self._incidents: dict[tuple, tuple[float, bytes]] = {}
        self._hang_culprits: list[tuple[float, bytes, set]] = []
        self._slow_votes: dict[tuple, list[_Vote]] = {}
        self._held_slow: dict[bytes, _HeldSlow] = {}  # trace id -> slow collective waiting for a stall's outcome
        self._history: dict[tuple, dict] = {}  # (comm, func or p2p, size bucket) -> its recent per-step values
        self._analysed: dict[str, deque] = {}  # comm -> its latest collectives analysed for a slowdown (seq)
        self._job_history: dict[str, dict] = {}  # job -> the same, all communicators and sizes (a fallback)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.counts = {"spans": 0, "unknown": 0, "ignored": 0, "propagated": 0, "deduped": 0, "analysis_errors": 0, "slow_candidates": 0}

    # -- ingest ---------------------------------------------------------------------------------
    def ingest_payload(self, data: bytes) -> int:
        """Ingest one ExportTraceServiceRequest payload (protobuf bytes); returns the number of spans rejected
        (unknown shape). Raises ValueError when the payload is malformed (nothing of it is ingested)."""
        d = decode(data)
        with self.lock:
            now = self.mono()
            bases: dict = {}  # (comm, func, bytes) -> (baseline, its samples) this payload's op spans are judged by
            for ref in detach(d.refs, len(data)):
                self._add(ref, now, bases)
            self.counts["spans"] += d.seen
            self.counts["unknown"] += d.rejected
            self.counts["ignored"] += d.ignored
        if self.metrics is not None:
            self.metrics.spans_received(d.seen, d.rejected)
        return d.rejected

    def ingest_request(self, req) -> int:
        """Ingest an ExportTraceServiceRequest message (tests, replays, OTLP/JSON)."""
        return self.ingest_payload(req.SerializeToString())

    def _add(self, ref, now: float, bases: dict) -> None:
        if ref.kind == SUMMARY:
            self._add_summary(ref)
            return
        st = self.store.add(ref, now)
        if ref.kind != OP:
            if st.verdict is None and st.explained_by is None:
                self._hang_cand[st.trace_id] = None
        else:
            if not ref.anomaly:
                what = (ref.comm, ref.func, ref.nbytes)
                judged = bases.get(what)
                if judged is None:
                    key = detect.baseline_key(*what)
                    judged = bases[what] = (self.baselines.get(key), self.baselines.window(key))
                base, window = judged
                duration = ref.end_ns - ref.start_ns
                if base is not None and duration >= self.slow_factor * base:
                    st.anomalous = True
                elif duration > 0:  # (detect.add_sample, inline: this runs once per span)
                    window.append(float(duration))
            # anomalous collectives, and every sampled one we hear from most ranks of (the agent's local rule
            # cannot see a slowdown that hides in the job's skew)
            if (st.anomalous or len(st.op) >= 3) and st.verdict is None and not st.analysed_slow:
                self._slow_cand.setdefault(st.trace_id, now)

    def _add_summary(self, ref) -> None:
        a = span_attributes(ref, _SUMMARY_KEYS)
        funcs, ops, means = a.get(sc.SUMMARY_FUNCS), a.get(sc.SUMMARY_FUNC_OPS), a.get(sc.SUMMARY_FUNC_DURATION_MEAN)
        total_ops, total_bytes = a.get(sc.SUMMARY_OPS), a.get(sc.SUMMARY_BYTES)
        if not (isinstance(funcs, list) and isinstance(means, list) and isinstance(total_ops, int) and total_ops > 0
                and isinstance(total_bytes, int)):
            return
        avg_bytes = total_bytes // total_ops
        for i, func in enumerate(funcs):
            if i < len(means) and isinstance(func, str) and isinstance(means[i], int):
                n = ops[i] if isinstance(ops, list) and i < len(ops) and isinstance(ops[i], int) else 1
                if n > 0:
                    self.baselines.add(detect.baseline_key(ref.comm, func, avg_bytes), means[i])

    # -- detection ------------------------------------------------------------------------------
    def start(self) -> "Processor":
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="mycroft-processor-tick", daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.tick_s):
            try:
                self.tick()
            except Exception:  # never let the timer die
                log.exception("processor tick failed")

    def shutdown(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self.exporter is not None:
            self.exporter.shutdown()

    def tick(self, now_ns: int | None = None) -> list[Verdict]:
        now_ns = self.clock_ns() if now_ns is None else now_ns
        mono = self.mono()
        out: list[Verdict] = []
        with self.lock:
            self.store.expire()
            self._stalling = None
            soonest_ns = self.stall_ms * 1e6 / 3  # the shortest stall any rule calls a hang (detect.is_hung)
            for tid in list(self._hang_cand):
                st = self.store.get(tid)
                if st is None or st.verdict is not None or st.explained_by is not None:
                    self._hang_cand.pop(tid, None)
                    continue
                # finishing the collective before this one is progress for this one (they run in order)
                st.last_progress_ns = max(st.last_progress_ns, self.store.runnable_ns(st))
                if now_ns - max(st.last_progress_ns, st.first_evidence_ns) < soonest_ns:
                    continue  # not hung yet whatever it holds: look again on a later tick
                if not st.has_hang_evidence():
                    if st.complete() or not st.inflight:
                        self._hang_cand.pop(tid, None)
                    continue
                # evidence still arriving (a restart, a late node): wait until the set of ranks is stable
                settling = (st.heard_from() < st.nranks and mono - st.ranks_changed_mono < self.settle_s)
                # a picture taken before the stall waits for the next snapshots (for one more stall at most:
                # an agent that stopped sending must not hide a hang)
                if (not settling and detect.is_hung(st, now_ns, self.stall_ms) and not self.store.queued(st)
                        and (detect.seen_stalled(st) or detect.is_hung(st, now_ns, 2 * self.stall_ms))):
                    v = self._analyse_hang(st, now_ns, mono)
                    if v is not None:
                        out.append(v)
            ready = []  # completed collectives to analyse now, measured together
            for tid, since in list(self._slow_cand.items()):
                st = self.store.get(tid)
                if st is None or st.verdict is not None or st.analysed_slow:
                    self._slow_cand.pop(tid, None)
                    continue
                if st.has_hang_evidence():
                    continue
                if st.complete() or mono - st.updated_mono >= self.settle_s or mono - since >= 3 * self.settle_s:
                    self._slow_cand.pop(tid, None)
                    st.analysed_slow = True
                    ready.append(st)
            for st, m in zip(ready, self._measure(ready)):
                v = self._analyse_slow(st, m, now_ns, mono)
                if v is not None:
                    out.append(v)
            if self._held_slow:
                out += self._release_held(now_ns, mono)
            for k, (t, _) in list(self._incidents.items()):
                if mono - t > INCIDENT_WINDOW_S:
                    del self._incidents[k]
            if self.metrics is not None:
                self.metrics.traces_in_memory(len(self.store), self.store.evicted_ttl, self.store.evicted_size,
                                              self.store.evicted_bytes, self.store.bytes)
        out.sort(key=lambda v: -v.finding.confidence)  # the surest first when several land together
        for v in out:
            self._publish(v)
        return out

    def _analyse_hang(self, st, now_ns: int, mono: float) -> Verdict | None:
        t0 = time.perf_counter()
        try:
            f = rca.analyse_hang(st)
        except Exception:  # hostile or inconsistent evidence must not stop the processor
            log.exception("hang analysis failed for trace %s", st.trace_id.hex())
            self.counts["analysis_errors"] += 1
            st.explained_by = st.trace_id
            return None
        dt = time.perf_counter() - t0
        if f is None:
            return None
        if f.category == "rank_absent" and f.reason == "silent" and f.waiting:
            moved_on = [r for r in f.ranks if self.store.seq_of.get((st.comm, r), -1) > st.seq]
            if moved_on and len(moved_on) == len(f.ranks):
                # the ranks we wait for have evidence in a later collective of this communicator: they
                # completed this one, so the waiting ranks expect something nobody sends
                f = self._mismatch_from_progress(st, f, moved_on)
        if f.category == "rank_absent" and f.reason in ("silent", "not_entered") and self._propagated(st, f, mono):
            return None
        return self._emit(st, f, now_ns, mono, dt)

    def _mismatch_from_progress(self, st, f: rca.Finding, moved_on: list[int]) -> rca.Finding:
        stuck = f.waiting
        nxt = min(self.store.seq_of[(st.comm, r)] for r in moved_on)
        detail = ""
        ref = st.inflight.get(stuck[0])
        if ref is not None:
            try:
                flows = rca.flows_of(ref)
                if flows:
                    detail = f" ({flows[0].done} of {flows[0].steps} steps done, expecting more)"
            except Exception:  # noqa: BLE001
                pass
        nf = rca.Finding(
            kind=sc.KIND_HANG, category="coll_mismatch", ranks=list(stuck),
            confidence=round(0.7 if len(stuck) < len(moved_on) + len(stuck) else 0.5, 3),
            evidence=(f"rank{'s' if len(stuck) > 1 else ''} {', '.join(map(str, stuck[:8]))} still wait in "
                      f"{st.func} {st.seq}{detail} while rank{'s' if len(moved_on) > 1 else ''} "
                      f"{', '.join(map(str, moved_on[:8]))} completed it and moved on to collective {nxt}: "
                      f"they disagree on the collective's size"),
            onset_ns=f.onset_ns, reason="moved_on", waiting=list(stuck))
        views = rca.build_views(st)
        rca._decorate(st, views, nf)
        return nf

    def _propagated(self, st, f: rca.Finding, mono: float) -> bool:
        """True when the culprit is busy in another hung trace (this trace waits for its verdict)."""
        others = []
        for r in f.ranks:
            # still in an earlier collective of this same communicator
            prev = self.store.seq_of.get((st.comm, r), -1)
            if 0 <= prev < st.seq:
                tid = self.store.trace_at.get((st.comm, prev))
                o = self.store.get(tid) if tid else None
                if o is not None and o.has_hang_evidence():
                    others.append(o)
            ref = st.status.get(r) or st.inflight.get(r)
            key = proc_key(ref) if ref is not None else None
            key = key or self.store.proc_of.get((st.comm, r))
            if key is None:
                continue
            if key[1] == "p" and any(proc_key(x) == key for x in st.inflight.values()):
                # known only by its process, which holds another rank waiting right here: that process is
                # not stuck elsewhere, this rank of it is missing (several GPUs per process)
                continue
            others += [o for o in self.store.busy_elsewhere(key, st.trace_id)
                       if (o.comm != st.comm or o.seq < st.seq) and o.has_hang_evidence()]
        if not others:
            return False
        for o in others:
            root = o
            hops = 0
            while root.explained_by is not None and hops < 8:
                nxt = self.store.get(root.explained_by)
                if nxt is None:
                    break
                root, hops = nxt, hops + 1
            if root.verdict is not None:
                st.explained_by = root.trace_id
                self._deferred.pop(st.trace_id, None)
                self.counts["propagated"] += 1
                if self.metrics is not None:
                    self.metrics.propagated()
                return True
        now_ns = self.clock_ns()
        if any(not detect.is_hung(o, now_ns, self.stall_ms) for o in others):
            # the culprit is busy in a collective that still moves: it is slow there, not absent here;
            # that collective either completes (then this trace proceeds) or hangs (then it is the root)
            self._deferred.pop(st.trace_id, None)
            return True
        self._waits_on[st.trace_id] = {o.trace_id for o in others}
        if len(self._waits_on) > 4096:
            self._waits_on.pop(next(iter(self._waits_on)))
        if all(st.trace_id in self._waits_on.get(o.trace_id, ()) for o in others):
            # a cycle: every hung trace we would wait for waits for this one (ranks sharing a process
            # see each other busy); waiting breaks no tie, so this one is named now and the others then
            # find its verdict (propagation or same-culprit dedupe)
            self._deferred.pop(st.trace_id, None)
            return False
        first = self._deferred.setdefault(st.trace_id, mono)
        # the other trace is hung: wait for its verdict, but not forever (a cycle of waits)
        return mono - first < max(2.0 * self.stall_ms / 1000.0, 1.0)

    def _measure(self, traces: list) -> list:
        """The traces' slowdown measures, MEASURE_BATCH at a time (None where a batch failed: hostile
        evidence; those are measured, and fail, alone)."""
        out: list = []
        for i in range(0, len(traces), MEASURE_BATCH):
            batch = traces[i:i + MEASURE_BATCH]
            try:
                out += slowdown.measure(batch)
            except Exception:  # noqa: BLE001 -- the per-trace analysis logs it
                out += [None] * len(batch)
        return out

    def _analyse_slow(self, st, m, now_ns: int, mono: float) -> Verdict | None:
        t0 = time.perf_counter()
        try:
            base = detect.trace_baseline(st, self.baselines)
            # per-step waits depend on the chunk size, so on the message size: a communicator alternating a
            # large and a small collective would otherwise judge the small one's waits by the large one's
            # (conformance slow_gpu alternates 4 and 8 MiB AllReduces: one processor of two missed it);
            # a transfer's two ends are one measure. The job's history, the reference while this one is thin,
            # pools everything: split by size it stayed too thin for a pipeline's transfers (pp_slow_transfer)
            hist_key = detect.baseline_key(st.comm, "p2p" if st.func in P2P else st.func,
                                           next(iter(st.op.values())).nbytes if st.op else 0)
            hist = self._history.get(hist_key)
            if hist is None:
                if len(self._history) > 4096:
                    del self._history[next(iter(self._history))]
                hist = self._history[hist_key] = slowdown.new_history(256)
            job = st.job
            jh = self._job_history.get(job)
            if jh is None:
                if len(self._job_history) > 256:
                    self._job_history.pop(next(iter(self._job_history)))
                jh = self._job_history[job] = slowdown.new_history(1024)
            hist["job"] = jh  # the reference while this communicator's own is thin
            f = slowdown.analyse_slowdown(st, m, base, self.slow_factor, history=hist)
        except Exception:
            log.exception("slowdown analysis failed for trace %s", st.trace_id.hex())
            self.counts["analysis_errors"] += 1
            return None
        dt = time.perf_counter() - t0
        warm = not 0 <= st.seq < WARMUP_SEQ
        if f is None or f.confidence < 0.5:
            if warm:
                self._analysed_seq(st)
            return None
        if f.category == "coll_mismatch":
            return self._emit(st, f, now_ns, mono, dt)
        if not warm:
            self.counts["slow_candidates"] += 1
            return None
        # while a collective of this job is stalling, slow collectives around it may be its symptoms -- once it
        # has stalled for longer than this one took (under a heavy slowdown every collective stalls a while):
        # this one waits until the stall is named a hang (then it was a symptom) or recovers (a slow p2p
        # transfer stalls the collectives of its ranks' process for seconds: conformance pp_slow_transfer)
        took = max((r.end_ns for r in st.op.values()), default=0) - min((r.start_ns for r in st.op.values()), default=0)
        if self._stall_of(st.job, now_ns) >= max(1_000_000_000, took):
            if len(self._held_slow) >= 4096:
                self._held_slow.pop(next(iter(self._held_slow)))
            self._held_slow[st.trace_id] = _HeldSlow(mono, f, dt, took)
            self.counts["slow_candidates"] += 1
            return None
        return self._vote(st, f, now_ns, mono, dt)

    def _stall_of(self, job: str, now_ns: int) -> int:
        """The longest stall among the job's traces not named yet (ns; computed once a tick)."""
        if self._stalling is None:
            self._stalling = {}
            for tid in self._hang_cand:
                o = self.store.get(tid)
                if o is not None and o.verdict is None:
                    self._stalling[o.job] = max(self._stalling.get(o.job, 0), detect.stall_ns(o, now_ns))
        return self._stalling.get(job, 0)

    def _release_held(self, now_ns: int, mono: float) -> list[Verdict]:
        """The held slow collectives whose job stalls no longer: a hang named since explains them, else they
        vote as usual."""
        out = []
        for tid, d in list(self._held_slow.items()):
            st = self.store.get(tid)
            if st is None or st.verdict is not None or st.explained_by is not None:
                del self._held_slow[tid]
                continue
            hang = next((h for t, h, who in reversed(self._hang_culprits)
                         if t >= d.since and any(j == st.job for j, _, _ in who)), None)
            if hang is not None:
                del self._held_slow[tid]
                st.explained_by = hang
                self.counts["deduped"] += 1
            elif self._stall_of(st.job, now_ns) < max(1_000_000_000, d.took):
                del self._held_slow[tid]
                v = self._vote(st, d.finding, now_ns, mono, d.analysis_s)
                if v is not None:
                    out.append(v)
        return out

    def _vote(self, st, f: rca.Finding, now_ns: int, mono: float, dt: float) -> Verdict | None:
        """A slowdown finding, unless a named incident explains it, counted toward its culprit's recurrence;
        the verdict when it has recurred enough."""
        self._fill_identity(st, f)
        # a named slowdown's symptoms: a flow into or out of its culprit (a slow GPU drains the flows into it
        # slowly), a collective slow as a whole with its culprit among the ranks (conformance slow_gpu and
        # pp_slow_transfer: slow_flow and slow_proxy verdicts after the right one)
        near = list(st.op) if f.reason == slowdown.WHOLE else [f.peer] if f.peer is not None else []
        named = self._slow_incident(f.job, st.comm, near, mono)
        if named is not None:
            st.explained_by = named
            self.counts["deduped"] += 1
            return None
        # a fault persists, jitter moves around: the same culprit must come back before we name it
        # the same culprit process recurring, in this communicator or another one (a slow GPU slows them all)
        key = (f.job, f.category, _culprit(st.comm, f.global_ranks, f.ranks), f.channel)
        inferred = f.reason == slowdown.WHOLE
        if inferred and self._direct_candidate(f.job, st.comm, key[2], mono):
            # a culprit inferred from a slow whole yields to one that counters point at directly while that
            # one collects its votes (conformance slow_gpu: slow_proxy at a healthy rank first, every
            # collective being slow behind the slow GPU); a stray vote elsewhere holds nothing up
            self.counts["slow_candidates"] += 1
            return None
        votes = [v for v in self._slow_votes.get(key, []) if mono - v.at <= SLOW_WINDOW_S and v.trace_id != st.trace_id]
        strength = -1 if f.reason == "weak" else 0 if f.reason == "soft" else 2 if f.confidence >= 0.95 else 1
        stalled = ((min(r.start_ns for r in st.inflight.values()), max(r.end_ns for r in st.inflight.values()))
                   if f.recovered and st.inflight else None)
        self._analysed_seq(st)
        votes.append(_Vote(mono, st.trace_id, f.onset_ns, strength, stalled, st.comm, st.seq, inferred,
                           f.ranks[0] if f.ranks else -1))
        self._slow_votes[key] = votes[-2 * max(SOFT_CONFIRM, WEAK_OF):]
        if len(self._slow_votes) > 4096:
            for k in [k for k, v in self._slow_votes.items() if mono - v[-1].at > SLOW_WINDOW_S]:
                del self._slow_votes[k]
        # milder outliers (flagged by the culprit's own agent, below the bars) must persist longer
        # (and close together: a fault slows every collective, jitter comes back now and then)
        seen = _distinct(_dense([v for v in votes if v.strength >= 0][-2 * SOFT_CONFIRM - 1:], self._analysed))
        soft = [v for v in seen if mono - v.at <= SOFT_WINDOW_S]
        # ... or the culprit's own agent has flagged most of its recent collectives slow (carried in this trace,
        # so one processor of several, seeing only its share of the collectives, needs fewer traces). Most,
        # not a few: on a loaded host a healthy rank's agent flags 3 of 8 now and then, and one 50x outlier
        # in such a stretch named a healthy rank (conformance slow_flow, before the fault). A fault flags all.
        # Yet the flags say only that the rank's collectives were slow -- every member of a communicator with a
        # slow member sees that, and so does every rank of a loaded host -- so the outlier itself must come back
        # at least once strictly, or twice more mildly: 5 flags and one strict outlier after a milder one, or 7
        # flags and two milder ones, named healthy ranks of a loaded host (conformance pp_slow_transfer before
        # the fault, healthy_jittery).
        # (not for a stall that recovered: on an overloaded host healthy collectives stall now and then)
        local = 0 if f.recovered else max((st.op[r].recent for r in [*f.ranks, f.peer] if r in st.op), default=0)
        strict = sum(v.strength >= 1 for v in seen)
        enough = strength >= 0 and (
            strict >= SLOW_CONFIRM or sum(v.strength == 2 for v in seen) >= STRONG_CONFIRM
            or len(soft) >= SOFT_CONFIRM or (strict >= 2 and local >= LOCAL_CONFIRM)
            or (len(seen) >= LOCAL_SOFT_VOTES and local >= LOCAL_CONFIRM_SOFT))
        if not enough and st.func not in P2P:
            # weak outliers: the same culprit in nearly every collective of the communicator, one after another
            # (a GPU 30x slower per step read 8-15x a loaded host's noisy reference, top in 15 of 15 collectives;
            # healthy ranks of a loaded host were top at >= 6x, flagged, in at most 6 of 10 -- recorded runs)
            latest = list(self._analysed.get(st.comm, ()))[-WEAK_OF:]
            mine = {v.seq for v in votes if v.comm == st.comm}
            if len(latest) >= WEAK_OF and sum(q in mine for q, _ in latest) >= WEAK_CONFIRM:
                enough, seen = True, [v for v in votes if v.comm == st.comm and v.seq >= latest[0][0]]
        if not enough:
            self.counts["slow_candidates"] += 1
            return None
        f.onset_ns = min((v.onset_ns for v in seen if v.onset_ns > 0), default=f.onset_ns)
        f.evidence += f" (seen in {len(seen)} collectives)"
        return self._emit(st, f, now_ns, mono, dt)

    def _direct_candidate(self, job: str, comm: str, culprit: tuple, mono: float) -> bool:
        """Another culprit in this communicator came back lately on evidence of its own (not inferred): two
        strict votes within SOFT_WINDOW_S."""
        for (j, _cat, who, _ch), votes in self._slow_votes.items():
            if j == job and who != culprit and sum(
                    v.comm == comm and v.strength >= 1 and not v.inferred and mono - v.at <= SOFT_WINDOW_S
                    for v in votes[-3:]) >= 2:
                return True
        return False

    def _analysed_seq(self, st) -> None:
        seqs = self._analysed.get(st.comm)
        if seqs is None:
            if len(self._analysed) > 4096:
                del self._analysed[next(iter(self._analysed))]
            seqs = self._analysed[st.comm] = deque(maxlen=ANALYSED_KEPT)
        seqs.append((st.seq, tuple(st.op) if st.func in P2P else None))

    def _slow_incident(self, job: str, comm: str, ranks: list[int], mono: float) -> bytes | None:
        """The live slowdown incident (its trace id) whose culprit process is one of these ranks of the
        communicator, if any (named by its global rank, or by its rank when that was not known yet)."""
        for r in ranks:
            proc = self.store.proc_of.get((comm, r))
            known = [proc[2]] if proc is not None and proc[1] == "g" else []
            for who in {_culprit(comm, known, [r]), _culprit(comm, [], [r])}:
                hit = self._incidents.get((sc.KIND_SLOWDOWN, job, who))
                if hit is not None and mono - hit[0] <= INCIDENT_WINDOW_S:
                    return hit[1]
        return None

    def _fill_identity(self, st, f: rca.Finding) -> None:
        """The job, and global ranks and hosts of culprits that sent nothing in this trace (from other
        traces of the comm)."""
        f.job = f.job or st.job
        if len(f.global_ranks) == len(f.ranks) and f.hosts:
            return
        g, hosts = [], list(f.hosts)
        for r in f.ranks:
            key = self.store.proc_of.get((st.comm, r))
            if key is not None:
                if key[1] == "g":
                    g.append(key[2])
                if key[0] and key[0] not in hosts:
                    hosts.append(key[0])
        if len(g) == len(f.ranks):
            f.global_ranks = g
        f.hosts = hosts

    def _same_hang_incident(self, f: rca.Finding, mono: float) -> bytes | None:
        """A hang whose culprit processes were already named by a live hang incident (e.g. a dead host seen
        from each of its communicators) is that incident."""
        if f.kind != sc.KIND_HANG:
            return None
        mine = _identity(f)
        for (t, tid, procs) in self._hang_culprits:
            if mono - t <= INCIDENT_WINDOW_S and (mine & procs or any((j, h, "*") in procs for j, h, _ in mine)):
                return tid
        return None

    def _emit(self, st, f: rca.Finding, now_ns: int, mono: float, dt: float) -> Verdict | None:
        self._fill_identity(st, f)
        same = self._same_hang_incident(f, mono)
        slow = self._slow_comms.get((f.job, st.comm))
        if (same is None and f.kind == sc.KIND_HANG and f.confidence < 0.5 and slow is not None
                and mono - slow[0] <= INCIDENT_WINDOW_S):
            # a weak hang reading (a cycle of waits nobody explains) in a communicator a named culprit is
            # slowing down right now: that culprit's incident, not a new one
            same = slow[1]
        if same is not None:
            st.explained_by = same
            self.counts["deduped"] += 1
            return None
        if f.kind == sc.KIND_SLOWDOWN and f.category != "coll_mismatch":
            # one slowdown incident per culprit process, whatever communicator, category or channel
            # shows it next (a slow GPU slows all its communicators; a slow flow shows on sibling channels)
            key = (f.kind, f.job, _culprit(st.comm, f.global_ranks, f.ranks))
            # ... and, for milder outliers, per host: its other ranks wait for it in their intra-node (TP)
            # collectives, so their next collectives start late and read as a slow GPU or flow of their
            # own -- symptoms (a strong outlier on the same host is a fault of its own)
            for (t, tid, job, hosts) in self._slow_hosts if f.reason in slowdown.MILD else ():
                if mono - t <= INCIDENT_WINDOW_S and job == f.job and hosts & set(f.hosts):
                    st.explained_by = tid
                    self.counts["deduped"] += 1
                    return None
        else:
            key = (f.kind, f.category, st.comm, tuple(f.ranks), f.channel)
        prev = self._incidents.get(key)
        if prev is not None and mono - prev[0] <= INCIDENT_WINDOW_S:
            self._incidents[key] = (mono, prev[1])
            st.explained_by = prev[1]
            self.counts["deduped"] += 1
            return None
        tid = int.from_bytes(st.trace_id, "big")
        v = Verdict(trace_id=st.trace_id, span_id=ids.span_id(tid, -1, sc.ROLE_ROOT_CAUSE, 0).to_bytes(8, "big"),
                    comm=st.comm, seq=st.seq, func=st.func, finding=f, detected_ns=now_ns, analysis_s=dt)
        if f.onset_ns <= 0 or f.onset_ns > now_ns:
            f.onset_ns = min(now_ns, max(st.last_progress_ns, st.first_evidence_ns) or now_ns)
        st.verdict = v
        self._incidents[key] = (mono, st.trace_id)
        if f.kind == sc.KIND_HANG:
            self._hang_culprits.append((mono, st.trace_id, _identity(f)))
            del self._hang_culprits[:-256]
        elif f.category != "coll_mismatch":
            if f.hosts:
                self._slow_hosts.append((mono, st.trace_id, f.job, set(f.hosts)))
                del self._slow_hosts[:-256]
            if len(self._slow_comms) > 4096:
                self._slow_comms.pop(next(iter(self._slow_comms)))
            self._slow_comms[(f.job, st.comm)] = (mono, st.trace_id)
        self.verdicts.append(v)
        return v

    def _publish(self, v: Verdict) -> None:
        log.warning("root cause: %s", v.summary())
        if self.metrics is not None:
            self.metrics.verdict(v)
        if self.exporter is not None:
            try:
                self.exporter.export(v)
            except Exception:
                log.exception("root-cause export failed")
        for fn in list(self.listeners):
            try:
                fn(v)
            except Exception:
                log.exception("verdict listener failed")
