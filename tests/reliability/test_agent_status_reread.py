"""A ring truncated between its own read and the poll's finalize check (the header re-read in ``_status``) is
given up on its own: the rest of the poll, and every other ring's spans of it, go on (issue #31).

The real agent program against real files and a real OTLP receiver. From outside, the truncation cannot be
aimed at the re-read: a ring cut before its read fails there (already guarded per ring). So the test widens the
window (100 idle rings read between one ring's read and its re-read, polls back to back), cuts rings one at a
time until the agent's DEBUG log shows a re-read that failed (a traceback through ``refresh_header``), while a
victim ring completes collectives all along.
"""

from __future__ import annotations

import os
import random
import time

import pytest

pytest.importorskip("mycroft_otel._native")

from agent_process import AgentProcess  # noqa: E402
from agent_shm import FakeRing  # noqa: E402
from mycroft_otel import ids  # noqa: E402
from mycroft_otel import semconv as sc  # noqa: E402

VICTIM_COMM = 0x0F00D0000000031
FILLERS = 100  # idle rings: their reads and status checks are the window between a ring's read and its re-read
HOSTILE = 40   # rings cut one at a time until one is cut inside the window


def test_a_ring_cut_before_its_finalize_re_read_fails_only_itself(tmp_path, otel_env):
    ring_dir = tmp_path / "rings"
    ring_dir.mkdir(mode=0o700)
    victim = FakeRing(ring_dir / "a-victim.mycroft", rank=0, nranks=1, comm_hash=VICTIM_COMM, ring_capacity=4096,
                      job_id="victim-job")
    rings = [FakeRing(ring_dir / f"b-idle-{i:03d}.mycroft", rank=0, nranks=1, comm_hash=0x1D1E000 + i,
                      live_slots=1, ring_capacity=4) for i in range(FILLERS)]
    hostile = [FakeRing(ring_dir / f"c-cut-{i:03d}.mycroft", rank=0, nranks=1, comm_hash=0xC070000 + i,
                        live_slots=1, ring_capacity=4) for i in range(HOSTILE)]
    total = 1 + FILLERS + HOSTILE
    agent = AgentProcess(ring_dir, tmp_path / "state", log_level="DEBUG", env={
        "MYCROFT_SAMPLE_RATIO": "1", "MYCROFT_IDLE_AFTER_MS": "600000", "MYCROFT_PEER_EXPORT": "0",
        "MYCROFT_POLL_MS": "1"}).start()
    rng = random.Random(31)
    ops = cut = 0
    t0 = time.monotonic()
    try:
        agent.wait_metric("sources", lambda v: v >= total, timeout_s=120)

        def victim_writes(seconds: float) -> None:  # a completion every ~2 ms: every poll has victim spans
            nonlocal ops
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                victim.op_done()
                ops += 1
                time.sleep(0.002)

        def re_read_failures() -> int:
            return agent.log().count("in refresh_header")

        victim_writes(0.5)
        for ring in hostile:
            victim_writes(rng.uniform(0.05, 0.15))
            os.truncate(ring.path, 4096)  # below the mapping: every later access of this ring fails
            cut += 1
            victim_writes(0.1)
            if re_read_failures():
                break
        victim_writes(0.5)
        m = agent.wait_metric("sources", lambda v: v <= total - cut, timeout_s=30)
        hits = re_read_failures()
        assert hits >= 1, f"no cut landed inside the window in {cut} tries\n{agent.log()[-3000:]}"
        victim_hex = ids.comm_hash_hex(VICTIM_COMM)

        def victim_ops(spans):
            return [s for s in spans if s["name"] == "nccl.AllReduce" and s["resource"].get(sc.COMM_HASH) == victim_hex]

        otel_env.sink.wait_for(lambda s: len(victim_ops(s)) >= ops, timeout=30)
        seqs = sorted(s["attrs"][sc.COLL_SEQ] for s in victim_ops(otel_env.sink.spans))
        log = agent.log()
        assert seqs == list(range(ops)), (f"{len(seqs)} of {ops} victim spans, {len(set(seqs))} distinct",
                                          log[-3000:])  # every one, exactly once (was: a poll's spans lost)
        assert agent.proc.poll() is None
        assert "poll failed" not in log  # the failure stayed the ring's own
        # counted: every cut ring given up (no longer among the followed sources), the victim and idle rings kept
        assert m["sources"] == total - cut and m["dropped_ring"] == 0
        assert log.count("giving up") == cut
        polls = m["polls"]
        agent.wait_metric("polls", lambda v: v > polls + 10)  # and it keeps polling
        print(f"\n{cut} rings cut, {hits} inside the re-read window; {len(seqs)} of {ops} victim spans exported "
              f"once; sources {m['sources']:.0f} of {total}; {time.monotonic() - t0:.1f} s")
    finally:
        agent.stop()
        for r in [victim, *rings, *hostile]:
            r.close()
