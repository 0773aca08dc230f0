"""The ABI driver against a recording plugin: version choice, translation and filtering as NCCL does."""

from __future__ import annotations

import ctypes
import os
import threading

import numpy as np
import pytest

from native_support import build_recorder
from events import Seq, p2p, ring_allreduce
from mycroft_otel import native
from mycroft_otel.native import NO_SLOT, Driver, EventType as T, State


def take(so: str) -> list[dict]:
    lib = ctypes.CDLL(so)
    buf = ctypes.create_string_buffer(1 << 22)
    n = lib.recorder_take(buf, len(buf))
    out = []
    for line in buf.raw[:n].decode().splitlines():
        kind, *kv = line.split()
        d = {"kind": kind}
        for item in kv:
            k, _, v = item.partition("=")
            d[k] = v
        out.append(d)
    return out


@pytest.fixture()
def rec(recorder_so):
    take(recorder_so)
    yield recorder_so
    take(recorder_so)


def test_picks_newest_version_or_the_one_asked(rec, recorder_dir):
    assert Driver(rec).version == 7
    for v in (4, 5, 6, 7):
        d = Driver(rec, version=v)
        assert d.version == v and d.name == "recorder"
    only45 = build_recorder(recorder_dir, versions=(1 << 4) | (1 << 5))
    assert Driver(str(only45)).version == 5
    with pytest.raises(ValueError, match="ncclProfiler_v7"):
        Driver(str(only45), version=7)
    with pytest.raises(ValueError, match="dlopen"):
        Driver("/nonexistent/libx.so")


@pytest.mark.parametrize("version", [4, 5, 6, 7])
def test_init_arguments_per_version(rec, version):
    d = Driver(rec, version=version, slots=64)
    ctx = d.init(None, 0xABCDEF, 2, 8, 3, env={"REC_PROBE": "yes"})
    assert ctx == 0 and d.num_contexts == 1
    assert os.environ.get("REC_PROBE") is None  # env applied around init only
    (line,) = [r for r in take(rec) if r["kind"] == "I"]
    assert line == {"kind": "I", "v": str(version), "ctx": line["ctx"], "name": "NULL", "hash": str(0xABCDEF),
                    "nnodes": "2", "nranks": "8", "rank": "3", "probe": "yes"}
    ctx2 = d.init("tp0", 5, 1, 2, 0, comm_id=77)
    assert ctx2 == 1
    (line,) = [r for r in take(rec) if r["kind"] == "I"]
    assert line["name"] == "tp0" and line["hash"] == ("5" if version == 4 else "77")
    assert d.activation_mask() == {4: 0xFF, 5: 0xFFF, 6: 0x7FFF, 7: 0xFFFF}[version]
    assert any("recorder init" in m["msg"] for m in native.log_messages(clear=True))


def test_init_failure_raises_with_the_plugin_log(rec):
    d = Driver(rec, slots=8)
    with pytest.raises(RuntimeError, match=r"ncclResult_t 4(.|\n)*REC_INIT_FAIL=1"):
        d.init("x", 1, 1, 1, 0, env={"REC_INIT_FAIL": "1"})
    assert d.num_contexts == 0


