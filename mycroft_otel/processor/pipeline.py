"""The processor proper: ingest -> per-trace state -> detection on a timer -> findings -> verdicts.

:class:`Processor` is what the receiver feeds and what the CLI, the demo and the tests drive. Spans land in
per-trace state (state.py). Each tick (every ``tick_s``):

1. hang candidates (traces with in-flight evidence) that stalled for MYCROFT_STALL_MS go to the hang walk
   (rca.py); what other traces say about the culprit comes from propagation.py;
2. completed collectives that settled are measured together (slowdown.py) and judged one by one, in
   completion order, by the sequential slowdown test (detector.py); a slow collective judged while a
   collective of its job is stalling waits for that stall's outcome (a named hang explains it);
3. findings become verdicts through incidents.py (one per incident), published surest first;
4. published verdicts open their job's incident (open_incidents.py), which the spans of the job keep open
   or close (a hang ends when the job moves again): the page reads it from /metrics.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from typing import Callable

from mycroft_otel.processor import detect, rca, shards, slowdown
from mycroft_otel.processor.checkpoint import Checkpoint
from mycroft_otel.processor.detector import SlowdownDetector
from mycroft_otel.processor.held import Held, HeldFindings
from mycroft_otel.processor.incidents import Incidents, Verdict
from mycroft_otel.processor.open_incidents import OpenIncidents
from mycroft_otel.processor.outcome import Decided, Decision, Outcome, silent
from mycroft_otel.processor.propagation import Propagation
from mycroft_otel.processor.allocator import Trimmer
from mycroft_otel.processor.published import PublishedVerdicts
from mycroft_otel.processor.settings import Settings
from mycroft_otel.processor.spans import OP, SUMMARY, decode, detach
from mycroft_otel.processor.state import TraceStore
from mycroft_otel.processor.views import Finding

__all__ = ["Processor", "Verdict"]

log = logging.getLogger("mycroft_otel.processor")

_DECISIONS_KEPT = 4096  # decisions kept for `report` and tests (each a few hundred bytes)


def _hang_detail(f: Finding) -> str:
    """A hang's decision in words: its category and culprit ranks (the hang walk names no hypothesis)."""
    return f"{f.category} rank {','.join(map(str, f.ranks))}"


