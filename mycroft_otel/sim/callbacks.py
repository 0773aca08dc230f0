"""Turning a collective's timing into the calls NCCL makes on the profiler ABI (EVENT_DTYPE rows).

``user_rows``: the user-thread calls of one NCCL API call (NCCL 2.28 order, design §3).
``flow_rows``: per network flow a ProxyOp and its ProxySteps with NCCL's state order, on the proxy thread.
"""

from __future__ import annotations

import numpy as np

from mycroft_otel.sim import abi
from mycroft_otel.sim.model import TimingModel
from mycroft_otel.sim.rows import PROXY, USER, SlotAllocator, block

INF = np.inf


def user_rows(inst, t_issue: np.ndarray, model: TimingModel, slots: SlotAllocator, ctx: np.ndarray,
               owner: np.ndarray, funcs: list, counts: np.ndarray, peers: np.ndarray, ranks: np.ndarray,
               seqs: np.ndarray, nccl_seqs: np.ndarray, roots: np.ndarray) -> tuple[list, np.ndarray]:
    """The user-thread calls of one NCCL API call per member (NCCL 2.28 order, design §3); returns the
    blocks and each member's Coll/P2p slot (the parent of its ProxyOps and KernelChs).

    The simulated framework tags every call with its training step + 1 (v7 userTag through
    ncclCollConfig_t.userProfilerTag; rows carry it in ``ptimer``, older ABIs never see it)."""
    nc = model.nccl
    gap = model.gpu.api_gap_ns
    n = len(t_issue)
    s_gapi, s_capi, s_kl, s_grp, s_coll = (slots.take(n) for _ in range(5))
    func_idx = np.asarray([abi.FUNC[f] for f in funcs], dtype=np.uint8)
    dt = abi.DATATYPE[nc.datatype]
    p2p = inst.is_p2p
    common = dict(ctx=ctx, rank=ranks)
    t = t_issue
    api_type = abi.P2P_API if p2p else abi.COLL_API
    ev_type = abi.P2P if p2p else abi.COLL
    root = peers if p2p else roots
    tag = np.uint64(inst.step + 1)
    out = [
        block(t, owner, USER, op=abi.OP_START, type=abi.GROUP_API, slot=s_gapi, parent_slot=abi.NO_SLOT, **common),
        block(t + gap, owner, USER, op=abi.OP_RECORD, slot=s_gapi, state=abi.S_GROUP_START_API_STOP, **common),
        block(t + 2 * gap, owner, USER, op=abi.OP_START, type=api_type, slot=s_capi, parent_slot=s_gapi,
              func=func_idx, count=counts, datatype=dt, root_or_peer=root, ptimer=tag, **common),
        block(t + 3 * gap, owner, USER, op=abi.OP_STOP, slot=s_capi, **common),
        block(t + 4 * gap, owner, USER, op=abi.OP_RECORD, slot=s_gapi, state=abi.S_GROUP_END_API_START, **common),
        block(t + 5 * gap, owner, USER, op=abi.OP_START, type=abi.KERNEL_LAUNCH, slot=s_kl, parent_slot=s_gapi,
              **common),
        block(t + 6 * gap, owner, USER, op=abi.OP_STOP, slot=s_kl, **common),
        block(t + 7 * gap, owner, USER, op=abi.OP_START, type=abi.GROUP, slot=s_grp, parent_slot=abi.NO_SLOT,
              **common),
        block(t + 8 * gap, owner, USER, op=abi.OP_START, type=ev_type, slot=s_coll, parent_slot=s_capi,
              func=func_idx, count=counts, datatype=dt, root_or_peer=root,
              seq=np.where(nccl_seqs >= 0, nccl_seqs, seqs).astype(np.uint64),
              algo=abi.ALGO[inst.algo], proto=abi.PROTO[nc.proto], n_channels=inst.comm.n_channels,
              # the Group handle (coll.parentGroup) rides in `size` as slot + 1 (driver_event.h convention)
              size=s_grp.astype(np.uint64) + 1, ptimer=tag, **common),
        block(t + 9 * gap, owner, USER, op=abi.OP_STOP, slot=s_coll, **common),
        block(t + 10 * gap, owner, USER, op=abi.OP_STOP, slot=s_grp, **common),
        block(t + 11 * gap, owner, USER, op=abi.OP_STOP, slot=s_gapi, **common),
    ]
    return [b for b in out if b is not None], s_coll