@pytest.mark.parametrize("version", [4, 5, 6, 7])
def test_allreduce_translation(rec, version):
    d = Driver(rec, version=version, slots=4096)
    ctx = d.init("c", 1, 1, 4, 1)
    take(rec)
    q = Seq()
    slots = ring_allreduce(q, ctx, rank=1, nranks=4, coll_seq=7, n_channels=2, steps=3)
    stats = d.replay(q.array())
    assert stats["missing_slot"] == 0 and stats["bad_rows"] == 0 and stats["errors"] == 0
    calls = take(rec)
    starts = [c for c in calls if c["kind"] == "S"]
    types = [int(c["type"]) for c in starts]
    api_types = {T.GroupApi, T.CollApi, T.KernelLaunch}
    if version == 4:
        assert not api_types & set(types)
    else:
        assert api_types <= set(types)
    coll = next(c for c in starts if int(c["type"]) == T.Coll)
    group_h = d.handle(slots["group"])
    api_h = d.handle(slots["api"])
    assert coll["func"] == "AllReduce" and coll["seq"] == "7" and coll["algo"] == "RING" and coll["proto"] == "SIMPLE"
    assert coll["dtype"] == "ncclFloat32" and coll["nch"] == "2" and coll["root"] == "-1"
    if version == 4:
        assert int(coll["parent"], 16) == group_h and api_h == 0  # v4: Group is the parent, no CollApi event
    else:
        assert int(coll["parent"], 16) == api_h and int(coll["group"], 16) == group_h
    pops = [c for c in starts if int(c["type"]) == T.ProxyOp]
    assert len(pops) == 4 and {c["peer"] for c in pops} == {"2", "0"}
    assert all(c["pid"] == str(os.getpid()) for c in pops)
    records = [c for c in calls if c["kind"] == "R"]
    states = [int(c["state"]) for c in records]
    group_api_states = {State.GroupStartApiStop, State.GroupEndApiStart}
    assert bool(group_api_states & set(states)) == (version >= 5)
    for c in records:
        if int(c["state"]) in group_api_states:
            assert c["args"] == "NULL"
        if int(c["state"]) == State.ProxyStepSendWait:
            assert c["trans"] == str(1 << 17)
        if int(c["state"]) == State.KernelChStop:
            assert c["ptimer"].startswith("200000")
    n_steps = 2 * 2 * 3
    assert sum(1 for c in starts if int(c["type"]) == T.ProxyStep) == n_steps


def test_mask_filters_like_nccl(rec):
    d = Driver(rec, version=7, slots=4096)
    ctx = d.init("c", 1, 1, 2, 0, env={"REC_MASK": str(int(T.ProxyStep))})
    assert d.activation_mask() == T.ProxyStep
    take(rec)
    q = Seq()
    ring_allreduce(q, ctx, rank=0, nranks=2, coll_seq=0, n_channels=1, steps=2)
    st = d.replay(q.array())
    types = {int(c["type"]) for c in take(rec) if c["kind"] == "S"}
    # ProxyStep brings its ancestors but not KernelCh / KernelLaunch.
    assert types == {T.GroupApi, T.CollApi, T.Group, T.Coll, T.ProxyOp, T.ProxyStep}
    assert st["filtered"] > 0 and st["null_handle"] > 0
    d.set_activation_mask(int(T.KernelPhase))
    ctx2 = d.init("c2", 2, 1, 2, 0, env={"REC_MASK": str(int(T.KernelPhase))})
    assert d.activation_mask() & T.KernelCh  # NCCL turns KernelCh on for KernelPhase


def test_p2p_and_hostile_raw_rows(rec):
    d = Driver(rec, version=5, slots=1024)
    ctx = d.init("c", 1, 1, 2, 0)
    q = Seq()
    p2p(q, ctx, 0, 1, send=True)
    d.replay(q.array())
    starts = [c for c in take(rec) if c["kind"] == "S"]
    p = next(c for c in starts if int(c["type"]) == T.P2p)
    assert p["func"] == "Send" and p["peer"] == "1"
    # Raw mode: NULL handles, garbage states and unknown types reach the plugin.
    d.set_handle(900, 0)
    d.set_handle(901, 0xDEAD0000)
    ev = native.new_events(4)
    ev["op"] = [2, 3, 1, 1]
    ev["slot"] = [900, 901, 902, 903]
    ev["state"] = [0, 9999, 0, 0]
    ev["type"] = [0, 0, 1 << 20, 3]
    ev["parent_slot"] = [NO_SLOT, NO_SLOT, 901, NO_SLOT]
    ev["func"] = [0, 0, 250, 0]
    st = d.replay(ev, raw=True)
    assert st["delivered"] == 4
    calls = take(rec)
    assert calls[0] == {"kind": "E", "h": "0"}
    assert calls[1]["state"] == "9999"
    assert calls[2]["parent"] == "0xdead0000"
    st = d.replay(ev)  # filtered mode: NULL stop skipped, bad state and bad types filtered
    assert st["delivered"] == 0 and st["null_handle"] == 1 and st["filtered"] == 3


