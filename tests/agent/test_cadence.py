"""Consistent stride sampling (agent/sampling.py Cadence): every rank of a communicator keeps the same
collectives, about ``per_s`` a second, whatever the rate."""

from __future__ import annotations

import pytest

from mycroft_otel.agent.sampling import Cadence


def _kept(c: Cadence, rate_per_s: float, seconds: float, jitter_ns: int = 0) -> list[int]:
    step = int(1e9 / rate_per_s)
    return [seq for seq in range(int(rate_per_s * seconds))
            if c.keep(seq, 1_000_000_000 + seq * step + (jitter_ns if seq % 2 else 0))]


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


def test_a_larger_stride_keeps_a_subset_of_a_smaller_one():
    """Two ranks near a rate boundary may pick neighbouring strides: the collectives the larger one keeps are
    kept by both, so their traces stay complete."""
    fast, slow = Cadence(per_s=8.0), Cadence(per_s=2.0)
    a, b = _kept(fast, 100.0, 20.0), _kept(slow, 100.0, 20.0)
    assert fast.stride < slow.stride
    assert set(s for s in b if s >= 400) <= set(a)
