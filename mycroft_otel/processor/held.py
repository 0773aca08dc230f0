"""Slowdown findings held while a collective of their job stalls.

A stall slows every collective of the job around it (they queue behind it on the GPUs' streams, or wait for
the stalled ranks in other communicators): a slowdown named meanwhile may be its symptom. So a finding made
while a collective of its job has stalled for longer than the slow one took waits here until the stall is
named a hang (the finding was its symptom: the same incident) or the job moves again (the finding stands on
its own).
"""

from __future__ import annotations

from typing import Iterable, NamedTuple

from mycroft_otel.processor import detect
from mycroft_otel.processor.outcome import Decision
from mycroft_otel.processor.state import TraceState, TraceStore

KEPT = 4096
#: a stall shorter than this never holds a finding (a healthy job's collectives wait that long for a late rank)
MIN_STALL_NS = 1_000_000_000


class Held(NamedTuple):
    """A slowdown finding made while a collective of its job stalled."""

    since: float        # monotonic seconds
    decision: Decision  # what the detector named
    analysis_s: float
    took: int           # ns, its ranks' first start to last end


class Released(NamedTuple):
    """A held finding whose job no longer stalls. ``hang``: the trace id of a hang named since (the finding
    was its symptom), else None (the finding is emitted as usual)."""

    st: TraceState
    held: Held
    hang: bytes | None


class HeldFindings:
    """The held findings of every job, and the longest stall of each job's hang candidates (once a tick)."""

    def __init__(self, store: TraceStore, hang_candidates: Iterable[bytes]):
        self.store = store
        self._candidates = hang_candidates  # the processor's live set of hang candidates' trace ids
        self._held: dict[bytes, Held] = {}
        self._stalling: dict[str, int] | None = None

    def __len__(self) -> int:
        return len(self._held)

    def new_tick(self) -> None:
        self._stalling = None

    def stall_of(self, job: str, now_ns: int) -> int:
        """The longest stall among the job's traces not named yet (ns; computed once a tick)."""
        if self._stalling is None:
            self._stalling = {}
            for tid in self._candidates:
                o = self.store.get(tid)
                if o is not None and o.verdict is None:
                    self._stalling[o.job] = max(self._stalling.get(o.job, 0), detect.stall_ns(o, now_ns))
        return self._stalling.get(job, 0)

    def should_hold(self, st: TraceState, took: int, now_ns: int) -> bool:
        """Whether a slowdown finding about ``st`` (which took ``took`` ns) waits: its job stalls for longer
        than it took (under a heavy slowdown every collective stalls a while)."""
        return self.stall_of(st.job, now_ns) >= max(MIN_STALL_NS, took)

    def hold(self, st: TraceState, held: Held) -> None:
        if len(self._held) >= KEPT:
            self._held.pop(next(iter(self._held)))
        self._held[st.trace_id] = held

    def release(self, now_ns: int, incidents) -> list[Released]:
        """The held findings decided now: explained by a hang named since, or their job stalls no longer.
        ``incidents``: what says whether a job's hang was named since a moment (``hang_since``)."""
        out: list[Released] = []
        for tid, h in list(self._held.items()):
            st = self.store.get(tid)
            if st is None or st.verdict is not None or st.explained_by is not None:
                del self._held[tid]
                continue
            hang = incidents.hang_since(st.job, h.since)
            if hang is not None or not self.should_hold(st, h.took, now_ns):
                del self._held[tid]
                out.append(Released(st, h, hang))
        return out
