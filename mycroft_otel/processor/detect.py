"""Detection: when does a trace need a root cause?

- Hang: the trace holds in-flight evidence (a rank's latest span is a
  ``mycroft.inflight`` snapshot, or a ``process_exited`` status) and nothing in it
  progressed for MYCROFT_STALL_MS, judged on the processor's clock on a timer, so a
  hang is found even when no new span arrives. A ``process_exited`` status shortens
  the wait to a third of the threshold (the evidence is already conclusive).
  The threshold is learned per (communicator, function, size bucket) from the job's own completed
  operations (:class:`StallThresholds`): a wait the job does every iteration is no hang.
- Slowdown candidates: a completed collective the agent flagged (``mycroft.anomaly``), one
  whose rank duration is >= MYCROFT_SLOW_FACTOR x its baseline for (communicator, function,
  size bucket = bit length of bytes), or one we heard from most ranks of; the sequential test
  (detector.py) decides.

Baselines are learnt online from healthy spans (sampled op spans and the agent's
per-window summaries): a median of the last samples after a warm-up, so a slow
first iteration or an occasional outlier does not move it.
"""

from __future__ import annotations

import statistics
from collections import deque

from mycroft_otel import semconv as sc
from mycroft_otel.processor.spans import SpanRef, span_attributes
from mycroft_otel.processor.state import TraceState

WARMUP = 3       # samples of a key before its baseline is trusted
WINDOW = 32      # recent samples kept per key
_SUMMARY_KEYS = frozenset({sc.SUMMARY_FUNCS, sc.SUMMARY_FUNC_OPS, sc.SUMMARY_FUNC_DURATION_MEAN, sc.SUMMARY_BYTES,
                           sc.SUMMARY_OPS})


def baseline_key(comm: str, func: str, nbytes: int) -> tuple:
    """What a baseline is kept for: (communicator, function, size bucket = bit length of the bytes)."""
    return (comm, func, nbytes.bit_length() if nbytes > 0 else 0)


class Baselines:
    """Online per-(comm, func, size bucket) duration baselines."""

    def __init__(self, max_keys: int = 32_768):  # ~1.5 KiB each (32 samples): ~48 MiB at most
        self.samples: dict[tuple, deque] = {}
        self.max_keys = max_keys

    def window(self, key: tuple) -> deque:
        """The key's recent samples (made empty when new): append positive durations to it."""
        d = self.samples.get(key)
        if d is None:
            if len(self.samples) >= self.max_keys:
                self.samples.pop(next(iter(self.samples)))
            d = self.samples[key] = deque(maxlen=WINDOW)
        return d

    def add(self, key: tuple, duration_ns: float) -> None:
        add_sample(self.window(key), duration_ns)

    def add_summary(self, ref: SpanRef) -> None:
        """An agent's per-window summary span: the mean duration of each function it ran, at the window's
        mean size (malformed attributes add nothing)."""
        a = span_attributes(ref, _SUMMARY_KEYS)
        funcs, ops, means = a.get(sc.SUMMARY_FUNCS), a.get(sc.SUMMARY_FUNC_OPS), a.get(sc.SUMMARY_FUNC_DURATION_MEAN)
        total_ops, total_bytes = a.get(sc.SUMMARY_OPS), a.get(sc.SUMMARY_BYTES)
        if not (isinstance(funcs, list) and isinstance(means, list) and isinstance(total_ops, int) and total_ops > 0
                and isinstance(total_bytes, int)):
            return
        avg_bytes = total_bytes // total_ops
        for i, func in enumerate(funcs):
            if i < len(means) and isinstance(func, str) and isinstance(means[i], int):
                n = ops[i] if isinstance(ops, list) and i < len(ops) and isinstance(ops[i], int) else 1
                if n > 0:
                    self.add(baseline_key(ref.comm, func, avg_bytes), means[i])

    def get(self, key: tuple) -> float | None:
        d = self.samples.get(key)
        if d is None or len(d) < WARMUP:
            return None
        return statistics.median(d)


def add_sample(window: deque, duration_ns: float) -> None:
    """One collective's duration into a key's window (Baselines.window); a span without one adds nothing."""
    if duration_ns > 0:
        window.append(float(duration_ns))


def stall_ns(st: TraceState, now_ns: int) -> int:
    """How long nothing progressed in a trace with in-flight evidence (0 when none)."""
    if not st.has_hang_evidence():
        return 0
    return max(0, now_ns - st.stopped_ns)


def seen_stalled(st: TraceState) -> bool:
    """Every waiting rank's latest snapshot was taken after the last progress anywhere in the trace: the
    picture the walk follows is of the stall, not of a collective still moving (snapshots come once per
    period; a fault between two of them leaves the earlier ones showing ranks that were only behind)."""
    return all(ref.end_ns >= st.last_progress_ns for ref in st.waiters())


class StallThresholds:
    """How long an operation of (communicator, function, size bucket) may go without progress before it is a
    hang: ``factor`` x the median duration of its recent completed collectives (one per trace; flagged ones
    included: a pipeline's first stage waits ~7 s in its backward Recv every iteration, and its agent flags
    each as stalled), never below MYCROFT_STALL_MS nor above ``cap_factor`` x it. The median of completions is an upper bound of how
    long they sat without progress, so the threshold errs long; a hang itself never completes and teaches
    nothing. Shorter than MYCROFT_STALL_MS it never gets: the agent reports an operation in flight only after
    MYCROFT_INFLIGHT_AFTER_MS and snapshots it once per MYCROFT_SNAPSHOT_MS (1 s each by default), so a
    shorter bar would judge a picture taken before the stall."""

    def __init__(self, stall_ms: float, factor: float = 2.0, cap_factor: float = 10.0, max_keys: int = 100_000):
        self.stall_ms = stall_ms
        self.factor = factor
        self.cap_ms = cap_factor * stall_ms
        self.max_keys = max_keys
        self._done: dict[tuple, deque] = {}

    def completed(self, key: tuple, duration_ns: int) -> None:
        d = self._done.get(key)
        if d is None:
            if len(self._done) >= self.max_keys:
                self._done.pop(next(iter(self._done)))
            d = self._done[key] = deque(maxlen=WINDOW)
        if duration_ns > 0:
            d.append(duration_ns)

    def for_trace(self, st: TraceState) -> float:
        """The trace's stall threshold (ms)."""
        ref = next(iter(st.inflight.values()), None) or next(iter(st.op.values()), None)
        if ref is None:
            return self.stall_ms
        d = self._done.get(baseline_key(st.comm, st.func, ref.nbytes))
        if d is None or len(d) < WARMUP:
            return self.stall_ms
        return min(self.cap_ms, max(self.stall_ms, self.factor * statistics.median(d) / 1e6))


def is_hung(st: TraceState, now_ns: int, stall_ms: float) -> bool:
    s = stall_ns(st, now_ns)
    if s <= 0:
        return False
    threshold = stall_ms * 1e6
    if any(v.status == sc.STATUS_PROCESS_EXITED for v in st.status.values()):
        threshold /= 3
    return s >= threshold
