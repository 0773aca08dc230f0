"""Detection: when does a trace need a root cause?

- Hang: the trace holds in-flight evidence (a rank's latest span is a
  ``mycroft.inflight`` snapshot, or a ``process_exited`` status) and nothing in it
  progressed for MYCROFT_STALL_MS, judged on the processor's clock on a timer, so a
  hang is found even when no new span arrives. A ``process_exited`` status shortens
  the wait to a third of the threshold (the evidence is already conclusive).
- Slowdown: a completed collective whose median rank duration is >= MYCROFT_SLOW_FACTOR
  x its baseline for (communicator, function, size bucket = bit length of bytes), or
  whose throughput halved; or spans the agent already flagged (``mycroft.anomaly``)
  that are confirmed by the same comparison against the agent's ``mycroft.baseline_ns``.

Baselines are learnt online from healthy spans (sampled op spans and the agent's
per-window summaries): a median of the last samples after a warm-up, so a slow
first iteration or an occasional outlier does not move it.
"""

from __future__ import annotations

import statistics
from collections import deque

from mycroft_otel import semconv as sc
from mycroft_otel.processor.state import TraceState

WARMUP = 3       # samples of a key before its baseline is trusted
WINDOW = 32      # recent samples kept per key


def baseline_key(comm: str, func: str, nbytes: int) -> tuple:
    """What a baseline is kept for: (communicator, function, size bucket = bit length of the bytes)."""
    return (comm, func, nbytes.bit_length() if nbytes > 0 else 0)


class Baselines:
    """Online per-(comm, func, size bucket) duration baselines."""

    def __init__(self, max_keys: int = 100_000):
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
    return max(0, now_ns - max(st.last_progress_ns, st.first_evidence_ns))


def seen_stalled(st: TraceState) -> bool:
    """Every waiting rank's latest snapshot was taken after the last progress anywhere in the trace: the
    picture the walk follows is of the stall, not of a collective still moving (snapshots come once per
    period; a fault between two of them leaves the earlier ones showing ranks that were only behind)."""
    return all(ref.end_ns >= st.last_progress_ns for ref in st.waiters())


def is_hung(st: TraceState, now_ns: int, stall_ms: float) -> bool:
    s = stall_ns(st, now_ns)
    if s <= 0:
        return False
    threshold = stall_ms * 1e6
    if any(v.status == sc.STATUS_PROCESS_EXITED for v in st.status.values()):
        threshold /= 3
    return s >= threshold


def trace_baseline(st: TraceState, baselines: Baselines) -> float | None:
    """The baseline duration for this trace: ours, else the agent's (median of BASELINE_NS)."""
    refs = list(st.op.values())
    if not refs:
        return None
    nbytes = refs[0].nbytes
    ours = baselines.get(baseline_key(st.comm, st.func, nbytes))
    if ours is not None:
        return ours
    theirs = [r.baseline_ns for r in refs if r.baseline_ns > 0 and r.anomaly in ("slow", "stalled")]
    return float(statistics.median(theirs)) if theirs else None


def is_slow(st: TraceState, baselines: Baselines, factor: float) -> tuple[bool, float | None]:
    """(slow?, baseline) for a trace with completed op spans."""
    refs = list(st.op.values())
    if not refs:
        return False, None
    base = trace_baseline(st, baselines)
    durs = [r.duration_ns for r in refs]
    med = statistics.median(durs)
    if base is not None:
        return med >= factor * base or max(durs) >= factor * base and _late_flagged(st), base
    # no baseline: trust the agent's flags when most ranks that reported agree
    flagged = sum(1 for r in refs if r.anomaly in ("slow", "stalled"))
    return flagged >= max(2, len(refs) // 2) and _late_flagged(st), None


def _late_flagged(st: TraceState) -> bool:
    return any(r.anomaly == "late" for r in st.op.values())
