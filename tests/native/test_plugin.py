"""The real plugin driven through NCCL's ABI by the Driver: what NCCL's call sequences leave in shm."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from native_support import HERE, ROOT
from events import Seq, p2p, ring_allreduce, tree_allreduce
from mycroft_otel import native
from mycroft_otel.native import Driver, OpKind, WaitState

CHUNK = 1 << 17


def one_ring(ring_dir: Path) -> native.RingReader:
    files = native.ring_files(ring_dir)
    assert len(files) == 1, files
    return native.open_ring(files[0])


def flows_by_key(rec) -> dict[tuple[int, int], np.void]:
    return {(int(f["channel"]), int(f["dir"])): f for f in rec["flows"][: int(rec["op"]["n_flows"])]}


@pytest.mark.parametrize("version", [4, 5, 6, 7])
def test_ring_allreduce_every_version(plugin_so, ring_dir, version):
    d = Driver(plugin_so, version=version)
    assert d.version == version
    ctx = d.init("dp0", 0x1234ABCD, 2, 4, 1, env={"MYCROFT_RING_DIR": str(ring_dir), "RANK": "9",
                                                   "LOCAL_RANK": "1", "MYCROFT_JOB_ID": "job-7"})
    q = Seq()
    for s in range(3):
        ring_allreduce(q, ctx, rank=1, nranks=4, coll_seq=100 + s, n_channels=2, steps=6, count=1 << 20)
    st = d.replay(q.array())
    assert st["errors"] == st["missing_slot"] == st["bad_rows"] == 0
    r = one_ring(ring_dir)
    h = native.read_header(r)
    assert (h.abi_version, h.rank, h.nranks, h.nnodes, h.comm_hash) == (version, 1, 4, 2, 0x1234ABCD)
    assert (h.global_rank, h.local_rank, h.job_id, h.comm_name, h.pid) == (9, 1, "job-7", "dp0", os.getpid())
    assert h.ops_started == h.ops_completed == 3 and h.ring_head == 3
    assert h.dropped_bad_handle == h.dropped_bad_descr == h.dropped_live_full == 0
    assert len(r.live()) == 0
    recs, cur, lost = r.read(0)
    assert (len(recs), cur, lost) == (3, 3, 0)
    ops = recs["op"]
    assert ops["seq"].tolist() == [0, 1, 2]  # per-communicator collective number
    assert ops["nccl_seq"].tolist() == [100, 101, 102]
    assert set(ops["kind"]) == {OpKind.COLL} and set(ops["func"]) == {native.FUNC_NAMES.index("AllReduce")}
    assert set(ops["bytes"]) == {4 << 20} and set(ops["count"]) == {1 << 20}
    assert native.algo_name(ops["algo"][0]) == "RING" and native.proto_name(ops["proto"][0]) == "SIMPLE"
    assert set(ops["abi_version"]) == {version} and set(ops["n_flows"]) == {4} and set(ops["n_channels"]) == {2}
    assert (ops["api_ns"] > 0).all() == (version >= 5)
    assert (ops["start_ns"] > 0).all() and (ops["end_ns"] >= ops["launch_ns"]).all()
    assert ops["op_id"].tolist() == sorted(set(ops["op_id"].tolist()))
    for rec in recs:
        flows = flows_by_key(rec)
        assert set(flows) == {(0, 0), (0, 1), (1, 0), (1, 1)}
        for (ch, direction), f in flows.items():
            assert f["peer"] == (2 if direction == 0 else 0)
            assert f["n_steps"] == f["posted"] == f["ready"] == f["transmitted"] == f["done"] == 6
            assert f["bytes"] == 6 * CHUNK and f["wait_state"] == WaitState.NONE and f["end_ns"] > 0
            assert f["version"] % 2 == 0
    start_real = h.to_realtime(int(ops["start_ns"][0]))
    assert abs(start_real - time.time_ns()) < 60e9


def test_tree_allreduce_keeps_one_flow_per_peer(plugin_so, ring_dir):
    d = Driver(plugin_so)
    ctx = d.init("tree", 7, 1, 3, 1, env={"MYCROFT_RING_DIR": str(ring_dir)})
    q = Seq()
    tree_allreduce(q, ctx, rank=1, nranks=3, coll_seq=0, steps=4)
    d.replay(q.array())
    (rec,), _, _ = one_ring(ring_dir).read(0)
    assert native.algo_name(rec["op"]["algo"]) == "TREE"
    flows = rec["flows"][: int(rec["op"]["n_flows"])]
    # reduce up (recv from child 2, send to parent 0), broadcast down (recv from 0, send to 2)
    keys = sorted((int(f["channel"]), int(f["dir"]), int(f["peer"])) for f in flows)
    assert keys == [(0, 0, 0), (0, 0, 2), (0, 1, 0), (0, 1, 2)]
    assert set(flows["n_proxy_ops"]) == {1} and set(flows["done"]) == {4} and set(flows["n_steps"]) == {4}


@pytest.mark.parametrize("version", [4, 5, 6, 7])
def test_p2p_both_sides_agree_on_n(plugin_so, ring_dir, version):
    d = Driver(plugin_so, version=version)
    env = {"MYCROFT_RING_DIR": str(ring_dir)}
    c0 = d.init("pp", 42, 1, 2, 0, env=env)
    c1 = d.init("pp", 42, 1, 2, 1, env=env)
    q0, q1 = Seq(first_slot=0), Seq(first_slot=100_000)
    for _ in range(3):
        p2p(q0, c0, 0, 1, send=True)
        p2p(q1, c1, 1, 0, send=False)
    p2p(q1, c1, 1, 0, send=True)  # the other direction counts on its own
    p2p(q0, c0, 0, 1, send=False)
    t = threading.Thread(target=d.replay, args=(q1.array(),))
    t.start()
    d.replay(q0.array())
    t.join(30)
    seen = {}
    for path in native.ring_files(ring_dir):
        r = native.open_ring(path)
        rank = r.header()["rank"]
        recs, _, _ = r.read(0)
        seen[rank] = [(native.op_kind_name(o["kind"]), int(o["root_or_peer"]), int(o["seq"])) for o in recs["op"]]
    assert seen[0] == [("send", 1, 0), ("send", 1, 1), ("send", 1, 2), ("recv", 1, 0)]
    assert seen[1] == [("recv", 0, 0), ("recv", 0, 1), ("recv", 0, 2), ("send", 0, 0)]


@pytest.mark.parametrize("version", [4, 7])
def test_inflight_state_is_live(plugin_so, ring_dir, version):
    d = Driver(plugin_so, version=version)
    ctx = d.init("dp", 3, 1, 4, 0, env={"MYCROFT_RING_DIR": str(ring_dir)})
    q = Seq()
    ring_allreduce(q, ctx, 0, 4, 0, n_channels=2, steps=6, stall_send_at=2)
    d.replay(q.array())
    r = one_ring(ring_dir)
    check_stalled(r.live(), expect_seq=0)
    assert r.read(0)[1] == 0


def check_stalled(live: np.ndarray, expect_seq: int) -> None:
    assert len(live) == 1
    op = live[0]["op"]
    assert op["seq"] == expect_seq and op["end_ns"] == 0 and op["kind"] == OpKind.COLL
    assert not native.torn_slots(live).any()
    flows = flows_by_key(live[0])
    stuck = flows[(0, 0)]
    assert (stuck["posted"], stuck["ready"], stuck["transmitted"], stuck["done"]) == (3, 3, 3, 2)
    assert stuck["wait_state"] == WaitState.SEND_WAIT and stuck["wait_step"] == 2 and stuck["wait_since_ns"] > 0
    assert stuck["end_ns"] == 0
    for key in [(0, 1), (1, 0), (1, 1)]:
        assert flows[key]["done"] == 6 and flows[key]["wait_state"] == WaitState.NONE


def test_reader_while_writer_runs(plugin_so, ring_dir):
    d = Driver(plugin_so)
    ctx = d.init("dp", 5, 1, 4, 2, env={"MYCROFT_RING_DIR": str(ring_dir), "MYCROFT_RING_RECORDS": "16"})
    q = Seq()
    n_ops = 300
    for s in range(n_ops):
        ring_allreduce(q, ctx, 2, 4, s, n_channels=2, steps=4)
    rows = q.array()
    t = threading.Thread(target=d.replay, args=(rows,))
    r = one_ring(ring_dir)
    t.start()
    got, lost, cursor, live_seen = [], 0, 0, 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        recs, cursor, n_lost = r.read(cursor, 8)
        got += recs["op"]["op_id"].tolist()
        lost += n_lost
        for row in r.live():
            live_seen += 1
            f = row["flows"][: int(row["op"]["n_flows"])]
            ok = ~native.torn_flows(f)
            assert (f["done"][ok] <= f["posted"][ok]).all() and (f["posted"][ok] <= 4).all()
        if not t.is_alive() and cursor == r.ring_head:
            break
    t.join(10)
    assert got == sorted(got) and len(set(got)) == len(got)
    assert len(got) + lost == n_ops == r.ring_head
    assert got[-1] == max(got)


def start_writer(plugin_so, ring_dir, mode) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE)]))
    p = subprocess.Popen([sys.executable, str(HERE / "writer.py"), plugin_so, str(ring_dir), mode], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if line.strip() != "READY":
        p.kill()
        pytest.fail(f"writer did not start: {line!r} {p.stderr.read()}")
    return p


@pytest.mark.parametrize("sig", [signal.SIGSTOP, signal.SIGKILL])
def test_inflight_state_survives_frozen_or_dead_writer(plugin_so, ring_dir, sig):
    p = start_writer(plugin_so, ring_dir, "inflight")
    try:
        os.kill(p.pid, sig)
        if sig == signal.SIGKILL:
            p.wait(10)
        r = one_ring(ring_dir)
        h = native.read_header(r)
        assert h.pid == p.pid and h.writer_alive() == (sig == signal.SIGSTOP)
        check_stalled(r.live(), expect_seq=1)
        recs, cursor, lost = r.read(0, skip_unpublished=True)
        assert recs["op"]["seq"].tolist() == [0] and lost == 0
    finally:
        p.kill()
        p.wait(10)


def test_reader_never_blocks_on_a_writer_frozen_mid_update(plugin_so, ring_dir):
    p = start_writer(plugin_so, ring_dir, "churn")
    try:
        r = None
        for _ in range(100):
            files = native.ring_files(ring_dir)
            if files:
                r = native.open_ring(files[0])
                break
            time.sleep(0.05)
        for delay in (0.05, 0.13, 0.31):
            time.sleep(delay)
            os.kill(p.pid, signal.SIGSTOP)
            t0 = time.monotonic()
            live = r.live()
            recs, cur, lost = r.read(max(0, r.ring_head - 16), 64)
            assert time.monotonic() - t0 < 2.0
            assert len(live) <= 1
            os.kill(p.pid, signal.SIGCONT)
        assert r.ring_head > 0
    finally:
        p.kill()
        p.wait(10)


def test_two_processes_share_one_ring_dir(plugin_so, ring_dir):
    procs = [start_writer(plugin_so, ring_dir, "inflight") for _ in range(2)]
    try:
        files = native.ring_files(ring_dir)
        assert len(files) == 2
        pids = set()
        for f in files:
            r = native.open_ring(f)
            pids.add(r.header()["pid"])
            check_stalled(r.live(), expect_seq=1)
        assert pids == {p.pid for p in procs}
        assert (ring_dir.stat().st_mode & 0o777) == 0o700
        assert all((f.stat().st_mode & 0o777) == 0o600 for f in files)
    finally:
        for p in procs:
            p.kill()
            p.wait(10)


def test_ring_overflow_and_live_table_full(plugin_so, ring_dir):
    d = Driver(plugin_so)
    ctx = d.init("dp", 9, 1, 2, 0, env={"MYCROFT_RING_DIR": str(ring_dir), "MYCROFT_RING_RECORDS": "16",
                                         "MYCROFT_LIVE_SLOTS": "4"})
    q = Seq()
    for s in range(40):
        ring_allreduce(q, ctx, 0, 2, s, n_channels=1, steps=2)
    for s in range(6):  # six stalled collectives: only four fit the live table
        ring_allreduce(q, ctx, 0, 2, 40 + s, n_channels=1, steps=2, stall_send_at=0)
    d.replay(q.array())
    r = one_ring(ring_dir)
    h = native.read_header(r)
    assert h.ring_head == 40 and h.ring_capacity == 16 and h.live_slots == 4
    recs, cur, lost = r.read(0)
    assert lost == 24 and recs["op"]["seq"].tolist() == list(range(24, 40))
    assert len(r.live()) == 4 and h.dropped_live_full == 2


def split_threads(rows: list[dict], tag: str) -> dict[str, list[dict]]:
    """NCCL 2.27-2.30 threads of one communicator: the user thread (API, Group, Coll/P2p) and the proxy
    progress thread (ProxyOp, ProxyStep, and KernelCh, which those releases report from the proxy thread)."""
    from mycroft_otel.native import EventType as T

    kind = {}
    out: dict[str, list[dict]] = {f"user{tag}": [], f"proxy{tag}": []}
    for r in rows:
        if r["op"] == 1:
            kind[r["slot"]] = r["type"]
        proxy = kind[r["slot"]] in (T.ProxyOp, T.ProxyStep, T.KernelCh)
        out[f"proxy{tag}" if proxy else f"user{tag}"].append(r)
    return out


def test_nccl_threads_replay_concurrently(plugin_so, ring_dir):
    """Two communicators, each with its user and proxy thread: four threads on one Driver."""
    from events import rows_to_array

    d = Driver(plugin_so)
    env = {"MYCROFT_RING_DIR": str(ring_dir), "MYCROFT_LIVE_SLOTS": "256"}
    n = 40
    streams = {}
    for i, tag in enumerate("AB"):
        ctx = d.init(f"comm{tag}", 11 + i, 1, 4, 3, env=env)
        q = Seq(first_slot=i * 500_000)
        for s in range(n):
            ring_allreduce(q, ctx, 3, 4, s, n_channels=3, steps=6)
        streams.update({k: rows_to_array(v) for k, v in split_threads(q.rows, tag).items()})
    results = {}
    threads = [threading.Thread(target=lambda k=k, a=a: results.__setitem__(k, d.replay(a))) for k, a in
               streams.items()]
    for t in reversed(threads):  # proxy threads first: they must wait for their parents' handles
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 4
    assert all(r["missing_slot"] == 0 and r["errors"] == 0 for r in results.values()), results
    files = native.ring_files(ring_dir)
    assert len(files) == 2
    for f in files:
        r = native.open_ring(f)
        recs, _, lost = r.read(0)
        assert len(recs) == n and lost == 0 and len(r.live()) == 0
        assert sorted(recs["op"]["seq"].tolist()) == list(range(n))
        flows = np.concatenate([rec["flows"][: int(rec["op"]["n_flows"])] for rec in recs])
        assert len(flows) == n * 6 and set(flows["done"]) == {6} and set(flows["posted"]) == {6}
