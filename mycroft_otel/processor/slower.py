"""Whether a communicator got slower: a slowdown is named for making the job slower.

The test compares candidates with each other, and a candidate can read off its peers for a while without
slowing anything (in a healthy ring every collective is paced by its slowest link of the moment). So an alarm
names only once the communicator's kernels (KernelCh, GPU time) run measurably longer than while it was
healthy; a fault present from the communicator's first collectives is judged by the test's pace and by where
its candidates stand (a role repeats where the algorithm repeats it, a fault sits in one place).
"""

from __future__ import annotations

from collections import deque
from operator import attrgetter
from typing import Callable

import numpy as np

from mycroft_otel import semconv as sc
from mycroft_otel.processor import slowdown
from mycroft_otel.processor.candidates import Alarm
from mycroft_otel.processor.keys import kind_of, step_of
from mycroft_otel.processor.memory import Durations, JobMemory, KernelTime, get_or_put
from mycroft_otel.processor.sequential import MAD_TO_SD, median
from mycroft_otel.processor.settings import Settings
from mycroft_otel.processor.spans import span_attributes
from mycroft_otel.processor.state import TraceState

_KERNEL = frozenset({sc.KERNEL_DURATION})
# Which of a collective's kernel times a fault lengthens (KernelTime keeps both). A rank's kernel runs from
# its launch to its last step, so it holds its wait for the peers that arrive after it, then the transfer.
# WAIT: the median rank's kernel, the others' wait for a late rank. TRANSFER: the shortest kernel, the last
# rank to arrive, which found its peers there and ran only the transfer: a slow GPU, link, NIC or proxy
# lengthens it, while the ranks' arrival skew (the model's compute jitter, large beside a TP group's NVLink
# all-reduce) does not.
KernelRead = Callable[[KernelTime], float]
WAIT: KernelRead = attrgetter("wait")
TRANSFER: KernelRead = attrgetter("transfer")


def _reach(unit, peers: dict[int, set[int]]) -> set[int]:
    """The ranks a fault at a candidate moves: a flow's two ends; a rank and the ranks it exchanges data with
    in the collective (``peers``, from its flows), whose waits its back-pressure or delay lengthens."""
    return set(unit[:2]) if isinstance(unit, tuple) else {unit} | peers.get(unit, set())


def _siblings(st: TraceState) -> tuple:
    """Where a communicator's kernel times are pooled with its siblings': the job's communicators of its size
    moving the same function, apart by whether they cross hosts (a TP group inside a node runs on NVLink,
    a DP ring of as many ranks on the network: their times are not comparable)."""
    hosts = {ref.resource.host for _, ref in zip(range(16), st.op.values())}
    return st.job, st.nranks, kind_of(st)[0], len(hosts) > 1


def _levels(times: list[KernelTime], read: KernelRead) -> dict[int, float]:
    """Per size bucket, the median of ``times`` read by ``read``; a size with fewer than 3 says nothing. A job
    moving several message sizes: each time is read against its own size's level, so that the sizes pool."""
    by: dict[int, list[float]] = {}
    for e in times:
        by.setdefault(e.bucket, []).append(read(e))
    return {k: median(np.array(ds)) for k, ds in by.items() if len(ds) >= 3}


def _residuals(times: list[KernelTime], read: KernelRead, level: dict[int, float]) -> list[float]:
    """``times`` read by ``read`` less their size's level (those of a size without one left out)."""
    return [read(e) - level[e.bucket] for e in times if e.bucket in level]


