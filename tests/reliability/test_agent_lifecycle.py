"""Ring lifecycle: a finished ring (finalized, or its process gone) is removed by the agent once its evidence
is exported, and the agent forgets it; a live process's ring is never removed.

A job that creates and destroys 1,000 communicators through the real plugin, on /dev/shm itself, leaves the
ring directory as it started.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mycroft_otel._native")

from agent_helpers import make_agent  # noqa: E402
from events import Seq, ring_allreduce  # noqa: E402
from mycroft_otel import semconv as sc  # noqa: E402
from mycroft_otel.agent.source import default_reader_factory  # noqa: E402
from mycroft_otel.native import Driver  # noqa: E402
from native_support import ROOT  # noqa: E402

WRITER = Path(__file__).resolve().parents[1] / "native" / "writer.py"


def _settle(agent, ring_dir: Path, rounds: int = 100) -> None:
    """Poll and flush until the ring directory is empty (or give up after `rounds`)."""
    for _ in range(rounds):
        agent.poll_once()
        assert agent.queue.flush(10)
        if not os.listdir(ring_dir) and not agent.ctxs:
            return
        time.sleep(0.02)


@pytest.fixture
def shm_ring_dir():
    d = Path(f"/dev/shm/mycroft-reliability-{os.getpid()}")
    shutil.rmtree(d, ignore_errors=True)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_a_thousand_communicators_leave_dev_shm_as_it_started(plugin_so, otel_env, shm_ring_dir, tmp_path):
    shm_before = sorted(os.listdir("/dev/shm"))
    d = Driver(plugin_so)
    env = {"MYCROFT_RING_DIR": str(shm_ring_dir), "MYCROFT_LIVE_SLOTS": "4", "MYCROFT_RING_RECORDS": "16"}
    agent = make_agent(shm_ring_dir, reader_factory=default_reader_factory, sample_ratio=1.0,
                       idle_after_ms=600000, state_dir=tmp_path / "agent-state")
    n = 0
    for _ in range(10):
        ctxs = []
        for _ in range(100):
            ctx = d.init(f"comm{n}", 0x100000 + n, 1, 2, 0, env=env)
            q = Seq()
            ring_allreduce(q, ctx, 0, 2, 0, n_channels=1, steps=2)
            d.reset_slots()
            st = d.replay(q.array())
            assert st["errors"] == 0
            ctxs.append(ctx)
            n += 1
        agent.poll_once()  # the agent sees them alive ...
        assert len(os.listdir(shm_ring_dir)) == 100
        for ctx in ctxs:
            d.finalize(ctx)  # ... then the communicators are destroyed
        agent.poll_once()
        assert agent.queue.flush(10)
        agent.poll_once()
    _settle(agent, shm_ring_dir)
    assert os.listdir(shm_ring_dir) == []
    assert agent.health.rings_removed == 1000
    # the agent's memory for retired rings is released
    assert agent.ctxs == {} and agent.discovery.known == {} and agent.store.data == {}
    ops = [s for s in otel_env.sink.spans if s["name"] == "nccl.AllReduce"]
    assert len(ops) == 1000  # every communicator's evidence was exported before its file went
    agent.close()
    os.rmdir(shm_ring_dir)  # created by the first init; empty now
    # other work on this machine may touch /dev/shm meanwhile: what this job created is gone
    assert not set(os.listdir("/dev/shm")) - set(shm_before)


def test_a_killed_process_ring_is_removed_after_its_exit_is_reported(plugin_so, otel_env, tmp_path):
    ring_dir = tmp_path / "rings"
    p = subprocess.Popen([sys.executable, str(WRITER), plugin_so, str(ring_dir), "inflight"], stdout=subprocess.PIPE,
                         text=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(WRITER.parent)])))
    try:
        assert p.stdout.readline().strip() == "READY"
        agent = make_agent(ring_dir, reader_factory=default_reader_factory, sample_ratio=1.0, inflight_after_ms=1,
                           snapshot_ms=10, idle_after_ms=600000)
        for _ in range(20):  # a live (here: stalled) process's ring is followed, never removed
            agent.poll_once()
            time.sleep(0.01)
        assert agent.queue.flush(10)
        assert len(os.listdir(ring_dir)) == 1 and agent.health.rings_removed == 0
        os.kill(p.pid, signal.SIGSTOP)  # frozen is alive too
        for _ in range(5):
            agent.poll_once()
        assert len(os.listdir(ring_dir)) == 1
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)
    finally:
        if p.poll() is None:
            p.kill()
    _settle(agent, ring_dir)
    assert os.listdir(ring_dir) == [] and agent.ctxs == {}
    exited = [s for s in otel_env.sink.spans if s["name"] == sc.STATUS_SPAN
              and s["attrs"].get(sc.STATUS_KIND) == sc.STATUS_PROCESS_EXITED]
    assert exited  # the evidence went out before the file did
    agent.close()
