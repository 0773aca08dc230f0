"""Hostile callback sequences against the real plugin, one per process (run by test_hostile.py).

usage: hostile.py CASE PLUGIN RING_DIR VERSION [SEED]
Each case drives the plugin through the Driver in raw mode (no NCCL-side filtering) and prints the
shm header counters as JSON on the last line. A crash or a hang is the test failing.
"""

from __future__ import annotations

import json
import os
import random
import sys

import numpy as np

from events import Seq, p2p, ring_allreduce, rows_to_array
from mycroft_otel import native
from mycroft_otel.native import NO_SLOT, Driver, EventType as T, Op, State

ALL_TYPES = [int(t) for t in T]
ALL_STATES = [int(s) for s in State]


def setup(plugin, ring_dir, version, **env):
    d = Driver(plugin, version=version)
    e = {"MYCROFT_RING_DIR": ring_dir, "MYCROFT_LIVE_SLOTS": "16", "MYCROFT_RING_RECORDS": "64"}
    e.update(env)
    ctx = d.init("hostile", 0xBAD, 1, 4, 1, env=e)
    return d, ctx


def complete(d, ctx, first_slot=0, seq=0):
    q = Seq(first_slot=first_slot)
    slots = ring_allreduce(q, ctx, 1, 4, seq, n_channels=2, steps=3)
    d.replay(q.array())
    return q, slots


def case_null_handles(d, ctx, rng):
    for slot in range(50):
        d.set_handle(slot, 0)
    rows = [dict(op=Op.STOP, slot=s) for s in range(10)]
    rows += [dict(op=Op.RECORD, slot=s, state=st, size=1 << 40) for s, st in enumerate(ALL_STATES)]
    # NULL parents for every child type
    rows += [dict(op=Op.START, ctx=ctx, slot=100 + i, type=t, parent_slot=0, channel=i, n_steps=4, is_send=i % 2)
             for i, t in enumerate(ALL_TYPES)]
    d.replay(rows_to_array(rows), raw=True)
    complete(d, ctx, first_slot=1000)


def case_after_stop(d, ctx, rng):
    q, _ = complete(d, ctx)
    again = q.array()
    stops_and_records = again[again["op"] != Op.START]
    d.replay(stops_and_records, raw=True)  # every stop and record a second time
    d.replay(stops_and_records, raw=True)
    complete(d, ctx, first_slot=10_000, seq=1)  # a stale handle must not touch the reused slot
    d.replay(stops_and_records, raw=True)


def case_after_finalize(d, ctx, rng):
    q = Seq()
    ring_allreduce(q, ctx, 1, 4, 0, n_channels=2, steps=3, stall_send_at=1)
    d.replay(q.array())
    assert d.finalize(ctx) == 0
    rows = q.array()
    late = rows[rows["op"] != Op.START]
    d.replay(late, raw=True)  # late stops/records after finalize
    starts = rows[rows["op"] == Op.START].copy()
    starts["slot"] += 50_000
    d.replay(starts, raw=True)  # even starts on the finalized context
    d.finalize(ctx, force=True)  # and a second finalize


def case_foreign_pxn(d, ctx, rng):
    q, slots = complete(d, ctx)
    foreign = os.getpid() + 100_000
    d.set_handle(500, 0x7F0000001000)  # a pointer from another address space
    rows = [dict(op=Op.START, ctx=ctx, slot=501, type=T.ProxyOp, parent_slot=500, pid=foreign, channel=3,
                 root_or_peer=2, n_steps=8, chunk_size=1024, is_send=1),
            dict(op=Op.RECORD, slot=501, state=State.ProxyOpInProgress),
            dict(op=Op.START, ctx=ctx, slot=502, type=T.ProxyStep, parent_slot=501, step=0),
            dict(op=Op.RECORD, slot=502, state=State.ProxyStepSendGPUWait, size=1024),
            dict(op=Op.RECORD, slot=502, state=State.ProxyStepSendWait, size=1024),
            dict(op=Op.STOP, slot=502), dict(op=Op.STOP, slot=501)]
    # a foreign ProxyOp whose parent is one of OUR live handles (pid differs: must not be used either)
    rows += [dict(op=Op.START, ctx=ctx, slot=503, type=T.ProxyOp, parent_slot=slots["coll"], pid=foreign,
                  channel=0, root_or_peer=2, n_steps=2, is_send=1), dict(op=Op.STOP, slot=503)]
    d.replay(rows_to_array(rows), raw=True)


