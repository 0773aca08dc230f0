"""A tiny EVENT_DTYPE builder for agent tests: ring all-reduces as NCCL 2.28 emits them (design §3).

The full NCCL-faithful streams are the simulator's job; this only needs the
callbacks that make the plugin fill its live table and ring: Group/Coll, ProxyOps
per channel and direction, ProxySteps with their states, KernelCh.
"""

from __future__ import annotations

import numpy as np

from mycroft_otel.native import NO_SLOT, EventType as T, Op, State, new_events


class Rows:
    def __init__(self) -> None:
        self.rows: list[tuple] = []
        self.next_slot = 0

    def _slot(self) -> int:
        self.next_slot += 1
        return self.next_slot - 1

    def start(self, ctx: int, type_: int, parent: int | None = None, **f) -> int:
        s = self._slot()
        self.rows.append((Op.START, ctx, s, NO_SLOT if parent is None else parent, int(type_), 0, f))
        return s

    def stop(self, ctx: int, slot: int) -> None:
        self.rows.append((Op.STOP, ctx, slot, NO_SLOT, 0, 0, {}))

    def record(self, ctx: int, slot: int, state: int, **f) -> None:
        self.rows.append((Op.RECORD, ctx, slot, NO_SLOT, 0, int(state), f))

    def array(self) -> np.ndarray:
        ev = new_events(len(self.rows))
        for i, (op, ctx, slot, parent, type_, state, f) in enumerate(self.rows):
            ev["op"][i], ev["ctx"][i], ev["slot"][i], ev["parent_slot"][i] = int(op), ctx, slot, parent
            ev["type"][i], ev["state"][i] = type_, state
            for k, v in f.items():
                ev[k][i] = v
        return ev


def ring_allreduce(q: Rows, ctx: int, rank: int, nranks: int, seq: int, n_channels: int = 2, steps: int = 4,
                   chunk: int = 1 << 17, count: int = 1 << 20, stall_send_channel0_at: int | None = None) -> None:
    """One ring AllReduce on RANK (func 4, ncclFloat32, Ring, Simple); optionally left in flight (send ch0 stuck)."""
    g_api = q.start(ctx, T.GroupApi, rank=rank)
    q.record(ctx, g_api, State.GroupStartApiStop)
    api = q.start(ctx, T.CollApi, parent=g_api, rank=rank, func=4, count=count, datatype=7, root_or_peer=-1)
    q.stop(ctx, api)
    q.record(ctx, g_api, State.GroupEndApiStart)
    group = q.start(ctx, T.Group, rank=rank)
    coll = q.start(ctx, T.Coll, parent=api, rank=rank, seq=seq, func=4, count=count, datatype=7, root_or_peer=-1,
                   n_channels=n_channels, algo=1, proto=2, size=group + 1)
    q.stop(ctx, coll)
    q.stop(ctx, group)
    q.stop(ctx, g_api)
    nxt, prv = (rank + 1) % nranks, (rank - 1) % nranks
    for ch in range(n_channels):
        so = q.start(ctx, T.ProxyOp, parent=coll, rank=rank, channel=ch, root_or_peer=nxt, n_steps=steps,
                     chunk_size=chunk, is_send=1)
        ro = q.start(ctx, T.ProxyOp, parent=coll, rank=rank, channel=ch, root_or_peer=prv, n_steps=steps,
                     chunk_size=chunk, is_send=0)
        q.record(ctx, so, State.ProxyOpInProgress)
        q.record(ctx, ro, State.ProxyOpInProgress)
        stalled = False
        for step in range(steps):
            s = q.start(ctx, T.ProxyStep, parent=so, rank=rank, step=step)
            q.record(ctx, s, State.ProxyStepSendGPUWait, size=chunk)
            q.record(ctx, s, State.ProxyStepSendWait, size=chunk)
            if ch == 0 and stall_send_channel0_at is not None and step >= stall_send_channel0_at:
                stalled = True
                break
            q.stop(ctx, s)
            r = q.start(ctx, T.ProxyStep, parent=ro, rank=rank, step=step)
            q.record(ctx, r, State.ProxyStepRecvWait, size=chunk)
            q.record(ctx, r, State.ProxyStepRecvFlushWait, size=chunk)
            q.record(ctx, r, State.ProxyStepRecvGPUWait, size=chunk)
            q.stop(ctx, r)
        if stalled:
            continue
        q.stop(ctx, so)
        q.stop(ctx, ro)
        k = q.start(ctx, T.KernelCh, parent=coll, rank=rank, channel=ch, ptimer=1)
        q.record(ctx, k, State.KernelChStop, ptimer=2)
        q.stop(ctx, k)