def flow_rows(is_send: bool, mask, rank_pos, peer_pos, member_pos, tm: dict, sizes, pstart_pos,
               coll_slot, ctx_pos, owner_pos, nsteps_pos, chunk: int, slots: SlotAllocator,
               predict: bool, hang_mask=None, retry_ns: float = 0.0,
               horizon: float = INF) -> tuple[list, list, np.ndarray]:
    """ProxyOp + ProxySteps of one direction for every flow in ``mask`` (C, L). Returns (blocks, predicted
    flow counters, per-flow op end (C, L)).

    NCCL records SendPeerWait again on every refused isend, i.e. continuously while the receiver has not
    posted: the oldest ready-but-untransmitted step of a flow repeats it every ``retry_ns`` until it is
    transmitted (or until ``horizon`` when it never is).
    """
    S = len(sizes)
    C, L = mask.shape
    if is_send:
        st = [tm["P"], tm["P"], np.where(tm["T"] > tm["G"], tm["G"], INF), tm["T"], tm["D"]]
        states = (abi.S_SEND_GPU_WAIT, abi.S_SEND_PEER_WAIT, abi.S_SEND_WAIT)
    else:
        st = [tm["Q"], tm["Q"], tm["A"], tm["F"], tm["U"]]
        states = (abi.S_RECV_WAIT, abi.S_RECV_FLUSH_WAIT, abi.S_RECV_GPU_WAIT)
    # Causality: a state happens only if the previous ones did (SendPeerWait is optional).
    reach = np.isfinite(st[0])
    for k in (1, 3, 4):
        st[k] = np.where(reach, st[k], INF)
        reach = np.isfinite(st[k])
    st[2] = np.where(np.isfinite(st[1]), st[2], INF)
    m3 = np.broadcast_to(mask, (S, C, L))
    st = [np.where(m3, x, INF) for x in st]
    op_end = np.where(mask, st[4].max(axis=0), INF)
    nflows = int(mask.sum())
    op_slot = np.zeros((C, L), dtype=np.uint32)
    op_slot[mask] = slots.take(nflows)
    step_slot = np.zeros((S, C, L), dtype=np.uint32)
    step_slot[m3] = slots.take(nflows * S)
    t_op = np.where(mask & np.isfinite(pstart_pos), pstart_pos, INF)
    step_idx = np.broadcast_to(np.arange(S, dtype=np.int32)[:, None, None], (S, C, L))
    size3 = np.broadcast_to(sizes[:, None, None], (S, C, L))
    ch = np.broadcast_to(np.arange(C, dtype=np.uint8)[:, None], (C, L))
    ctx3 = np.broadcast_to(ctx_pos, (S, C, L))
    own3 = np.broadcast_to(owner_pos, (S, C, L))
    rank3 = np.broadcast_to(rank_pos, (S, C, L))
    blocks = [
        block(t_op, owner_pos, PROXY, op=abi.OP_START, type=abi.PROXY_OP, slot=op_slot, parent_slot=coll_slot,
              ctx=ctx_pos, rank=rank_pos, root_or_peer=peer_pos, channel=ch, is_send=int(is_send),
              n_steps=nsteps_pos, chunk_size=chunk),
        block(np.where(np.isfinite(t_op), st[0][0], INF), owner_pos, PROXY, op=abi.OP_RECORD, slot=op_slot,
              state=abi.S_PROXY_OP_IN_PROGRESS, ctx=ctx_pos, rank=rank_pos),
        block(st[0], own3, PROXY, op=abi.OP_START, type=abi.PROXY_STEP, slot=step_slot,
              parent_slot=np.broadcast_to(op_slot, (S, C, L)), step=step_idx, ctx=ctx3, rank=rank3),
    ]
    for k, state in enumerate(states):
        # transSize is valid at SendWait and RecvFlushWait only (NCCL sets it when it posts / receives).
        sz = size3 if state in (abi.S_SEND_WAIT, abi.S_RECV_FLUSH_WAIT) else 0
        blocks.append(block(st[k + 1], own3, PROXY, op=abi.OP_RECORD, slot=step_slot, state=state, size=sz,
                            step=step_idx, ctx=ctx3, rank=rank3))
    if is_send and retry_ns > 0:
        blocks += _peer_wait_retries(st, mask, step_slot, owner_pos, ctx_pos, rank_pos, retry_ns, horizon)
    blocks.append(block(st[4], own3, PROXY, op=abi.OP_STOP, slot=step_slot, ctx=ctx3, rank=rank3))
    if hang_mask is not None and hang_mask.any():
        # A rank that called a bigger collective (coll_mismatch) posts more steps than its peers serve:
        # after its last real step it waits forever on the next ones (no credit / no data).
        last = np.where(np.isfinite(st[4][-1]), st[4][-1], INF)
        extra = 1 if is_send else abi.NCCL_STEPS
        for c, p in zip(*np.nonzero(hang_mask & mask & np.isfinite(last))):
            sl = slots.take(extra)
            t = np.full(extra, last[c, p])
            steps = np.arange(S, S + extra, dtype=np.int32)
            kw = dict(ctx=ctx_pos[c, p], rank=rank_pos[c, p], step=steps)
            blocks.append(block(t, owner_pos[c, p], PROXY, op=abi.OP_START, type=abi.PROXY_STEP, slot=sl,
                                parent_slot=op_slot[c, p], **kw))
            blocks.append(block(t, owner_pos[c, p], PROXY, op=abi.OP_RECORD, slot=sl, state=states[0], **kw))
            if is_send:  # the GPU produced it; the receiver never gives credit
                blocks.append(block(t + 1000.0, owner_pos[c, p], PROXY, op=abi.OP_RECORD, slot=sl,
                                    state=abi.S_SEND_PEER_WAIT, size=int(sizes[-1]), **kw))
        op_end = np.where(hang_mask, INF, op_end)
    blocks.append(block(op_end, owner_pos, PROXY, op=abi.OP_STOP, slot=op_slot, ctx=ctx_pos, rank=rank_pos))
    flows = []
    if predict:
        fin = [np.isfinite(x) for x in st]
        ready = fin[2] | fin[3] if is_send else fin[2]
        for c, p in zip(*np.nonzero(mask)):
            flows.append(dict(
                rank=int(rank_pos[c, p]), channel=int(c), dir="send" if is_send else "recv",
                peer=int(peer_pos[c, p]), n_steps=int(nsteps_pos[c, p]), posted=int(fin[0][:, c, p].sum()),
                ready=int(ready[:, c, p].sum()), transmitted=int(fin[3][:, c, p].sum()),
                done=int(fin[4][:, c, p].sum()), bytes_done=int(sizes[fin[4][:, c, p]].sum()),
                end_ns=float(op_end[c, p])))
    return [b for b in blocks if b is not None], flows, op_end


def _peer_wait_retries(st, mask, step_slot, owner_pos, ctx_pos, rank_pos, retry_ns: float, horizon: float) -> list:
    """Repeated SendPeerWait records of the step each flow is retrying (see flow_rows)."""
    t_peer, t_send = st[2], st[3]
    waiting = np.isfinite(t_peer) & (np.minimum(t_send, horizon) - t_peer > retry_ns)
    out = []
    for c, p in zip(*np.nonzero(mask & waiting.any(axis=0))):
        s = int(np.nonzero(waiting[:, c, p])[0][0])  # the oldest step: NCCL retries steps in order
        t = np.arange(t_peer[s, c, p] + retry_ns, min(t_send[s, c, p], horizon), retry_ns)
        if len(t):
            out.append(block(t, owner_pos[c, p], PROXY, op=abi.OP_RECORD, slot=step_slot[s, c, p],
                             state=abi.S_SEND_PEER_WAIT, step=s, ctx=ctx_pos[c, p], rank=rank_pos[c, p]))
    return [b for b in out if b is not None]
