"""The node agent's poll loop: discover → read → spans → sample → export.

Every MYCROFT_POLL_MS the :class:`Agent` rescans the ring directory, and for each
rank context (one shared-memory file, a :class:`~.source.RingSource`):

1. drains new completion records from the ring (bounded per poll, never waits on export);
2. classifies them (:mod:`.sampling`: slow / late / had in-flight snapshots) and keeps
   anomalous and sampled ones as ``nccl.<Func>`` spans (:mod:`.spans`), the rest in the
   window's summary;
3. snapshots the live table: operations in flight longer than MYCROFT_INFLIGHT_AFTER_MS
   get a ``mycroft.inflight`` span every MYCROFT_SNAPSHOT_MS;
4. emits ``mycroft.status`` evidence: ``not_entered`` for a rank idle past
   MYCROFT_IDLE_AFTER_MS (with back-off), ``process_exited`` when the writer is gone;
5. queues the spans with the ring's cursor for export (:mod:`.exporter`); committed
   cursors are persisted (:mod:`.state`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from mycroft_otel import semconv as sc
from mycroft_otel.agent import spans as sp
from mycroft_otel.agent import provenance
from mycroft_otel.agent.budget import SNAPSHOTS_PER_RING, PollBudget, RingCredit
from mycroft_otel.agent.discovery import Candidate, Discovery, sparse_problem
from mycroft_otel.agent.exporter import ExportQueue, OtlpTransport, Transport
from mycroft_otel.agent.health import Health, RateLimitedLog
from mycroft_otel.agent.metrics import CollectiveMetrics
from mycroft_otel.agent.plugin_counters import PluginCounters
from mycroft_otel.agent.sampling import Baselines, Cadence, FlowRule, StepPattern, Summary, sample_bound, sampled
from mycroft_otel.agent.settings import AgentSettings
from mycroft_otel.agent.source import PROC_EXITED, PROC_STOPPED, RingSource, default_reader_factory
from mycroft_otel.agent.state import CursorStore
from mycroft_otel.native import ring_ops

log = logging.getLogger("mycroft_otel.agent")

MAX_RECORDS_PER_READ = 4096
MAX_READS_PER_POLL = 8
MAX_STATUS_BACKOFF_NS = 60_000_000_000
HISTORY = 64  # unexported completions kept per ring, for when a local peer flags the same collective
FLAGGED = 4096  # (comm, trace) flagged anomalous by some local rank, remembered
RECENT_ON_STALL = 4  # unexported completions of the communicator exported with a rank's first stalled snapshot
VECTOR_MIN = 24  # batches of at least this many spans go through the vectorised encoder
STALE_RING_NS = 600_000_000_000  # a crashed writer's ring older than this at discovery is history, not evidence
MIN_OP_NS = 1000  # no NCCL operation completes in under a microsecond: bounds what a ring can have dropped


@dataclass
class _Inflight:
    k: int = -1             # last snapshot number emitted
    anomaly: str = sc.ANOMALY_SLOW


@dataclass
class _Ctx:
    """Per-source state of the loop."""
    src: RingSource
    builder: sp.SpanBuilder
    baselines: Baselines
    summary: Summary
    inflight: dict[int, _Inflight] = field(default_factory=dict)   # op_id -> snapshots state
    had_inflight: dict[int, str] = field(default_factory=dict)     # op_id -> anomaly, until it completes
    last_seq: int = -1            # last completed collective
    last_end: int = 0             # end of the last completed op (monotonic)
    busy: bool = False            # something in flight at the last poll
    idle_emits: int = 0           # not_entered emissions in the current idle period
    idle_next: int = 0            # monotonic ns of the next not_entered emission
    recent_sent: bool = False     # recent completions already exported in this idle period
    slow_marks: deque = field(default_factory=lambda: deque(maxlen=sc.RECENT_WINDOW))  # last collectives flagged slow?
    exit_emits: int = 0
    flow_rule: FlowRule = field(default_factory=FlowRule)  # slow by the flows' own waits (skew-proof)
    cadence: Cadence = field(default_factory=Cadence)  # a steady few complete traces for the cross-rank test
    step: StepPattern = field(default_factory=StepPattern)  # each collective's place in the training step
    exit_next: int = 0
    done: bool = False            # process exited and reported: nothing more to read
    remove: bool = False          # done, and the file is to be deleted once its last hand-over is exported
    committed: tuple = ()         # the last (cursor, last_seq, last_end) the exporter committed
    marked: tuple = ()            # (cursor, last_seq, last_end) last handed to the exporter
    history: deque = field(default_factory=lambda: deque(maxlen=HISTORY))  # recent unexported (trace, record)
    owner: int = 0                # uid owning the ring file: its spans speak for this user, its budget is theirs
    credit: RingCredit = field(default_factory=RingCredit)
    dropped: int = 0              # completions counted as overwritten in this ring
    in_flight: int = -1           # ops in flight at the last live-table read (-1: never read)


class Agent:
    def __init__(self, settings: AgentSettings, transport: Transport | None = None,
                 reader_factory: Callable[[str], Any] | None = None, resource_extra: list | None = None,
                 health: Health | None = None, only_pid: int | None = None,
                 clock: Callable[[], int] | None = None, metrics: CollectiveMetrics | None = None):
        self.s = settings
        # The clock the rings are stamped with (CLOCK_MONOTONIC, ns): in-flight ages, idle periods, snapshot
        # and summary windows are measured on it. A simulation on virtual time passes its virtual clock.
        self.now_ns: Callable[[], int] = clock or time.monotonic_ns
        self.metrics = metrics  # collective metrics over every completed op (OTEL_METRICS_EXPORTER)
        self.only_pid = only_pid  # in-process mode: follow only this process's rings
        self.health = health or Health()
        self.plugin = PluginCounters()  # the plugin's drop and bad-handle counters, summed over the node's rings
        self.reader_factory = reader_factory or default_reader_factory
        self.discovery = Discovery(settings.ring_dir, all_users=settings.all_users)
        self.store = CursorStore(settings.state_dir)
        self.ctxs: dict[str, _Ctx] = {}
        self.bound = sample_bound(settings.sample_ratio)
        if resource_extra is None:
            resource_extra = _env_resource_attributes()
        self.resource_extra = resource_extra
        self.queue = ExportQueue(transport or OtlpTransport(settings.protocol), self.health,
                                 settings.export_queue, settings.export_batch, scope=sp.SCOPE)
        self.flagged: OrderedDict[tuple[int, int], None] = OrderedDict()
        self._new_flags: set[tuple[int, int]] = set()
        self._rl = RateLimitedLog()
        self._stop = threading.Event()
        self._closed = False

    # --- sources --------------------------------------------------------------------------
    def _open(self, cand: Candidate) -> None:
        path = cand.path
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError:
            return
        why = sparse_problem(st)  # never map a file with holes: reading them would make tmpfs allocate them
        reader = None
        if not why:
            try:
                reader = self.reader_factory(path)
            except (ValueError, OSError) as exc:
                why = str(exc)
        if reader is None:
            # what a ring looks like while the plugin creates it (empty, then sized, magic written last; the
            # reader's words, shm_reader.h Validate): retried a while. Anything else waits until it changes.
            transient = st.st_size == 0 or "not initialised yet" in why
            if self.discovery.refuse(cand, why, transient):
                self.health.bad_files += 1
            return
        try:
            src = RingSource(path, reader)
            src.apply(provenance.check(cand.uid, src.pid, src.job_id, src.host))
        except Exception as exc:
            reader.close()
            if self.discovery.refuse(cand, f"cannot use {path}: {exc}"):
                self.health.bad_files += 1
            return
        saved = self.store.get(src.identity.key) or {}
        head = int(reader.ring_head)
        cursor = int(saved.get("cursor", 0))
        src.cursor = cursor if 0 <= cursor <= head else 0
        now = self.now_ns()
        ctx = _Ctx(src, sp.SpanBuilder(src, self.s.service_name, self.resource_extra, self.s.detail_chunk,
                                       self.s.shard_ranks),
                   Baselines(self.s.slow_factor, self.s.warmup_ops, self.s.slow_min_ns), Summary(now))
        ctx.last_seq = int(saved.get("last_seq", -1))
        ctx.last_end = int(saved.get("last_end", 0))
        ctx.owner = cand.uid
        if self.only_pid is not None and src.pid != self.only_pid:
            self._retire(ctx)  # another process's ring: its own in-process agent (or the node agent) reports it
        elif not saved and src.process_state() == PROC_EXITED:
            h = src.header
            last = max(int(h.get("finalized_ns", 0)), int(h.get("heartbeat_ns", 0)), src.start_mono_ns)
            if now - last > STALE_RING_NS:
                # a long-finished job's leftover: history, not evidence; removed unread and counted. A ring born
                # and finished between two polls is younger than this and is read like any other first.
                self._retire(ctx, remove=True)
                self.health.rings_skipped += 1
        self.ctxs[path] = ctx
        self.discovery.accepted(path, cand.ident)
        self.health.sources_opened += 1
        log.info("%s %s (comm %s rank %d/%d pid %d, cursor %d)", "ignoring" if ctx.done else "following", path,
                 src.comm_hex, src.rank, src.nranks, src.pid, src.cursor)

    def _close(self, path: str) -> None:
        ctx = self.ctxs.pop(path, None)
        if ctx is None:
            return
        if not ctx.done:
            out: list[bytes] = []
            self._drain(ctx, out, self.now_ns())  # the mapping outlives the unlink: read the rest
            self._queue(ctx, out)
        self.store.forget(ctx.src.identity.key)
        self.plugin.forget(path)
        ctx.src.close()
        log.info("ring gone: %s", path)

    def _retire(self, ctx: _Ctx, remove: bool = False) -> None:
        """Nothing more will happen in this ring: release the mapping, keep the path known (no reopening).

        remove: the writer finalized or exited, so once what was handed to the exporter for this ring is
        committed, the file is deleted (:meth:`_remove_exported`); its path then reads as gone and
        :meth:`_close` drops the agent's state for it.
        """
        ctx.done = True
        ctx.remove = remove
        ctx.inflight.clear()
        ctx.had_inflight.clear()
        ctx.src.close()

    # --- the loop ---------------------------------------------------------------------------
    def poll_once(self) -> None:
        t0 = time.perf_counter()
        scan = self.discovery.scan()
        for path in scan.gone:
            self._close(path)
        for cand in scan.appeared:
            self._open(cand)
        now = self.now_ns()
        pstate: dict[int, str] = {}
        pending: dict[str, list[bytes]] = {}
        budget = PollBudget()
        order = list(self.ctxs.items())
        if order:  # a turn that rotates every poll: an owner's share does not always go to the same ring
            k = self.health.polls % len(order)
            order = order[k:] + order[:k]
        for path, ctx in order:
            if ctx.done:
                continue
            out: list[bytes] = []
            self._guarded(path, ctx, self._poll_ctx, ctx, out, now, pstate, budget)
            pending[path] = out
        self.health.deferred_live_reads += budget.deferred_live
        self.health.deferred_snapshots += budget.deferred_snapshots
        self._peer_flagged(pending)
        self._status(now, pending, pstate)
        backlog = 0
        for path, ctx in self.ctxs.items():
            if path in pending:
                self._queue(ctx, pending[path])
            backlog += ctx.src.backlog if not ctx.done else 0
        self.health.ring_backlog = backlog
        self.health.sources = sum(1 for c in self.ctxs.values() if not c.done)
        live_keys = {c.src.identity.key: c for c in self.ctxs.values()}
        for key, cursor in self.queue.take_committed().items():
            if key in live_keys:  # a ring closed meanwhile is forgotten, not resurrected
                self.store.update(key, **cursor)
                live_keys[key].committed = (cursor.get("cursor"), cursor.get("last_seq"), cursor.get("last_end"))
        self._remove_exported()
        if self.health.polls == 0:  # rings that vanished while no agent ran
            for key in [k for k in self.store.data if k not in live_keys]:
                self.store.forget(key)
        self.store.save()
        self.health.polls += 1
        self.health.poll_duration_s = time.perf_counter() - t0

    def _guarded(self, path: str, ctx: _Ctx, fn: Callable[..., None], *args: Any) -> None:
        """Run one ring's part of the poll; whatever that ring does, the others go on."""
        try:
            fn(*args)
        except Exception:
            if ctx.src.broken:  # shrank, replaced or faulted under the reader: give the ring up
                log.warning("giving up %s: %s", path, ctx.src.broken)
                self._retire(ctx)
            else:
                self._rl.warning(path, "error polling %s", path)
            log.debug("error polling %s", path, exc_info=True)

    def _remove_exported(self) -> None:
        """Delete retired rings whose last hand-over the exporter has committed (the queue is FIFO)."""
        for path, ctx in self.ctxs.items():
            if ctx.done and ctx.remove and ctx.committed == ctx.marked:
                ctx.remove = False
                if self.discovery.remove(path):
                    self.health.rings_removed += 1

    def _queue(self, ctx: _Ctx, out: list[bytes]) -> None:
        self.health.spans_built += len(out)
        state = (ctx.src.cursor, ctx.last_seq, ctx.last_end)
        if not out and state == ctx.marked:
            return  # nothing new: no hand-over at all
        ctx.marked = state
        mark = {ctx.src.identity.key: {"cursor": state[0], "last_seq": state[1], "last_end": state[2]}}
        self.queue.put(ctx.builder.resource, out, mark)

    def _poll_ctx(self, ctx: _Ctx, out: list[bytes], now: int, pstate: dict[int, str], budget: PollBudget) -> None:
        src = ctx.src
        try:
            st_file = os.stat(src.path, follow_symlinks=False)
        except OSError:
            st_file = None  # gone: the next scan closes it (the mapping outlives the unlink)
        if st_file is not None and sparse_problem(st_file):
            # holes punched after open: reading the live table would make tmpfs allocate them again
            src.broken = f"{src.path}: became " + sparse_problem(st_file)
            raise ValueError(src.broken)
        self._drain(ctx, out, now, budget)
        st = pstate.get(src.pid)
        if st is None:
            st = pstate[src.pid] = src.process_state()
        ctx.credit.refill()
        fresh = ctx.in_flight < 0 or budget.may_read_live(ctx.owner, ctx.credit)
        live = None
        if fresh:
            live = src.live()
            budget.paid_live(ctx.owner, ctx.credit, live.nbytes)
            ctx.in_flight = len(live)
        # (else the ring waits for credit: a huge live table is read every few polls, not every poll; what
        # it held last time stands meanwhile, and no copy of it is kept)
        ctx.busy = ctx.in_flight > 0
        if self.metrics:
            self.metrics.in_flight(src, ctx.in_flight)
        if ctx.busy:
            ctx.idle_emits = 0
            ctx.idle_next = 0
            ctx.recent_sent = False
        if st != PROC_EXITED and live is not None:  # (a table not read again would repeat stale counters)
            self._snapshots(ctx, live, out, now, st == PROC_STOPPED, budget)
        # summary window
        if now - ctx.summary.start >= self.s.summary_ns:
            sm = ctx.summary
            if sm.ops or sm.dropped_ring:
                out.append(ctx.builder.summary_span(src.to_real(sm.start), src.to_real(now), sm.attributes()))
            ctx.summary = Summary(now)

    def _drain(self, ctx: _Ctx, out: list[bytes], now: int, budget: PollBudget | None = None) -> None:
        src = ctx.src
        left = MAX_READS_PER_POLL * MAX_RECORDS_PER_READ
        if budget is not None:
            left = budget.records_allowance(ctx.owner, left)
        while left > 0:
            want = min(MAX_RECORDS_PER_READ, left)
            recs, over = src.read(want)
            left -= len(recs)
            if budget is not None:
                budget.took_records(ctx.owner, len(recs))
            if over:
                # a ring head rewritten to 2^62 must not count 4.6e18 drops: no ring can have lost more
                # completions than its writer could have made since it started (one per MIN_OP_NS)
                possible = max(0, (now - src.start_mono_ns) // MIN_OP_NS - ctx.dropped)
                over = min(over, possible)
                ctx.dropped += over
            if over:
                self.health.dropped_ring += over
                ctx.summary.dropped_ring += over
                self._rl.warning("ring-" + src.path, "%s: %d completions overwritten before the agent read them",
                                 src.path, over)
            if len(recs):
                self.health.records_read += len(recs)
                self._records(ctx, recs, out)
            if len(recs) < want:
                break

    def _records(self, ctx: _Ctx, recs: np.ndarray, out: list[bytes]) -> None:
        if self.metrics:
            self.metrics.record(ctx.src, recs)
        b = ctx.builder
        ops = recs["op"]
        traces = b.trace_ids(ops)
        kinds = ops["kind"].tolist()
        funcs = ops["func"].tolist()
        seqs = ops["seq"].tolist()
        nbytes = ops["bytes"].tolist()
        api = ops["api_ns"].tolist()
        start = ops["start_ns"].tolist()
        end = ops["end_ns"].tolist()
        op_ids = ops["op_id"].tolist()
        n_flows = ops["n_flows"].tolist()
        flow_rows = recs["flows"]
        keep, anomalies, step_indices = [], [], []
        kept = None  # the batch's op records and flows, copied for the history of records not exported
        for i in range(len(recs)):
            arrive = api[i] or start[i]
            coll = kinds[i] == sp.KIND_COLL
            step_index = ctx.step.index(seqs[i], arrive) if coll else -1
            an = ctx.baselines.classify(funcs[i], nbytes[i], arrive, end[i])
            stalled = ctx.had_inflight.pop(op_ids[i], None)
            ctx.inflight.pop(op_ids[i], None)
            if stalled and an is None:
                an = (stalled, None, None)
            nf = n_flows[i]
            if nf and ctx.flow_rule.classify(funcs[i], nbytes[i], flow_rows[i, :nf]) and an is None:
                an = (sc.ANOMALY_SLOW, None, None)
            if coll:
                ctx.slow_marks.append(an is not None and an[0] == sc.ANOMALY_SLOW)
                if ctx.slow_marks[-1]:
                    an = (*an[:3], sum(ctx.slow_marks))
            # a local peer's flag exports this rank's side too, by trace: a collective's other ranks, a
            # Send's Recv (conformance pp_slow_transfer: the slow Send exported, the Recv it fed sampled away,
            # and a transfer with one end only cannot be compared with the others)
            if an is not None and self.s.peer_export:
                self._flag((ctx.src.comm_hash, traces[i]))
            exported = (an is not None or sampled(traces[i], self.bound)
                        or ctx.cadence.keep(traces[i], end[i])
                        or (ctx.src.comm_hash, traces[i]) in self.flagged)
            if exported:
                keep.append(i)
                anomalies.append(an)
                step_indices.append(step_index)
            elif self.s.peer_export:  # compact copy: the op and its valid flows (~1 KB instead of 10 KB)
                if kept is None:  # one copy per batch, the first time one of its records is kept back
                    kept = (ring_ops(recs), flow_rows[:, :max(n_flows)].copy())
                ctx.history.append((traces[i], {"op": kept[0][i], "flows": kept[1][i, :nf]}))
            ctx.summary.add(sp.func_name(funcs[i]), seqs[i], nbytes[i], end[i] - arrive, exported)
            if coll and seqs[i] > ctx.last_seq:
                ctx.last_seq = seqs[i]
            if end[i] > ctx.last_end:
                ctx.last_end = end[i]
                ctx.idle_emits = 0
                ctx.idle_next = 0
        if self.metrics and keep:  # exported ones link the duration histogram to their traces (exemplars)
            self.metrics.exemplars(ctx.src, recs[np.asarray(keep, dtype=np.int64)], [traces[i] for i in keep])
        if len(keep) >= VECTOR_MIN:
            sel = recs[np.asarray(keep, dtype=np.int64)]
            out.extend(b.op_spans(sel, [traces[i] for i in keep], anomalies, step_indices))
        else:  # a few spans: the generic writer is cheaper than the vectorised setup (same bytes)
            for i, an, step_index in zip(keep, anomalies, step_indices):
                out.append(b.op_span_generic(recs[i], *(an or (None, None, None, None)), step_index=step_index))

    def _flag(self, key: tuple[int, int]) -> None:
        if key not in self.flagged:
            self.flagged[key] = None
            self._new_flags.add(key)
            if len(self.flagged) > FLAGGED:
                self.flagged.popitem(last=False)

    def _peer_flagged(self, pending: dict[str, list[bytes]]) -> None:
        """Export the other local ranks' spans of collectives (and the other end of p2p transfers) a local
        rank found anomalous.

        The processor compares ranks within a trace (arrival, flow and GPU times); a slowdown that
        only some ranks' local rule flags would otherwise reach it with most ranks sampled away.
        Across nodes the ranks' own rules (and trace-id sampling) have to do.
        """
        if not self._new_flags:
            return
        new, self._new_flags = self._new_flags, set()
        comms = {c for c, _ in new}
        for path, ctx in self.ctxs.items():
            if ctx.done or path not in pending or ctx.src.comm_hash not in comms or not ctx.history:
                continue
            c = ctx.src.comm_hash
            hit = [(q, r) for q, r in ctx.history if (c, q) in new]
            if hit:
                ctx.history = deque(((q, r) for q, r in ctx.history if (c, q) not in new), maxlen=HISTORY)
                for _, rec in hit:
                    pending[path].append(ctx.builder.op_span_generic(rec))

    def _snapshots(self, ctx: _Ctx, live: np.ndarray, out: list[bytes], now: int, stopped: bool,
                   budget: PollBudget | None = None) -> None:
        ops = live["op"]
        start = ops["start_ns"].astype(np.int64)
        op_ids = ops["op_id"].tolist()
        seen = {op_ids[i] for i in np.flatnonzero(start > 0).tolist()}
        # snapshot k covers [threshold + k periods, threshold + (k+1) periods) of the op's age: numbers
        # follow from the op's own start, so a restarted agent continues them instead of starting at 0
        aged = np.flatnonzero((start > 0) & (now - start >= self.s.inflight_after_ns))
        due = []
        if len(aged):
            ks = ((now - start[aged] - self.s.inflight_after_ns) // self.s.snapshot_ns).tolist()
            for i, k in zip(aged.tolist(), ks):
                inf = ctx.inflight.get(op_ids[i])
                last = -1 if inf is None else inf.k
                if k > last:
                    due.append((last, i, k))
        if due:
            allowance = len(due) if budget is None else budget.snapshot_allowance(ctx.owner)
            if len(due) > allowance:
                due.sort()  # the slots least recently snapshotted first: every slot is reached in turn
            for _, i, k in due[:allowance]:
                inf = ctx.inflight.get(op_ids[i])
                if inf is None:
                    inf = ctx.inflight[op_ids[i]] = _Inflight()
                self._emit_snapshot(ctx, live[i], inf, out, now, stopped, k)
            if budget is not None:
                budget.took_snapshots(ctx.owner, min(allowance, len(due)), len(due))
        for op_id in [k for k in ctx.inflight if k not in seen]:
            del ctx.inflight[op_id]  # completed: had_inflight keeps its anomaly until its record is read
        if len(ctx.had_inflight) > 4096:
            ctx.had_inflight.clear()

    def _emit_snapshot(self, ctx: _Ctx, slot: Any, inf: _Inflight, out: list[bytes], now: int,
                       stopped: bool, k: int) -> None:
        op = slot["op"]
        last = max(int(op["last_progress_ns"]), int(op["start_ns"]))
        anomaly = sc.ANOMALY_STALLED if now - last >= self.s.inflight_after_ns else sc.ANOMALY_SLOW
        if anomaly == sc.ANOMALY_STALLED and inf.anomaly != sc.ANOMALY_STALLED:
            self._recent(ctx, out)
            if self.s.peer_export:
                # ... and the local peers' side of this very collective: which of them completed it tells a
                # rank waiting for data its peers never send (called with a larger count) from one waiting
                # for a peer that is stuck too (conformance mismatch_count's last collective: only the
                # culprit's snapshots reached the processor, which then blamed a silent peer)
                self._flag((ctx.src.comm_hash, ctx.builder.trace_id(int(op["kind"]), int(op["seq"]),
                                                                     int(op["root_or_peer"]))))
        inf.anomaly = anomaly
        out.append(ctx.builder.inflight_span(slot, k, ctx.src.to_real(now), anomaly, stopped))
        ctx.had_inflight[int(op["op_id"])] = anomaly
        inf.k = k

    def _recent(self, ctx: _Ctx, out: list[bytes]) -> None:
        """Export the rank's last unexported completions on the communicator, once a wait begins (its op
        stalls, or it sits idle while a local peer waits). A mismatched collective rarely hangs where it was
        called (NCCL's steps run on as one stream per connection): its culprit is stuck, or idle, collectives
        later, and the processor needs the culprit's own record of the mismatched one to compare signatures."""
        for _ in range(min(RECENT_ON_STALL, len(ctx.history))):
            trace, rec = ctx.history.pop()
            out.append(ctx.builder.op_span_generic(rec))
            # ... and the local peers' records of the same collectives: the culprit may be one of them,
            # running on (conformance mismatch_func: the rank that called AllGather instead of AllReduce ran
            # ahead, and its record of that collective was never exported beside the waiters')
            if self.s.peer_export:
                self._flag((ctx.src.comm_hash, trace))

    # --- status evidence ------------------------------------------------------------------------
    def _status(self, now: int, pending: dict[str, list[bytes]], pstate: dict[int, str]) -> None:
        by_comm: dict[int, list[_Ctx]] = {}
        for ctx in self.ctxs.values():
            if not ctx.done:
                by_comm.setdefault(ctx.src.comm_hash, []).append(ctx)
        for path, ctx in list(self.ctxs.items()):
            if ctx.done or path not in pending:
                continue
            # the header is re-read here: a file racing this poll fails its own ring, never the poll
            self._guarded(path, ctx, self._status_ctx, ctx, now, pending[path], pstate, by_comm)

    def _status_ctx(self, ctx: _Ctx, now: int, out: list[bytes], pstate: dict[int, str],
                    by_comm: dict[int, list[_Ctx]]) -> None:
        src = ctx.src
        st = pstate.get(src.pid)
        header = src.refresh_header()
        self.plugin.observe(src.path, header)
        finalized = int(header.get("finalized_ns", 0)) != 0
        if st == PROC_EXITED and not finalized:
            self._exited(ctx, out, now)
            return
        if finalized:
            if not ctx.busy:
                # a local peer still in a collective of this communicator may wait for data this rank never
                # sent: its last completions say which collectives it finished before it left (conformance
                # mismatch_count at the job's last collective: the culprit, called with a larger count, was
                # left waiting on peers that had completed and gone)
                if self.s.peer_export and any(p.busy for p in by_comm.get(src.comm_hash, ()) if p is not ctx):
                    self._recent(ctx, out)
                self._drain(ctx, out, now)  # records published between this poll's drain and finalize
                self._retire(ctx, remove=True)  # the communicator is destroyed and its ring drained
            return
        if ctx.busy:
            return
        idle_since = ctx.last_end or src.start_mono_ns
        idle_for = now - idle_since
        if idle_for < self.s.idle_after_ns or now < ctx.idle_next:
            return
        peers = by_comm.get(src.comm_hash, [])
        if len(peers) > 1 and all(not p.busy and p.last_seq == ctx.last_seq for p in peers):
            return  # the whole communicator is idle here: no local evidence of a wait
        if ctx.last_seq < 0 and not any(p.busy for p in peers):
            return  # no collective yet (or a p2p-only communicator) and nobody here waits on one
        nxt = ctx.last_seq + 1
        trace = ctx.builder.trace_id(sp.KIND_COLL, nxt, -1)
        text = (f"idle since collective {ctx.last_seq} completed" if ctx.last_seq >= 0
                else "no collective completed yet")
        out.append(ctx.builder.status_span(sc.STATUS_NOT_ENTERED, trace, nxt, ctx.last_seq,
                                           src.to_real(idle_since), src.to_real(now), text,
                                           st == PROC_STOPPED))
        if not ctx.recent_sent and ctx.baselines.unusual_idle(idle_for):
            self._recent(ctx, out)
            ctx.recent_sent = True
        ctx.idle_emits += 1
        backoff = min(self.s.idle_after_ns * (2 ** ctx.idle_emits), MAX_STATUS_BACKOFF_NS)
        ctx.idle_next = idle_since + backoff if ctx.idle_emits < 6 else now + MAX_STATUS_BACKOFF_NS
        ctx.idle_next = max(ctx.idle_next, now + self.s.poll_s * 1e9)

    def _exited(self, ctx: _Ctx, out: list[bytes], now: int) -> None:
        if ctx.exit_emits and now < ctx.exit_next:
            return
        src = ctx.src
        live = src.live()
        slots = sorted(live, key=lambda s: int(s["op"]["start_ns"])) if len(live) else []
        real_now = src.to_real(now)
        if slots:
            first = slots[0]
            op = first["op"]
            trace = ctx.builder.trace_id(int(op["kind"]), int(op["seq"]), int(op["root_or_peer"]))
            text = "process exited " + sp.last_state_text(op, first["flows"])
            out.append(ctx.builder.status_span(sc.STATUS_PROCESS_EXITED, trace, int(op["seq"]), ctx.last_seq,
                                               src.to_real(int(op["start_ns"])), real_now, text, False,
                                               func=sp.func_name(int(op["func"]))))
            if ctx.exit_emits == 0:
                for slot in slots[:SNAPSHOTS_PER_RING]:  # the last state the oldest ops reached, as final snapshots
                    inf = ctx.inflight.setdefault(int(slot["op"]["op_id"]), _Inflight())
                    age_k = (now - int(slot["op"]["start_ns"]) - self.s.inflight_after_ns) // self.s.snapshot_ns
                    self._emit_snapshot(ctx, slot, inf, out, now, False, max(inf.k + 1, age_k, 0))
                    inf.anomaly = sc.ANOMALY_STALLED
        else:
            nxt = ctx.last_seq + 1
            trace = ctx.builder.trace_id(sp.KIND_COLL, nxt, -1)
            idle_since = ctx.last_end or src.start_mono_ns
            out.append(ctx.builder.status_span(
                sc.STATUS_PROCESS_EXITED, trace, nxt, ctx.last_seq, src.to_real(idle_since), real_now,
                f"process exited after collective {ctx.last_seq}", False))
        ctx.exit_emits += 1
        ctx.exit_next = now + self.s.snapshot_ns
        if ctx.exit_emits >= 2:
            self._retire(ctx, remove=True)
            log.info("%s: process %d exited; evidence sent", src.path, src.pid)

    # --- running ----------------------------------------------------------------------------------
    def run(self, stop: threading.Event | None = None) -> None:
        stop = stop or self._stop
        while not stop.is_set():
            t = time.monotonic()
            try:
                self.poll_once()
            except Exception:
                log.exception("poll failed")
            stop.wait(max(0.0, self.s.poll_s - (time.monotonic() - t)))

    def stop(self) -> None:
        self._stop.set()

    def close(self, flush_timeout_s: float = 3.0) -> None:
        """Flush pending spans (bounded), persist cursors, release rings (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self.queue.shutdown(flush_timeout_s)
        for key, cursor in self.queue.take_committed().items():
            self.store.update(key, **cursor)
        self.store.save()
        self.store.close()
        for ctx in self.ctxs.values():
            ctx.src.close()
        self.ctxs.clear()


def _env_resource_attributes() -> list[tuple[str, Any]]:
    """OTEL_RESOURCE_ATTRIBUTES (and the SDK's telemetry.sdk.*), as the SDK parses them."""
    from opentelemetry.sdk.resources import Resource

    attrs = dict(Resource.create({}).attributes)
    attrs.pop("service.name", None)  # ours: OTEL_SERVICE_NAME or mycroft-otel-agent
    return [(k, v if not isinstance(v, tuple) else list(v)) for k, v in attrs.items()]