class SlowerCheck:
    """A communicator's kernel times, and whether they moved since an alarm's evidence began."""

    def __init__(self, settings: Settings, memory: JobMemory):
        self.s, self.mem = settings, memory

    def note_duration(self, st: TraceState, m: slowdown.Measures, tested: bool, healthy: bool) -> Durations:
        """Remember how long this collective's kernels ran (over up to 16 of its ranks, the kernel's GPU time,
        KernelCh start to stop: the median rank's and the shortest, WAIT and TRANSFER), per communicator and
        function, with its size; the communicator's recent durations. Not its spans: a span opens when the
        host enqueues the collective, and the kernel then waits on the stream behind the model's compute,
        often far longer than it runs. A kernel waits for its peers once running, so a late rank, a slow link
        or GPU lengthens its peers' kernels too. ``tested``: the test judged every measure (each had a null);
        ``healthy``: nothing alarmed and no slowdown named in a joined communicator persists. Only healthy
        collectives stand for the communicator's healthy time, so a fault that follows a named one is compared
        with the time before that one. A collective whose agents export no kernel times (an NCCL without
        KernelCh events) adds nothing."""
        func, bucket = kind_of(st)
        history = get_or_put(self.mem.durations, (st.job, st.comm, func),
                              lambda: Durations(deque(maxlen=self.s.duration_history)))
        if len(m.refs) >= 2:  # a rank flagged alone was exported for being slow: no fair sample
            ran = [v for ref in m.refs[:16] if type(v := span_attributes(ref, _KERNEL).get(sc.KERNEL_DURATION)) is int]
            if ran:  # kept at the collective's start, the time base of the evidence's onset (Cusum.onset_ns)
                when = min(ref.start_ns for ref in m.refs)
                times = KernelTime(when, bucket, float(np.log(median(np.array(ran, dtype=np.float64)) + 1.0)),
                                   float(np.log(min(ran) + 1.0)), healthy, st.comm, step_of(st))
                history.recent.append(times)
                if tested and history.judged_from < 0:
                    history.judged_from = when
                get_or_put(self.mem.sibling_durations, _siblings(st),
                           lambda: deque(maxlen=4 * self.s.duration_history)).append(times)
        return history

    def _than_siblings(self, st: TraceState, history: Durations, onset_ns: int, read: KernelRead,
                       at: Callable[[KernelTime], bool]) -> bool:
        """Whether this communicator's kernels since ``onset_ns`` ran longer than its siblings' over the same
        time (the job's other communicators of its size and function, on the network or inside a node alike:
        a TP x DP job's DP rings, or its TP groups), by 3 standard errors of the difference; False when there is
        too little to compare (fewer than 2 siblings, 8 of their kernel times or 3 of its own). Siblings move
        the same data at the same moments of the step, so a collective-wide effect (the model's step, a bigger
        message, a loaded job) moves them alike, and they need no history of their own: a ring whose fault
        began a few steps into the job is judged as soon as it has run a few slow collectives."""
        sib = self.mem.sibling_durations.get(_siblings(st))
        if sib is None:
            return False
        others = [e for e in sib if e.start >= onset_ns and e.comm != st.comm and at(e)]
        level = _levels(others, read)
        theirs = _residuals(others, read, level)
        mine = _residuals([e for e in history.recent if e.start >= onset_ns and at(e)], read, level)
        if len({e.comm for e in others if e.bucket in level}) < 2 or \
                len(theirs) < self.s.null_min_collectives or len(mine) < 3:
            return False
        return self._longer(mine, theirs)

    def _longer(self, mine: list[float], theirs: list[float]) -> bool:
        """Whether ``mine`` (log kernel times, less their size's level) run longer than ``theirs``: their median
        above by 3 standard errors of the difference (sqrt(pi/2) x spread x sqrt(1/n + 1/m), the spread theirs,
        at least min_scale), or their mean by 3 standard errors (theirs' standard deviation, at least
        min_scale). The median is what a typical collective took; the mean is what the job spent. A fault
        that acts on one collective of each training step (a rank late before one of its TP group's four
        all-reduces per step, a proxy thread that sleeps now and then) leaves the median where it was and
        moves the mean by its share of the collectives. The healthy deviation counts every healthy outlier
        (a descheduled rank's long kernel), so the mean's bar widens with them."""
        t, m = np.array(theirs), np.array(mine)
        mid = median(t)
        scale = max(MAD_TO_SD * median(np.abs(t - mid)), self.s.min_scale)
        spread = np.sqrt(1.0 / len(m) + 1.0 / len(t))
        if median(m) - mid >= 3.0 * 1.2533 * scale * spread:
            return True
        sd = max(float(t.std(ddof=1)) if len(t) > 1 else 0.0, self.s.min_scale)
        return float(m.mean() - t.mean()) >= 3.0 * sd * spread

    def is_slower(self, st: TraceState, ev: slowdown.Evidence, history: Durations, alarms: list[Alarm]) -> bool:
        """Whether the communicator's collectives since the alarms' evidence began take longer than its
        healthy ones before (_note_duration), in the kernel time an alarm's fault lengthens (WAIT for a late
        rank, at the place of the step its lateness is kept at; TRANSFER for the rest): by their median or
        their mean (_longer). Since the latest onset among
        the alarms: a fault's culprit and symptoms start gathering together, while a candidate that has crept
        up since the first collectives must not stretch the window back.

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
        reads = dict.fromkeys(WAIT if a.measure == slowdown.LATE else TRANSFER for a in alarms)
        healthy = [e for e in history.recent if e.start < onset_ns and e.healthy]
        recent = [e for e in history.recent if e.start >= onset_ns]
        # A lateness kept at one place of the step (the agent's StepPattern) moved that place's waits; each
        # place has its own (the first all-reduce after the optimizer waits for the ranks' different host work,
        # one inside the backward pass for the compute jitter only), severalfold apart: read at the alarm's
        # place, against that place's healthy waits, neither the other places' unmoved waits nor the spread
        # between the places hide it. The transfer does not depend on the place.
        places = {a.step for a in alarms if a.measure == slowdown.LATE}
        anywhere: Callable[[KernelTime], bool] = lambda e: True  # noqa: E731
        at = {WAIT: (lambda e: e.step in places) if places and -1 not in places else anywhere, TRANSFER: anywhere}
        enough = False
        for read in reads:
            there = [e for e in healthy if at[read](e)][-self.s.own_size:]
            level = _levels(there, read)
            before = _residuals(there, read, level)
            since = _residuals([e for e in recent if at[read](e)], read, level)
            known = len(before) >= self.s.null_min_collectives
            enough = enough or known
            if known and since and self._longer(since, before):
                return True
        if enough and onset_ns > history.judged_from >= 0:
            return False
        if not enough and any(self._than_siblings(st, history, onset_ns, read, at[read]) for read in reads):
            # slower than its siblings; not slower than them says nothing: a fault that slows a DP ring slows
            # every TP group waiting on it, and through them every other ring
            return True
        d = self.s.cusum.strong  # found fast by the strong test: its own run (another test may hold S up longer)
        return any(a.cusum.strong >= d.h and a.cusum.strong_run <= 2 * d.h / (d.cap - d.k)
                   and not self._twinned(st, ev, a.measure) for a in alarms)

    def _twinned(self, st: TraceState, ev: slowdown.Evidence, name: str) -> bool:
        """Whether the candidates of this collective's measure ``name`` that gather evidence (S >= h/2) stand in
        two places out of each other's reach (_reach: not even a neighbour in common). A role repeats where the
        algorithm repeats it: NCCL's double binary tree has two roots, each reducing what its children send
        while leaves only receive, and a ring or a rail gives every flow of a kind a twin on other ranks. A
        fault sits in one place: the candidates it moves are its neighbours (a slow GPU's upstream peer blocks
        on its FIFO slots), whose reach overlaps its own."""
        peers: dict[int, set[int]] = {}  # rank -> the ranks its flows (sender, receiver, channel) join it to
        for src, dst, _ in ev.units(slowdown.FLOW):
            peers.setdefault(src, set()).add(dst)
            peers.setdefault(dst, set()).add(src)
        half = self.s.cusum.h / 2
        gathering = [_reach(u, peers) for u in ev.units(name)
                     if (c := self.mem.cusum(st, name, u)) is not None and c.s >= half]
        return any(a.isdisjoint(b) for i, a in enumerate(gathering) for b in gathering[i + 1:])
