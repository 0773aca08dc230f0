"""The sequential change test behind every slowdown verdict: a learned null per measure, CUSUM per candidate.

A *measure* is one kind of per-collective evidence (a rank's GPU wait per step, a flow's network wait per
step, ...) kept apart per (job, communicator, function, size bucket): per-step waits grow with NCCL's chunk
size, so a communicator's 4 MiB and 64 MiB all-reduces have different healthy spreads. Each collective gives
every *candidate* (a rank, a flow) a score x, the log-ratio of its value to the collective's typical one.

- :class:`RobustNull` learns what x looks like in this job: median and MAD of the recent healthy scores.
  A quiet H200 ring gets a narrow null, a loaded 2-core CI host a wide one; nothing is tuned per machine.
- :class:`Cusum` accumulates z = (x - median) / scale, winsorized to ±``cap``, less the reference drift
  ``k``: S = max(0, S + min(max(z, -cap), cap) - k). A candidate alarms at S >= ``h``. Winsorizing bounds
  what one collective can add (cap - k), so one GC pause or one descheduled proxy thread never alarms alone.
  Every candidate runs two such tests on the same scores (:class:`SequentialDesign`): a CUSUM is fastest
  for the shift twice its drift, so one tuned for 2 scales (a link at half speed) and one for 1 scale
  (a 1.25x slower collective moves its culprit's score about one scale) with a higher bar; it alarms when
  either does. A measure read by its place among healthy values (a proxy's wait) runs a Bernoulli CUSUM on
  how often it reads far out (:class:`HitDesign`) instead of the mild one.

The constants come from a false-alarm budget, not from a test run: :func:`arl` computes the average run
length of the test (Brook & Evans' Markov chain) for a null distribution and a shift, and
``tests/processor/test_detector.py`` holds the chosen design to ARL0 >= 10^6 collectives per candidate
under a Laplace-tailed null (heavier than Gaussian; healthy NCCL waits are heavy-tailed) -- docs/algorithm.md.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np


@dataclass(frozen=True, slots=True)
class CusumDesign:
    """One-sided CUSUM on winsorized standardized scores."""

    k: float = 1.0    # reference drift, half the shift (in null scales) the test is tuned for: 2 scales
    h: float = 6.0    # alarm threshold: ARL0 5e7 (Gaussian null) / 1.1e6 (Laplace) collectives per candidate
    cap: float = 2.0  # winsorizing bound: one collective adds at most cap - k = 1, so >= 6 collectives alarm

    def __post_init__(self) -> None:
        if not (0 < self.k < self.cap and self.h > self.cap - self.k):
            raise ValueError(f"CUSUM needs 0 < k < cap and h > cap - k (one collective never alarms): {self}")


@dataclass(frozen=True, slots=True)
class HitDesign:
    """A Bernoulli CUSUM on how often a score reaches ``at`` null scales: each such collective (a hit) adds
    log(p1 / p0), each other takes log((1 - p0) / (1 - p1)) away. For a measure whose fault shows on some
    collectives only (a proxy thread descheduled at one moment of a transfer: its ready data waits on the
    collectives where that moment fell on a step, not on the others), the winsorized tests cannot gather: a
    hit adds cap - k, a quiet collective takes k again. ``p0`` is the hit rate of a healthy score read by its
    place among the n healthy values of its null (RobustNull.normal_scores): 1 - Phi(at) where the null is
    large, but a value above all but its top ``tail`` reads as far out as its size says, which a healthy one
    is with probability (tail + 1) / (n + 1) (exchangeable values): a small null's hit says less."""

    at: float = 2.0    # a hit: a score this far out or further
    p1: float = 0.3    # the hit rate it is tuned for: three collectives in ten
    h: float = 14.0    # ARL0 1.2e7 collectives per candidate (large null); a hit every other collective alarms in ~13

    def __post_init__(self) -> None:
        if not (self.floor < self.p1 < 1 and self.h > self.steps(self.floor)[0]):
            raise ValueError(f"a hit test needs p0 < p1 < 1 and h above one hit's step (one never alarms): {self}")

    @property
    def floor(self) -> float:
        """The healthy hit rate on a large null."""
        return 1.0 - NormalDist().cdf(self.at)

    def p0(self, n: int, tail: int) -> float:
        """The healthy hit rate on a null of ``n`` values whose top ``tail`` read as far out as its size says."""
        return max(self.floor, (tail + 1) / (n + 1))

    def steps(self, p0: float) -> tuple[float, float]:
        """(what a hit adds, what another collective takes away) at healthy hit rate ``p0``; none at all
        where p0 is no lower than the rate the test is tuned for (a null too small to tell)."""
        if p0 >= self.p1:
            return 0.0, 0.0
        return math.log(self.p1 / p0), math.log((1.0 - p0) / (1.0 - self.p1))