class Processor:
    """Thread-safe: the receiver's threads call :meth:`ingest_request`; a timer calls :meth:`tick`."""

    def __init__(self, env=None, exporter=None, metrics=None, clock_ns: Callable[[], int] = time.time_ns,
                 tick_s: float = 0.2, settle_s: float = 1.0, stall_ms: float | None = None,
                 mono_clock: Callable[[], float] = time.monotonic, settings: Settings | None = None,
                 incident_clock: Callable[[], float] | None = None, published: PublishedVerdicts | None = None,
                 checkpoint: Checkpoint | None = None):
        self.settings = settings if settings is not None else Settings.from_env(env, stall_ms)
        s = self.settings
        self.stall_ms = s.stall_ms
        self.slow_factor = s.slow_factor
        self.store = TraceStore(ttl_s=s.trace_ttl_s, max_traces=s.max_traces, clock=mono_clock,
                                max_bytes=s.max_trace_bytes,
                                on_drop=metrics.spans_dropped if metrics is not None else None)
        self.mono = mono_clock
        self.baselines = detect.Baselines()
        self.stall_thresholds = detect.StallThresholds(s.stall_ms)
        self.exporter = exporter
        self.metrics = metrics
        self.published = published  # (--state-dir) verdicts published before a restart are not published again
        self._trimmer = Trimmer()
        self.clock_ns = clock_ns
        self.tick_s = tick_s
        self.settle_s = settle_s
        self.lock = threading.RLock()
        self.listeners: list[Callable[[Verdict], None]] = []
        self.incidents = Incidents(self.store, s.incident_window_s)
        # its own clock, injectable: a page lives minutes to hours of the job's time, apart from the detector's
        self.open_incidents = OpenIncidents(self.store, s.incident_quiet_s, s.trace_ui_url, s.runbook_url,
                                            metrics, incident_clock or mono_clock)
        self.propagation = Propagation(self.store, s.stall_ms, clock_ns)
        self.detector = SlowdownDetector(s, lambda comm, rank: self.store.proc_of.get((comm, rank)),
                                         self.store.waiting, self.store.earlier)
        self._hang_cand: dict[bytes, None] = {}
        self._slow_cand: dict[bytes, float] = {}
        self._held = HeldFindings(self.store, self._hang_cand)  # slowdown findings waiting for a stall's outcome
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.counts = Counter({"spans": 0, "unknown": 0, "ignored": 0, "propagated": 0, "deduped": 0,
                               "analysis_errors": 0, "slow_candidates": 0})  # plus "decision:<outcome>"
        self.decisions: deque[Decided] = deque(maxlen=_DECISIONS_KEPT)  # the latest, oldest first
        self.checkpoint = checkpoint  # (--state-dir) the learned history, restored now, saved by the timer
        if checkpoint is not None:
            checkpoint.load(self)

    @property
    def verdicts(self) -> list[Verdict]:
        return self.incidents.verdicts

    # -- ingest ---------------------------------------------------------------------------------
    def ingest_payload(self, data: bytes) -> int:
        """Ingest one ExportTraceServiceRequest payload (protobuf bytes); returns the number of spans rejected
        (unknown shape). Raises ValueError when the payload is malformed (nothing of it is ingested)."""
        d = decode(data)
        with self.lock:
            now = self.mono()
            bases: dict = {}  # (comm, func, bytes) -> (baseline, its samples) this payload's op spans are judged by
            refs = detach(d.refs, len(data))
            add = self._add
            for ref in refs:
                add(ref, now, bases)
            if self.open_incidents:
                self.open_incidents.heard(refs)
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
        kind = ref.kind
        if kind == SUMMARY:
            self.baselines.add_summary(ref)
            return
        st = self.store.add(ref, now)
        if kind != OP:
            if st.verdict is None and st.explained_by is None:
                self._hang_cand[st.trace_id] = None
            return
        heard = len(st.op)
        duration = ref.end_ns - ref.start_ns
        if heard == 1:  # one duration per collective: its first completed rank's
            self.stall_thresholds.completed(detect.baseline_key(ref.comm, ref.func, ref.nbytes), duration)
        if not ref.anomaly:
            what = (ref.comm, ref.func, ref.nbytes)
            judged = bases.get(what)
            if judged is None:
                key = detect.baseline_key(*what)
                judged = bases[what] = (self.baselines.get(key), self.baselines.window(key))
            base, window = judged
            if base is not None and duration >= self.slow_factor * base:
                st.anomalous = True
            elif duration > 0:  # (detect.add_sample, inline: this runs once per span)
                window.append(float(duration))
        # anomalous collectives, and every sampled one we hear from most ranks of (the agent's local rule
        # cannot see a slowdown that hides in the job's skew): min(3, max(nranks, 2)) of them
        if (st.anomalous or heard >= (3 if st.nranks >= 3 else 2)) and st.verdict is None and not st.analysed_slow:
            self._slow_cand.setdefault(st.trace_id, now)

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
        if self.checkpoint is not None:
            self.checkpoint.save(self)
        if self.exporter is not None:
            self.exporter.shutdown()

    def tick(self, now_ns: int | None = None) -> list[Verdict]:
        """One round of detection; the verdicts it published."""
        now_ns = self.clock_ns() if now_ns is None else now_ns
        mono = self.mono()
        out: list[Verdict] = []
        with self.lock:
            self.store.expire()
            self._trimmer.watch(self.store.bytes)  # after a burst expired: its memory back to the system
            self._held.new_tick()
            out += self._hangs(now_ns, mono)
            ready = []  # completed collectives to analyse now, measured together
            for tid, since in list(self._slow_cand.items()):
                st = self.store.get(tid)
                if st is None or st.verdict is not None or st.analysed_slow:
                    self._slow_cand.pop(tid, None)
                    continue
                if st.has_hang_evidence():
                    continue
                if (st.complete(shards.ranks_here(self.store, st)) or mono - st.updated_mono >= self.settle_s
                        or mono - since >= 3 * self.settle_s):
                    self._slow_cand.pop(tid, None)
                    st.analysed_slow = True
                    ready.append(st)
            # in the job's order, whatever order the spans came in (the agent reads its rings in directory
            # order): the sequential test counts a collective that started before its latest evidence as late
            # news, so the order within one tick decides what counts
            ready.sort(key=lambda st: (min((r.start_ns for r in st.op.values()), default=0), st.seq))
            for st, m in zip(ready, self._measure(ready)):
                v = self._analyse_slow(st, m, now_ns, mono)
                if v is not None:
                    out.append(v)
            if self._held:
                out += self._release_held(now_ns, mono)
            self.incidents.expire(mono)
            self.open_incidents.expire()
            if self.metrics is not None:
                self.metrics.traces_in_memory(len(self.store), self.store.evicted_ttl, self.store.evicted_size,
                                              self.store.evicted_bytes, self.store.bytes)
        out.sort(key=lambda v: -v.finding.confidence)  # the surest first when several land together
        published = [v for v in out if self._publish(v)]
        if self.checkpoint is not None and (out or self.checkpoint.due(self)):  # a verdict: its incident now
            self.checkpoint.save(self)
        return published

    # -- hangs ----------------------------------------------------------------------------------
    def _hangs(self, now_ns: int, mono: float) -> list[Verdict]:
        """The hung collectives' verdicts. All that are ready are analysed first, then heard surest first
        (then the one that stopped progressing first, then by trace id): a guess about a collective without
        network flows waits for the evidence that another collective of the same tick holds, and which
        agent's request arrived first (or which processor of a gateway it went through) decides nothing."""
        found = [x for x in map(self._analyse_hang, self._hung(now_ns, mono)) if x is not None]
        found.sort(key=lambda x: (-x[1].confidence, x[0].stopped_ns, x[0].trace_id))
        out, waited = [], []
        for x in found:
            v = self._hear_hang(*x, now_ns, mono)
            if v is not None:
                out.append(v)
            elif self.propagation.waits_for(x[0]):
                waited.append(x)
        # a wait heard later in the tick may close a cycle with one heard before it: those are heard again
        for x in waited:
            v = self._hear_hang(*x, now_ns, mono)
            if v is not None:
                out.append(v)
        return out

    def _hung(self, now_ns: int, mono: float) -> list:
        """The hang candidates whose evidence is ready for the analysis (the others wait, or are dropped)."""
        ready = []
        soonest_ns = self.stall_ms * 1e6 / 3  # the shortest stall any rule calls a hang (detect.is_hung)
        for tid in list(self._hang_cand):
            st = self.store.get(tid)
            if st is None or st.verdict is not None or st.explained_by is not None:
                self._hang_cand.pop(tid, None)
                continue
            # finishing the collective before this one is progress for this one (they run in order)
            st.last_progress_ns = max(st.last_progress_ns, self.store.runnable_ns(st))
            if now_ns - st.stopped_ns < soonest_ns:
                continue  # not hung yet whatever it holds: look again on a later tick
            if not st.has_hang_evidence():
                if st.complete(shards.ranks_here(self.store, st)) or not st.inflight:
                    self._hang_cand.pop(tid, None)
                continue
            # evidence still arriving (a restart, a late node): wait until the set of ranks is stable
            settling = shards.settling(self.store, st, mono, self.settle_s)
            # a picture taken before the stall waits for the next snapshots (for one more stall at most:
            # an agent that stopped sending must not hide a hang)
            stall_ms = self.stall_thresholds.for_trace(st)
            if (not settling and detect.is_hung(st, now_ns, stall_ms) and not self.store.queued(st)
                    and (detect.seen_stalled(st) or detect.is_hung(st, now_ns, 2 * stall_ms))):
                ready.append(st)
        return ready

    def _analyse_hang(self, st) -> tuple | None:
        """(st, finding, seconds the analysis took), or None: no finding (or evidence the analysis failed on)."""
        t0 = time.perf_counter()
        outside = shards.outside(self.store, st)
        try:
            f = rca.analyse_hang(st, earlier=lambda: self.store.earlier(st), outside=outside)
        except Exception:  # hostile or inconsistent evidence must not stop the processor
            log.exception("hang analysis failed for trace %s", st.trace_id.hex())
            self.counts["analysis_errors"] += 1
            st.explained_by = st.trace_id
            self._decided(st, silent(Outcome.ERROR, "the hang walk raised"))
            return None
        if f is None and outside is not None:  # analysed once: its culprit is the other shard's to name
            st.explained_by, st.elsewhere = st.trace_id, True
            self._decided(st, silent(Outcome.OTHER_SHARD, "every wait leads to ranks of another shard"))
        return None if f is None else (st, f, time.perf_counter() - t0)

    def _hear_hang(self, st, f: Finding, dt: float, now_ns: int, mono: float) -> Verdict | None:
        """A hang's finding after the others heard before it: moved on, waiting for another's verdict, or a
        verdict."""
        f = self.propagation.moved_on(st, f)
        before = self.propagation.propagated
        if self.propagation.waits(st, f, mono):
            if self.propagation.propagated > before:
                self.counts["propagated"] += 1
                self._decided(st, silent(Outcome.WAITS_ON, _hang_detail(f)))
                if self.metrics is not None:
                    self.metrics.propagated()
            return None
        return self._emit(st, f, now_ns, mono, dt, Decision(Outcome.HANG, f, _hang_detail(f)))

    # -- slowdowns ------------------------------------------------------------------------------
    def _measure(self, traces: list) -> list:
        """The traces' slowdown measures, a batch at a time (None where a batch failed: hostile evidence;
        those are measured, and fail, alone)."""
        out: list = []
        n = self.settings.measure_batch
        for i in range(0, len(traces), n):
            batch = traces[i:i + n]
            try:
                out += slowdown.measure(batch)
            except Exception:  # noqa: BLE001 -- the per-trace analysis logs it
                out += [None] * len(batch)
        return out

    def _analyse_slow(self, st, m, now_ns: int, mono: float) -> Verdict | None:
        t0 = time.perf_counter()
        try:
            d = self.detector.judge(st, m, mono)
        except Exception:
            log.exception("slowdown analysis failed for trace %s", st.trace_id.hex())
            self.counts["analysis_errors"] += 1
            self._decided(st, silent(Outcome.ERROR))
            return None
        dt = time.perf_counter() - t0
        f = d.finding
        if f is None:
            self._decided(st, d)
            return None
        if d.outcome == Outcome.MISMATCH:
            return self._emit(st, f, now_ns, mono, dt, d)
        # slow collectives around a stall of their job may be its symptoms (held.py)
        took = max((r.end_ns for r in st.op.values()), default=0) - min((r.start_ns for r in st.op.values()), default=0)
        if self._held.should_hold(st, took, now_ns):
            self._held.hold(st, Held(mono, d, dt, took))
            self.counts["slow_candidates"] += 1
            self._decided(st, silent(Outcome.HELD_FOR_STALL, d.finding.hypothesis if d.finding else ""))
            return None
        return self._emit(st, f, now_ns, mono, dt, d)

    def _decided(self, st, d: Decision) -> None:
        """Count one decision about a collective (a verdict or a silence and its reason) and keep the latest
        ones for `report` and tests (bounded)."""
        self.counts["decision:" + d.outcome.value] += 1
        self.decisions.append(Decided(st.comm, st.seq, d.outcome,
                                      d.detail or (d.finding.hypothesis if d.finding else "")))
        if self.metrics is not None:
            self.metrics.decided(d.outcome)

    def _release_held(self, now_ns: int, mono: float) -> list[Verdict]:
        """The held slowdown findings whose job stalls no longer: a hang named since explains them, else
        they are emitted as usual."""
        out = []
        for st, h, hang in self._held.release(now_ns, self.incidents):
            if hang is not None:
                st.explained_by = hang
                self.counts["deduped"] += 1
                self._decided(st, silent(Outcome.SAME_INCIDENT, "a hang named while it was held"))
                continue
            v = self._emit(st, h.decision.finding, now_ns, mono, h.analysis_s, h.decision)
            if v is not None:
                out.append(v)
        return out

    # -- verdicts -------------------------------------------------------------------------------
    def _emit(self, st, f: Finding, now_ns: int, mono: float, dt: float,
              d: Decision | None = None) -> Verdict | None:
        v = self.incidents.emit(st, f, now_ns, mono, dt)
        if v is None:
            self.counts["deduped"] += 1
            if st.explained_by is not None:  # the incident's evidence persists
                self.open_incidents.touch(st.explained_by)
        if d is not None:
            self._decided(st, d if v is not None else silent(Outcome.SAME_INCIDENT, d.detail or f.hypothesis))
        return v

    def _publish(self, v: Verdict) -> bool:
        """Publish a verdict (its page, the root-cause span, the listeners); False when it was published before a
        restart (``--state-dir``): its page opens again, nothing else."""
        with self.lock:  # a restarted processor that names a published verdict again still has its incident
            self.open_incidents.verdict(v)  # open: the job is still hung, its page must not resolve
        if self.published is not None and not self.published.first(v.trace_id):
            self.counts["already_published"] += 1
            return False
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
        return True
