"""Volume control: what of a rank's completed operations is exported (issue 4 §3).

* :class:`Baselines`: the local anomaly rule. Per rank context and (function, size
  bucket), running baselines of the duration and of the gap since the previous
  operation on the communicator; after a warm-up an operation is ``slow`` (duration
  ≥ factor × baseline) or ``late`` (gap ≥ factor × baseline gap: a straggler's own
  collective is short, only its late arrival marks it).
* :data:`FlowRule`: the local rule on an op's own flow counters (a slow flow, GPU or NIC; native).
* :func:`sampled`: consistent trace-id ratio sampling, like OpenTelemetry's
  ``TraceIdRatioBased``: every rank keeps the same collectives.
* :class:`Cadence`: consistent hashed sampling per communicator at an adaptive rate, so that the processor's
  sequential slowdown test sees a steady few collectives per second, every place of a training step in turn,
  with every rank's span in them (a mild fault that no local rule flags is visible only across ranks).
* :class:`StepPattern`: a collective's place in its communicator's training step (sequence number modulo the
  step's length in collectives, learnt from the rank's call times).
* :class:`Summary`: per-window aggregate of everything completed, exported as
  ``mycroft.summary``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mycroft_otel import _native
from mycroft_otel import semconv as sc

_MASK64 = (1 << 64) - 1


def sample_bound(ratio: float) -> int:
    return int(ratio * (1 << 64))


def sampled(trace_id: int, bound: int) -> bool:
    """Keep iff the low 64 bits of the trace id are below ``ratio × 2^64``."""
    return (trace_id & _MASK64) < bound


class Baselines(_native.Baselines):
    """The local slow / late rule for one rank context (native: ``native/bindings/rules.cc``).

    Per (function, size bucket), running baselines of the op's duration and of the gap since the communicator's
    previous op ended: a mean and mean absolute deviation (``alpha``), seeded by the median of the first
    ``warmup`` values so that a slow first iteration does not inflate them, and a fast mean that follows the last
    few ops. After the warm-up an op is ``slow`` when its duration is ≥ factor × the mean and above it by
    max(``min_excess_ns``, ``k_dev`` × the deviation) (jittery baselines, e.g. durations dominated by waiting for
    peers, need more), or when the fast mean shifted that far with this op as slow; ``late`` when its gap is such
    an outlier (a straggler's own collective is short, only its late arrival marks it). Anomalies update the
    baselines too, clipped to 2 × factor × the mean and four times slower while shifted: a new regime is absorbed
    in the end, a sustained slowdown stays visible for a few dozen ops. ``classify`` returns (anomaly,
    baseline_ns, gap_ns or None) or None; ``unusual_idle(idle_ns)``: idle longer than factor × the longest usual
    gap (the rank is not merely between steps). A full table (``max_keys``) starts over: bounded memory.
    """

    def __init__(self, factor: float, warmup: int, min_excess_ns: int = 1_000_000, alpha: float = 0.1,
                 k_dev: float = 4.0, max_keys: int = 4096):
        super().__init__(factor, warmup, min_excess_ns, alpha, k_dev, max_keys, sc.ANOMALY_SLOW, sc.ANOMALY_LATE)


class Cadence:
    """Keep a communicator's collective when the high half of its trace id is a multiple of ``stride``, the power
    of two that keeps about ``per_s`` collectives per second at the communicator's measured completion rate.

    Every rank of a communicator derives the same trace id for a collective (ids.py) and completes collectives at
    the same rate, so all pick the same stride and keep the same collectives: the processor gets complete traces
    to compare ranks and flows in, without any coordination. Near a boundary two ranks may briefly pick
    neighbouring strides; being powers of two, the larger stride's collectives are kept by both.

    The trace id is a hash of the sequence number, not the number itself: a training step calls the same
    collectives on a communicator every iteration (:class:`StepPattern`), and ``seq % stride`` with a stride that
    is a multiple of the step's length would keep the same place of every step for ever, so that a rank late
    into any other place would never be judged. Hashed, every place of the step is kept in turn, at the same
    rate; the processor keeps what depends on the place apart by :class:`StepPattern`'s index. Cost: ``per_s`` op
    spans per rank and communicator per second on top of the ratio sampling and the flags (docs/span-schema.md
    states it in bytes).
    """

    __slots__ = ("per_s", "window_ns", "stride", "_count", "_since")

    def __init__(self, per_s: float = 4.0, window_ns: int = 2_000_000_000):
        if per_s <= 0 or window_ns <= 0:
            raise ValueError(f"Cadence needs per_s > 0 and window_ns > 0 (got {per_s}, {window_ns})")
        self.per_s = per_s
        self.window_ns = window_ns
        self.stride = 0  # nothing kept until a first window measured the rate (the processor's warm-up anyway)
        self._count = 0
        self._since = 0

    def keep(self, trace_id: int, end_ns: int) -> bool:
        if self._since == 0:
            self._since = end_ns
        self._count += 1
        span = end_ns - self._since
        if span >= self.window_ns:
            want = self._count * 1e9 / span / self.per_s
            # change only when clearly off (3/4 of a doubling): ranks near a boundary keep the same stride
            if self.stride == 0 or abs(math.log2(max(want, 1.0)) - math.log2(self.stride)) > 0.75:
                self.stride = 1 << max(0, min(20, round(math.log2(max(want, 1.0)))))
            self._count, self._since = 0, end_ns
        # the high half: the low one decides the ratio sampling (sampled), whose kept set this must not follow
        return self.stride > 0 and (trace_id >> 64) % self.stride == 0


class StepPattern:
    """The length of a communicator's training step in collectives, learnt from the rank's own call times, and so
    each collective's place in the step (its sequence number modulo that length; -1 while none is known).

    A training loop calls the same collectives on a communicator in the same order every iteration -- a TP
    group's all-reduces layer by layer, forward then backward, a DP ring's gradient buckets, a pipeline stage's
    transfers per micro-batch -- with the same compute between them, so the intervals between a rank's calls
    repeat with the step's length K. Each place of the step has its own run-ahead and arrival skew: the first
    call after the optimizer and the data loader is not the third inside the backward pass, and a rank late into
    one place only (a hook, a host-side copy) moves that place's collectives alone. The processor keeps the
    lateness of each place apart.

    K is the shortest lag at which the log-intervals match as well as at any lag up to ``max_period``
    (the mean absolute difference between each and the one K before), and only where that is clearly better than
    lag 1: evenly spaced calls have no places worth telling apart. The ranks of a communicator run the same
    program: they find the same K; where two disagree the processor keeps the first span's index. Learnt on the
    last ``window`` intervals every ``window / 2`` calls, and every ``window / 4`` while the first window fills
    (lags up to a quarter of the intervals seen); a new K only when the current one matches clearly worse, so a
    noisy window does not relabel the places.
    """

    __slots__ = ("window", "max_period", "period", "_log", "_n", "_prev")

    def __init__(self, window: int = 64, max_period: int = 16):
        if not 1 <= max_period <= window // 4:
            raise ValueError(f"StepPattern needs 1 <= max_period <= window / 4 (got {max_period}, {window})")
        self.window = window
        self.max_period = max_period
        self.period = 0  # not known yet
        self._log = np.zeros(window)
        self._n = 0      # intervals seen
        self._prev = 0   # the previous call (monotonic ns)

    def index(self, seq: int, arrive_ns: int) -> int:
        """One collective called at ``arrive_ns``: its place in the step, -1 while the step's length is unknown
        or when the calls show no repeating pattern."""
        if arrive_ns > self._prev:
            if self._prev:
                self._log[self._n % self.window] = math.log(arrive_ns - self._prev)
                self._n += 1
                # every quarter window while the first fills (a step of a few calls is learnt within a few
                # steps), then every half window
                if self._n % (self.window // (4 if self._n <= self.window else 2)) == 0:
                    w = min(self._n, self.window)
                    self._learn(np.roll(self._log, -(self._n % self.window))[-w:])
            self._prev = arrive_ns
        return seq % self.period if self.period > 1 and seq >= 0 else -1

    def _learn(self, x: np.ndarray) -> None:
        """``x``: the last log-intervals, oldest first (a window's, or all seen while the first fills)."""
        n = len(x)
        lags = np.arange(1, min(self.max_period, n // 4) + 1)
        # the mean, clipped: a step of 16 calls with one long gap differs in 2 pairs of 16 at the wrong lag (a
        # median would not see it), and one descheduled call adds at most 2 / window. All lags at once (this
        # runs every few dozen calls of every rank context, in the agent's poll loop): row k - 1 holds each
        # interval's difference to the one k later, the pairs past the end counting 0
        later = np.arange(n)[None, :] + lags[:, None]
        diff = np.minimum(np.abs(x[np.minimum(later, n - 1)] - x[None, :]), 1.0)
        miss = np.where(later < n, diff, 0.0).sum(axis=1) / (n - lags)
        best = miss.min()
        # the shortest lag within the noise of the best (a multiple of the step matches as well as the step)
        k = int(lags[np.flatnonzero(miss <= 1.25 * best + 0.02)[0]])
        if miss[0] <= 2 * miss[k - 1] + 0.02:
            k = 1  # calls evenly spaced, or no pattern this short: one place
        if self.period == 0 or self.period > len(miss) or miss[self.period - 1] > 1.5 * miss[k - 1] + 0.02:
            self.period = k


class Summary:
    """Aggregate of a rank context's completed operations in one window."""

    def __init__(self, window_start_mono: int):
        self.start = window_start_mono
        self.ops = 0
        self.exported = 0
        self.seq_first: int | None = None
        self.seq_last: int | None = None
        self.bytes = 0
        self.dur_sum = 0
        self.dur_max = 0
        self.funcs: dict[str, list[int]] = {}
        self.dropped_ring = 0

    def add(self, func: str, seq: int, nbytes: int, dur: int, exported: bool) -> None:
        self.ops += 1
        self.exported += int(exported)
        if self.seq_first is None or seq < self.seq_first:
            self.seq_first = seq
        if self.seq_last is None or seq > self.seq_last:
            self.seq_last = seq
        self.bytes += nbytes
        dur = max(dur, 0)
        self.dur_sum += dur
        self.dur_max = max(self.dur_max, dur)
        f = self.funcs.setdefault(func, [0, 0])
        f[0] += 1
        f[1] += dur

    def attributes(self) -> list[tuple[str, Any]]:
        funcs = sorted(self.funcs)
        return [
            (sc.SUMMARY_OPS, self.ops), (sc.SUMMARY_EXPORTED, self.exported),
            (sc.SUMMARY_SEQ_FIRST, -1 if self.seq_first is None else self.seq_first),
            (sc.SUMMARY_SEQ_LAST, -1 if self.seq_last is None else self.seq_last),
            (sc.SUMMARY_BYTES, self.bytes),
            (sc.SUMMARY_DURATION_MEAN, self.dur_sum // self.ops if self.ops else 0),
            (sc.SUMMARY_DURATION_MAX, self.dur_max),
            (sc.SUMMARY_FUNCS, funcs),
            (sc.SUMMARY_FUNC_OPS, [self.funcs[f][0] for f in funcs]),
            (sc.SUMMARY_FUNC_DURATION_MEAN, [self.funcs[f][1] // max(self.funcs[f][0], 1) for f in funcs]),
            (sc.SUMMARY_DROPPED_RING, self.dropped_ring),
        ]


# The local rule on a collective's own flow counters, which arrival skew does not dominate. The duration rule
# (Baselines) measures arrival -> end, mostly the wait for the last rank to arrive, so a rank whose GPU, NIC or
# one flow got slower is seldom flagged. Each flow carries the time its steps waited on the GPU and on the
# network (their union over the steps: the processor's measures); per step:
#
# * one send flow's network wait >= ``factor`` x its own history (per channel and peer, after the warm-up) and
#   >= ``sib_factor`` / 2 x the median of the rank's other send flows -> slow flow;
# * the rank's receive-side GPU wait per step >= ``factor`` x its own history -> slow GPU;
# * the network wait per step of the rank's least-waiting send flow >= ``factor`` x its own history (every flow
#   slower: its NIC, or congestion) -> slow NIC.
#
# Each history is a running mean and deviation like Baselines', clipped and 16 times slower while above,
# so a sustained slowdown stays flagged for dozens of collectives (the processor names it only once it recurs)
# and a new regime is still absorbed in the end. A flag only makes the agent export the span (and its local
# peers'); the processor decides. It runs for every completed op with flows, in the poll loop, so natively
# (native/bindings/rules.cc; in Python it was a point of a core at 8 ranks x 100 collectives/s):
# ``FlowRule(factor=3.0, sib_factor=8.0, warmup=8, min_step_ns=20_000, alpha=0.1, max_keys=4096)``,
# ``classify(func, nbytes, flows)`` -> whether the op looks slow by its valid FLOW_DTYPE records.
FlowRule = _native.FlowRule