@dataclass(frozen=True, slots=True)
class SequentialDesign:
    """The tests every candidate runs on its scores: ``strong`` for shifts of >= 2 scales (fast: >= 6
    collectives), ``mild`` for shifts of about one scale (k = 0.5; a higher h for the same false-alarm budget).
    A candidate's evidence is read in ``strong``'s units (:attr:`Cusum.s`): the further of the two tests on
    the way to its own h, so S >= h/2 ("gathering") and S >= h (alarm) mean the same for both."""

    strong: CusumDesign = CusumDesign()
    mild: CusumDesign = CusumDesign(k=0.5, h=12.0, cap=1.5)  # ARL0 2.2e7 (Laplace); ARL1 39 at 1 scale
    hits: HitDesign = HitDesign()  # instead of ``mild`` on measures read by their place (candidates.BY_RANK)

    @property
    def k(self) -> float:  # a score beyond this reads slow to the strong test
        return self.strong.k

    @property
    def h(self) -> float:
        return self.strong.h

    @property
    def cap(self) -> float:
        return self.strong.cap

    def arl0_bound(self, null: str = "laplace") -> float:
        """A lower bound on the average run length to a false alarm of the pair a candidate runs (strong with
        mild, or strong with hits): P(either alarms by n) <= P(strong by n) + P(the other by n), so the pair's
        alarm rate is at most the sum of the two rates."""
        other = min(arl(self.mild, null=null), arl_hits(self.hits, self.hits.floor))
        return 1.0 / (1.0 / arl(self.strong, null=null) + 1.0 / other)


def arl(design: CusumDesign, shift: float = 0.0, null: str = "normal", cells: int = 300) -> float:
    """Average number of collectives until the test alarms, starting from S = 0, when every score is
    ``null`` noise (unit robust scale: MAD x 1.4826 = 1) plus ``shift`` scales. ``null``: "normal" or
    "laplace" (same median and MAD, exponential tails)."""
    k, h, cap = design.k, design.h, design.cap
    if null == "normal":
        erf = np.vectorize(math.erf)

        def cdf(x):
            return 0.5 * (1.0 + erf(np.asarray(x) / math.sqrt(2.0)))
    elif null == "laplace":
        b = 1.0 / (1.4826 * math.log(2.0))  # the Laplace scale whose MAD x 1.4826 is 1

        def cdf(x):
            x = np.asarray(x, dtype=np.float64)
            return np.where(x < 0, 0.5 * np.exp(np.minimum(x, 0) / b), 1.0 - 0.5 * np.exp(-np.maximum(x, 0) / b))
    else:
        raise ValueError(f"unknown null distribution {null!r}")
    w = h / cells
    edges = np.arange(cells + 1) * w

    def step_cdf(y):  # P(clip(X + shift, -cap, cap) - k <= y)
        z = np.asarray(y, dtype=np.float64) + k
        p = cdf(z - shift)
        return np.where(z >= cap, 1.0, np.where(z < -cap, 0.0, p))

    p = np.empty((cells, cells))
    for i in range(cells):
        c = (i + 0.5) * w
        f = step_cdf(edges - c)
        p[i, 0] = f[1]              # back to (or near) zero
        p[i, 1:] = f[2:] - f[1:-1]  # what is left leaves through h: the alarm
    n = np.linalg.solve(np.eye(cells) - p, np.ones(cells))
    return float(n[0])