def test_missing_slot_is_bounded_and_threads_fill_slots(rec):
    d = Driver(rec, version=7, slots=64)
    ctx = d.init("c", 1, 1, 2, 0)
    d.slot_timeout_ms = 100
    ev = native.new_events(1)
    ev["op"] = 2
    ev["slot"] = 5
    st = d.replay(ev)
    assert st["missing_slot"] == 1
    # A child row waiting on a parent another thread fills later.
    child = native.new_events(1)
    child[0] = (0, ctx, 7, 6, int(T.ProxyOp), 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 4, 1024, 0, 0, 0, 0, 0)
    parent = native.new_events(1)
    parent[0]["op"] = 1
    parent[0]["ctx"] = ctx
    parent[0]["slot"] = 6
    parent[0]["type"] = int(T.Coll)
    parent[0]["parent_slot"] = NO_SLOT
    d.slot_timeout_ms = 5000
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("st", d.replay(child)))
    t.start()
    threading.Event().wait(0.05)
    d.replay(parent)
    t.join(10)
    assert out["st"]["missing_slot"] == 0 and out["st"]["delivered"] == 1
    assert d.handle(7) is not None


def test_pacing(rec):
    d = Driver(rec, version=7, slots=64)
    ctx = d.init("c", 1, 1, 2, 0)
    ev = native.new_events(3)
    ev["op"] = 1
    ev["ctx"] = ctx
    ev["type"] = int(T.ProxyCtrl)
    ev["slot"] = [0, 1, 2]
    ev["t_ns"] = [1_000_000, 5_000_000, 20_000_000]
    epoch = native.monotonic_ns()
    st = d.replay(ev, epoch_ns=epoch)
    elapsed = native.monotonic_ns() - epoch
    assert 20_000_000 <= elapsed < 1_000_000_000
    assert st["max_late_ns"] < 200_000_000  # loose: a shared 2-core CI box oversleeps


def test_finalize(rec):
    d = Driver(rec, version=6, slots=8)
    ctx = d.init("c", 1, 1, 1, 0)
    assert d.finalize(ctx) == 0
    assert any(c["kind"] == "F" for c in take(rec))
    with pytest.raises(RuntimeError, match="already finalized"):
        d.finalize(ctx)
    with pytest.raises(IndexError):
        d.finalize(5)


def test_replay_throughput(rec):
    """Per-row overhead stays small (no Python per row): a loose bound for a shared 2-core box."""
    d = Driver(rec, version=7, slots=1 << 16)
    ctx = d.init("c", 1, 1, 2, 0, env={"REC_MASK": "0"})  # everything filtered: measures the driver alone
    ev = native.new_events(200_000)
    ev["op"] = 1
    ev["ctx"] = ctx
    ev["type"] = int(T.ProxyStep)
    ev["slot"] = np.arange(200_000) % (1 << 16)
    st = d.replay(ev)
    assert st["filtered"] == 200_000
    assert st["wall_ns"] / 200_000 < 2000  # ns per row


def test_descriptor_strings_are_nccls_spellings(rec):
    d = Driver(rec, version=7, slots=256)
    ctx = d.init("c", 1, 1, 2, 0)
    q = Seq()
    g = q.start(ctx, T.Group)
    for dt in ("ncclUint8", "ncclBfloat16"):
        c = q.start(ctx, T.Coll, group=g, func=native.FUNC_NAMES.index("AlltoAll"),
                    datatype=native.DATATYPE_NAMES.index(dt), algo=native.ALGO_NAMES.index("NVLS_TREE"),
                    proto=native.PROTO_NAMES.index("LL128"))
        q.stop(c)
    c = q.start(ctx, T.Coll, group=g, func=200, datatype=200, algo=200, proto=200)
    take(rec)
    d.replay(q.array())
    colls = [c for c in take(rec) if c["kind"] == "S" and int(c["type"]) == T.Coll]
    assert [(c["func"], c["dtype"], c["algo"], c["proto"]) for c in colls] == [
        ("AlltoAll", "Unknown", "NVLS_TREE", "LL128"),  # NCCL prints ncclUint8 as "Unknown"
        ("AlltoAll", "ncclBfloat16", "NVLS_TREE", "LL128"),
        ("Unknown", "Unknown", "Unknown", "Unknown")]
