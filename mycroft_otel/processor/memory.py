"""What the slowdown detector remembers of each job, and the questions it asks of that memory.

Per job, communicator, function and size: the measures' learned nulls and healthy levels, each candidate's own
healthy scores (its role), the communicator's recent kernel times; per candidate: its CUSUM evidence; per job:
the slowdowns and stragglers named, each process's long waits, and the graph of communicators joined by shared
processes (a TP group joins its ranks' DP rings: they wait for each other). Every table is bounded
(:data:`MAX_KEYS`, oldest forgotten first), and the learned tables together by bytes
(``Settings.max_history_bytes``, :meth:`JobMemory.trim`): a client that invents communicators (each 8-rank
one left ~98 KiB behind) cannot grow it past its budget.

A candidate is a place a fault can sit: a GPU, a NIC or a proxy thread belongs to a process, and a slow GPU
slows every communicator of its process, so their evidence is kept per process (by its global rank) across
communicators; a flow belongs to one communicator.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from itertools import islice
from typing import Callable, Iterator, NamedTuple

import numpy as np

from mycroft_otel.processor import slowdown
from mycroft_otel.processor.keys import CandidateKey, NullKey, step_of
from mycroft_otel.processor.sequential import Cusum, OwnSpreads, RobustNull
from mycroft_otel.processor.settings import Settings
from mycroft_otel.processor.state import TraceState

WAITS_KEPT = 4  # long waits remembered per process (a straggler's consequences follow it within seconds)
NAMED_KEPT = 8  # slowdowns named per job whose persistence explains later alarms (joined communicators)
MAX_KEYS = 200_000  # candidates and nulls kept (oldest forgotten first): bounded memory for any job
TRIM_EVERY = 256    # judged collectives between two estimates of the history's bytes (each walks its tables)
# Estimated bytes of the Python objects around each entry (key tuple and strings, dict slot, object header),
# beside the numpy buffers counted exactly; set from tracemalloc (tests/reliability/test_processor_memory.py).
_ENTRY_BYTES = 400
_ITEM_BYTES = 150   # one remembered kernel time (a tuple of four or five numbers and a string reference)


def bounded_put(d: dict, key, value) -> None:
    if len(d) >= MAX_KEYS:
        d.pop(next(iter(d)))
    d[key] = value


def get_or_put(d: dict, key, make: Callable[[], object]):
    v = d.get(key)
    if v is None:
        v = make()
        bounded_put(d, key, v)
    return v


# Measures whose evidence is kept per communicator. A flow is one communicator's connection. A rank's start
# is judged against its peers of one communicator: a rank late into its DP ring (a slow gradient hook, a
# data loader) is on time into its TP group, whose collectives, as many or more, would cancel the
# evidence of its DP ones in a CUSUM kept per process. For the same reason it is kept per place of the
# training step (step_of): a rank late into one of its TP group's all-reduces of a step (a host-side copy
# before it) is on time into the others, which would cancel its evidence.
_PER_COMMUNICATOR = frozenset({slowdown.FLOW, slowdown.LATE})
_PER_STEP = frozenset({slowdown.LATE})


class KernelTime(NamedTuple):
    """One collective's kernel times (KernelCh, GPU time) over up to 16 of its ranks, in log ns (which of them a
    fault lengthens is slower.py's matter), kept in its communicator's Durations and among its siblings'."""

    start: int       # the collective's start (the evidence's time base, Cusum.onset_ns)
    bucket: int      # its message size bucket (kind_of)
    wait: float      # the median rank's kernel: its wait for the peers that arrive after it, then the transfer
    transfer: float  # the shortest kernel: the last rank to arrive, which ran the transfer only
    healthy: bool    # stands for the communicator's healthy time (SlowerCheck.note_duration)
    comm: str
    step: int = -1   # its place in the training step (keys.step_of; -1 when not known)


@dataclass(slots=True)
class Durations:
    """A communicator's recent kernel times (per function and size), and when the test first judged it."""

    recent: deque          # of KernelTime
    judged_from: int = -1  # start of the first collective whose every measure the test judged


