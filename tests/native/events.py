"""Event-row builders for the native tests: NCCL's documented call sequences as EVENT_DTYPE rows.

Sequences follow design.md section 3 (NCCL 2.28 order for one implicit-group collective) and NCCL's
ProxyStep state machine (send: GPUWait -> [PeerWait] -> SendWait -> stop; recv: RecvWait ->
RecvFlushWait -> RecvGPUWait -> stop). Rows use the newest ABI's numbers; the Driver translates.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mycroft_otel.native import (ALGO_NAMES, DATATYPE_NAMES, FUNC_NAMES, NO_SLOT, PROTO_NAMES, EventType as T, Op,
                                 State, new_events)


@dataclass
class Seq:
    """Accumulates rows; hands out fresh handle slots."""

    first_slot: int = 0
    rows: list[dict] = field(default_factory=list)

    def __post_init__(self):
        self._next = self.first_slot

    def slot(self) -> int:
        s = self._next
        self._next += 1
        return s

    def start(self, ctx: int, type_: int, parent: int | None = None, group: int | None = None, **f) -> int:
        s = self.slot()
        row = dict(op=Op.START, ctx=ctx, slot=s, type=int(type_), parent_slot=NO_SLOT if parent is None else parent, **f)
        if group is not None:
            row["size"] = group + 1
        self.rows.append(row)
        return s

    def stop(self, slot: int, **f) -> None:
        self.rows.append(dict(op=Op.STOP, slot=slot, **f))

    def record(self, slot: int, state: int, **f) -> None:
        self.rows.append(dict(op=Op.RECORD, slot=slot, state=int(state), **f))

    def array(self) -> np.ndarray:
        return rows_to_array(self.rows)


def rows_to_array(rows: list[dict]) -> np.ndarray:
    ev = new_events(len(rows))
    for i, r in enumerate(rows):
        for k, v in r.items():
            ev[k][i] = int(v)
    return ev


def idx(table, name):
    return table.index(name)


def send_steps(q: Seq, op_slot: int, ctx: int, rank: int, n_steps: int, chunk: int, peer_wait: bool = False,
               stop_after: int | None = None):
    """ProxySteps of one send ProxyOp; stop_after=k leaves step k in SendWait (for in-flight tests)."""
    for step in range(n_steps):
        s = q.start(ctx, T.ProxyStep, parent=op_slot, rank=rank, step=step)
        q.record(s, State.ProxyStepSendGPUWait, size=chunk)
        if peer_wait:
            q.record(s, State.ProxyStepSendPeerWait, size=chunk)
        q.record(s, State.ProxyStepSendWait, size=chunk)
        if stop_after is not None and step >= stop_after:
            return
        q.stop(s)


def recv_steps(q: Seq, op_slot: int, ctx: int, rank: int, n_steps: int, chunk: int, stop_after: int | None = None):
    for step in range(n_steps):
        s = q.start(ctx, T.ProxyStep, parent=op_slot, rank=rank, step=step)
        q.record(s, State.ProxyStepRecvWait, size=chunk)
        if stop_after is not None and step >= stop_after:
            return
        q.record(s, State.ProxyStepRecvFlushWait, size=chunk)
        q.record(s, State.ProxyStepRecvGPUWait, size=chunk)
        q.stop(s)


def api_prologue(q: Seq, ctx: int, rank: int, func: str, count: int, dtype: str, root: int = -1,
                 p2p: bool = False, user_tag: int = 0) -> tuple[int, int, int]:
    """GroupApi start, GroupStartApiStop, CollApi/P2pApi start/stop, GroupEndApiStart, KernelLaunch, Group start.

    ``user_tag``: the v7 userTag NCCL copies into CollApi/P2pApi and Coll/P2p (rows carry it in ``ptimer``)."""
    g_api = q.start(ctx, T.GroupApi, rank=rank, step=1)
    q.record(g_api, State.GroupStartApiStop)
    api = q.start(ctx, T.P2pApi if p2p else T.CollApi, parent=g_api, rank=rank, func=idx(FUNC_NAMES, func),
                  count=count, datatype=idx(DATATYPE_NAMES, dtype), root_or_peer=root, ptimer=user_tag)
    q.stop(api)
    q.record(g_api, State.GroupEndApiStart)
    kl = q.start(ctx, T.KernelLaunch, parent=g_api, rank=rank)
    q.stop(kl)
    group = q.start(ctx, T.Group, rank=rank)
    return g_api, api, group


def ring_allreduce(q: Seq, ctx: int, rank: int, nranks: int, coll_seq: int, count: int = 1 << 20,
                   dtype: str = "ncclFloat32", n_channels: int = 2, steps: int | None = None, chunk: int = 1 << 17,
                   algo: str = "RING", proto: str = "SIMPLE", func: str = "AllReduce",
                   stall_send_at: int | None = None, user_tag: int = 0,
                   phases_ns: tuple[int, int, int] | None = None) -> dict:
    """One ring collective on RANK; returns the slots. steps defaults to the ring all-reduce 2*(n-1)*chunks.

    ``phases_ns``: (initial sync, compute, final sync) durations: each KernelCh then carries three v7
    KernelPhase sub-events (start/KernelPhaseStop/stop) tiling the channel's GPU time."""
    if steps is None:
        steps = 2 * (nranks - 1)
    g_api, api, group = api_prologue(q, ctx, rank, func, count, dtype, user_tag=user_tag)
    coll = q.start(ctx, T.Coll, parent=api, group=group, rank=rank, seq=coll_seq, func=idx(FUNC_NAMES, func),
                   count=count, datatype=idx(DATATYPE_NAMES, dtype), root_or_peer=-1, n_channels=n_channels,
                   algo=idx(ALGO_NAMES, algo), proto=idx(PROTO_NAMES, proto), ptimer=user_tag)
    q.stop(coll)
    q.stop(group)
    q.stop(g_api)
    nxt, prv = (rank + 1) % nranks, (rank - 1) % nranks
    ops = []
    for ch in range(n_channels):
        so = q.start(ctx, T.ProxyOp, parent=coll, rank=rank, channel=ch, root_or_peer=nxt, n_steps=steps,
                     chunk_size=chunk, is_send=1)
        ro = q.start(ctx, T.ProxyOp, parent=coll, rank=rank, channel=ch, root_or_peer=prv, n_steps=steps,
                     chunk_size=chunk, is_send=0)
        q.record(so, State.ProxyOpInProgress)
        q.record(ro, State.ProxyOpInProgress)
        ops.append((so, ro))
    for ch, (so, ro) in enumerate(ops):
        stalled = stall_send_at is not None and ch == 0
        send_steps(q, so, ctx, rank, steps, chunk, stop_after=stall_send_at if stalled else None)
        recv_steps(q, ro, ctx, rank, steps, chunk)
        if not stalled:
            q.stop(so)
        q.stop(ro)
    kchs = []
    for ch in range(n_channels):
        k = q.start(ctx, T.KernelCh, parent=coll, rank=rank, channel=ch, ptimer=1_000_000 + ch)
        kchs.append(k)
        if phases_ns is not None:
            t = 1_000_000 + ch
            for ph, dur in enumerate(phases_ns):
                p = q.start(ctx, T.KernelPhase, parent=k, rank=rank, channel=ch, step=ph, ptimer=t)
                t += dur
                q.record(p, State.KernelPhaseStop, ptimer=t)
                q.stop(p)
    if stall_send_at is None:
        for ch, k in enumerate(kchs):
            q.record(k, State.KernelChStop, ptimer=2_000_000 + ch)
            q.stop(k)
    return dict(group_api=g_api, api=api, group=group, coll=coll, proxy_ops=ops, kernel_ch=kchs)


