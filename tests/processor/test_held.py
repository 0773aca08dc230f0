"""Slowdown findings held while a collective of their job stalls (processor/held.py)."""

from __future__ import annotations

import time

from mycroft_otel.processor import Processor
from mycroft_otel.processor.held import Held, HeldFindings
from mycroft_otel.processor.outcome import Decision, Outcome

from synth import Ring


class _Incidents:
    """What HeldFindings asks of the incidents: whether the job's hang was named since a moment."""

    def __init__(self) -> None:
        self.hang: bytes | None = None

    def hang_since(self, job: str, since: float) -> bytes | None:
        return self.hang


def _job(now_ns: int):
    """A processor holding one hung collective (stalled 5 s) and one completed collective of the same job."""
    proc = Processor(env={}, settle_s=0.2)
    hung = Ring(8, comm=0xA1, t0=now_ns - 6_000_000_000)
    hung.hang_all(when=now_ns - 5_000_000_000, snap_time=now_ns - 1_000_000_000)
    done = Ring(8, comm=0xB2, t0=now_ns - 2_000_000_000)
    proc.ingest_request(hung.request())
    proc.ingest_request(done.request())
    return proc, proc.store.get(hung.tid.to_bytes(16, "big")), proc.store.get(done.tid.to_bytes(16, "big"))


def test_a_finding_waits_while_its_job_stalls_longer_than_it_took():
    now = time.time_ns()
    proc, hung, done = _job(now)
    held = HeldFindings(proc.store, [hung.trace_id])
    assert held.stall_of(done.job, now) >= 4_000_000_000
    assert held.should_hold(done, 5_000_000, now)
    assert not held.should_hold(done, 6_000_000_000, now)  # it took longer than the stall: not its symptom
    assert not HeldFindings(proc.store, []).should_hold(done, 5_000_000, now)  # nothing stalls


def test_released_as_the_hangs_symptom_once_the_hang_is_named():
    now = time.time_ns()
    proc, hung, done = _job(now)
    held, incidents = HeldFindings(proc.store, [hung.trace_id]), _Incidents()
    held.hold(done, Held(1.0, Decision(Outcome.NAMED), 0.001, 5_000_000))
    assert held.release(now, incidents) == [] and len(held) == 1  # the job still stalls, nothing named
    incidents.hang = hung.trace_id
    (r,) = held.release(now, incidents)
    assert (r.st, r.hang) == (done, hung.trace_id) and len(held) == 0


def test_released_on_its_own_once_the_job_moves_again():
    now = time.time_ns()
    proc, hung, done = _job(now)
    candidates = [hung.trace_id]
    held = HeldFindings(proc.store, candidates)
    held.hold(done, Held(1.0, Decision(Outcome.NAMED), 0.001, 5_000_000))
    candidates.clear()  # the stalled collective completed: no hang candidate left
    held.new_tick()
    (r,) = held.release(now, _Incidents())
    assert r.hang is None and r.held.decision.outcome == Outcome.NAMED
