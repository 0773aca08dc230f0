"""Volume control: what of a rank's completed operations is exported (issue 4 §3).

* :class:`Baselines`: the local anomaly rule. Per rank context and (function, size
  bucket), running baselines of the duration and of the gap since the previous
  operation on the communicator; after a warm-up an operation is ``slow`` (duration
  ≥ factor × baseline) or ``late`` (gap ≥ factor × baseline gap: a straggler's own
  collective is short, only its late arrival marks it).
* :func:`sampled`: consistent trace-id ratio sampling, like OpenTelemetry's
  ``TraceIdRatioBased``: every rank keeps the same collectives.
* :class:`Summary`: per-window aggregate of everything completed, exported as
  ``mycroft.summary``.
"""

from __future__ import annotations

from typing import Any

from mycroft_otel import semconv as sc

_MASK64 = (1 << 64) - 1


def sample_bound(ratio: float) -> int:
    return int(ratio * (1 << 64))


def sampled(trace_id: int, bound: int) -> bool:
    """Keep iff the low 64 bits of the trace id are below ``ratio × 2^64``."""
    return (trace_id & _MASK64) < bound


class _Ewma:
    __slots__ = ("n", "value")

    def __init__(self) -> None:
        self.n = 0
        self.value = 0.0

    def add(self, x: float, alpha: float) -> None:
        self.n += 1
        if self.n == 1:
            self.value = x
        else:
            a = max(alpha, 1.0 / self.n)  # plain mean during warm-up, then EWMA
            self.value += a * (x - self.value)


class Baselines:
    """The local slow / late rule for one rank context."""

    def __init__(self, factor: float, warmup: int, min_excess_ns: int = 1_000_000, alpha: float = 0.1,
                 max_keys: int = 4096):
        self.factor = factor
        self.warmup = warmup
        self.alpha = alpha
        self.min_excess_ns = min_excess_ns
        self.max_keys = max_keys
        self._dur: dict[tuple, _Ewma] = {}
        self._gap: dict[tuple, _Ewma] = {}
        self.prev_end = 0  # end of the previous op on this communicator (monotonic ns)

    def _get(self, d: dict, key: tuple) -> _Ewma:
        e = d.get(key)
        if e is None:
            if len(d) >= self.max_keys:
                d.clear()
            e = d[key] = _Ewma()
        return e

    def classify(self, func: int, nbytes: int, arrive_ns: int, end_ns: int) -> tuple[str, int, int | None] | None:
        """Update with one completed op; (anomaly, baseline_ns, gap_ns or None) when anomalous."""
        key = (func, int(nbytes).bit_length())
        dur = end_ns - arrive_ns
        gap = arrive_ns - self.prev_end if self.prev_end and arrive_ns > self.prev_end else None
        if end_ns > self.prev_end:
            self.prev_end = end_ns
        result = None
        d = self._get(self._dur, key)
        slow = d.n >= self.warmup and dur >= self.factor * d.value and dur - d.value >= self.min_excess_ns
        if gap is not None:
            g = self._get(self._gap, key)
            if g.n >= self.warmup and gap >= self.factor * g.value and gap - g.value >= self.min_excess_ns:
                result = (sc.ANOMALY_LATE, int(g.value), int(gap))
            # anomalies update the baseline too (a new regime is absorbed in ~1/alpha ops instead of
            # locking in a baseline learnt from an unusual warm-up), clipped so one outlier moves it little
            g.add(min(gap, 2 * self.factor * g.value) if g.n >= self.warmup else gap, self.alpha)
        if slow and result is None:
            result = (sc.ANOMALY_SLOW, int(d.value), None)
        if dur >= 0:
            d.add(min(dur, 2 * self.factor * d.value) if d.n >= self.warmup else dur, self.alpha)
        return result


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