class JobMemory:
    """The detector's state, shared by its stages (candidates, slower, naming)."""

    def __init__(self, settings: Settings, process_of: Callable[[str, int], tuple | None],
                 waiting: Callable[[tuple], list[tuple]]):
        self.s = settings
        # process -> (comm, start, last seen) of the collectives it is still seen in flight in (the store's
        # in-flight snapshots): a wait whose completion has not reached the processor yet
        self.waiting = waiting
        # (comm, rank) -> the rank's process (host, "g", global rank) or (host, "p", pid), None when unknown:
        # a GPU, a NIC, a proxy thread belong to a process, and a slow GPU slows every communicator of its
        # process, so their evidence accumulates across communicators; a flow is one communicator's
        self.process_of = process_of
        self.nulls: dict[NullKey, RobustNull] = {}   # -> healthy scores
        self.levels: dict[NullKey, RobustNull] = {}  # -> log(value + floor) of healthy values
        self.cusums: dict[CandidateKey, Cusum] = {}  # -> evidence
        self.named: dict[str, list[tuple]] = {}      # job -> (communicator, evidence) of the slowdowns named
        self.stragglers: dict[str, list[tuple]] = {}  # job -> (start, end) of the stragglers' waits named
        self.waits: dict[tuple, list[tuple]] = {}     # (job, process) -> (comm, start, end) of its long waits
        # communicators and the processes in them, as one graph: communicators that share a process, or are
        # joined through others that do (a TP group joins its ranks' DP rings), wait for each other
        self._joined: dict[tuple, tuple] = {}        # node -> its parent (union-find); a root maps to itself
        self._linked: dict[tuple, int] = {}          # (job, comm) -> ranks linked so far
        self._members: dict[tuple, set] = {}         # (job, comm) -> its ranks' places (CandidateKey.place)
        self._comms_of: dict[tuple, set] = {}        # (job, place) -> the communicators it is in
        self.own: dict[NullKey, OwnSpreads] = {}     # -> its candidates' own healthy scores
        self.durations: dict[tuple, Durations] = {}  # (job, comm, func) -> its kernels' recent times
        # (job, ranks, func, crosses hosts) -> recent KernelTime of every communicator of that shape: a
        # communicator's siblings (slower.py)
        self.sibling_durations: dict[tuple, deque] = {}
        self._key_memo: dict[tuple, tuple[list, list[CandidateKey]]] = {}  # (job, comm, measure) -> (units, keys)
        self._until_trim = TRIM_EVERY
        self.trimmed = 0  # times the history was cut to its budget

    # -- bytes ----------------------------------------------------------------------------------
    def history_bytes(self) -> int:
        """The learned tables' bytes, estimated: numpy buffers exactly, the objects around them per entry."""
        n = sum(len(t) for t in (self.nulls, self.levels, self.own, self.cusums, self.durations,
                                 self.sibling_durations, self._key_memo, self._joined, self._linked, self._members,
                                 self._comms_of, self.waits))
        total = n * _ENTRY_BYTES
        total += sum(v.nbytes for t in (self.nulls, self.levels) for v in t.values())
        total += sum(v.nbytes for v in self.own.values())
        total += _ITEM_BYTES * (sum(len(d.recent) for d in self.durations.values())
                                + sum(len(d) for d in self.sibling_durations.values())
                                + sum(len(m) for m in self._members.values())
                                + sum(len(c) for c in self._comms_of.values())
                                + sum(len(u) for u, _k in self._key_memo.values()))
        return total

    def trim(self) -> bool:
        """Once per judged collective: every TRIM_EVERY, when the history is over its budget, forget the older
        half of each learned table (oldest first) and the communicator graph, until it fits. A forgotten null
        or level is relearned before its candidates are tested again and forgotten evidence only delays an
        alarm: a verdict is delayed, never made up (the graph's forgetting is discussed at ``link``)."""
        self._until_trim -= 1
        if self._until_trim > 0:
            return False
        self._until_trim = TRIM_EVERY
        cut = False
        while self.history_bytes() > self.s.max_history_bytes:
            cut = True
            for table in (self.nulls, self.levels, self.own, self.cusums, self.durations, self.sibling_durations,
                          self._key_memo, self.waits):
                for key in list(islice(table, (len(table) + 1) // 2)):
                    del table[key]
            for table in (self._joined, self._linked, self._members, self._comms_of):
                table.clear()
        self.trimmed += cut
        return cut


    def null(self, table: dict, key: tuple) -> RobustNull:
        return get_or_put(table, key, lambda: RobustNull(self.s.null_size, self.s.min_scale))

    def ready(self, table: dict, keys: tuple[NullKey, ...], collectives: int = 0) -> RobustNull | None:
        """The first of ``keys``' nulls (the communicator's own, then its other sizes' or its siblings') that
        holds enough."""
        for key in keys:
            null = table.get(key)
            if null is not None and len(null) >= self.s.null_min_values and null.collectives >= collectives:
                return null
        return None

    def keys(self, job: str, comm: str, name: str, units: list, step: int = -1) -> list[CandidateKey]:
        """The candidates' keys (candidate) for one measure of a collective; remembered per communicator,
        measure and place in the step while its candidates stay the same and every one's process is known (a
        process, once learnt, stays the same: the key cannot change)."""
        step = step if name in _PER_STEP else -1
        memo = self._key_memo.get((job, comm, name, step))
        if memo is not None and memo[0] == units:
            return memo[1]
        keys = [self.candidate(job, comm, name, u, step) for u in units]
        if name in _PER_COMMUNICATOR or all(self.process_of(comm, u) is not None for u in units):
            bounded_put(self._key_memo, (job, comm, name, step), (units, keys))
        return keys

    def candidate(self, job: str, comm: str, name: str, unit, step: int = -1) -> CandidateKey:
        """Where ``unit``'s evidence for measure ``name`` in ``comm`` is kept; ``step`` its collective's place in
        the training step (read for the measures kept per place only)."""
        if name in _PER_COMMUNICATOR:
            return CandidateKey(job, name, comm, unit, step if name in _PER_STEP else -1)
        proc = self.process_of(comm, unit)
        # a GPU is one rank: known by its global rank it is the same in every communicator; a process known
        # only by its pid may drive several GPUs, so its ranks stay apart (per communicator)
        return CandidateKey(job, name, proc if proc is not None and proc[1] == "g" else (comm, unit))

    def held(self, st: TraceState, ev: slowdown.Evidence,
             known: dict[str, list] | None = None) -> Iterator[tuple[str, object, Cusum]]:
        """(measure, unit, its evidence) of this collective's candidates that hold any; ``known``: per measure,
        their evidence already looked up (Evidence.held), valid while no candidate's was added or forgotten."""
        for name, (units, _) in ev.values.items():
            cs = known.get(name) if known is not None else None
            if cs is None:
                cs = map(self.cusums.get, self.keys(st.job, st.comm, name, units, step_of(st)))
            for u, c in zip(units, cs):
                if c is not None:
                    yield name, u, c

    def cusum(self, st: TraceState, measure: str, unit) -> Cusum | None:
        return self.cusums.get(self.candidate(st.job, st.comm, measure, unit, step_of(st)))

    def evidence(self, st: TraceState, measure: str, unit) -> float:
        """The candidate's evidence S (0 when it never read slow)."""
        c = self.cusum(st, measure, unit)
        return 0.0 if c is None else c.s

    def gathering(self, st: TraceState, measure: str, unit) -> Cusum | None:
        """The candidate's evidence when it is half way to an alarm (S >= h/2), else None."""
        c = self.cusum(st, measure, unit)
        return c if c is not None and c.s >= self.s.cusum.h / 2 else None

    def half_way(self, job: str, names: tuple[str, ...]) -> Iterator[CandidateKey]:
        """The keys of the job's candidates of these measures that are half way to an alarm (S >= h/2)."""
        half = self.s.cusum.h / 2
        return (k for k, c in self.cusums.items() if k.job == job and k.measure in names and c.s >= half)

    def accumulating(self, st: TraceState, names: tuple[str, ...]) -> bool:
        """Some candidate of these measures in this communicator is half way to an alarm."""
        mine = {self.candidate(st.job, st.comm, slowdown.GPU, r).place for r in st.op}
        return any(k.place in mine or k.place == st.comm for k in self.half_way(st.job, names))

    def crosses_hosts(self, comm: str, rank: int, peer: int) -> bool:
        """Whether a flow between two ranks of ``comm`` goes through their NICs: their hosts differ, or one is
        not known (then it may)."""
        a, b = self.process_of(comm, rank), self.process_of(comm, peer)
        return a is None or b is None or a[0] != b[0]

    def evidence_elsewhere(self, st: TraceState, rank: int, peer: int, into: bool) -> float:
        """The most evidence S that a flow of another communicator into (``into``) or out of the process of
        ``rank`` from or to another host holds, its other end not the process of ``peer``: a NIC's receive
        (send) side slows every flow it takes in (sends out), whatever the communicator, while a link to
        ``peer`` slows only theirs."""
        me, other = self.process_of(st.comm, rank), self.process_of(st.comm, peer)
        most = 0.0
        if me is None:
            return most
        for k, c in self.cusums.items():
            if k.job != st.job or k.measure != slowdown.FLOW or k.place == st.comm or c.s <= most:
                continue
            s, d, _ = k.unit
            end, far = (d, s) if into else (s, d)
            if self.process_of(k.place, end) == me and self.process_of(k.place, far) != other and \
                    self.crosses_hosts(k.place, s, d):
                most = c.s
        return most

    def link_gathers(self, st: TraceState) -> bool:
        """A flow of another communicator joined to this one is half way to an alarm."""
        here = self.root(("c", st.job, st.comm))
        return any(k.place != st.comm and self.root(("c", st.job, k.place)) == here
                   for k in self.half_way(st.job, (slowdown.FLOW,)))

    def root(self, node: tuple) -> tuple:
        up = self._joined.setdefault(node, node)
        while up != node:
            self._joined[node] = self._joined.setdefault(up, up)  # path halving
            node, up = up, self._joined[up]
        return node

    def link(self, st: TraceState) -> None:
        """Join this communicator with the processes of the ranks it reports (once per rank count seen)."""
        key = (st.job, st.comm)
        if self._linked.get(key, 0) >= len(st.op):
            return
        bounded_put(self._linked, key, len(st.op))
        a = self.root(("c",) + key)
        members = get_or_put(self._members, key, set)
        for r in st.op:
            proc = self.process_of(st.comm, r)
            b = self.root(("p", st.job, proc if proc is not None else (st.comm, r)))
            if a != b:
                self._joined[b] = a
            place = self.candidate(st.job, st.comm, slowdown.GPU, r).place
            members.add(place)
            get_or_put(self._comms_of, (st.job, place), set).add(st.comm)
        if len(self._joined) > MAX_KEYS:
            # bounded: forgetting only makes later consequences name, never hides one
            for table in (self._joined, self._linked, self._members, self._comms_of):
                table.clear()

    def held_in_shared(self, st: TraceState, rank: int, own_gpu: bool = True) -> bool:
        """A GPU, proxy thread or NIC in another communicator this rank is in (its own included; its own GPU
        unless ``own_gpu`` is False) is half way to an alarm: the rank's collective there ran long, and its
        kernels run in order on its stream. Or a link there, or one that holds back a peer it meets there (a
        slow pipeline transfer keeps its end late into their TP group, where this rank waits for it), or one
        of this communicator. Not a link of this communicator's peers' other rings: it holds that peer back,
        which is then late into this communicator, not this rank."""
        place = self.candidate(st.job, st.comm, slowdown.GPU, rank).place
        others = self._comms_of.get((st.job, place), set()) - {st.comm}
        near = {place}.union(*(self._members.get((st.job, c), ()) for c in others))
        comms = {st.comm} | others
        for c in others:
            for peer in self._members.get((st.job, c), ()):
                comms |= self._comms_of.get((st.job, peer), set()) - {c}
        for k in self.half_way(st.job, (slowdown.GPU, slowdown.PROXY, slowdown.FLOW, slowdown.NIC_SEND,
                                        slowdown.NIC_RECV)):
            if k.place in comms if k.measure == slowdown.FLOW else \
                    k.place in near and (own_gpu or k.place != place or k.measure != slowdown.GPU):
                return True
        return False

    def waited_in_shared(self, st: TraceState, rank: int) -> bool:
        """Another rank, late into a communicator this rank is in besides this one, is half way to an alarm:
        this rank waited there for it, so it enters its other communicators' collectives late by as much (a
        TP group's late rank makes its peers late into their DP rings)."""
        place = self.candidate(st.job, st.comm, slowdown.GPU, rank).place
        shared = self._comms_of.get((st.job, place), set()) - {st.comm}
        return any(k.place in shared and self.candidate(st.job, k.place, slowdown.GPU, k.unit).place != place
                   for k in self.half_way(st.job, (slowdown.LATE,)))

    def explained(self, st: TraceState) -> bool:
        """A slowdown named in a communicator joined to this one persists: its culprit (or a symptom whose
        alarm led to it) still reads slow (this collective's score beyond the mild test's drift) or keeps the
        strong test's evidence. A ring or tree is a pipeline, so one slow GPU, flow or NIC slows its
        neighbours' steps too (they wait for it, and the ones before it block on its credits), and a TP group
        passes the wait on to its ranks' other rings; alarms there while it persists are its consequences,
        not new faults. Every named one counts, not only the latest: a consequence named once must not hide
        the fault that still holds it back."""
        k = self.s.cusum.mild.k
        here = self.root(("c", st.job, st.comm))
        # a mild fault reads beyond the mild test's drift most collectives; the strong test's evidence, not the
        # mild one's, carries a strong fault over a quiet collective (the mild test drains at half the rate
        # and would outlive the fault by twice as many collectives, holding back a second fault's verdict)
        return any((c.strong > 0 or c.z > k) and self.root(("c", st.job, comm)) == here
                   for comm, c in self.named.get(st.job, ()))

    def note_waits(self, st: TraceState, m: slowdown.Measures | None) -> None:
        """Remember the processes that spent long in this collective or transfer (a quarter of the straggler
        bar: what can hold a rank back enough to matter there), and when."""
        if m is None:
            return
        for i in np.flatnonzero(m.duration >= self.s.straggler_ns // 4):
            ref = m.refs[i]
            proc = self.process_of(st.comm, ref.rank)
            if proc is not None:
                seen = get_or_put(self.waits, (st.job, proc), list)
                seen.append((st.comm, ref.start_ns, ref.end_ns))
                del seen[:-WAITS_KEPT]

    def held_back(self, st: TraceState, rank: int, since: int, until: int) -> bool:
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

    def first_straggler(self, st: TraceState, start: int, end: int) -> bool:
        """Whether this collective's wait for a straggler ([start, end], job time) is a new incident: not
        one that overlaps a straggler's wait already named in the job. A rank late into one collective holds
        back the next collective of each of its other communicators (its TP group's, its DP ring's), and each
        of the ranks held back there then enters its own next collectives late by as much: those waits are
        the first straggler's consequences. The job's communicators need not be known to be joined yet (a
        straggler in the first seconds arrives before the agents' cadence exports a DP ring's collectives),
        so the overlap in time is what ties them; the root's collective completes first."""
        seen = get_or_put(self.stragglers, st.job, list)
        if any(s0 <= end and start <= e0 for s0, e0 in seen):
            return False
        seen.append((start, end))
        del seen[:-NAMED_KEPT]
        return True