def arl_hits(design: HitDesign, rate: float, p0: float | None = None, cells: int = 2000) -> float:
    """Average number of collectives until the hit test alarms, starting from S = 0, when each collective is
    a hit with probability ``rate`` independently and the test reads its hits at healthy rate ``p0`` (the
    design's floor: a large null), by the Markov chain of S on a grid of ``cells``."""
    up, down = design.steps(design.floor if p0 is None else p0)
    if up == 0.0:
        return math.inf
    w = design.h / cells
    p = np.zeros((cells, cells))
    for i in range(cells):
        s = i * w
        if s + up < design.h:
            p[i, int((s + up) / w)] += rate
        p[i, int(max(0.0, s - down) / w)] += 1.0 - rate
    return float(np.linalg.solve(np.eye(cells) - p, np.ones(cells))[0])


@functools.lru_cache(maxsize=1024)
def _normal_scores(n: int) -> np.ndarray:
    """The standard normal quantile of k / (2 (n + 1)) for k = 0 .. 2n + 2, indexed by k: a value with ``below``
    of n values under it and ``upto`` at most it sits at k = below + upto + 1, in (0, 1) however far out. One
    table per null size a null passes through while it fills (n <= Settings.null_size: a few MB at most); a
    full null is one table."""
    std = NormalDist()
    return np.array([math.nan] + [std.inv_cdf(k / (2.0 * (n + 1))) for k in range(1, 2 * n + 2)] + [math.nan])


#: a normal distribution's standard deviation per unit of its median absolute deviation (1 / Phi^-1(3/4)):
#: a MAD times this is the robust spread every null and candidate is scaled by
MAD_TO_SD = 1.4826


def median(values: np.ndarray) -> float:
    """The median of a 1-d array by partition (np.median's own checks cost more than the work on the few
    hundred values a null or a collective holds)."""
    n = len(values)
    k = n // 2
    p = np.array(values)  # a copy, partitioned in place (np.partition's wrapper costs as much on a few hundred)
    if n % 2:
        p.partition(k)
        return float(p[k])
    p.partition((k - 1, k))
    return (float(p[k - 1]) + float(p[k])) / 2


class RobustNull:
    """The recent healthy scores of one measure (a ring of ``size``): median and scaled MAD."""

    __slots__ = ("_buf", "_n", "_at", "collectives", "min_scale", "_cache", "_sorted")

    def __init__(self, size: int = 512, min_scale: float = 0.05):
        self._buf = np.empty(size, dtype=np.float64)
        self._n = 0
        self._at = 0
        self.collectives = 0
        self.min_scale = min_scale  # log units: a noiseless measure still needs a 5% change per scale
        self._cache: tuple[float, float] | None = None
        self._sorted: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        """Bytes of its buffer (JobMemory's budget)."""
        return self._buf.nbytes

    def __len__(self) -> int:
        return self._n

    def add(self, values: np.ndarray) -> None:
        size = len(self._buf)
        values = np.asarray(values, dtype=np.float64)
        k = len(values)
        if k == 0:
            return
        if k > size:
            values, k = values[-size:], size
        at = self._at
        if at + k <= size:  # (most adds: no wrap around the ring's end)
            self._buf[at:at + k] = values
        else:
            first = size - at
            self._buf[at:] = values[:first]
            self._buf[:k - first] = values[first:]
        self._at = (at + k) % size
        self._n = min(size, self._n + k)
        self.collectives += 1
        self._cache = None
        self._sorted = None

    def location_scale(self) -> tuple[float, float]:
        if self._cache is None:
            v = self._buf[:self._n]
            med = median(v)
            mad = median(np.abs(v - med))
            self._cache = (med, max(MAD_TO_SD * mad, self.min_scale))
        return self._cache

    def normal_scores(self, x: np.ndarray, tail: int = 0) -> np.ndarray:
        """Each of ``x`` as the standard normal score of its place among the recent healthy scores (mid-rank:
        a value tied with k of them sits in the middle of the k). For a measure whose healthy value is one
        number most of the time (a proxy's credit wait: 0 on most steps), the MAD is 0 and every healthy
        exception reads as a shift of many scales; its place among the healthy values reads it as often as
        healthy runs show it, and the CUSUM's false-alarm budget (computed on a continuous null) holds again.
        A value with ``tail`` or fewer of the null above it reads +inf: there the place is the top of the
        tail, estimated from a handful of values, which may be the candidate's own first slow collectives
        (taught before its evidence gathered)."""
        if self._sorted is None:
            self._sorted = np.sort(self._buf[:self._n])
        upto = np.searchsorted(self._sorted, x, side="right")
        z = _normal_scores(self._n)[np.searchsorted(self._sorted, x, side="left") + upto + 1]
        return np.where(self._n - upto > tail, z, np.inf)


