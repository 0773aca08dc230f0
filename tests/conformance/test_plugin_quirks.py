"""Fast checks of the plugin alone, driven by nccl_ctypes (not our Driver), read back with the ring reader.

Each test is one of NCCL's real event shapes (see nccl_ctypes / rankproc docstrings). Reading uses our
RingReader only as a window onto the shared memory; every call into the plugin is ours.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

import nccl_ctypes as N

native = pytest.importorskip("mycroft_otel.native")


@pytest.fixture
def ring_dir(tmp_path, monkeypatch):
    d = tmp_path / "rings"
    monkeypatch.setenv("MYCROFT_RING_DIR", str(d))
    monkeypatch.setenv("MYCROFT_JOB_ID", "conformance-unit")
    return d


def _live(ring_dir, comm_hash: int):
    files = [p for p in native.ring_files(ring_dir) if f"{comm_hash:016x}" in p.name]
    assert len(files) == 1, files
    r = native.open_ring(files[0])
    return r


def _one_send_op(ctx: N.Context, nch: int = 1):
    g = ctx.group_api_start()
    api = ctx.coll_api(g, "AllReduce", 1 << 20, "ncclFloat32")
    grp = ctx.group_start()
    coll = ctx.coll_start(api, grp, 0, "AllReduce", 1 << 20, "ncclFloat32", nch)
    ctx.stop(coll)  # stopped at launch, before any child starts
    ctx.stop(grp)
    ctx.stop(g)
    return coll


@pytest.mark.parametrize("version", [4, 5, 7])
def test_abi_tables_and_mask(ring_dir, version):
    p = N.Plugin(version)
    c = p.init(0xABC000 + version, nranks=4, rank=2, nnodes=2)
    assert c.rc == 0 and c.ctx
    m = p.mask.value
    for bit in (N.COLL, N.PROXY_OP, N.PROXY_STEP, N.KERNEL_CH):
        assert m & bit, f"mask {m:#x} lacks {bit:#x}"
    h = native.read_header(_live(ring_dir, 0xABC000 + version))
    assert (h.rank, h.nranks) == (2, 4)
    c.finalize()


def test_children_after_parent_stop_complete_the_op(ring_dir):
    """Coll/Group stop at launch; ProxyOp (proxy thread) and KernelCh (profiler thread, GPU clock) come later."""
    p = N.Plugin(7)
    c = p.init(0x5EED01, nranks=2, rank=0, nnodes=2)
    coll = _one_send_op(c, nch=1)

    def proxy():
        op = c.proxy_op_start(coll, 0, 1, 2, 1 << 19, True)
        c.record(op, N.ST_PROXY_OP_IN_PROGRESS)
        for k in range(2):
            s = c.proxy_step_start(op, k)
            c.record(s, N.ST_SEND_GPU_WAIT, 0)
            c.record(s, N.ST_SEND_PEER_WAIT, 0)
            c.record(s, N.ST_SEND_WAIT, 1 << 19)
            c.stop(s)
        c.stop(op)

    def kernel():
        gpu = time.time_ns() + 10**12
        kc = c.kernel_ch_start(coll, 0, gpu)
        c.kernel_ch_stop(kc, gpu + 5_000_000)

    ts = [threading.Thread(target=proxy), threading.Thread(target=kernel)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    r = _live(ring_dir, 0x5EED01)
    rows = [rec for batch, _, _ in native.drain(r) for rec in batch]
    assert len(rows) == 1
    c.finalize()


def test_repeated_send_peer_wait_is_not_progress(ring_dir):
    """NCCL re-records SendPeerWait on every isend the network refuses (net.cc sendProxyProgress: before each
    isend attempt), i.e. continuously while the peer has not posted its receive. A retry moves no counter, so it
    must not look like progress: otherwise a sender blocked by an absent/stuck peer or a dead NIC keeps its op
    (and the whole trace) 'progressing' and the processor's stall timer never runs out."""
    p = N.Plugin(7)
    c = p.init(0x5EED02, nranks=2, rank=0, nnodes=2)
    coll = _one_send_op(c)
    op = c.proxy_op_start(coll, 0, 1, 4, 1 << 19, True)
    c.record(op, N.ST_PROXY_OP_IN_PROGRESS)
    s = c.proxy_step_start(op, 0)
    c.record(s, N.ST_SEND_GPU_WAIT, 0)
    c.record(s, N.ST_SEND_PEER_WAIT, 0)  # data ready, isend refused
    r = _live(ring_dir, 0x5EED02)

    def snapshot():
        live = r.live()
        assert len(live) == 1
        f = live[0]["flows"][0]
        return int(live[0]["op"]["last_progress_ns"]), int(f["last_progress_ns"]), int(f["ready"])

    before = snapshot()
    time.sleep(0.05)
    for _ in range(50):  # the proxy loop retrying
        c.record(s, N.ST_SEND_PEER_WAIT, 0)
    after = snapshot()
    assert after[2] == before[2] == 1
    assert after[:2] == before[:2], (
        "a repeated SendPeerWait (isend retry, no counter moved) advanced last_progress_ns "
        f"(op {before[0]} -> {after[0]}, flow {before[1]} -> {after[1]})")
    c.finalize()