def tree_allreduce(q: Seq, ctx: int, rank: int, nranks: int, coll_seq: int, count: int = 1 << 16,
                   n_channels: int = 1, steps: int = 4, chunk: int = 1 << 16) -> dict:
    """A chain tree: reduce up (recv from child, send to parent), broadcast down (recv parent, send child)."""
    g_api, api, group = api_prologue(q, ctx, rank, "AllReduce", count, "ncclFloat32")
    coll = q.start(ctx, T.Coll, parent=api, group=group, rank=rank, seq=coll_seq, func=idx(FUNC_NAMES, "AllReduce"),
                   count=count, datatype=idx(DATATYPE_NAMES, "ncclFloat32"), root_or_peer=-1,
                   n_channels=n_channels, algo=idx(ALGO_NAMES, "TREE"), proto=idx(PROTO_NAMES, "SIMPLE"))
    q.stop(coll)
    q.stop(group)
    q.stop(g_api)
    parent, child = rank - 1, rank + 1
    for ch in range(n_channels):
        for phase in ("up", "down"):
            send_peer = parent if phase == "up" else child
            recv_peer = child if phase == "up" else parent
            if 0 <= recv_peer < nranks:
                ro = q.start(ctx, T.ProxyOp, parent=coll, rank=rank, channel=ch, root_or_peer=recv_peer,
                             n_steps=steps, chunk_size=chunk, is_send=0)
                recv_steps(q, ro, ctx, rank, steps, chunk)
                q.stop(ro)
            if 0 <= send_peer < nranks:
                so = q.start(ctx, T.ProxyOp, parent=coll, rank=rank, channel=ch, root_or_peer=send_peer,
                             n_steps=steps, chunk_size=chunk, is_send=1)
                send_steps(q, so, ctx, rank, steps, chunk)
                q.stop(so)
        k = q.start(ctx, T.KernelCh, parent=coll, rank=rank, channel=ch, ptimer=5)
        q.record(k, State.KernelChStop, ptimer=9)
        q.stop(k)
    return dict(coll=coll)


def p2p(q: Seq, ctx: int, rank: int, peer: int, send: bool, count: int = 1 << 16, steps: int = 4,
        chunk: int = 1 << 16, channel: int = 0) -> dict:
    """One ncclSend (send=True) or ncclRecv on RANK with PEER."""
    func = "Send" if send else "Recv"
    g_api, api, group = api_prologue(q, ctx, rank, func, count, "ncclFloat32", p2p=True)
    op = q.start(ctx, T.P2p, parent=api, group=group, rank=rank, func=idx(FUNC_NAMES, func), count=count,
                 datatype=idx(DATATYPE_NAMES, "ncclFloat32"), root_or_peer=peer, n_channels=1)
    q.stop(op)
    q.stop(group)
    q.stop(g_api)
    po = q.start(ctx, T.ProxyOp, parent=op, rank=rank, channel=channel, root_or_peer=peer, n_steps=steps,
                 chunk_size=chunk, is_send=int(send))
    (send_steps if send else recv_steps)(q, po, ctx, rank, steps, chunk)
    q.stop(po)
    k = q.start(ctx, T.KernelCh, parent=op, rank=rank, channel=channel, ptimer=1)
    q.record(k, State.KernelChStop, ptimer=2)
    q.stop(k)
    return dict(p2p=op)
