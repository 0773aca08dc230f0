"""The sequential test on one collective's candidates: scores, nulls, CUSUMs, and the alarms they raise.

For every measure of a completed collective (slowdown.py: GPU wait per step, a flow's network wait per step, a
NIC's least-waiting flow, a proxy's credit wait, lateness), each candidate's score is the log-ratio of its value
to the collective's median (to the measure's recent healthy level when the trace holds fewer than 2
candidates, e.g. only the flagged rank's span). A collective-wide effect -- a loaded host, a bigger message, a
slow step of the model -- moves every candidate alike and cancels; a fault moves one. The scores, less each
candidate's role (its own healthy offset from its peers where it stands clear of its sampling error: a tree's
inner ranks), are standardized by the measure's learned null (sequential.RobustNull, per job, communicator,
function and size; its other sizes' or its siblings' until it has its own; lateness a prior) and accumulated
per candidate by CUSUMs (sequential.Cusum: one tuned for a shift of 2 null scales, and on the network measures
a mild one tuned for 1). A candidate whose evidence reaches h raises an :class:`Alarm`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import compress, repeat
from operator import is_not

import numpy as np

from mycroft_otel.processor import slowdown
from mycroft_otel.processor.keys import NullKey, kind_of, step_of
from mycroft_otel.processor.memory import JobMemory, bounded_put, get_or_put
from mycroft_otel.processor.recovered import stall_window
from mycroft_otel.processor.views import Finding
from mycroft_otel.processor.sequential import Cusum, OwnSpreads, RobustNull, median
from mycroft_otel.processor.settings import Settings
from mycroft_otel.processor.state import TraceState

# measures that run the mild test too: a flow's or a NIC's network busy time is the link's own, which a fault
# elsewhere does not move; a GPU's received data and a rank's start wait for the pipeline's back-pressure (a
# kernel blocked on a send FIFO slot behind any slower hop), so a mild fault anywhere shifts them a little
# at its neighbours, and only the strong test judges them
MILD = (slowdown.FLOW, slowdown.NIC_SEND, slowdown.NIC_RECV)
# measures that are 0 on most healthy collectives: a proxy's ready data waits for its post only when its thread
# was busy or descheduled at that moment, which on a healthy host happens to some ranks now and then. The MAD
# of such a null is 0 (the floor's min_scale) and any healthy wait would read as a shift of 100 scales, a full
# CUSUM step; a wait as common as healthy runs show it must read as healthy (sequential.RobustNull.normal_scores).
# A slow proxy thread shows on the collectives where its stall fell on a step its ranks had ready, not on the
# others, so these are judged by how often they read far out too (sequential.HitDesign) instead of the mild test
BY_RANK = (slowdown.PROXY,)


@dataclass(slots=True)
class Alarm:
    measure: str
    unit: object      # a rank, or (sender, receiver, channel)
    cusum: Cusum
    z: float          # this collective's standardized score
    via: tuple[Cusum, ...] = ()  # the symptoms whose alarm led here (a held-back GPU): the same incident
    step: int = -1    # the place of the training step its evidence is kept at (CandidateKey.step; -1: all)

    def led_to(self, measure: str, unit, cusum: Cusum, z: float | None = None) -> "Alarm":
        """The candidate this alarm's evidence points at, carrying this one as its symptom."""
        return Alarm(measure, unit, cusum, self.z if z is None else z, (self.cusum,) + self.via)


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


