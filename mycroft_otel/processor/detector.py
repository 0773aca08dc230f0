"""The slowdown detector: per-candidate sequential tests on the job's own healthy spread.

For every analysed collective and measure (slowdown.py: GPU wait per step, a flow's network wait per step,
a NIC's least-waiting flow, a proxy's credit wait, lateness), each candidate's score is the log-ratio of
its value to the collective's median (to the measure's recent healthy median when the trace holds fewer
than 2 candidates, e.g. only the flagged rank's span). A collective-wide effect -- a loaded host, a bigger
message, a slow step of the model -- moves every candidate alike and cancels; a fault moves one.

The scores, less each candidate's role (its own healthy offset from its peers, where it stands clear of its
sampling error: a tree's inner ranks), are standardized by the measure's learned null (sequential.RobustNull,
kept per job, communicator, function and size bucket; its other sizes' or its siblings' until it has its own,
lateness a prior) and accumulated per candidate by CUSUMs (sequential.Cusum: one tuned for a shift of 2 null
scales, and on the network measures a mild one tuned for 1). A candidate whose CUSUM reaches h is named once
the communicator's kernels run measurably longer than while it was healthy (a slowdown slows the job; a
candidate drifting off its peers while nothing slows is chance or a role). When several alarm in
one collective, the most specific explanation wins: a late rank (everybody waited for it), unless a link, or
its own GPU, that would have held it back gathers evidence in a joined communicator; a late rank over the
GPUs before it (they block on its FIFO slots); a gathering proxy over the GPUs it blocks; a slow GPU over
slow flows into it (its GPU drains them slowly) unless a network path out of it, into it (a late link
delivers in bursts that wait for the GPU) or out of a held-back GPU gathers evidence, or exactly one flow
touching it is slow (its kernel queued behind the collective that flow delayed); a NIC over its single
flows; a proxy unless a late rank (its senders wait for credit too) or a link gathers.

Two findings bypass the test: a straggler that everybody waited >= 1 s for (slowdown.straggler) and a
stall that recovered naming a rank that had not started (a late rank too), unless that rank spent its
lateness in another communicator's collective (held back there, not late); any other recovered stall adds
one capped score to its candidate, once per distinct stall (collectives in flight together stall together
when one process is descheduled once).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from mycroft_otel import semconv as sc
from mycroft_otel.processor import rca, slowdown
from mycroft_otel.processor.outcome import NO_CANDIDATE, Decision, Outcome, silent
from mycroft_otel.processor.rca import Finding
from mycroft_otel.processor.sequential import Cusum, OwnSpreads, RobustNull, median
from mycroft_otel.processor.settings import Settings
from mycroft_otel.processor.spans import span_attributes
from mycroft_otel.processor.state import P2P, TraceState

# precedence when several candidates of one collective alarm (see the module docstring)
_ORDER = (slowdown.LATE, slowdown.GPU, slowdown.NIC_SEND, slowdown.NIC_RECV, slowdown.FLOW, slowdown.PROXY)
# measures that run the mild test too: a flow's or a NIC's network busy time is the link's own, which a fault
# elsewhere does not move; a GPU's received data and a rank's start wait for the pipeline's back-pressure (a
# kernel blocked on a send FIFO slot behind any slower hop), so a mild fault anywhere shifts them a little
# at its neighbours, and only the strong test judges them
_MILD = (slowdown.FLOW, slowdown.NIC_SEND, slowdown.NIC_RECV)
_WAITS_KEPT = 4  # long waits remembered per process (a straggler's consequences follow it within seconds)
_NAMED_KEPT = 8  # slowdowns named per job whose persistence explains later alarms (joined communicators)
_MAX_KEYS = 200_000  # candidates and nulls kept (oldest forgotten first): bounded memory for any job
_KERNEL = frozenset({sc.KERNEL_DURATION})


@dataclass(slots=True)
class Alarm:
    measure: str
    unit: object      # a rank, or (sender, receiver, channel)
    cusum: Cusum
    z: float          # this collective's standardized score
    via: tuple[Cusum, ...] = ()  # the symptoms whose alarm led here (a held-back GPU): the same incident

    def led_to(self, measure: str, unit, cusum: Cusum, z: float | None = None) -> "Alarm":
        """The candidate this alarm's evidence points at, carrying this one as its symptom."""
        return Alarm(measure, unit, cusum, self.z if z is None else z, (self.cusum,) + self.via)


def _bounded_put(d: dict, key, value) -> None:
    if len(d) >= _MAX_KEYS:
        d.pop(next(iter(d)))
    d[key] = value


def _get_or_put(d: dict, key, make: Callable[[], object]):
    v = d.get(key)
    if v is None:
        v = make()
        _bounded_put(d, key, v)
    return v


def judged_by(null: RobustNull, mine: RobustNull | None) -> tuple[float, float]:
    """(location, scale) of the null a measure's scores are judged by: ``null``, the first one ready (_ready),
    whose scale is widened to ``mine``'s, the measure's own null at this size, when ``null`` is borrowed
    (another size's, the siblings'). A borrowed null says where healthy scores sit, not how far they spread at
    this size: a per-step wait averages over a different number of slices and steps at another size, so its
    spread differs, severalfold between a latency-bound and a bandwidth-bound size. So the wider of the two,
    however few scores this size has shown: another size's narrower spread would inflate every score by the
    ratio, and a candidate a little off its peers would gather evidence at every collective."""
    loc, scale = null.location_scale()
    if mine is not None and mine is not null and len(mine):
        scale = max(scale, mine.location_scale()[1])
    return loc, scale


@dataclass(slots=True)
class _Durations:
    """A communicator's recent kernel times (per function and size), and when the test first judged it."""

    recent: deque          # (start, size bucket, log of the median rank's kernel time, healthy)
    judged_from: int = -1  # start of the first collective whose every measure the test judged


def _reach(unit, peers: dict[int, set[int]]) -> set[int]:
    """The ranks a fault at a candidate moves: a flow's two ends; a rank and the ranks it exchanges data with
    in the collective (``peers``, from its flows), whose waits its back-pressure or delay lengthens."""
    return set(unit[:2]) if isinstance(unit, tuple) else {unit} | peers.get(unit, set())