def case_garbage_parents(d, ctx, rng):
    complete(d, ctx)
    bad = [0x10, 0xDEADBEEF0000, 0xFFFFFFFFFFFFFFF0, 0x1000, 8]
    rows = []
    for i, p in enumerate(bad):
        d.set_handle(600 + i, p)
        for j, t in enumerate([T.ProxyOp, T.ProxyStep, T.KernelCh, T.Coll, T.P2p, T.NetPlugin]):
            s = 700 + i * 10 + j
            rows += [dict(op=Op.START, ctx=ctx, slot=s, type=t, parent_slot=600 + i, channel=j, n_steps=2, is_send=1),
                     dict(op=Op.RECORD, slot=s, state=State.ProxyStepSendWait, size=1), dict(op=Op.STOP, slot=s)]
    d.replay(rows_to_array(rows), raw=True)
    # stop/record on garbage handles the plugin never issued
    rows = [dict(op=Op.STOP, slot=600 + i) for i in range(len(bad))]
    rows += [dict(op=Op.RECORD, slot=600 + i, state=State.ProxyStepRecvWait) for i in range(len(bad))]
    d.replay(rows_to_array(rows), raw=True)


def case_cross_context(d, ctx, rng):
    ctx2 = d.init("other", 0xB0B, 1, 2, 0, env={"MYCROFT_RING_DIR": os.environ["HOSTILE_RING_DIR"]})
    q = Seq()
    s = ring_allreduce(q, ctx, 1, 4, 0, n_channels=1, steps=2, stall_send_at=0)
    d.replay(q.array())
    # children of ctx's Coll started on ctx2, then the stuck ops stopped through ctx2-started steps
    rows = [dict(op=Op.START, ctx=ctx2, slot=900, type=T.ProxyOp, parent_slot=s["coll"], channel=5, n_steps=2,
                 is_send=1, root_or_peer=1),
            dict(op=Op.START, ctx=ctx2, slot=901, type=T.ProxyStep, parent_slot=s["proxy_ops"][0][0], step=1),
            dict(op=Op.RECORD, slot=901, state=State.ProxyStepSendWait, size=4), dict(op=Op.STOP, slot=901),
            dict(op=Op.STOP, slot=900)]
    d.replay(rows_to_array(rows), raw=True)


def case_out_of_range(d, ctx, rng):
    q = Seq()
    g = q.start(ctx, T.Group)
    for i in range(40):
        c = q.start(ctx, T.Coll, group=g, func=rng.choice([200, 11, 255]), datatype=rng.choice([12, 99, 255]),
                    algo=rng.choice([7, 200]), proto=rng.choice([3, 250]), n_channels=rng.choice([0, 64, 65, 255]),
                    count=rng.choice([0, 2**64 - 1, 2**63]), seq=2**64 - 1, root_or_peer=rng.choice([-7, 2**31 - 1]))
        q.stop(c)
        for ch in (0, 63, 64, 200, 255):
            po = q.start(ctx, T.ProxyOp, parent=c, channel=ch, root_or_peer=rng.choice([-1, 10**9, 3]),
                         n_steps=rng.choice([-5, 0, 2**31 - 1, 3]), chunk_size=rng.choice([-1, 0, 2**31 - 1]),
                         is_send=rng.choice([0, 1, 7]))
            for step in (-1, 0, 2**31 - 1, 7, 8, 9):
                ps = q.start(ctx, T.ProxyStep, parent=po, step=step)
                for st in (State.ProxyStepSendGPUWait, State.ProxyStepRecvGPUWait, 9999, 2**31 - 1):
                    q.record(ps, st, size=rng.choice([0, 2**64 - 1]))
                q.stop(ps)
            q.stop(po)
        for ch in (0, 255):
            k = q.start(ctx, T.KernelCh, parent=c, channel=ch, ptimer=2**64 - 1)
            q.record(k, State.KernelChStop, ptimer=0)
            q.stop(k)
    q.stop(g)
    d.replay(q.array(), raw=True)
    complete(d, ctx, first_slot=500_000, seq=1)