class CandidateTest:
    """Judges a collective's candidates in the job's order (the tests are sequential)."""

    def __init__(self, settings: Settings, memory: JobMemory):
        self.s, self.mem = settings, memory
        d = settings.cusum
        # a candidate teaches the null until its evidence reaches h/2: at a fault's fastest, one step of cap - k
        # a collective, its first ceil(h/2 / (cap - k)) slow scores can be in the null (3)
        self.taught = math.ceil(d.h / 2 / (d.cap - d.k))

    def update(self, st: TraceState, ev: slowdown.Evidence, at: float) -> tuple[list[Alarm], bool]:
        """The candidates that alarm, and whether the test judged every measure (each had a null to judge by)."""
        job, comm = st.job, st.comm
        func, bucket = kind_of(st)
        when = min((r.start_ns for r in st.op.values()), default=0)
        alarms: list[Alarm] = []
        tested = True
        for name, (units, values) in ev.values.items():
            own, sizes = NullKey(job, comm, func, bucket, name), NullKey(job, comm, func, "*", name)
            if name == slowdown.LATE:
                # lateness is a share of the makespan, which is short on NVLink: only its own communicator
                # says what is healthy, at its place in the training step (each place has its own arrival
                # skew: the first call after the optimizer is not one inside the backward pass) once it has
                # seen 8 collectives there, until then at its size, then at all its sizes (a job alternating
                # two message sizes would judge the rarer one late)
                step = step_of(st)
                levels = (own,)
                nulls = (own, sizes) if step < 0 else (NullKey(job, comm, func, (bucket, step), name), own, sizes)
            else:
                # Until a communicator has a history of its own at this size, it borrows: its null from its
                # other sizes (a score is a log-ratio, which the size scales away; a job alternating two
                # message sizes learns the rarer one late), then both null and level from its siblings, the
                # job's communicators of its size moving the same function and size (a PP job's stage pairs,
                # a TP x DP job's DP rings). A stage pair that transfers once per micro-batch, or a ring the
                # agents rarely export, would otherwise learn a fault that starts early as its healthy level.
                siblings = NullKey(job, ("*", st.nranks), func, bucket, name)
                levels, nulls = (own, siblings), (own, sizes, siblings)
            got = self._scores(levels, name, values, func == "p2p")
            if got is None:
                for key in levels:
                    self.mem.null(self.mem.levels, key).add(np.log(values + self.s.step_floor_ns))
                tested = False
                continue
            found, judged = self._test(levels, nulls, name, units, values, got, when, at, st, ev)
            alarms += found
            tested &= judged
        return alarms, tested

    def _scores(self, keys: tuple[NullKey, ...], name: str, values: np.ndarray,
                p2p: bool) -> tuple[np.ndarray, str] | None:
        """(the candidates' scores, mode): log-ratios to the collective's median of all its
        candidates ("x"), or to the measure's recent healthy level ("h") when the trace holds fewer than 3
        candidates or is one p2p transfer (a slow transfer slows all its channels alike: it is compared with
        the communicator's other transfers, or its siblings' while it has had too few); None when there is
        nothing to compare to yet. Two candidates' median is their midpoint: each would score half their
        difference, the slow one and the fast one alike, and the fault would be learnt as the pair's roles
        before its evidence gathered (a DP ring of two ranks, TP x DP on two nodes)."""
        if name == slowdown.LATE:
            return values, "x"
        lv = np.log(values + self.s.step_floor_ns)
        if len(values) >= 3 and not p2p:
            ref, mode = median(lv), "x"
        else:
            level = self.mem.ready(self.mem.levels, keys)
            if level is None:
                return None
            ref, mode = level.location_scale()[0], "h"
        return lv - ref, mode

    def _test(self, levels: tuple[NullKey, ...], nulls: tuple[NullKey, ...], name: str, units: list,
              values: np.ndarray, got: tuple[np.ndarray, str], when: int, at: float, st: TraceState,
              ev: slowdown.Evidence) -> tuple[list[Alarm], bool]:
        """One group of candidates through the test: their CUSUMs updated, the null and level taught with
        the healthy ones; the candidates that alarm, and whether there was a null to judge them by."""
        x, mode = got
        alarms: list[Alarm] = []
        nulls = tuple(NullKey(*key[:5], mode) for key in nulls)  # (not _replace: this runs per measure)
        ready = self.mem.ready(self.mem.nulls, nulls, self.s.null_min_collectives)
        healthy = np.ones(len(units), dtype=bool)
        # a candidate noisier than the others (a flow on a longer route, a GPU that shares its host) is
        # standardized by its own spread, never by a narrower one: that only lengthens the run to a false alarm
        own = get_or_put(self.mem.own, nulls[0], lambda: OwnSpreads(self.s.own_size, self.s.own_min_values))
        rows = own.rows(units)
        own_med, own_scale, own_n = own.stats(rows)
        prior = (0.0, self.s.late_prior_scale) if name == slowdown.LATE else None
        role = None  # 0 for every candidate until one holds its own healthy median
        if ready is not None or prior is not None:
            loc, scale = judged_by(ready, self.mem.nulls.get(nulls[0])) if ready is not None else prior
            spread = np.maximum(scale, own_scale)
            # A candidate's role can place it off the collective's median for good: a tree's root and inner
            # ranks reduce what their children send while its leaves only receive the broadcast, a flow over
            # NVLink waits less per step than one over the network. Its own healthy median says so; the part
            # of its offset that stands clear of that median's sampling error (3 standard errors, sqrt(pi/2)
            # x spread / sqrt(n)) is its role, and the test judges what it adds beyond. An offset within the
            # error stays 0, so peers alike are still judged against each other, not each against its own
            # past (a fault present from a candidate's first collectives is learned only when it is large
            # enough to stand out and too mild for the test to name before its history fills).
            if own_n.any():
                dev = own_med - loc
                err = 3.0 * 1.2533 * spread / np.sqrt(np.maximum(own_n, 1))
                role = np.where(own_n > 0, np.sign(dev) * np.maximum(0.0, np.abs(dev) - err), 0.0)
            z = ((x - loc) if role is None else (x - loc - role)) / spread
            if name in BY_RANK and ready is not None:
                # never further out than its place among the healthy scores says (a point-mass null's MAD is 0),
                # where that place is known: not in the null's top few, which a fault's first collectives may
                # have taught before their evidence gathered half way (self.taught)
                z = np.minimum(z, ready.normal_scores(x if role is None else x - role, self.taught))
            ev.z[name] = z
            # the hit test reads a hit as rare as its null's size lets it be (none before a null is ready)
            p0 = self.s.cusum.hits.p0(len(ready), self.taught) if name in BY_RANK and ready is not None else 0.0
            alarms = self._accumulate(st, name, units, x, z, when, at, healthy, ev, p0)
        if not healthy.all():  # (most collectives teach with every candidate)
            rows, x, values = rows[healthy], x[healthy], values[healthy]
            role = None if role is None else role[healthy]
        own.add(rows, x)
        taught = x if role is None else x - role
        for key in nulls:
            self.mem.null(self.mem.nulls, key).add(taught)
        if name != slowdown.LATE:
            level = np.log(values + self.s.step_floor_ns)
            for key in levels:
                self.mem.null(self.mem.levels, key).add(level)
        return alarms, ready is not None or prior is not None

    def _accumulate(self, st: TraceState, name: str, units: list, x: np.ndarray, z: np.ndarray, when: int,
                    at: float, healthy: np.ndarray, ev: slowdown.Evidence, p0: float) -> list[Alarm]:
        """The candidates' CUSUMs updated with this collective's scores (``p0``: the hit test's healthy rate,
        0 where the measure runs none); ``healthy`` cleared where a candidate
        gathers evidence (it does not teach the null what healthy looks like), and their evidence left in
        ``ev.held``; the ones that alarm."""
        d = self.s.cusum
        alarms: list[Alarm] = []
        keys = self.mem.keys(st.job, st.comm, name, units, step_of(st))
        held = list(map(self.mem.cusums.get, keys))
        # a candidate with no evidence for either test and none held costs nothing
        moved = np.flatnonzero(z > (d.mild.k if name in MILD else d.k)).tolist()
        holding = list(compress(range(len(held)), map(is_not, held, repeat(None))))
        for i in (sorted(set(holding).union(moved)) if holding else moved):
            c = held[i]
            if c is None:
                c = held[i] = Cusum()
                bounded_put(self.mem.cusums, keys[i], c)
            elif when < c.last_when_ns:
                # late news: a collective older than the candidate's latest evidence (flagged ones arrive at
                # once, sampled ones of before the fault later); the test runs in the job's order, so it only
                # teaches the null
                healthy[i] = c.s < d.h / 2
                continue
            elif at - c.updated_at > self.s.evidence_ttl_s:
                c.reset()  # evidence from long ago says nothing about consecutive collectives
            s = c.update(float(z[i]), d, when, at, mild=name in MILD, p0=p0)
            c.x = float(x[i])
            healthy[i] = s < d.h / 2
            if s >= d.h:
                alarms.append(Alarm(name, units[i], c, float(z[i]), step=keys[i].step))
        ev.held[name] = held
        return alarms

    def recovered(self, st: TraceState, f: Finding, at: float) -> Alarm | None:
        """A stall that recovered, naming a slow proxy, GPU or flow: one capped score for its candidate,
        once per distinct stall."""
        name = slowdown.MEASURE_OF.get(f.category)
        if name is None or not f.ranks:
            return None
        unit = (f.ranks[0], f.peer, f.channel) if name == slowdown.FLOW and f.peer is not None else f.ranks[0]
        if name == slowdown.FLOW and not isinstance(unit, tuple):
            name = slowdown.NIC_SEND
        key = self.mem.candidate(st.job, st.comm, name, unit, step_of(st))
        c = get_or_put(self.mem.cusums, key, Cusum)
        start, end = stall_window(st)
        if start < c.last_stall_end_ns:
            return None  # the same descheduling, seen in another collective in flight with this one
        c.last_stall_end_ns = end
        s = c.update(self.s.cusum.cap, self.s.cusum, start, at, mild=name in MILD,
                     p0=self.s.cusum.hits.floor if name in BY_RANK else 0.0)
        return Alarm(name, unit, c, self.s.cusum.cap, step=key.step) if s >= self.s.cusum.h else None
