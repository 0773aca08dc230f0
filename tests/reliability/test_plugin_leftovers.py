"""Leftover ring files without an agent are bounded: the plugin's init removes this user's files of exited
processes when they are old (600 s), or when there are too many (more than 64; oldest first, none younger than
60 s). Never a live process's file, another user's, a symlink or its target, or a young dead one."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import numpy as np

from agent_shm import HEADER, MAGIC
from mycroft_otel.native import Driver

S = 1_000_000_000


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _ring_header(path: Path, pid: int, age_s: float, finalized: bool = False) -> None:
    """A ring file's header as the plugin writes it, last heartbeat `age_s` ago (enough for the cleanup's reader)."""
    h = np.zeros((), HEADER)
    now = time.monotonic_ns()
    h["magic"], h["pid"] = MAGIC, pid
    h["start_mono_ns"] = h["heartbeat_ns"] = now - int(age_s * S)
    if finalized:
        h["finalized_ns"] = now - int(age_s * S)
    path.write_bytes(h.tobytes() + b"\0" * 4096)
    os.chmod(path, 0o600)


def _init(plugin_so: str, ring_dir: Path) -> None:
    d = Driver(plugin_so)
    ctx = d.init("c", 0x77, 1, 2, 0, env={"MYCROFT_RING_DIR": str(ring_dir), "MYCROFT_LIVE_SLOTS": "1",
                                          "MYCROFT_RING_RECORDS": "16", "NCCL_HOSTID": "fresh"})
    d.finalize(ctx)


def test_old_dead_files_go_everything_else_stays(plugin_so, tmp_path):
    ring_dir = tmp_path / "rings"
    ring_dir.mkdir(mode=0o700)
    dead = _dead_pid()
    _ring_header(ring_dir / "old-dead.mycroft", dead, 700)
    _ring_header(ring_dir / "old-dead-finalized.mycroft", dead, 700, finalized=True)
    _ring_header(ring_dir / "young-dead.mycroft", dead, 5)
    _ring_header(ring_dir / "old-live.mycroft", os.getpid(), 700)          # a running (idle) process
    _ring_header(ring_dir / "old-live-parent.mycroft", os.getppid(), 700)
    _ring_header(ring_dir / "other-user.mycroft", dead, 700)
    os.chown(ring_dir / "other-user.mycroft", 4242, 4242)
    _ring_header(ring_dir / "not-a-ring.txt", dead, 700)                  # not ours by name
    outside = tmp_path / "outside.mycroft"
    _ring_header(outside, dead, 700)
    (ring_dir / "link.mycroft").symlink_to(outside)
    named_dead = f"node-r1-{dead}-00000000000000ab-r3-1.mycroft"  # the plugin's own naming (host with "-r")
    _ring_header(ring_dir / named_dead, dead, 700)
    named_live = f"node-{os.getpid()}-00000000000000ab-r0.mycroft"  # named for a live writer: skipped unread
    _ring_header(ring_dir / named_live, dead, 700)
    _init(plugin_so, ring_dir)
    left = {p.name for p in ring_dir.iterdir()}
    assert "old-dead.mycroft" not in left and "old-dead-finalized.mycroft" not in left
    assert named_dead not in left and named_live in left
    assert {"young-dead.mycroft", "old-live.mycroft", "old-live-parent.mycroft", "other-user.mycroft",
            "not-a-ring.txt", "link.mycroft"} <= left
    assert outside.exists() and outside.stat().st_size == HEADER.itemsize + 4096


def test_too_many_dead_files_are_cut_to_the_bound_oldest_first(plugin_so, tmp_path):
    ring_dir = tmp_path / "rings"
    ring_dir.mkdir(mode=0o700)
    dead = _dead_pid()
    for i in range(80):  # 80 dead writers, 120..199 s ago: over the count bound, none past the age bound
        _ring_header(ring_dir / f"dead-{i:03d}.mycroft", dead, 120 + i)
    for i in range(10):  # ... and 10 that died just now: kept whatever the count
        _ring_header(ring_dir / f"recent-{i}.mycroft", dead, 1)
    _init(plugin_so, ring_dir)
    left = sorted(p.name for p in ring_dir.iterdir() if p.name.startswith(("dead-", "recent-")))
    assert len(left) == 64
    assert all(f"recent-{i}.mycroft" in left for i in range(10))
    assert [n for n in left if n.startswith("dead-")] == [f"dead-{i:03d}.mycroft" for i in range(54)]
