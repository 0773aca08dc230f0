"""The Slower check (processor/slower.py): a verdict needs the communicator's kernels to run longer since the
evidence began than while it was healthy, in the kernel time the alarm's fault lengthens (the median rank's
wait for a late rank, the shortest kernel's transfer for the rest), by what a typical collective took (the
median) or by what the job spent (the mean)."""

from __future__ import annotations

from collections import deque

import numpy as np

from mycroft_otel.processor import slowdown
from mycroft_otel.processor.candidates import Alarm
from mycroft_otel.processor.memory import Durations, KernelTime
from mycroft_otel.processor.sequential import Cusum
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


def _history(rng: np.random.Generator, onset: int, shift: float) -> Durations:
    """A TP group's kernel times: the median rank's wait for its peers swings with the model's compute jitter
    (here 0.4 in log units), the last rank's transfer does not; from ``onset`` on the transfer runs ``shift``
    longer (and so does the wait, within its jitter)."""
    h = Durations(deque())
    for t in range(40):
        late = shift if t >= onset else 0.0
        h.recent.append(KernelTime(t, 24, 13.0 + rng.normal(0.0, 0.4) + late, 12.0 + rng.normal(0.0, 0.03) + late,
                                   t < onset, "tp0"))
    h.judged_from = 0
    return h


def _alarm(measure: str, onset: int, step: int = -1) -> Alarm:
    c = Cusum()
    c.onset_ns = onset
    return Alarm(measure, 1, c, 3.0, step=step)


def test_a_slow_gpu_is_read_in_the_transfer_not_in_the_wait_for_peers():
    """A GPU 1.2x slower on NVLink: the arrival skew hides it in the median rank's kernel, the shortest kernel
    (the last rank to arrive ran the transfer only) shows it."""
    rng = np.random.default_rng(4)
    history = _history(rng, onset=24, shift=np.log(1.2))
    check = _check()
    assert check.is_slower(None, None, history, [_alarm(slowdown.GPU, 24)])
    assert not check.is_slower(None, None, history, [_alarm(slowdown.LATE, 24)])  # a late rank's cost is the wait


def test_healthy_kernel_times_are_seldom_slower():
    """Each reading is a test at 3 standard errors (by the median or by the mean): on healthy times it passes
    about 1 time in 300, never more than a few in 300 histories."""
    check = _check()
    passed = {m: sum(check.is_slower(None, None, _history(np.random.default_rng(seed), onset=24, shift=0.0),
                                     [_alarm(m, 24)]) for seed in range(300))
              for m in (slowdown.GPU, slowdown.LATE)}
    assert passed[slowdown.GPU] <= 3 and passed[slowdown.LATE] <= 6, passed


def _places(rng: np.random.Generator, onset: int, late_place: int, shift: float) -> Durations:
    """A TP group's four all-reduces per training step, each place with its own wait (the first after the
    optimizer waits for the ranks' host work, the others for the compute jitter only: levels 1-2 apart in log
    units, jitter 0.15 within a place); from ``onset`` on, the place ``late_place`` waits ``shift`` longer."""
    h = Durations(deque())
    levels = (14.0, 12.0, 13.0, 12.5)
    for t in range(72):
        place = t % 4
        late = shift if t >= onset and place == late_place else 0.0
        h.recent.append(KernelTime(t, 24, levels[place] + rng.normal(0.0, 0.15) + late, 12.0 + rng.normal(0.0, 0.03),
                                   t < onset, "tp0", place))
    h.judged_from = 0
    return h


def test_a_rank_late_into_one_place_of_the_step_is_read_at_that_place():
    """A rank late into the third all-reduce of each step: that place's waits are 1.4x longer, the others'
    untouched. Read against each place's own level and at the alarm's place it is slower; pooled, the spread
    between the places' levels hides it; read at another place nothing moved."""
    history = _places(np.random.default_rng(5), onset=48, late_place=2, shift=np.log(1.4))
    check = _check()
    assert check.is_slower(None, None, history, [_alarm(slowdown.LATE, 48, step=2)])
    assert not check.is_slower(None, None, history, [_alarm(slowdown.LATE, 48, step=0)])
    unplaced = Durations(deque(e._replace(step=-1) for e in history.recent), judged_from=0)
    assert not check.is_slower(None, None, unplaced, [_alarm(slowdown.LATE, 48)])


def test_healthy_places_are_seldom_slower():
    """The read at one place is the same 3-standard-error test: about 1 in 300 healthy histories passes."""
    check = _check()
    passed = sum(check.is_slower(None, None, _places(np.random.default_rng(seed), 48, 2, 0.0),
                                 [_alarm(slowdown.LATE, 48, step=seed % 4)]) for seed in range(300))
    assert passed <= 6, passed
