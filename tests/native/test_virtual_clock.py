"""Virtual time through the ABI driver: the plugin stamps every record with the driver's clock.

The driver sets its clock to each row's time (epoch + t_ns) before delivering the row, so the rings
hold exactly those times; without a virtual clock the plugin reads CLOCK_MONOTONIC/REALTIME again.
"""

from __future__ import annotations

import numpy as np
import pytest

from events import Seq, ring_allreduce
from mycroft_otel import native
from mycroft_otel.native import Driver, EventType as T, Op

EPOCH = 5_000_000_000_000                  # virtual CLOCK_MONOTONIC at t = 0
REAL = 1_767_225_600_000_000_000           # its CLOCK_REALTIME


def _read(ring_dir):
    files = native.ring_files(ring_dir)
    assert len(files) == 1
    r = native.open_ring(files[0])
    try:
        recs = [x[0] for x in native.drain(r)]
        return native.read_header(r), np.concatenate(recs) if recs else []
    finally:
        r.close()


def _t(rows, sel) -> list[int]:
    return [int(x) for x in rows["t_ns"][sel]]


def test_ring_times_are_the_drivers_times(plugin_so, ring_dir):
    d = Driver(plugin_so)
    d.use_virtual_clock(EPOCH, REAL - EPOCH)
    try:
        assert d.virtual and d.time_ns == EPOCH
        ctx = d.init("vt", 0xABC, 1, 2, 0, env={"MYCROFT_RING_DIR": str(ring_dir)})
        q = Seq()
        ring_allreduce(q, ctx, 0, 2, 0, n_channels=2, steps=3)
        rows = q.array()
        # every row at its own time, ~8 s apart: paced, this replay would take 11 minutes
        rows["t_ns"] = 1_000 + 7_919_000_000 * np.arange(len(rows), dtype=np.uint64)
        st = d.replay(rows, EPOCH)
        assert st["errors"] == 0 and st["missing_slot"] == 0 and st["max_late_ns"] == 0  # nothing paced
        assert d.time_ns == EPOCH + int(rows["t_ns"][-1])
        h, recs = _read(ring_dir)
        assert h.start_mono_ns == EPOCH and h.start_realtime_ns == REAL
        assert len(recs) == 1
        op = recs[0]["op"]
        start = (rows["op"] == Op.START)
        stop = (rows["op"] == Op.STOP)
        coll_slot = int(rows["slot"][start & (rows["type"] == T.Coll)][0])
        assert int(op["api_ns"]) == EPOCH + _t(rows, start & (rows["type"] == T.CollApi))[0]
        assert int(op["start_ns"]) == EPOCH + _t(rows, start & (rows["type"] == T.Coll))[0]
        assert int(op["launch_ns"]) == EPOCH + _t(rows, stop & (rows["slot"] == coll_slot))[0]
        assert int(op["end_ns"]) == EPOCH + int(rows["t_ns"][-1])  # the last KernelCh stop completes it
        # per flow: first step posted, last step done, at the times of those rows
        ops = rows["slot"][start & (rows["type"] == T.ProxyOp)]
        for f in recs[0]["flows"][: int(op["n_flows"])]:
            want = [s for s in ops if int(rows["channel"][rows["slot"] == s][0]) == int(f["channel"])
                    and int(rows["is_send"][rows["slot"] == s][0]) == (int(f["dir"]) == 0)]
            assert len(want) == 1
            steps = rows["slot"][start & (rows["type"] == T.ProxyStep) & (rows["parent_slot"] == want[0])]
            assert int(f["first_ns"]) == EPOCH + _t(rows, start & (rows["slot"] == steps[0]))[0]
            assert int(f["end_ns"]) == EPOCH + _t(rows, stop & (rows["slot"] == steps[-1]))[0]
        d.time_ns = EPOCH + 10 ** 13
        assert d.finalize(ctx) == 0
        assert _read(ring_dir)[0].finalized_ns == EPOCH + 10 ** 13
    finally:
        d.release_clock()
    assert not d.virtual


def test_real_clocks_again_after_release(plugin_so, ring_dir):
    d = Driver(plugin_so)
    d.use_virtual_clock(EPOCH, 0)
    d.release_clock()
    with pytest.raises(RuntimeError, match="not on virtual time"):
        d.time_ns = 5
    before = native.monotonic_ns()
    ctx = d.init("rt", 0xDEF, 1, 2, 0, env={"MYCROFT_RING_DIR": str(ring_dir)})
    after = native.monotonic_ns()
    h, _ = _read(ring_dir)
    assert before <= h.start_mono_ns <= after
    d.finalize(ctx)


def test_one_clock_per_process(plugin_so):
    a, b = Driver(plugin_so), Driver(plugin_so)
    a.use_virtual_clock(EPOCH, 0)
    try:
        with pytest.raises(RuntimeError, match="already sets the plugin's clock"):
            b.use_virtual_clock(EPOCH, 0)
    finally:
        a.release_clock()
    b.use_virtual_clock(EPOCH, 0)  # free again
    b.release_clock()


def test_a_plugin_without_the_entry_point_is_named(recorder_so):
    with pytest.raises(ValueError, match="mycroftProfilerSetClock"):
        Driver(recorder_so).use_virtual_clock(EPOCH, 0)
