"""Consistent hashed sampling (agent/sampling.py Cadence): every rank of a communicator keeps the same
collectives, about ``per_s`` a second, whatever the rate, and every place of a training step in turn; and the
place itself (StepPattern), learnt from a rank's call times."""

from __future__ import annotations

import numpy as np
import pytest

from mycroft_otel import ids
from mycroft_otel.agent.sampling import Cadence, StepPattern

COMM = 0x5EED


def _kept(c: Cadence, rate_per_s: float, seconds: float, jitter_ns: int = 0) -> list[int]:
    step = int(1e9 / rate_per_s)
    return [seq for seq in range(int(rate_per_s * seconds))
            if c.keep(ids.coll_trace_id("job", COMM, seq), 1_000_000_000 + seq * step + (jitter_ns if seq % 2 else 0))]


@pytest.mark.parametrize("rate", [3.0, 40.0, 1000.0])
def test_ranks_keep_the_same_collectives_at_a_few_per_second(rate):
    a, b = Cadence(per_s=4.0), Cadence(per_s=4.0)
    ka = _kept(a, rate, 20.0)
    kb = _kept(b, rate, 20.0, jitter_ns=50_000)  # another rank completes each a little later
    late = [s for s in ka if s >= rate * 4]  # after the first windows measured the rate
    assert late == [s for s in kb if s >= rate * 4]
    per_s = len(late) / 16.0
    assert min(rate, 4.0) / 2 <= per_s <= 8.0, per_s


def test_bad_settings_are_refused():
    with pytest.raises(ValueError):
        Cadence(per_s=0)
    with pytest.raises(ValueError):
        StepPattern(window=16, max_period=16)


def test_a_larger_stride_keeps_a_subset_of_a_smaller_one():
    """Two ranks near a rate boundary may pick neighbouring strides: the collectives the larger one keeps are
    kept by both, so their traces stay complete."""
    fast, slow = Cadence(per_s=8.0), Cadence(per_s=2.0)
    a, b = _kept(fast, 100.0, 20.0), _kept(slow, 100.0, 20.0)
    assert fast.stride < slow.stride
    assert set(s for s in b if s >= 400) <= set(a)


@pytest.mark.parametrize("ops_per_step", [2, 4, 8])
def test_every_place_of_a_training_step_is_kept(ops_per_step):
    """A step of 2, 4 or 8 collectives on a communicator, a stride that is a multiple of it: each place of the
    step is kept in about its share (``seq % stride`` kept the step's first place only)."""
    c = Cadence(per_s=4.0)
    kept = [s for s in _kept(c, 64.0, 120.0) if s >= 64 * 4]
    assert c.stride % ops_per_step == 0
    share = np.bincount([s % ops_per_step for s in kept], minlength=ops_per_step) / len(kept)
    assert share.min() >= 0.5 / ops_per_step, share


def _places(pattern_ms: list[float], calls: int, noise: float, seed: int) -> tuple[StepPattern, list[int]]:
    rng = np.random.default_rng(seed)
    sp, t, out = StepPattern(), 1_000_000_000, []
    for seq in range(calls):
        t += int(pattern_ms[seq % len(pattern_ms)] * 1e6 * (1 + noise * abs(rng.standard_normal())))
        out.append(sp.index(seq, t))
    return sp, out


@pytest.mark.parametrize("pattern_ms", [[150, 10, 40, 20], [50, 10, 10], [100] + [5] * 7, [150, 2, 2, 2]])
def test_a_repeating_step_gives_each_collective_its_place(pattern_ms):
    """The intervals between a rank's calls repeat with the step: the place is the sequence number modulo the
    step's length, the same for two ranks with their own noise."""
    a, pa = _places(pattern_ms, 400, 0.1, seed=1)
    b, pb = _places(pattern_ms, 400, 0.1, seed=2)
    assert a.period == b.period == len(pattern_ms)
    assert pa[-64:] == pb[-64:] == [s % len(pattern_ms) for s in range(336, 400)]
    # learnt on a quarter window of intervals (16: lags up to 4), then every quarter until the window is full
    first = 17 if len(pattern_ms) <= 4 else 65
    assert pa[first:] == [s % len(pattern_ms) for s in range(first, 400)]


def test_evenly_spaced_calls_have_no_places():
    sp, places = _places([30.0], 400, 0.2, seed=3)
    assert set(places) == {-1}


def test_a_noisy_window_does_not_relabel_the_places():
    """Once learnt, the step's length changes only when another matches clearly better: a burst of noisy calls
    leaves the places as they were."""
    sp, _ = _places([150, 10, 40, 20], 256, 0.1, seed=4)
    assert sp.period == 4
    rng = np.random.default_rng(5)
    t = sp._prev
    for seq in range(256, 320):  # a window of calls at random times
        t += int(rng.uniform(1, 200) * 1e6)
        sp.index(seq, t)
    assert sp.period == 4
