"""The slowdown detector: what one completed collective decides (processor/outcome.py).

Stages, each in its own module: ``memory`` (what is kept per job), ``candidates`` (the sequential test on
the collective's candidates), ``slower`` (did the communicator get slower), ``naming`` (which alarm names the
culprit). Two findings bypass the test: a straggler that everybody waited >= 1 s for (slowdown.straggler) and a
stall that recovered naming a rank that had not started (a late rank too), unless that rank spent its lateness
in another communicator's collective (held back there, not late); any other recovered stall adds one capped
score to its candidate, once per distinct stall (collectives in flight together stall together when one
process is descheduled once). Every return is a :class:`~mycroft_otel.processor.outcome.Decision`: a verdict,
or the reason for silence.
"""

from __future__ import annotations

from typing import Callable, Iterable

from mycroft_otel import semconv as sc
from mycroft_otel.processor import mismatch, slowdown
from mycroft_otel.processor.candidates import CandidateTest
from mycroft_otel.processor.memory import MAX_KEYS, JobMemory
from mycroft_otel.processor.naming import Naming, label
from mycroft_otel.processor.outcome import NO_CANDIDATE, Decision, Outcome, silent
from mycroft_otel.processor.recovered import recovered_stall, stall_window
from mycroft_otel.processor.views import Finding, build_views, decorate
from mycroft_otel.processor.settings import Settings
from mycroft_otel.processor.slower import SlowerCheck
from mycroft_otel.processor.state import TraceState


class SlowdownDetector:
    """Judges completed collectives one at a time, in completion order (the tests are sequential)."""

    def __init__(self, settings: Settings, process_of: Callable[[str, int], tuple | None] = lambda c, r: None,
                 waiting: Callable[[tuple], list[tuple]] = lambda proc: [],
                 earlier: Callable[[TraceState], Iterable[TraceState]] = lambda st: ()):
        """``process_of(comm, rank)``: the rank's process, (host, "g", global rank) or (host, "p", pid), None when
        unknown; ``waiting(process)``: (comm, start, last seen) of the collectives it is still seen in flight in;
        ``earlier(st)``: the communicator's collectives before this one still held (a mismatch's usual call)."""
        self.s = settings
        self.earlier = earlier
        self.mem = JobMemory(settings, process_of, waiting)
        self.test = CandidateTest(settings, self.mem)
        self.slower = SlowerCheck(settings, self.mem)
        self.naming = Naming(settings, self.mem)

    def judge(self, st: TraceState, m: slowdown.Measures | None, at: float) -> Decision:
        """What this collective decides (outcome.Outcome): a mismatch, a straggler, a candidate whose
        evidence crossed h and slowed the communicator, or the reason for silence. ``at``: the processor's
        monotonic clock (seconds)."""
        if m is None:
            m = slowdown.measure([st])[0] if st.op else None
        before = lambda: self.earlier(st)  # noqa: E731  (asked only when a mismatch is one against one)
        mm = slowdown.check_mismatch(st, m, before) if m is not None else mismatch.check_mismatch(st, before)
        if mm is not None:
            if m is None:
                decorate(st, build_views(st), mm)
            mm.hypothesis = mm.hypothesis or f"{mm.category} rank {mm.ranks[0]}"
            return Decision(Outcome.MISMATCH, mm)
        if 0 <= st.seq < self.s.warmup_seq:
            return silent(Outcome.WARMUP, f"collective {st.seq} < {self.s.warmup_seq}")
        self.mem.trim()
        self.mem.link(st)
        self.mem.note_waits(st, m)
        recovered = recovered_stall(st)
        if recovered is not None and recovered.category == sc.CAT_LATE_RANK:
            start, end = stall_window(st)
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
                decorate(st, build_views(st), f)
            return d
        return self._sequential(st, m, ev, recovered, at)

    def _straggler(self, st: TraceState, f: Finding, start: int, arrived: int, end: int) -> Decision:
        """A straggler everybody waited for ([start, end], the late rank there at ``arrived``): named unless
        the rank was held back elsewhere or the wait is a straggler's already named."""
        if self.mem.held_back(st, f.ranks[0], start, arrived):
            return silent(Outcome.HELD_BACK, f"rank {f.ranks[0]} waited in another communicator")
        if not self.mem.first_straggler(st, start, end):
            return silent(Outcome.SAME_STRAGGLER, f"rank {f.ranks[0]}'s wait overlaps a straggler named")
        f.hypothesis = label(slowdown.LATE, f.ranks[0])
        return Decision(Outcome.STRAGGLER, f)

    def _sequential(self, st: TraceState, m: slowdown.Measures, ev: slowdown.Evidence, recovered: Finding | None,
                    at: float) -> Decision:
        """The sequential test on this collective's candidates, then naming the alarm that explains them."""
        alarms, tested = self.test.update(st, ev, at)
        history = self.slower.note_duration(st, m, tested, not alarms and not self.mem.explained(st))
        if recovered is not None:
            alarm = self.test.recovered(st, recovered, at)
            if alarm is not None:
                alarms.append(alarm)
        if not alarms:
            return silent(Outcome.BELOW_BAR, self._closest(st, ev, recovered is None))
        if self.mem.explained(st):
            for a in alarms:
                a.cusum.reset()  # consequences (or the named fault itself, which its incident holds): spent
            return silent(Outcome.EXPLAINED, f"{label(alarms[0].measure, alarms[0].unit)} alarms while a slowdown "
                                             f"named in a joined communicator holds")
        # the evidence stands, but nothing is slower for it (yet: judged again next collective)
        if recovered is None and not self.slower.is_slower(st, ev, history, alarms):
            return silent(Outcome.NOT_SLOWER, f"{label(alarms[0].measure, alarms[0].unit)} alarms; the "
                                              f"communicator's kernels are not slower than before")
        d = self.naming.name(st, m, ev, alarms, recovered)
        if d.finding is not None:
            decorate(st, build_views(st), d.finding)
        return d

    def _closest(self, st: TraceState, ev: slowdown.Evidence, as_tested: bool) -> str:
        """The candidate of this collective nearest to the bar, for a silence's reason; ``as_tested``: the
        candidates' evidence is as the test left it (no stall that recovered added one since)."""
        # below the table's bound nothing was forgotten to make room since the test looked them up
        known = ev.held if as_tested and len(self.mem.cusums) < MAX_KEYS else None
        name, unit, c = None, None, None
        for held in self.mem.held(st, ev, known):  # the first of the most evidence (as max would)
            if c is None or held[2].s > c.s:
                name, unit, c = held
        if c is None or c.s <= 0:
            return NO_CANDIDATE
        return f"closest: {label(name, unit)} at {c.s:.1f} of {self.s.cusum.h:g}"