@dataclass(slots=True)
class Cusum:
    """One candidate's accumulated evidence (the tests of a :class:`SequentialDesign` it runs)."""

    s: float = 0.0            # the evidence in the strong test's units: the furthest test's S x h_strong / its h
    strong: float = 0.0       # the strong test's S
    mild: float = 0.0         # the mild test's S
    hits: float = 0.0         # the hit test's S
    updated_at: float = 0.0   # processor monotonic seconds
    onset_ns: int = 0         # when the current run of evidence started (first collective with S > 0)
    collectives: int = 0      # collectives in the current run
    strong_run: int = 0       # collectives since the strong test's own S last left 0 (the others' may hold S up)
    last_stall_end_ns: int = 0  # the latest recovered stall counted (a stall counts once however many it held)
    last_when_ns: int = 0     # start of the latest collective counted: the test runs in the job's order
    z: float = 0.0            # the latest collective's standardized score (before winsorizing)
    x: float = 0.0            # ... and its raw score (log-ratio to the collective's median): candidates of one
                              # collective compare on it, each z having its own scale

    def update(self, z: float, design: SequentialDesign, when_ns: int, at: float, mild: bool = True,
               p0: float = 0.0) -> float:
        """The strong test on this collective's score, and the mild one (``mild``) or, where ``p0`` (the
        healthy hit rate of this score's null, HitDesign.p0) is given, the hit test."""
        self.z = z
        self.last_when_ns = max(self.last_when_ns, when_ns)
        before = self.s
        st, mi, hi = design.strong, design.mild, design.hits
        self.strong = max(0.0, self.strong + min(max(z, -st.cap), st.cap) - st.k)
        if mild:
            self.mild = max(0.0, self.mild + min(max(z, -mi.cap), mi.cap) - mi.k)
        if p0:
            up, down = hi.steps(p0)
            self.hits = max(0.0, self.hits + (up if z >= hi.at else -down))
        self.s = max(self.strong, self.mild * st.h / mi.h, self.hits * st.h / hi.h)
        self.strong_run = self.strong_run + 1 if self.strong > 0.0 else 0
        self.updated_at = at
        if self.s == 0.0:
            self.collectives, self.onset_ns = 0, 0
        else:
            if before == 0.0:
                self.onset_ns = when_ns
            self.collectives += 1
        return self.s

    def reset(self) -> None:
        self.s, self.strong, self.mild, self.hits, self.collectives, self.onset_ns = 0.0, 0.0, 0.0, 0.0, 0, 0
        self.strong_run = 0


