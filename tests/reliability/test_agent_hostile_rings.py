"""Ring files are hostile input: mutated, truncated, sparse-huge, FIFO and symlinked files in the ring
directory leave the agent running and every other ring exporting.

The agent reads through the real bindings (``_native.RingReader``, shm_reader.h); the rings are written in
the plugin's exact layout by the agent tests' writer (agent_shm.FakeRing), so a test can change them at will.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

_native = pytest.importorskip("mycroft_otel._native")

from agent_helpers import make_agent  # noqa: E402
from agent_shm import HEADER, LAYOUT_VERSION, LIVE, RECORD, FakeRing  # noqa: E402
from mycroft_otel.agent.source import default_reader_factory  # noqa: E402
from native_support import run_isolated  # noqa: E402


def _agent(ring_dir):
    return make_agent(ring_dir, reader_factory=default_reader_factory, sample_ratio=1.0,
                      idle_after_ms=600000)


def _poll(agent, n=1):
    for _ in range(n):
        t = threading.Thread(target=agent.poll_once)  # a blocking open (FIFO) must not stall the loop
        t.start()
        t.join(30)
        assert not t.is_alive(), "a poll blocked"


def _good_ops(sink, rank: int) -> int:
    return sum(1 for s in sink.spans if s["name"] == "nccl.AllReduce"
               and rank in (s["resource"].get("mycroft.rank"), s["attrs"].get("mycroft.rank")))


def test_files_changed_after_open_leave_the_agent_and_the_other_rings_working(tmp_path, otel_env):
    ring_dir = tmp_path / "rings"
    ring_dir.mkdir(mode=0o700)
    good = FakeRing(ring_dir / "good.mycroft", rank=0, nranks=3)
    cut = FakeRing(ring_dir / "cut.mycroft", rank=1, nranks=3)
    mut = FakeRing(ring_dir / "mutated.mycroft", rank=2, nranks=3)
    for r in (good, cut, mut):
        r.op_done()
    agent = _agent(ring_dir)
    _poll(agent)
    assert len(agent.ctxs) == 3 and not any(c.done for c in agent.ctxs.values())
    # after open: one file cut to a page (the SIGBUS case), one rewritten with an absurd geometry and ring head,
    # a live slot claiming 255 flows, a record claiming a huge sequence
    os.truncate(ring_dir / "cut.mycroft", 4096)
    mut.h["live_slots"], mut.h["ring_capacity"] = 600000, 1 << 30
    mut.h["live_offset"], mut.h["ring_offset"], mut.h["file_size"] = 1 << 31, 0xFFFFFFFF, 1 << 62
    mut.h["ring_head"] = 1 << 62
    slot = mut.begin(mut.make_op())
    mut.live[slot]["op"]["n_flows"] = 255
    mut.ring[0]["seq"] = (1 << 63) - 1
    for _ in range(3):
        good.op_done()
    _poll(agent, 3)
    assert agent.queue.flush(10)
    assert _good_ops(otel_env.sink, 0) == 4  # every op of the healthy ring, once
    cut_ctx = agent.ctxs[str(ring_dir / "cut.mycroft")]
    assert cut_ctx.done and "shrank" in cut_ctx.src.broken
    good.op_done()
    _poll(agent)
    assert agent.queue.flush(10)
    assert _good_ops(otel_env.sink, 0) == 5
    agent.close()


def test_sparse_huge_fifo_and_symlinked_files_are_refused_quickly(tmp_path, otel_env):
    ring_dir = tmp_path / "rings"
    ring_dir.mkdir(mode=0o700)
    good = FakeRing(ring_dir / "good.mycroft", rank=0, nranks=2)
    good.op_done()
    # sparse-huge: a consistent header for 200,000 live slots (50x the plugin's bound; the offsets are u32) on a
    # sparse file of gigabytes
    h = np.zeros((), HEADER)
    h["magic"], h["layout_version"], h["header_size"] = 0x315446524359434D, LAYOUT_VERSION, HEADER.itemsize
    live_off = (HEADER.itemsize + 63) & ~63
    h["live_slots"], h["ring_capacity"] = 200000, 16
    h["live_offset"], h["ring_offset"] = live_off, live_off + 200000 * LIVE.itemsize
    h["file_size"] = int(h["ring_offset"]) + 16 * RECORD.itemsize
    with open(ring_dir / "huge.mycroft", "wb") as f:
        f.write(h.tobytes())
        f.truncate(int(h["file_size"]))
    os.mkfifo(ring_dir / "fifo.mycroft", 0o600)
    victim = tmp_path / "victim"
    victim.write_bytes(b"not yours")
    (ring_dir / "link.mycroft").symlink_to(victim)
    agent = _agent(ring_dir)
    _poll(agent, 2)
    assert agent.queue.flush(10)
    assert _good_ops(otel_env.sink, 0) == 1
    assert agent.health.bad_files == 1  # the huge one (FIFO and symlink are not even candidates)
    assert list(agent.ctxs) == [str(ring_dir / "good.mycroft")]
    assert victim.read_bytes() == b"not yours"
    # the reader refuses them on its own too (the agent's scan is not the only line)
    for name, why in (("huge.mycroft", "out of the plugin's bounds"), ("fifo.mycroft", "not a regular file"),
                      ("link.mycroft", "symbolic link")):
        with pytest.raises(ValueError, match=why):
            _native.RingReader(str(ring_dir / name))
    agent.close()


TRUNCATE_RACE = r"""
import os, sys, threading, time
from mycroft_otel import _native
path, size = sys.argv[1], int(sys.argv[2])
stop = False
def cut():
    while not stop:
        os.truncate(path, 4096)
        os.truncate(path, size)
t = threading.Thread(target=cut); t.start()
opened = broken = 0
end = time.monotonic() + 2
while time.monotonic() < end:
    try:
        r = _native.RingReader(path)
    except ValueError:
        continue
    opened += 1
    try:
        for _ in range(20):
            r.live(); r.read(0, 64); r.header()
    except ValueError:
        broken += 1
stop = True; t.join()
print(opened, broken)
"""


def test_truncation_racing_the_reader_never_kills_the_reading_process(tmp_path):
    """In instrument() mode this reader runs inside the training process: a SIGBUS there would kill the job."""
    ring = FakeRing(tmp_path / "r.mycroft", rank=0, nranks=2)
    ring.op_done()
    size = os.path.getsize(ring.path)
    p = run_isolated(["-c", TRUNCATE_RACE, ring.path, str(size)], timeout=60)
    assert p.returncode == 0, f"reader process died (rc {p.returncode}): {p.stderr[-2000:]}"
    opened, broken = map(int, p.stdout.split())
    assert opened > 0 and broken > 0