def test_recv_restart_is_not_progress(ring_dir):
    """NCCL starts a recv step again while irecv is refused; the restart moves no counter."""
    p = N.Plugin(7)
    c = p.init(0x5EED03, nranks=2, rank=1, nnodes=2)
    coll = _one_send_op(c)
    op = c.proxy_op_start(coll, 0, 0, 4, 1 << 19, False)
    c.record(op, N.ST_PROXY_OP_IN_PROGRESS)
    c.proxy_step_start(op, 0)
    r = _live(ring_dir, 0x5EED03)
    live = r.live()
    before = int(live[0]["op"]["last_progress_ns"]), int(live[0]["flows"][0]["posted"])
    time.sleep(0.05)
    for _ in range(20):
        c.proxy_step_start(op, 0)  # earlier handles never stopped
    live = r.live()
    after = int(live[0]["op"]["last_progress_ns"]), int(live[0]["flows"][0]["posted"])
    assert after == before
    c.finalize()


def test_growing_step_numbers_across_proxy_ops(ring_dir):
    """Older releases number steps base+posted, growing across the ProxyOps of one connection."""
    p = N.Plugin(5)
    c = p.init(0x5EED04, nranks=2, rank=0, nnodes=2)
    base = 0
    for seq in range(3):
        coll = _one_send_op(c)
        op = c.proxy_op_start(coll, 0, 1, 12, 1 << 19, True)
        c.record(op, N.ST_PROXY_OP_IN_PROGRESS)
        live = {}
        for k in range(12):  # at most 8 outstanding, slot = step % 8
            if len(live) == 8:
                kk = min(live)
                c.stop(live.pop(kk))
            s = c.proxy_step_start(op, base + k)
            c.record(s, N.ST_SEND_GPU_WAIT, 0)
            c.record(s, N.ST_SEND_WAIT, 1 << 19)
            live[k] = s
        for k in sorted(live):
            c.stop(live[k])
        c.stop(op)
        gpu = time.time_ns() + 10**12
        kc = c.kernel_ch_start(coll, 0, gpu)
        c.kernel_ch_stop(kc, gpu + 1000)
        base += 12
    r = _live(ring_dir, 0x5EED04)
    rows = [rec for batch, _, _ in native.drain(r) for rec in batch]
    assert len(rows) == 3
    for row in rows:
        f = row["flows"][0]
        assert (int(f["posted"]), int(f["transmitted"]), int(f["done"]), int(f["n_steps"])) == (12, 12, 12, 12)
    c.finalize()


if __name__ == "__main__":  # pragma: no cover
    os._exit(pytest.main([__file__, "-q"]))
