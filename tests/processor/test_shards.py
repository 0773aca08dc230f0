"""A job sharded over processors (MYCROFT_SHARD_RANKS, docs/algorithm.md §7): the processor that holds the
culprit's block of global ranks names it, once; the others stay silent and say why (Outcome.OTHER_SHARD)."""

from __future__ import annotations

import pytest

from mycroft_otel import semconv as sc
from mycroft_otel.processor import Processor
from mycroft_otel.processor.outcome import Outcome
from synth import Ring

N, SHARD = 32, 8  # a 32-rank ring over four shards of 8 global ranks


def _sharded(ring: Ring, shard: int) -> bytes:
    """The spans of the ranks of one shard, each resource carrying its shard as a sharding agent sets it."""
    return ring.request(list(range(shard * SHARD, (shard + 1) * SHARD)), shard=shard).SerializeToString()


class Clock:
    """The processors' monotonic clock, moved by the test: a trace's set of ranks settles in 1 s of it."""

    def __init__(self) -> None:
        self.s = 0.0

    def __call__(self) -> float:
        return self.s


def _settled(procs: list[Processor], clock: Clock, wait_s: float = 2.0) -> None:
    clock.s += wait_s
    for proc in procs:
        proc.tick()


def _run(rings: list[Ring], wait_s: float = 2.0) -> list[Processor]:
    """Each ring's spans into the processors of their shards, 2 s apart; the processors' verdicts ``wait_s``
    after the last."""
    clock = Clock()
    procs = [Processor(env={}, mono_clock=clock) for _ in range(N // SHARD)]
    for i, ring in enumerate(rings):
        clock.s += 2.0 * (i > 0)
        for shard, proc in enumerate(procs):
            proc.ingest_payload(_sharded(ring, shard))
    _settled(procs, clock, wait_s)
    return procs


def _outcomes(proc: Processor) -> set[Outcome]:
    return {d.outcome for d in proc.decisions}


@pytest.mark.parametrize("known", [True, False])
def test_a_world_size_gpu_stall_is_named_by_the_culprits_shard_alone(known):
    """At once where the communicator's ranks of each shard are known from its earlier collectives (a
    processor whose ranks have all reported waits for no other); at its first collective, once the ranks heard
    from have not grown for the settle time (a rank not heard from yet is not yet another shard's)."""
    ring = Ring(N, comm=0x5A1, seq=17)
    ring.gpu_stall(21)
    procs = _run([Ring(N, comm=0x5A1, seq=16), ring] if known else [ring], wait_s=0.0)
    if not known:
        assert not any(proc.verdicts for proc in procs)
        _settled(procs, procs[0].mono)
    for shard, proc in enumerate(procs):
        if shard == 21 // SHARD:
            assert [(v.category, v.finding.ranks) for v in proc.verdicts] == [(sc.CAT_GPU_STALLED, [21])]
        else:  # every wait in this block leads upstream, out of it: the culprit's shard names it
            assert not proc.verdicts, shard
            assert Outcome.OTHER_SHARD in _outcomes(proc), shard


def test_a_rank_of_the_shard_that_went_silent_is_named_absent_there():
    # the communicator's previous collective: every rank heard from, so each processor knows its ranks
    before = Ring(N, comm=0x5A2, seq=16)
    ring = Ring(N, comm=0x5A2, seq=17)
    ring.absent(13, how="none")  # rank 13 (shard 1) sends nothing at all
    procs = _run([before, ring])
    assert [(v.category, v.finding.ranks) for v in procs[1].verdicts] == [(sc.CAT_RANK_ABSENT, [13])]
    for shard in (0, 2, 3):
        assert not procs[shard].verdicts, shard


def test_an_unsharded_job_still_names_a_rank_never_heard_from():
    """Without a shard on the spans, a rank missing from the trace is absent, whether or not it was ever heard
    from: this processor holds the whole job."""
    ring = Ring(N, comm=0x5A3)
    ring.absent(13, how="none")
    clock = Clock()
    proc = Processor(env={}, mono_clock=clock)
    proc.ingest_payload(ring.request().SerializeToString())
    _settled([proc], clock)
    assert [(v.category, v.finding.ranks) for v in proc.verdicts] == [(sc.CAT_RANK_ABSENT, [13])]
