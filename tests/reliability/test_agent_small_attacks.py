"""Smaller attacks on the agent program, from outside: 1,000 rings born and finished between two polls, a ring
head rewritten to 2^62, and 500 idle connections to the metrics port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("mycroft_otel._native")

from agent_process import ROOT, AgentProcess  # noqa: E402
from agent_shm import FakeRing  # noqa: E402

SHORT_LIVED = 1000

WRITER = r"""
import sys
from agent_shm import FakeRing
d, n = sys.argv[1], int(sys.argv[2])
for i in range(n):  # a communicator created, used once and destroyed, then the process exits
    r = FakeRing(f"{d}/short-{i:04d}.mycroft", rank=0, nranks=1, comm_hash=0x5400000 + i, live_slots=1, ring_capacity=4)
    r.op_done()
    r.finalize()
    r.close()
"""


def test_short_lived_rings_a_huge_ring_head_and_idle_metrics_clients(tmp_path, otel_env):
    ring_dir = tmp_path / "rings"
    ring_dir.mkdir(mode=0o700)
    liar = FakeRing(ring_dir / "liar.mycroft", rank=0, nranks=1, comm_hash=0x11A2, ring_capacity=16)
    liar.op_done()
    # polls 2 s apart: every short-lived ring is born, finished and its writer gone between two of them
    agent = AgentProcess(ring_dir, tmp_path / "state", env={
        "MYCROFT_SAMPLE_RATIO": "1", "MYCROFT_IDLE_AFTER_MS": "600000", "MYCROFT_POLL_MS": "2000"}).start()
    idle: list[socket.socket] = []
    try:
        agent.wait_metric("sources", lambda v: v >= 1)
        liar.h["ring_head"] = 1 << 62
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests" / "agent")]))
        subprocess.run([sys.executable, "-c", WRITER, str(ring_dir), str(SHORT_LIVED)], env=env, check=True,
                       timeout=300)
        m = agent.wait_metric("rings_removed", lambda v: v >= SHORT_LIVED, timeout_s=240)
        short_ops = [s for s in otel_env.sink.spans if s["name"] == "nccl.AllReduce"
                     and s["resource"]["mycroft.comm.hash"] != "00000000000011a2"]
        assert len(short_ops) == SHORT_LIVED  # read before removal: each ring's one op (was: 699 of 1,000 lost)
        assert sorted(os.listdir(ring_dir)) == ["liar.mycroft"]
        assert m["rings_skipped"] == 0
        # 2^62 in one ring head: no more drops than completions its writer could have made (one a microsecond)
        alive_s = (time.monotonic_ns() - int(liar.h["start_mono_ns"])) / 1e9
        assert 0 < m["dropped_ring"] <= alive_s * 1e6, m["dropped_ring"]  # (was 4.6e18)
        assert m["ring_backlog"] <= 16
        threads_before = agent.status("Threads")
        for _ in range(500):  # clients that connect and never send a request
            idle.append(socket.create_connection(("127.0.0.1", agent.metrics_port)))
        time.sleep(1.0)
        threads = agent.status("Threads")
        scrape = agent.metrics()  # answered beside them
        assert threads <= threads_before + 2, (threads_before, threads)  # (was 3,010 threads for 3,000 clients)
        assert "polls" in scrape
        print(f"\n{SHORT_LIVED} short-lived rings: {len(short_ops)} ops exported, {m['rings_removed']:.0f} removed; "
              f"dropped_ring {m['dropped_ring']:.3g} after {alive_s:.0f} s; threads {threads_before} -> {threads} "
              f"with 500 idle metrics clients")
    finally:
        for s in idle:
            s.close()
        agent.stop()
        liar.close()