def _row_medians(v: np.ndarray, held: np.ndarray) -> np.ndarray:
    """Per row of ``v``, the median of its ``held`` values that are not NaN (the slots a ring buffer has not
    filled yet). np.nanmedian does the same through masked arrays, at a hundred times the cost on the small
    rows a collective's candidates make; sorting puts the NaNs last, so the median sits at fixed indices."""
    s = np.sort(v, axis=1)
    at = np.arange(len(v))
    return (s[at, (held - 1) // 2] + s[at, held // 2]) / 2


def _row_median_mad(v: np.ndarray, held: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``v`` (as _row_medians, its ``held`` values first), the median and the median absolute
    deviation from it. Rows that hold as many values each (a measure's candidates are taught together) are
    sorted without their empty slots, and no index per row is gathered."""
    n = int(held[0]) if len(held) else 0
    if not n or not (held == n).all():
        m = _row_medians(v, held)
        return m, _row_medians(np.abs(v - m[:, None]), held)
    lo, hi = (n - 1) // 2, n // 2
    s = np.sort(v[:, :n], axis=1)
    m = (s[:, lo] + s[:, hi]) / 2
    d = np.sort(np.abs(s - m[:, None]), axis=1)
    return m, (d[:, lo] + d[:, hi]) / 2


class OwnSpreads:
    """Each candidate's own recent healthy scores of one measure, one row of a ring buffer per
    candidate (numpy, so a collective's candidates are read and taught at once): its own median and spread
    (MAD x 1.4826) once it holds ``min_values`` scores."""

    __slots__ = ("size", "min_values", "_row", "_buf", "_n", "_at", "_last")

    def __init__(self, size: int, min_values: int):
        self.size, self.min_values = size, min_values
        self._row: dict = {}
        self._buf = np.full((0, size), np.nan)
        self._n = np.zeros(0, dtype=np.int64)
        self._at = np.zeros(0, dtype=np.int64)
        self._last: tuple[list, np.ndarray] = ([], np.zeros(0, dtype=np.int64))  # a measure's candidates repeat

    @property
    def nbytes(self) -> int:
        """Bytes of its buffers and row index (JobMemory's budget)."""
        return self._buf.nbytes + self._n.nbytes + self._at.nbytes + 100 * len(self._row)

    def rows(self, units: list) -> np.ndarray:
        if units == self._last[0]:
            return self._last[1]
        out = np.empty(len(units), dtype=np.int64)
        for i, u in enumerate(units):
            r = self._row.get(u)
            if r is None:
                r = self._row[u] = len(self._row)
            out[i] = r
        grow = len(self._row) - len(self._n)
        if grow > 0:
            self._buf = np.vstack((self._buf, np.full((grow, self.size), np.nan)))
            self._n = np.concatenate((self._n, np.zeros(grow, dtype=np.int64)))
            self._at = np.concatenate((self._at, np.zeros(grow, dtype=np.int64)))
        self._last = (units, out)
        return out

    def stats(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per row: (median, spread, scores held); median and spread 0 while it holds fewer than
        ``min_values``. A row's first n slots hold its scores (add fills the ring from slot 0; n stops at
        size), the rest NaN: the count of scores held is n, not a scan for NaNs."""
        n = self._n[rows]
        ready = n >= self.min_values
        if ready.all():  # (the usual case once a measure's candidates have been taught a while)
            m, mad = _row_median_mad(self._buf[rows], n)
            return m, MAD_TO_SD * mad, n
        med, scale = np.zeros(len(rows)), np.zeros(len(rows))
        if ready.any():
            m, mad = _row_median_mad(self._buf[rows[ready]], n[ready])
            med[ready] = m
            scale[ready] = MAD_TO_SD * mad
        return med, scale, np.where(ready, n, 0)

    def add(self, rows: np.ndarray, values: np.ndarray) -> None:
        at = self._at[rows]
        self._buf[rows, at] = values
        self._at[rows] = (at + 1) % self.size
        self._n[rows] = np.minimum(self._n[rows] + 1, self.size)