def case_fuzz(d, ctx, rng):
    """Random descriptors and states, parents drawn from earlier handles (including stale ones)."""
    n = 4000
    ev = native.new_events(n)
    gen = np.random.default_rng(rng.randrange(2**32))
    ev["op"] = gen.choice([1, 1, 2, 3, 3, 3], n)
    ev["ctx"] = ctx
    ev["slot"] = gen.integers(0, 512, n)
    ev["parent_slot"] = np.where(gen.random(n) < 0.1, NO_SLOT, gen.integers(0, 512, n))
    ev["type"] = np.where(gen.random(n) < 0.9, gen.choice(ALL_TYPES, n), gen.integers(0, 2**32 - 1, n, dtype=np.uint64))
    ev["state"] = np.where(gen.random(n) < 0.9, gen.choice(ALL_STATES, n), gen.integers(0, 2**32 - 1, n, dtype=np.uint64))
    for f, valid in (("func", 11), ("datatype", 12), ("algo", 7), ("proto", 3), ("n_channels", 33),
                     ("channel", 32), ("is_send", 2)):
        ev[f] = np.where(gen.random(n) < 0.8, gen.integers(0, valid, n), gen.integers(0, 256, n))
    for f in ("rank", "root_or_peer", "n_steps", "chunk_size", "step"):
        ev[f] = gen.integers(-2**31, 2**31 - 1, n)
    ev["pid"] = gen.choice([0, 0, 0, os.getpid() + 1, -1], n)
    for f in ("seq", "count", "size", "ptimer"):
        ev[f] = gen.integers(0, 2**63, n, dtype=np.uint64) * gen.integers(1, 3, n, dtype=np.uint64)
    task_start = (ev["op"] == Op.START) & np.isin(ev["type"], [int(T.Coll), int(T.P2p)])
    ev["size"][task_start] = gen.integers(0, 513, int(task_start.sum()))  # group slot + 1: keep it in the table
    for slot in range(512):
        d.set_handle(slot, 0)
    d.replay(ev, raw=True)
    d.replay(ev)  # and once more through the NCCL-faithful filters
    complete(d, ctx, first_slot=1000, seq=1)


def case_null_comm_name(d, ctx, rng):
    ctx2 = d.init(None, 0, 1, 1, 0, env={"MYCROFT_RING_DIR": os.environ["HOSTILE_RING_DIR"]})
    q = Seq()
    p2p(q, ctx2, 0, 0, send=True)
    d.replay(q.array())


def main() -> int:
    case, plugin, ring_dir, version = sys.argv[1:5]
    seed = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    os.environ["HOSTILE_RING_DIR"] = ring_dir
    d, ctx = setup(plugin, ring_dir, int(version))
    globals()["case_" + case](d, ctx, random.Random(seed))
    out = {}
    for path in native.ring_files(ring_dir):
        r = native.open_ring(path)
        h = r.header()
        recs, _, lost = r.read(0)
        live = r.live()
        out[h["comm_name"] or "-"] = dict(h, records=len(recs), lost=lost, live=len(live),
                                          completed_seqs=recs["op"]["seq"].tolist())
    print(json.dumps(out, default=int))
    return 0


if __name__ == "__main__":
    sys.exit(main())
