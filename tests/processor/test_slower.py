"""The Slower check (processor/slower.py): a verdict needs the communicator's kernels to run longer since the
evidence began than while it was healthy, by what a typical collective took (the median) or by what the job
spent (the mean)."""

from __future__ import annotations

import numpy as np

from mycroft_otel.processor.settings import Settings
from mycroft_otel.processor.slower import SlowerCheck


def _check() -> SlowerCheck:
    return SlowerCheck(Settings(), memory=None)


def _healthy(rng: np.random.Generator, n: int) -> list[float]:
    return list(12.0 + rng.normal(0.0, 0.1, n))


def test_a_fault_on_one_op_of_each_step_is_slower_by_the_mean():
    """A rank late into one of its TP group's four all-reduces per step: that op's kernels wait 3x as long,
    the other three are untouched, so the median does not move and the mean does."""
    rng = np.random.default_rng(1)
    before = _healthy(rng, 64)
    since = [v + (np.log(3.0) if i % 4 == 0 else 0.0) for i, v in enumerate(_healthy(rng, 24))]
    check = _check()
    assert np.median(since) - np.median(before) < 0.1  # the median alone would say: not slower
    assert check._longer(since, before)


def test_every_op_slower_is_slower():
    rng = np.random.default_rng(2)
    assert _check()._longer([v + 0.3 for v in _healthy(rng, 8)], _healthy(rng, 64))


def test_healthy_times_with_an_outlier_are_not_slower():
    """A descheduled rank's one long kernel (e^1: 2.7x) among a dozen healthy ones is not a slowdown; the
    healthy window's own outliers widen the mean's bar."""
    rng = np.random.default_rng(3)
    before = _healthy(rng, 64)
    before[10] += 1.0
    before[40] += 0.8
    since = _healthy(rng, 12)
    since[5] += 1.0
    assert not _check()._longer(since, before)
    assert not _check()._longer(_healthy(rng, 12), _healthy(rng, 64))
