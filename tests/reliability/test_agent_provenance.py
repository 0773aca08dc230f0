"""A ring speaks only for its owner: another user's forged rings, claiming a victim's job, host and
communicator, are exported as that user's, never into the victim's traces.

The real agent program (root, as a node agent runs) follows a directory holding the victim's ring and two
rings owned by another uid: one naming that user's own process (whose environment says its real job), one
naming the victim's process.
"""

from __future__ import annotations

import os
import socket

import pytest

pytest.importorskip("mycroft_otel._native")

from agent_process import AgentProcess, spawn_as  # noqa: E402
from agent_shm import FakeRing  # noqa: E402
from mycroft_otel import semconv as sc  # noqa: E402

MALLORY = 4243
COMM = 0x5EC0DE0000000042
OPS = 5


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: files and a process of another uid")
def test_a_forged_ring_carries_its_owner_and_never_joins_another_job(tmp_path, otel_env):
    ring_dir = tmp_path / "rings"
    ring_dir.mkdir(mode=0o755)
    mallory = spawn_as(MALLORY, ["sleep", "300"],
                       env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "MYCROFT_JOB_ID": "mallory-job"})
    rings = []
    try:
        # the victim: root's job (the agent's own user), rank 0 of a 2-rank communicator
        rings.append(FakeRing(ring_dir / "victim.mycroft", rank=0, nranks=2, comm_hash=COMM, job_id="victim-job",
                              host="victim-host"))
        # forged: rank 1 of the victim's communicator, claiming its job and host, naming mallory's own process
        rings.append(FakeRing(ring_dir / "forged-own.mycroft", rank=1, nranks=2, comm_hash=COMM, job_id="victim-job",
                              host="victim-host", pid=mallory.pid))
        # forged: naming the victim's process (this test's) as its writer
        rings.append(FakeRing(ring_dir / "forged-victim-pid.mycroft", rank=1, nranks=2, comm_hash=COMM,
                              job_id="victim-job", host="victim-host", pid=os.getpid()))
        for r in rings[1:]:
            os.chown(r.path, MALLORY, MALLORY)
        for _ in range(OPS):
            for r in rings:
                r.op_done()
        agent = AgentProcess(ring_dir, tmp_path / "state", env={
            "MYCROFT_SAMPLE_RATIO": "1", "MYCROFT_IDLE_AFTER_MS": "600000", "MYCROFT_PEER_EXPORT": "0"}).start()
        try:
            ops = lambda spans: [s for s in spans if s["name"] == "nccl.AllReduce"]  # noqa: E731
            assert otel_env.sink.wait_for(lambda s: len(ops(s)) >= 3 * OPS, timeout=60), agent.log()[-3000:]
        finally:
            agent.stop()
        by_pid = {}
        for s in ops(otel_env.sink.spans):
            by_pid.setdefault((s["resource"][sc.PROCESS_PID], s["resource"][sc.RING_OWNER_UID]), []).append(s)
        victim = by_pid.pop((os.getpid(), 0))
        own = by_pid.pop((mallory.pid, MALLORY))
        liar = by_pid.pop((os.getpid(), MALLORY))
        assert not by_pid and len(victim) == len(own) == len(liar) == OPS
        victim_traces = {s["trace_id"] for s in victim}
        for s in victim:
            assert s["resource"][sc.JOB_ID] == "victim-job" and s["resource"][sc.RING_VERIFIED] is True
        for s in own:  # mallory's own process: the job its environment says, the agent's host
            r = s["resource"]
            assert r[sc.JOB_ID] == "mallory-job" and r[sc.HOST_NAME] == socket.gethostname()
            assert r[sc.RING_CLAIMED_JOB_ID] == "victim-job" and r[sc.RING_CLAIMED_HOST] == "victim-host"
            assert r[sc.RING_VERIFIED] is True
        for s in liar:  # names a process that is not mallory's: no job at all, unverified
            r = s["resource"]
            assert r[sc.JOB_ID] == "" and r[sc.RING_VERIFIED] is False and r[sc.HOST_NAME] == socket.gethostname()
        # same communicator hash and sequence numbers, yet never the victim's traces
        assert not victim_traces & {s["trace_id"] for s in own + liar}
    finally:
        mallory.kill()
        mallory.wait(10)
        for r in rings:
            r.close()
