"""Hang evidence: in-flight snapshots, not_entered and process_exited status spans, in the right traces."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mycroft_otel import ids
from mycroft_otel import semconv as sc
from agent_helpers import make_agent
from agent_shm import FakeRing

JOB, COMM = "job-1", 0x5F3A9C0E12AB44D1
HERE = Path(__file__).parent
FAST = dict(poll_ms=50, inflight_after_ms=300, snapshot_ms=300, idle_after_ms=300, sample_ratio=0.0)


class Running:
    def __init__(self, agent):
        self.agent = agent
        self.stop = threading.Event()
        self.t = threading.Thread(target=agent.run, args=(self.stop,), daemon=True)
        self.t0 = time.monotonic()
        self.t.start()

    def close(self):
        self.stop.set()
        self.t.join(5)
        self.agent.close(2)


def _writer(path: Path, rank: int, nranks: int, n_done: int, inflight: bool) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, str(HERE / "writer_proc.py"), str(path), str(rank), str(nranks),
                          str(n_done), "1" if inflight else "0"], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def test_stalled_op_snapshots_and_not_entered(tmp_path, otel_env):
    # rank 0 is stuck in collective 5 (GPU stall); rank 1 completed 0..4 and never enters 5
    r0 = FakeRing(tmp_path / "r0", rank=0, nranks=2)
    r1 = FakeRing(tmp_path / "r1", rank=1, nranks=2)
    for _ in range(5):
        r0.op_done()
        r1.op_done()
    r0.begin(r0.make_op(done=3, wait_state=(1, 6)))
    run = Running(make_agent(tmp_path, **FAST))
    trace = ids.coll_trace_id(JOB, COMM, 5)
    sink = otel_env.sink
    # threshold 0.3 s: first snapshot within one poll, and a second within one more snapshot period
    assert sink.wait_for(lambda s: sum(x["name"] == sc.INFLIGHT_SPAN for x in s) >= 2, timeout=0.3 + 2 * 0.3 + 1.0)
    assert sink.wait_for(lambda s: any(x["name"] == sc.STATUS_SPAN for x in s), timeout=2)
    elapsed = time.monotonic() - run.t0
    run.close()
    snaps = sink.named(sc.INFLIGHT_SPAN)
    assert {s["trace_id"] for s in snaps} == {trace}
    ks = sorted(s["attrs"][sc.SNAPSHOT_SEQ] for s in snaps)
    assert ks[:2] == [0, 1]
    s0 = snaps[0]
    a = s0["attrs"]
    assert s0["span_id"] == ids.span_id(trace, 0, sc.ROLE_INFLIGHT, a[sc.SNAPSHOT_SEQ])
    assert a[sc.OP_STATE] == "in_flight" and a[sc.RANK] == 0 and a[sc.COLL_SEQ] == 5
    assert a[sc.ANOMALY] == sc.ANOMALY_STALLED
    assert a[sc.FLOW_WAIT_STATE] == ["SendGpuWait", "SendGpuWait", "RecvGpuWait", "RecvGpuWait"]
    assert a[sc.FLOW_DONE] == [3, 3, 3, 3] and a[sc.TIME_END] == 0
    # in flight, what a completed op leaves out says where it stands: the step each flow waits on, since when
    # (after the op's start), and the ProxyOps and kernels not stopped yet
    own = s0["span_attrs"]
    assert own[sc.FLOW_WAIT_STEP] == [3, 3, 3, 3] and all(s0["start"] <= t for t in a[sc.FLOW_WAIT_SINCE])
    assert own[sc.PROXY_OPS] == [4, 0] and own[sc.KERNEL_CHANNELS] == [2, 0] and sc.FLOW_END not in own  # none yet
    roles = [lk["attrs"][sc.LINK_ROLE] for lk in s0["links"]]
    assert roles[0] == sc.LINK_SNAPSHOT_OF and s0["links"][0]["span_id"] == ids.span_id(trace, 0, sc.ROLE_OP)
    assert sorted(roles[1:]) == ["recv_from", "send_to"]  # its one peer, fed and waited on, over both channels
    status = sink.named(sc.STATUS_SPAN)
    assert all(s["trace_id"] == trace for s in status)
    st = status[0]["attrs"]
    assert st[sc.STATUS_KIND] == sc.STATUS_NOT_ENTERED and st[sc.RANK] == 1
    assert st[sc.STATUS_LAST_SEQ] == 4 and st[sc.COLL_SEQ] == 5
    assert status[0]["span_id"] == ids.span_id(trace, 1, sc.ROLE_STATUS, 0)
    assert elapsed < 5


def test_whole_comm_idle_is_not_evidence(tmp_path, otel_env):
    rings = [FakeRing(tmp_path / f"r{r}", rank=r, nranks=2) for r in range(2)]
    for _ in range(3):
        for ring in rings:
            ring.op_done()
    run = Running(make_agent(tmp_path, **FAST))
    time.sleep(1.0)
    run.close()
    assert otel_env.sink.named(sc.STATUS_SPAN) == []


def test_completed_after_snapshots_is_exported_as_anomalous(tmp_path, otel_env):
    ring = FakeRing(tmp_path / "r0", rank=0, nranks=2)
    rec = ring.make_op(done=3, wait_state=(1, 4))
    slot = ring.begin(rec)
    run = Running(make_agent(tmp_path, **FAST))
    assert otel_env.sink.wait_for(lambda s: any(x["name"] == sc.INFLIGHT_SPAN for x in s), timeout=3)
    done = ring.make_op(seq=0, start_ns=int(rec["op"]["start_ns"]), end_ns=time.monotonic_ns())
    done["op"]["op_id"] = rec["op"]["op_id"]
    ring.complete(done, slot)
    assert otel_env.sink.wait_for(lambda s: any(x["name"] == "nccl.AllReduce" for x in s), timeout=3)
    run.close()
    span = otel_env.sink.named("nccl.AllReduce")[0]
    assert span["attrs"][sc.ANOMALY] in (sc.ANOMALY_STALLED, sc.ANOMALY_SLOW)
    assert span["span_id"] == ids.span_id(ids.coll_trace_id(JOB, COMM, 0), 0, sc.ROLE_OP)


@pytest.mark.parametrize("inflight", [True, False])
def test_sigkill_gives_process_exited(tmp_path, otel_env, inflight):
    p = _writer(tmp_path / "r0", 0, 2, 4, inflight)
    peer = FakeRing(tmp_path / "r1", rank=1, nranks=2)
    for _ in range(4):
        peer.op_done()
    peer.begin(peer.make_op(done=2, wait_state=(2, 4)))  # the peer waits in collective 4
    run = Running(make_agent(tmp_path, **FAST))
    time.sleep(0.5)
    p.kill()
    p.wait()
    t_kill = time.monotonic()
    trace = ids.coll_trace_id(JOB, COMM, 4)
    ok = otel_env.sink.wait_for(lambda s: any(x["name"] == sc.STATUS_SPAN and x["attrs"][sc.STATUS_KIND] ==
                                              sc.STATUS_PROCESS_EXITED for x in s), timeout=3)
    latency = time.monotonic() - t_kill
    time.sleep(0.4)
    run.close()
    assert ok
    assert latency < 2 * 0.3 + 0.2
    exited = [s for s in otel_env.sink.named(sc.STATUS_SPAN) if s["attrs"][sc.STATUS_KIND] == "process_exited"]
    assert {s["trace_id"] for s in exited} == {trace}
    assert {s["span_id"] for s in exited} == {ids.span_id(trace, 0, sc.ROLE_STATUS, 1)}
    a = exited[0]["attrs"]
    assert a[sc.RANK] == 0 and a[sc.STATUS_LAST_SEQ] == 3 and a[sc.COLL_SEQ] == 4
    if inflight:
        assert "SendGpuWait" in a[sc.STATUS_LAST_STATE] and a[sc.COLL_FUNC] == "AllReduce"
        final = [s for s in otel_env.sink.named(sc.INFLIGHT_SPAN) if s["attrs"][sc.RANK] == 0]
        assert final and final[-1]["attrs"][sc.FLOW_DONE] == [3, 3, 3, 3]
    # the waiting peer keeps producing snapshots in the same trace
    assert any(s["attrs"][sc.RANK] == 1 and s["trace_id"] == trace for s in otel_env.sink.named(sc.INFLIGHT_SPAN))


def test_sigstop_frozen_writer(tmp_path, otel_env):
    p = _writer(tmp_path / "r0", 0, 2, 2, True)
    try:
        os.kill(p.pid, signal.SIGSTOP)
        t_stop = time.monotonic()
        run = Running(make_agent(tmp_path, **FAST))
        trace = ids.coll_trace_id(JOB, COMM, 2)
        ok = otel_env.sink.wait_for(lambda s: any(x["name"] == sc.INFLIGHT_SPAN and
                                                  x["attrs"].get(sc.PROCESS_STOPPED) for x in s), timeout=3)
        latency = time.monotonic() - t_stop
        run.close()
        assert ok and latency < 0.3 + 2 * 0.3 + 0.5
        snaps = otel_env.sink.named(sc.INFLIGHT_SPAN)
        assert all(s["trace_id"] == trace for s in snaps)
        assert snaps[0]["attrs"][sc.ANOMALY] == sc.ANOMALY_STALLED
        assert otel_env.sink.named(sc.STATUS_SPAN) == []  # stopped is not exited
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()


def test_snapshot_numbers_continue_across_agent_restart(tmp_path, otel_env):
    ring = FakeRing(tmp_path / "r0", rank=0, nranks=2)
    ring.begin(ring.make_op(done=3, wait_state=(1, 4)))
    run = Running(make_agent(tmp_path, **FAST))
    assert otel_env.sink.wait_for(lambda s: sum(x["name"] == sc.INFLIGHT_SPAN for x in s) >= 2, timeout=3)
    run.close()
    first = max(s["attrs"][sc.SNAPSHOT_SEQ] for s in otel_env.sink.named(sc.INFLIGHT_SPAN))
    otel_env.sink.clear()
    run = Running(make_agent(tmp_path, **FAST))
    assert otel_env.sink.wait_for(lambda s: any(x["name"] == sc.INFLIGHT_SPAN for x in s), timeout=3)
    run.close()
    again = min(s["attrs"][sc.SNAPSHOT_SEQ] for s in otel_env.sink.named(sc.INFLIGHT_SPAN))
    assert again >= first >= 1  # continues (same period: same k, later end), no second "snapshot 0"


def test_a_wait_exports_the_recent_completions(tmp_path, otel_env):
    """A mismatched collective hangs collectives later: when rank 0 stalls and rank 1 sits unusually idle, each
    exports its last 4 unexported completions (sampling is off), and its local peers their records of the same
    collectives, so the processor can compare what they called."""
    r0 = FakeRing(tmp_path / "r0", rank=0, nranks=2)
    r1 = FakeRing(tmp_path / "r1", rank=1, nranks=2)
    t = time.monotonic_ns() - 40_000_000
    for i in range(12):  # regular 3 ms cadence: no op is anomalous by itself
        r0.complete(r0.make_op(start_ns=t, end_ns=t + 1_000_000))
        # rank 1 called collective 10 with another count
        r1.complete(r1.make_op(start_ns=t, end_ns=t + 1_000_000, count=(2 << 20) if i == 10 else 1 << 20))
        t += 3_000_000
    r0.begin(r0.make_op(done=3, wait_state=(1, 6)))
    run = Running(make_agent(tmp_path, **FAST))
    sink = otel_env.sink
    ops = lambda s: [x for x in s if x["name"] == "nccl.AllReduce"]  # noqa: E731
    assert sink.wait_for(lambda s: len(ops(s)) >= 12, timeout=5)
    run.close()
    got = {(x["attrs"][sc.RANK], x["attrs"][sc.COLL_SEQ]): x["attrs"] for x in ops(sink.spans)}
    # the first rank's wait brings the other's records of the same collectives (a local peer's), so the other
    # one's own wait exports the 4 before them: its last 4 unexported
    both = [(r, q) for r in (0, 1) for q in (8, 9, 10, 11)]
    assert sorted(got) in (sorted(both + [(r, q) for q in (4, 5, 6, 7)]) for r in (0, 1))
    assert got[(1, 10)][sc.COLL_COUNT] == 2 << 20 and got[(0, 10)][sc.COLL_COUNT] == 1 << 20
    assert all(sc.ANOMALY not in a for a in got.values())
