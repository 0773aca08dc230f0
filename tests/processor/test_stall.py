"""The hang threshold is learned from the job's own completions (detect.StallThresholds): a wait the job does
every iteration is no hang; MYCROFT_STALL_MS stays the floor."""

from __future__ import annotations

import time

from synth import Ring

from mycroft_otel.processor import Processor


def _hung(stalled_s: float, history_s: float | None) -> list:
    now = time.time_ns()
    proc = Processor(env={})
    if history_s is not None:  # collectives 1..10 each took history_s (e.g. a pipeline stage's long Recv)
        for seq in range(1, 11):
            proc.ingest_request(Ring(8, seq=seq, t0=now - 200_000_000_000 + seq * 12_000_000_000,
                                     dur_ns=int(history_s * 1e9)).request())
    ring = Ring(8, seq=11, t0=now - int(stalled_s * 1e9) - 1_000_000)
    ring.gpu_stall(2)
    for rv in ring.ranks.values():
        rv.end = now  # the latest snapshots, taken just now
    proc.ingest_request(ring.request())
    return [(v.category, v.finding.ranks) for v in proc.tick()]


def test_a_wait_the_job_does_every_iteration_is_no_hang():
    assert _hung(4.5, history_s=7.0) == []           # threshold 2 x 7 s
    assert _hung(15.0, history_s=7.0) == [("gpu_stalled", [2])]


def test_without_history_the_default_threshold_holds():
    assert _hung(4.5, history_s=None) == [("gpu_stalled", [2])]
    assert _hung(2.0, history_s=None) == []
    assert _hung(4.5, history_s=0.005) == [("gpu_stalled", [2])]  # short collectives: never below the floor