def _kind(st: TraceState) -> tuple[str, int]:
    """(function, size bucket) a collective's nulls and durations are kept under: p2p transfers as one
    function, sizes by their power of two."""
    return ("p2p" if st.func in P2P else st.func), (next(iter(st.op.values())).nbytes.bit_length() if st.op else 0)


def _label(measure: str, unit) -> str:
    """A hypothesis in words: the measure and the place (a rank, or a flow sender -> receiver on a channel)."""
    if isinstance(unit, tuple):
        return f"{measure} {unit[0]}->{unit[1]} ch{unit[2]}"
    return f"{measure} rank {unit}"


def _stall_window(st: TraceState) -> tuple[int, int]:
    """When a stall that recovered began and ended: its in-flight snapshots' earliest start, latest end."""
    return min(r.start_ns for r in st.inflight.values()), max(r.end_ns for r in st.inflight.values())


class SlowdownDetector:
    """Judges completed collectives one at a time, in completion order (the tests are sequential)."""

    def __init__(self, settings: Settings, process_of: Callable[[str, int], tuple | None] = lambda c, r: None,
                 waiting: Callable[[tuple], list[tuple]] = lambda proc: []):
        self.s = settings
        # process -> (comm, start, last seen) of the collectives it is still seen in flight in (the store's
        # in-flight snapshots): a wait whose completion has not reached the processor yet
        self.waiting = waiting
        # (comm, rank) -> the rank's process (host, "g", global rank) or (host, "p", pid), None when unknown:
        # a GPU, a NIC, a proxy thread belong to a process, and a slow GPU slows every communicator of its
        # process, so their evidence accumulates across communicators; a flow is one communicator's
        self.process_of = process_of
        self.nulls: dict[tuple, RobustNull] = {}     # (job, comm, func, bucket, measure, mode) -> scores
        self.levels: dict[tuple, RobustNull] = {}    # (job, comm, func, bucket, measure) -> log(value + floor)
        self.cusums: dict[tuple, Cusum] = {}         # (job, measure, candidate) -> evidence
        self.named: dict[str, list[tuple]] = {}      # job -> (communicator, evidence) of the slowdowns named
        self.stragglers: dict[str, list[tuple]] = {}  # job -> (start, end) of the stragglers' waits named
        self.waits: dict[tuple, list[tuple]] = {}     # (job, process) -> (comm, start, end) of its long waits
        # communicators and the processes in them, as one graph: communicators that share a process, or are
        # joined through others that do (a TP group joins its ranks' DP rings), wait for each other
        self._joined: dict[tuple, tuple] = {}        # node -> its parent (union-find); a root maps to itself
        self._linked: dict[tuple, int] = {}          # (job, comm) -> ranks linked so far
        self.own: dict[tuple, OwnSpreads] = {}       # null key + (mode,) -> its candidates' own healthy scores
        self.durations: dict[tuple, _Durations] = {}  # (job, comm, func) -> its kernels' recent times
        self._key_memo: dict[tuple, tuple[list, list[tuple]]] = {}  # (job, comm, measure) -> (units, keys)

    # -- the per-measure scores -------------------------------------------------------------
    def _null(self, table: dict, key: tuple) -> RobustNull:
        return _get_or_put(table, key, lambda: RobustNull(self.s.null_size, self.s.min_scale))

    def _ready(self, table: dict, keys: tuple[tuple, ...], collectives: int = 0) -> RobustNull | None:
        """The first of ``keys``' nulls (the communicator's own, then its other sizes' or its siblings') that
        holds enough."""
        for key in keys:
            null = table.get(key)
            if null is not None and len(null) >= self.s.null_min_values and null.collectives >= collectives:
                return null
        return None

    def _scores(self, keys: tuple[tuple, ...], name: str, values: np.ndarray,
                p2p: bool) -> tuple[np.ndarray, str] | None:
        """(the candidates' scores, mode): log-ratios to the collective's median of all its
        candidates ("x"), or to the measure's recent healthy level ("h") when the trace holds too few
        candidates or is one p2p transfer (a slow transfer slows all its channels alike: it is compared with
        the communicator's other transfers, or its siblings' while it has had too few); None when there is
        nothing to compare to yet."""
        if name == slowdown.LATE:
            return values, "x"
        lv = np.log(values + self.s.step_floor_ns)
        if len(values) >= 2 and not p2p:
            ref, mode = median(lv), "x"
        else:
            level = self._ready(self.levels, keys)
            if level is None:
                return None
            ref, mode = level.location_scale()[0], "h"
        return lv - ref, mode

    # -- judging one collective -------------------------------------------------------------
    def judge(self, st: TraceState, m: slowdown.Measures | None, at: float) -> Decision:
        """What this collective decides (outcome.Outcome): a mismatch, a straggler, a candidate whose
        evidence crossed h and slowed the communicator, or the reason for silence. ``at``: the processor's
        monotonic clock (seconds)."""
        if m is None:
            m = slowdown.measure([st])[0] if st.op else None
        mm = slowdown.check_mismatch(st, m) if m is not None else rca.check_mismatch(st)
        if mm is not None:
            if m is None:
                rca.decorate(st, rca.build_views(st), mm)
            mm.hypothesis = mm.hypothesis or f"{mm.category} rank {mm.ranks[0]}"
            return Decision(Outcome.MISMATCH, mm)
        if 0 <= st.seq < self.s.warmup_seq:
            return silent(Outcome.WARMUP, f"collective {st.seq} < {self.s.warmup_seq}")
        self._link(st)
        self._note_waits(st, m)
        recovered = slowdown.recovered_stall(st)
        if recovered is not None and recovered.category == sc.CAT_LATE_RANK:
            start, end = _stall_window(st)
            if end - start >= self.s.straggler_ns:
                recovered.reason = "straggler"
                late = st.op.get(recovered.ranks[0])
                return self._straggler(st, recovered, start, late.start_ns if late else end, end)
        if m is None:
            return silent(Outcome.NOT_MEASURED)
        ev = slowdown.evidence(st, m)
        f = slowdown.straggler(st, ev, self.s.straggler_ns)
        if f is not None:
            start = int(m.arrival.min())
            d = self._straggler(st, f, start, start + ev.lateness_ns, m.end)
            if d.finding is not None:
                rca.decorate(st, rca.build_views(st), f)
            return d
        return self._sequential(st, m, ev, recovered, at)

    def _straggler(self, st: TraceState, f: Finding, start: int, arrived: int, end: int) -> Decision:
        """A straggler everybody waited for ([start, end], the late rank there at ``arrived``): named unless
        the rank was held back elsewhere or the wait is a straggler's already named."""
        if self._held_back(st, f.ranks[0], start, arrived):
            return silent(Outcome.HELD_BACK, f"rank {f.ranks[0]} waited in another communicator")
        if not self._first_straggler(st, start, end):
            return silent(Outcome.SAME_STRAGGLER, f"rank {f.ranks[0]}'s wait overlaps a straggler named")
        f.hypothesis = _label(slowdown.LATE, f.ranks[0])
        return Decision(Outcome.STRAGGLER, f)

    def _sequential(self, st: TraceState, m: slowdown.Measures, ev: slowdown.Evidence, recovered: Finding | None,
                    at: float) -> Decision:
        """The sequential test on this collective's candidates, then naming the alarm that explains them."""
        alarms, tested = self._update(st, ev, at)
        history = self._note_duration(st, m, tested, not alarms and not self._explained(st))
        if recovered is not None:
            alarm = self._recovered(st, recovered, at)
            if alarm is not None:
                alarms.append(alarm)
        if not alarms:
            return silent(Outcome.BELOW_BAR, self._closest(st, ev))
        if self._explained(st):
            for a in alarms:
                a.cusum.reset()  # consequences (or the named fault itself, which its incident holds): spent
            return silent(Outcome.EXPLAINED, f"{_label(alarms[0].measure, alarms[0].unit)} alarms while a slowdown "
                                             f"named in a joined communicator holds")
        # the evidence stands, but nothing is slower for it (yet: judged again next collective)
        if recovered is None and not self._slower(st, ev, history, alarms):
            return silent(Outcome.NOT_SLOWER, f"{_label(alarms[0].measure, alarms[0].unit)} alarms; the "
                                              f"communicator's kernels are not slower than before")
        f = self._name(st, m, ev, alarms, recovered)
        if f is None:
            return silent(Outcome.DEFERRED, f"{_label(alarms[0].measure, alarms[0].unit)} alarms; a likelier "
                                            f"cause gathers evidence")
        rca.decorate(st, rca.build_views(st), f)
        return Decision(Outcome.NAMED, f)

    def _closest(self, st: TraceState, ev: slowdown.Evidence) -> str:
        """The candidate of this collective nearest to the bar, for a silence's reason."""
        best: tuple[float, str] = (0.0, "")
        for name, (units, _) in ev.values.items():
            for u, k in zip(units, self._keys(st.job, st.comm, name, units)):
                c = self.cusums.get(k)
                if c is not None and c.s > best[0]:
                    best = (c.s, _label(name, u))
        return f"closest: {best[1]} at {best[0]:.1f} of {self.s.cusum.h:g}" if best[1] else NO_CANDIDATE

    def _note_duration(self, st: TraceState, m: slowdown.Measures, tested: bool, healthy: bool) -> _Durations:
        """Remember how long this collective's kernels ran (the median over up to 16 of its ranks of the
        kernel's GPU time, KernelCh start to stop), per communicator and function, with its size; the
        communicator's recent durations. Not its spans: a span opens when the host enqueues the collective, and the kernel
        then waits on the stream behind the model's compute, often far longer than it runs. A kernel waits
        for its peers once running, so a late rank, a slow link or GPU lengthens its peers' kernels too.
        ``tested``: the test judged every measure (each had a null); ``healthy``: nothing alarmed and no
        slowdown named in a joined communicator persists. Only healthy collectives stand for the
        communicator's healthy time, so a fault that follows a named one is compared with the time before
        that one. A collective whose agents export no kernel times (an NCCL without KernelCh events) adds
        nothing."""
        func, bucket = _kind(st)
        history = _get_or_put(self.durations, (st.job, st.comm, func),
                              lambda: _Durations(deque(maxlen=self.s.duration_history)))
        if len(m.refs) >= 2:  # a rank flagged alone was exported for being slow: no fair sample
            ran = [v for ref in m.refs[:16] if type(v := span_attributes(ref, _KERNEL).get(sc.KERNEL_DURATION)) is int]
            if ran:  # kept at the collective's start, the time base of the evidence's onset (Cusum.onset_ns)
                when = min(ref.start_ns for ref in m.refs)
                history.recent.append((when, bucket, float(np.log(median(np.array(ran, dtype=np.float64)) + 1.0)), healthy))
                if tested and history.judged_from < 0:
                    history.judged_from = when
        return history

    def _slower(self, st: TraceState, ev: slowdown.Evidence, history: _Durations, alarms: list[Alarm]) -> bool:
        """Whether the communicator's collectives since the alarms' evidence began take longer than its
        healthy ones before (_note_duration): their median log-duration above the healthy median by 3
        standard errors of the difference (sqrt(pi/2) x spread x sqrt(1/n_since + 1/n_healthy), the spread
        at least min_scale). Since the latest onset among the alarms: a fault's culprit and symptoms start
        gathering together, while a candidate that has crept up since the first collectives must not stretch
        the window back.

        A slowdown is named for making the job slower. The test compares candidates with each other; a
        candidate can read off its peers for a while without slowing anything: in a healthy ring every
        collective is paced by its slowest link of the moment, so two flows into one rank that happen to be
        drawn slower than the median for a few collectives in a row change no duration. A fault that holds
        a ring, a tree or a pipeline back shows in its collectives' durations; a mild one (1.1x) stands ~2
        spreads out after a few collectives.

        The test's nulls take a few collectives to fill, so its evidence cannot begin before the first
        collective it judged; the kernel times recorded before that (from the end of warm-up on) still say
        whether a fault that began early slowed anything. A role never moved them: a tree's root GPU reduces
        twice its leaves' data in every collective from the first.

        When they did not move and the evidence began with the first judged collective, or there are fewer
        than 8 healthy times before it, a fault present since the communicator's first collectives is left
        (every one felt it). Then the test's pace and place decide: only a shift of the size the strong test
        is designed for names (2 scales, which add cap - k = 1 per collective and cross h in h / (cap - k)
        collectives), seen as the strong test crossing h at half that pace or faster, and only in a candidate
        with no twin (_twinned). A slow creep, of the mild test or of the strong one, is what a role produces
        when it sits a scale off its peers for good (a tree's leaf, a flow on a longer route), short of what
        the role offset takes away (sequential.OwnSpreads) while its own history is short; a larger role
        repeats where the algorithm repeats it."""
        onset_ns = max(a.cusum.onset_ns for a in alarms)
        # a job moving several message sizes: each kernel time against its own size's healthy median, so
        # that the sizes pool (a size with fewer than 3 healthy times before says nothing)
        healthy = [(k, d) for t, k, d, ok in history.recent if t < onset_ns and ok][-self.s.own_size:]
        level = {k: float(np.median([d for k2, d in healthy if k2 == k])) for k in {k for k, _ in healthy}
                 if sum(k2 == k for k2, _ in healthy) >= 3}
        before = [d - level[k] for k, d in healthy if k in level]
        since = [d - level[k] for t, k, d, _ in history.recent if t >= onset_ns and k in level]
        enough = len(before) >= self.s.null_min_collectives
        if enough and since:
            b = np.array(before)
            mid = median(b)
            scale = max(1.4826 * median(np.abs(b - mid)), self.s.min_scale)
            err = 1.2533 * scale * np.sqrt(1.0 / len(since) + 1.0 / len(b))
            if median(np.array(since)) - mid >= 3.0 * err:
                return True
        if enough and onset_ns > history.judged_from >= 0:
            return False
        d = self.s.cusum.strong
        return any(a.cusum.strong >= d.h and a.cusum.collectives <= 2 * d.h / (d.cap - d.k)
                   and not self._twinned(st, ev, a.measure) for a in alarms)

    def _first_straggler(self, st: TraceState, start: int, end: int) -> bool:
        """Whether this collective's wait for a straggler ([start, end], job time) is a new incident: not
        one that overlaps a straggler's wait already named in the job. A rank late into one collective holds
        back the next collective of each of its other communicators (its TP group's, its DP ring's), and each
        of the ranks held back there then enters its own next collectives late by as much: those waits are
        the first straggler's consequences. The job's communicators need not be known to be joined yet (a
        straggler in the first seconds arrives before the agents' cadence exports a DP ring's collectives),
        so the overlap in time is what ties them; the root's collective completes first."""
        seen = _get_or_put(self.stragglers, st.job, list)
        if any(s0 <= end and start <= e0 for s0, e0 in seen):
            return False
        seen.append((start, end))
        del seen[:-_NAMED_KEPT]
        return True

    def _note_waits(self, st: TraceState, m: slowdown.Measures | None) -> None:
        """Remember the processes that spent long in this collective or transfer (a quarter of the straggler
        bar: what can hold a rank back enough to matter there), and when."""
        if m is None:
            return
        for i in np.flatnonzero(m.duration >= self.s.straggler_ns // 4):
            ref = m.refs[i]
            proc = self.process_of(st.comm, ref.rank)
            if proc is not None:
                seen = _get_or_put(self.waits, (st.job, proc), list)
                seen.append((st.comm, ref.start_ns, ref.end_ns))
                del seen[:-_WAITS_KEPT]

    def _held_back(self, st: TraceState, rank: int, since: int, until: int) -> bool:
        """Whether a rank that joined this collective late spent most of its lateness ([since, until], job
        time) in a collective or transfer of another communicator: then it was not computing but held
        back, by a straggler or a slow path there (a pipeline stage's Recv from a straggling stage, a DP ring
        behind a slow proxy), and enters its TP group's next collective late by as much. Naming it would name
        a consequence; the cause is judged where it waited. The wait counts completed or still in flight:
        the held-back collective's completion can reach the processor after this one's (another agent's
        export batch), while its in-flight snapshot is here already."""
        proc = self.process_of(st.comm, rank)
        if proc is None or until <= since:
            return False
        return any(c != st.comm and min(e, until) - max(s0, since) >= (until - since) / 2
                   for c, s0, e in (*self.waits.get((st.job, proc), ()), *self.waiting(proc)))

    def _root(self, node: tuple) -> tuple:
        up = self._joined.setdefault(node, node)
        while up != node:
            self._joined[node] = self._joined.setdefault(up, up)  # path halving
            node, up = up, self._joined[up]
        return node

    def _link(self, st: TraceState) -> None:
        """Join this communicator with the processes of the ranks it reports (once per rank count seen)."""
        key = (st.job, st.comm)
        if self._linked.get(key, 0) >= len(st.op):
            return
        _bounded_put(self._linked, key, len(st.op))
        a = self._root(("c",) + key)
        for r in st.op:
            proc = self.process_of(st.comm, r)
            b = self._root(("p", st.job, proc if proc is not None else (st.comm, r)))
            if a != b:
                self._joined[b] = a
        if len(self._joined) > _MAX_KEYS:
            self._joined.clear()  # bounded: forgetting only makes later consequences name, never hides one
            self._linked.clear()

    def _explained(self, st: TraceState) -> bool:
        """A slowdown named in a communicator joined to this one persists: its culprit (or a symptom whose
        alarm led to it) still reads slow (this collective's score beyond the mild test's drift) or keeps the
        strong test's evidence. A ring or tree is a pipeline, so one slow GPU, flow or NIC slows its
        neighbours' steps too (they wait for it, and the ones before it block on its credits), and a TP group
        passes the wait on to its ranks' other rings; alarms there while it persists are its consequences,
        not new faults. Every named one counts, not only the latest: a consequence named once must not hide
        the fault that still holds it back."""
        k = self.s.cusum.mild.k
        here = self._root(("c", st.job, st.comm))
        # a mild fault reads beyond the mild test's drift most collectives; the strong test's evidence, not the
        # mild one's, carries a strong fault over a quiet collective (the mild test drains at half the rate
        # and would outlive the fault by twice as many collectives, holding back a second fault's verdict)
        return any((c.strong > 0 or c.z > k) and self._root(("c", st.job, comm)) == here
                   for comm, c in self.named.get(st.job, ()))

    def _update(self, st: TraceState, ev: slowdown.Evidence, at: float) -> tuple[list[Alarm], bool]:
        """The candidates that alarm, and whether the test judged every measure (each had a null to judge by)."""
        job, comm = st.job, st.comm
        func, bucket = _kind(st)
        when = min((r.start_ns for r in st.op.values()), default=0)
        alarms: list[Alarm] = []
        tested = True
        for name, (units, values) in ev.values.items():
            own, sizes = (job, comm, func, bucket, name), (job, comm, func, "*", name)
            if name == slowdown.LATE:
                # lateness is a share of the makespan, which is short on NVLink: only its own communicator
                # says what is healthy, at its size once it has seen 8 collectives of it (until then, at all
                # its sizes: a job alternating two message sizes would judge the rarer one late)
                levels, nulls = (own,), (own, sizes)
            else:
                # Until a communicator has a history of its own at this size, it borrows: its null from its
                # other sizes (a score is a log-ratio, which the size scales away; a job alternating two
                # message sizes learns the rarer one late), then both null and level from its siblings, the
                # job's communicators of its size moving the same function and size (a PP job's stage pairs,
                # a TP x DP job's DP rings). A stage pair that transfers once per micro-batch, or a ring the
                # agents rarely export, would otherwise learn a fault that starts early as its healthy level.
                siblings = (job, ("*", st.nranks), func, bucket, name)
                levels, nulls = (own, siblings), (own, sizes, siblings)
            got = self._scores(levels, name, values, func == "p2p")
            if got is None:
                for key in levels:
                    self._null(self.levels, key).add(np.log(values + self.s.step_floor_ns))
                tested = False
                continue
            found, judged = self._test(levels, nulls, name, units, values, got, when, at, comm, job)
            alarms += found
            tested &= judged
        return alarms, tested

    def _test(self, levels: tuple[tuple, ...], nulls: tuple[tuple, ...], name: str, units: list,
              values: np.ndarray, got: tuple[np.ndarray, str], when: int, at: float, comm: str,
              job: str) -> tuple[list[Alarm], bool]:
        """One group of candidates through the test: their CUSUMs updated, the null and level taught with
        the healthy ones; the candidates that alarm, and whether there was a null to judge them by."""
        d = self.s.cusum
        x, mode = got
        alarms: list[Alarm] = []
        nulls = tuple(key + (mode,) for key in nulls)
        ready = self._ready(self.nulls, nulls, self.s.null_min_collectives)
        healthy = np.ones(len(units), dtype=bool)
        # a candidate noisier than the others (a flow on a longer route, a GPU that shares its host) is
        # standardized by its own spread, never by a narrower one: that only lengthens the run to a false alarm
        own = _get_or_put(self.own, nulls[0], lambda: OwnSpreads(self.s.own_size, self.s.own_min_values))
        rows = own.rows(units)
        own_med, own_scale, own_n = own.stats(rows)
        prior = (0.0, self.s.late_prior_scale) if name == slowdown.LATE else None
        role = np.zeros(len(units))
        if ready is not None or prior is not None:
            loc, scale = judged_by(ready, self.nulls.get(nulls[0])) if ready is not None else prior
            spread = np.maximum(scale, own_scale)
            # A candidate's role can place it off the collective's median for good: a tree's root and inner
            # ranks reduce what their children send while its leaves only receive the broadcast, a flow over
            # NVLink waits less per step than one over the network. Its own healthy median says so; the part
            # of its offset that stands clear of that median's sampling error (3 standard errors, sqrt(pi/2)
            # x spread / sqrt(n)) is its role, and the test judges what it adds beyond. An offset within the
            # error stays 0, so peers alike are still judged against each other, not each against its own
            # past (a fault present from a candidate's first collectives is learned only when it is large
            # enough to stand out and too mild for the test to name before its history fills).
            dev = own_med - loc
            err = 3.0 * 1.2533 * spread / np.sqrt(np.maximum(own_n, 1))
            role = np.where(own_n > 0, np.sign(dev) * np.maximum(0.0, np.abs(dev) - err), 0.0)
            z = (x - loc - role) / spread
            keys = self._keys(job, comm, name, units)
            held = [self.cusums.get(k) for k in keys]
            # a candidate with no evidence for either test and none held costs nothing
            for i in sorted({i for i, c in enumerate(held) if c is not None}.union(
                    np.flatnonzero(z > (d.mild.k if name in _MILD else d.k)).tolist())):
                u, c = units[i], held[i]
                if c is None:
                    c = Cusum()
                    _bounded_put(self.cusums, keys[i], c)
                elif when < c.last_when_ns:
                    # late news: a collective older than the candidate's latest evidence (flagged ones
                    # arrive at once, sampled ones of before the fault later); the test runs in the job's
                    # order, so it only teaches the null
                    healthy[i] = c.s < d.h / 2
                    continue
                elif at - c.updated_at > self.s.evidence_ttl_s:
                    c.reset()  # evidence from long ago says nothing about consecutive collectives
                s = c.update(float(z[i]), d, when, at, mild=name in _MILD)
                c.x = float(x[i])
                # a candidate gathering evidence does not teach the null what healthy looks like
                healthy[i] = s < d.h / 2
                if s >= d.h:
                    alarms.append(Alarm(name, u, c, float(z[i])))
        own.add(rows[healthy], x[healthy])
        for key in nulls:
            self._null(self.nulls, key).add((x - role)[healthy])
        if name != slowdown.LATE:
            for key in levels:
                self._null(self.levels, key).add(np.log(values[healthy] + self.s.step_floor_ns))
        return alarms, ready is not None or prior is not None

    def _twinned(self, st: TraceState, ev: slowdown.Evidence, name: str) -> bool:
        """Whether the candidates of this collective's measure ``name`` that gather evidence (S >= h/2) stand in
        two places out of each other's reach (_reach: not even a neighbour in common). A role repeats where the
        algorithm repeats it: NCCL's double binary tree has two roots, each reducing what its children send
        while leaves only receive, and a ring or a rail gives every flow of a kind a twin on other ranks. A
        fault sits in one place: the candidates it moves are its neighbours (a slow GPU's upstream peer blocks
        on its FIFO slots), whose reach overlaps its own."""
        peers: dict[int, set[int]] = {}  # rank -> the ranks its flows (sender, receiver, channel) join it to
        for src, dst, _ in ev.values.get(slowdown.FLOW, ((), None))[0]:
            peers.setdefault(src, set()).add(dst)
            peers.setdefault(dst, set()).add(src)
        half = self.s.cusum.h / 2
        gathering = [_reach(u, peers) for u in ev.values[name][0]
                     if (c := self.cusums.get(self._candidate(st.job, st.comm, name, u))) is not None and c.s >= half]
        return any(a.isdisjoint(b) for i, a in enumerate(gathering) for b in gathering[i + 1:])

    def _keys(self, job: str, comm: str, name: str, units: list) -> list[tuple]:
        """The candidates' keys (_candidate) for one measure of a collective; remembered per communicator
        and measure while its candidates stay the same and every one's process is known (a process, once
        learnt, stays the same: the key cannot change)."""
        memo = self._key_memo.get((job, comm, name))
        if memo is not None and memo[0] == units:
            return memo[1]
        keys = [self._candidate(job, comm, name, u) for u in units]
        if name == slowdown.FLOW or all(self.process_of(comm, u) is not None for u in units):
            _bounded_put(self._key_memo, (job, comm, name), (units, keys))
        return keys

    def _candidate(self, job: str, comm: str, name: str, unit) -> tuple:
        if name == slowdown.FLOW:
            return (job, name, comm, unit)
        proc = self.process_of(comm, unit)
        # a GPU is one rank: known by its global rank it is the same in every communicator; a process known
        # only by its pid may drive several GPUs, so its ranks stay apart (per communicator)
        return (job, name, proc if proc is not None and proc[1] == "g" else (comm, unit))

    def _recovered(self, st: TraceState, f: Finding, at: float) -> Alarm | None:
        """A stall that recovered, naming a slow proxy, GPU or flow: one capped score for its candidate,
        once per distinct stall."""
        name = slowdown.MEASURE_OF.get(f.category)
        if name is None or not f.ranks:
            return None
        unit = (f.ranks[0], f.peer, f.channel) if name == slowdown.FLOW and f.peer is not None else f.ranks[0]
        if name == slowdown.FLOW and not isinstance(unit, tuple):
            name = slowdown.NIC_SEND
        c = _get_or_put(self.cusums, self._candidate(st.job, st.comm, name, unit), Cusum)
        start, end = _stall_window(st)
        if start < c.last_stall_end_ns:
            return None  # the same descheduling, seen in another collective in flight with this one
        c.last_stall_end_ns = end
        s = c.update(self.s.cusum.cap, self.s.cusum, start, at, mild=name in _MILD)
        return Alarm(name, unit, c, self.s.cusum.cap) if s >= self.s.cusum.h else None

    def _half_way(self, job: str, names: tuple[str, ...]) -> Iterator[tuple]:
        """The keys of the job's candidates of these measures that are half way to an alarm (S >= h/2)."""
        half = self.s.cusum.h / 2
        return (k for k, c in self.cusums.items() if k[0] == job and k[1] in names and c.s >= half)

    def _accumulating(self, st: TraceState, names: tuple[str, ...]) -> bool:
        """Some candidate of these measures in this communicator is half way to an alarm."""
        mine = {self._candidate(st.job, st.comm, slowdown.GPU, r)[2] for r in st.op}
        return any(k[2] in mine or k[2] == st.comm for k in self._half_way(st.job, names))

    def _link_gathers(self, st: TraceState, elsewhere: bool = False) -> bool:
        """A link (a flow or a NIC) of this communicator or one joined to it is half way to an alarm;
        ``elsewhere``: a flow of another joined communicator only."""
        here = self._root(("c", st.job, st.comm))
        for k in self._half_way(st.job, (slowdown.FLOW, slowdown.NIC_SEND, slowdown.NIC_RECV)):
            if k[1] == slowdown.FLOW:
                if elsewhere and k[2] == st.comm:
                    continue
                node = ("c", st.job, k[2])
            elif elsewhere:
                continue
            else:
                node = ("p", st.job, k[2])  # a NIC is a process's (or a rank's of a pid-only one), as _link joins
            if self._root(node) == here:
                return True
        return False

    def _name(self, st: TraceState, m: slowdown.Measures, ev: slowdown.Evidence, alarms: list[Alarm],
              recovered: Finding | None) -> Finding | None:
        by = {name: [a for a in alarms if a.measure == name] for name in _ORDER}
        pick: Alarm | None = None
        late = [a for a in by[slowdown.LATE] if not self._busy_before(st, a.unit)]
        if late:
            pick = max(late, key=lambda a: a.cusum.s)
        elif by[slowdown.GPU]:
            held = {a.unit for a in by[slowdown.GPU]}
            g = self._source_gpu(st, ev, max(by[slowdown.GPU], key=lambda a: a.cusum.s))
            if self._link_gathers(st, elsewhere=True):
                return None  # its kernel queued behind a transfer of a joined communicator: that one's verdict
            late_one = self._waited_for(st, ev, g.unit)
            if late_one is not None:
                g.cusum.reset()
                return self._finding(st, ev, g.led_to(slowdown.LATE, ev.late_rank, late_one), recovered)
            proxy = self._proxy_behind(st, ev)
            if proxy is not None:
                # a rank whose proxy leaves its ready data unposted blocks its kernel on the send FIFO slots
                # that data holds, so its received data waits for that kernel, and the ranks sending into it
                # block in turn, hop by hop: their GPUs read slow. A slow GPU never reads as a proxy (its
                # upstream's credit wait is its own busy time)
                g.cusum.reset()
                g = g.led_to(slowdown.PROXY, *proxy)
            pick = self._path(g, self._held_back_path(st, ev, g.unit, held)) if g.measure == slowdown.GPU else g
            if pick is g:
                touching = [a for a in by[slowdown.FLOW] if g.unit in a.unit[:2]]
                if len(touching) == 1 and not by[slowdown.NIC_SEND] and not by[slowdown.NIC_RECV]:
                    pick = touching[0]  # its kernel queued behind the collective that one flow delayed
        elif by[slowdown.NIC_SEND] or by[slowdown.NIC_RECV]:
            pick = max(by[slowdown.NIC_SEND] + by[slowdown.NIC_RECV], key=lambda a: a.cusum.s)
        elif by[slowdown.FLOW]:
            f = max(by[slowdown.FLOW], key=lambda a: a.cusum.s)
            pick = self._path(f, self._network(st, ev, f.unit[0]))
        elif by[slowdown.PROXY] and not self._accumulating(
                st, (slowdown.LATE, slowdown.NIC_SEND, slowdown.NIC_RECV, slowdown.FLOW)):
            # the ranks sending into a late rank wait for credit on buffers it posts late, and the network
            # may hold data it has not delivered yet: those verdicts come first (held-back GPUs are the
            # proxy's own doing)
            pick = max(by[slowdown.PROXY], key=lambda a: a.cusum.s)
        if pick is None:
            return None
        return self._finding(st, ev, pick, recovered)

    def _proxy_behind(self, st: TraceState, ev: slowdown.Evidence) -> tuple[int, Cusum] | None:
        """The rank of this collective whose proxy gathers the most evidence (half way to an alarm), with it."""
        units = ev.values.get(slowdown.PROXY, ([], None))[0]
        found = [(u, c) for u in units if (c := self._gathering(st, slowdown.PROXY, u)) is not None]
        return max(found, key=lambda x: x[1].s) if found else None

    def _busy_before(self, st: TraceState, rank: int) -> bool:
        """The rank's lateness has a cause the test is gathering evidence of (half way to an alarm): its own
        GPU, or a link in this communicator or one joined to it. A rank's kernels run in order on its stream,
        so a slow GPU or a slow transfer of its pipeline stage holds back its start in the next collective,
        and through a TP group the start of its peers' next collectives too. The reverse never holds: a rank
        that calls late leaves its peers' sends waiting for its credit (SendPeerWait), not on the link, and
        its own GPU idle. (Another rank's GPU can read slow behind a late rank: the rank before it blocks on
        a FIFO slot the late one has not freed.) So lateness waits for that verdict."""
        return self._gathering(st, slowdown.GPU, rank) is not None or self._link_gathers(st)

    def _waited_for(self, st: TraceState, ev: slowdown.Evidence, gpu: int) -> Cusum | None:
        """The evidence of another rank that started last and reads late, when it gathers: the ranks before
        it in the ring block on the FIFO slots it has not freed, so their received data waits for their GPUs,
        and a GPU's reading is its back-pressure. Not when a link or its own GPU explains its lateness
        (_busy_before)."""
        rank = ev.late_rank
        if rank in (gpu, -1) or ev.lateness_ns <= 0 or self._busy_before(st, rank):
            return None
        return self._gathering(st, slowdown.LATE, rank)

    def _cusum(self, st: TraceState, measure: str, unit) -> Cusum | None:
        return self.cusums.get(self._candidate(st.job, st.comm, measure, unit))

    def _evidence(self, st: TraceState, measure: str, unit) -> float:
        """The candidate's evidence S (0 when it never read slow)."""
        c = self._cusum(st, measure, unit)
        return 0.0 if c is None else c.s

    def _gathering(self, st: TraceState, measure: str, unit) -> Cusum | None:
        """The candidate's evidence when it is half way to an alarm (S >= h/2), else None."""
        c = self._cusum(st, measure, unit)
        return c if c is not None and c.s >= self.s.cusum.h / 2 else None

    def _source_gpu(self, st: TraceState, ev: slowdown.Evidence, g: Alarm) -> Alarm:
        """Of the GPUs gathering evidence in this collective, the one whose data waits longest: a slow GPU
        holds its ring neighbours back (the one before it blocks in its send primitive until a FIFO slot
        frees, so the data it received waits for its GPU too), and which of them crosses h first is a matter
        of noise; the held-back wait is the source's, less the slack of NCCL_STEPS slots."""
        best = g
        for u in ev.values[slowdown.GPU][0]:
            c = self._gathering(st, slowdown.GPU, u)
            if c is not None and c is not g.cusum and c.last_when_ns == g.cusum.last_when_ns and c.x > best.cusum.x:
                best = g.led_to(slowdown.GPU, u, c, c.z)
        if best is not g:
            g.cusum.reset()  # its evidence was the source's doing: named once, as the source
        return best

    def _held_back_path(self, st: TraceState, ev: slowdown.Evidence, source: int,
                        alarmed: set) -> tuple[str, object, Cusum] | None:
        """The network path that explains a GPU alarm: the source GPU's own way out, else the path with the
        most evidence among the ways into it and those out of the held-back GPUs (alarmed in this collective
        or gathering evidence), else None. A slow GPU cannot be behind a flow's network busy time: it posts
        its sends late, and its receive buffers late (the sender then waits for credit, SendPeerWait); once
        posted, a step moves at the network's speed. A slow link, though, shows at GPUs on both sides of it.
        It holds back its sender's kernel and, through the FIFO credits, every kernel upstream of it in the
        ring (in a large ring the sender is not always the one whose received data waits longest). And a
        link that delivers late delivers in bursts (the steps in flight land together once the window is
        full), so its receiver's data waits while the GPU reduces and forwards the ones before it."""
        found = self._network(st, ev, source)
        if found is not None:
            return found
        flows = ev.values.get(slowdown.FLOW, ([], None))[0]
        behind = {u[0] for u in flows if u[1] == source}
        behind.update(u for u in ev.values[slowdown.GPU][0]
                      if u != source and (u in alarmed or self._gathering(st, slowdown.GPU, u) is not None))
        for u in sorted(behind):
            other = self._network(st, ev, u)
            if other is not None and other[2].s > (found[2].s if found is not None else 0.0):
                found = other
        return found

    @staticmethod
    def _path(alarm: Alarm, found: tuple[str, object, Cusum] | None) -> Alarm:
        """The network path found behind ``alarm`` (:meth:`_network`), named for its evidence, else ``alarm``."""
        if found is None:
            return alarm
        path = alarm.led_to(*found)
        if path.cusum is not alarm.cusum:
            alarm.cusum.reset()  # what it measured was the path's doing: named once, as the path
        return path

    def _network(self, st: TraceState, ev: slowdown.Evidence, sender: int) -> tuple[str, object, Cusum] | None:
        """Who holds whom back, once a rank's GPU or one of its flows out reads slow: the network path its
        evidence points at (measure, unit, evidence), else None.

        A slow GPU posts its sends late, but once posted they move at the network's speed: slow flows *out* of
        a rank are the network's doing. They also hold its GPU back (the kernel's send primitive blocks until
        a FIFO slot frees, so data received meanwhile waits for the GPU), and with two similar effects the one
        that crosses h first is a matter of noise, so the decision reads each flow's accumulated evidence
        (half way to h), not only this collective's alarms. Which part of the path: slow flows that all go to
        one receiver whose other senders' flows read slow too, or whose least-waiting flow in holds as much
        evidence as the slowest, are that receiver's NIC (congestion into it); else the sender's NIC when its
        least-waiting flow out (``nic_send``: every flow of that NIC) gathers and holds as much evidence as
        its slowest flow or every flow out holds half of it, or all its flows out gather evidence (a ring's
        one peer cannot tell the two ends apart: the sender is named); else its slowest flow (a link, a
        route, a QP), and a rank with one flow out names that flow. With no slow flow out, the NIC of a
        receiver it sends into, when that gathers evidence."""
        flows = ev.values.get(slowdown.FLOW, ([], None))[0]
        out = [u for u in flows if u[0] == sender]
        slow = [(u, c) for u in out if (c := self._gathering(st, slowdown.FLOW, u)) is not None]
        # its least-waiting flow out reads slow: every flow of its NIC does (with one flow out, that flow)
        nic = self._gathering(st, slowdown.NIC_SEND, sender) if len(out) > 1 else None
        if not slow:
            if nic is not None:
                return slowdown.NIC_SEND, sender, nic
            # no flow of its own reads slow yet, but the NIC it sends into does: congestion into that receiver
            # slows every sender's flow a little and holds their kernels back
            into = [(u[1], c) for u in out if (c := self._gathering(st, slowdown.NIC_RECV, u[1])) is not None]
            return None if not into else (slowdown.NIC_RECV,) + max(into, key=lambda x: x[1].s)
        u, c = max(slow, key=lambda x: x[1].s)
        # a NIC's least-waiting flow (a minimum) rises when any one of its flows slows down: it reads as
        # much evidence as the slowest flow only when every flow of the NIC is slow
        into = self._gathering(st, slowdown.NIC_RECV, u[1])
        if len({v[1] for v, _ in slow}) == 1 and ((into is not None and into.s >= c.s) or any(
                v[1] == u[1] and v[0] != sender and self._gathering(st, slowdown.FLOW, v) is not None
                for v in flows)):
            return slowdown.NIC_RECV, u[1], into if into is not None else c
        if (nic is not None and (nic.s >= c.s or all(
                self._evidence(st, slowdown.FLOW, v) >= c.s / 2 for v in out))) or len(slow) == len(out) > 1:
            # the least-waiting flow holds as much evidence as the slowest, or every flow out half of it:
            # what slows them is common
            return slowdown.NIC_SEND, sender, nic if nic is not None else c
        return slowdown.FLOW, u, c

    def _runner_up(self, st: TraceState, ev: slowdown.Evidence, a: Alarm) -> tuple[str, float]:
        """The strongest other explanation in this collective: the candidate with the most evidence that is
        neither the named one nor a symptom that led to it."""
        mine = (a.cusum,) + a.via
        best: tuple[str, float] = ("", 0.0)
        for name, (units, _) in ev.values.items():
            for u, k in zip(units, self._keys(st.job, st.comm, name, units)):
                c = self.cusums.get(k)
                if c is not None and c.s > best[1] and not any(c is m for m in mine):
                    best = (_label(name, u), c.s)
        return best

    def _finding(self, st: TraceState, ev: slowdown.Evidence, a: Alarm, recovered: Finding | None) -> Finding:
        c = a.cusum
        n = c.collectives
        runner_up, runner_s = self._runner_up(st, ev, a)
        won_s = max(c.s, max((v.s for v in a.via), default=0.0))  # a path named for what it holds back
        cat = slowdown.CATEGORY_OF[a.measure]
        h = self.s.cusum.h
        # a path or source named for the evidence it explains may itself be only half way to h
        seen = (f"(sustained over {n} collectives: CUSUM {c.s:.1f} >= {h:g})" if c.s >= h else
                f"(sustained over {n} collectives: CUSUM {c.s:.1f}, and {h:g} reached by what it holds back)")
        chan = peer = None
        if a.measure == slowdown.FLOW:
            s, d, chan = a.unit
            who, peer = s, d
            what = f"flow rank {s} -> rank {d} on channel {chan} waits longer per step on the network than its siblings"
        else:
            who = a.unit
            what = {
                slowdown.GPU: f"rank {who}'s GPU takes longer per step to consume received data than the other ranks'",
                slowdown.NIC_SEND: f"every flow sent by rank {who} waits longer per step on the network",
                slowdown.NIC_RECV: f"every flow into rank {who} waits longer per step on the network",
                slowdown.PROXY: (f"rank {who}'s ready send steps wait for credit while their receivers' buffers are "
                                 f"posted: its proxy posts ready chunks late"),
                slowdown.LATE: f"rank {who} starts its collectives late and the others wait for it",
            }[a.measure]
        if recovered is not None and recovered.ranks == [who] and recovered.category == cat:
            what = recovered.evidence
        onset = c.onset_ns
        # the culprit and the symptoms that led to it: while any of them persists, so does this incident
        named = _get_or_put(self.named, st.job, list)
        for e in (c,) + a.via:
            if not any(n is e for _, n in named):
                named.append((st.comm, e))
        del named[:-_NAMED_KEPT]
        c.reset()  # named: the incident window dedupes what follows; a fault that persists accumulates again
        return Finding(kind=sc.KIND_SLOWDOWN, category=cat, ranks=[who], channel=chan, peer=peer,
                       confidence=round(min(0.95, 0.6 + 0.02 * n), 3),
                       evidence=f"{what} in {st.func} {st.seq} {seen}", onset_ns=onset,
                       reason=a.measure, recovered=recovered is not None, hypothesis=_label(a.measure, a.unit),
                       runner_up=runner_up, margin=round(won_s - runner_s, 2))
