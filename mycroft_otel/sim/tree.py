"""Tree AllReduce (NCCL's double binary tree): timing of the reduce-up / broadcast-down pipeline.

Per channel a binary tree (Comm.tree: even channels tree 0, odd channels its mirror). Every
non-root rank has one link to its parent; the link carries the reduce phase upward and the
broadcast phase downward, so link arrays are indexed by the child rank: ``up[s, c, child]``
and ``down[s, c, child]`` (columns k*n + r for K communicators side by side). Per chunk s:

* up, leaves first: a rank reduces chunk s of all its children (their up data flushed) with its
  own and sends it to its parent (needs a free slot P and the parent's credit Q);
* the root turns the reduced chunk around; down, root first: a rank receives chunk s from its
  parent and forwards it to its children.

Up and down run on separate GPU cursors (NCCL splits the tree kernel's warps between the two
directions). The per-link recurrence (posts, credits, wire, ack, flush) is the ring's.
"""

from __future__ import annotations

import numpy as np

from mycroft_otel.sim import abi

INF = np.inf


def _kill(t, thr):
    return np.where(t >= thr, INF, t)


def tree_times(sizes, parent, depth, kstart, pstart, gpu_nspb, bw_up, bw_down, lat, flush, ack,
               gpu_stall, send_stall, deliver_up, deliver_down, dead, sleep_t, sleep_ns) -> dict:
    """All arrays (C, N) over ranks (N = K*n); parent (C, N) column index or -1. Returns link times."""
    S = len(sizes)
    C, N = kstart.shape
    keys = ("P", "G", "T", "D", "Q", "A", "F", "U")
    up = {k: np.full((S, C, N), INF) for k in keys}
    dn = {k: np.full((S, C, N), INF) for k in keys}
    xu = kstart.copy()
    xd = kstart.copy()
    wire_u = np.full((C, N), -INF)
    wire_d = np.full((C, N), -INF)
    tprev_u = np.full((C, N), -INF)
    tprev_d = np.full((C, N), -INF)
    cc = np.broadcast_to(np.arange(C)[:, None], (C, N))
    has_parent = parent >= 0
    par = np.where(has_parent, parent, 0)
    maxd = int(depth.max())
    levels = [depth == d for d in range(maxd + 1)]

    def at_parent(a):  # value of the parent of each node
        return np.take_along_axis(a, par, axis=1)

    for s in range(S):
        b = float(sizes[s])
        # posts for this step on every link, at both ends (8 slots per connection)
        up_P = pstart if s < abi.NCCL_STEPS else np.maximum(pstart, up["D"][s - abi.NCCL_STEPS] + 1)
        up["P"][s] = up_P = np.where(has_parent, _kill(up_P, dead), INF)
        pst_par = at_parent(pstart)
        up_Q = pst_par if s < abi.NCCL_STEPS else np.maximum(pst_par, up["U"][s - abi.NCCL_STEPS] + 1)
        up["Q"][s] = up_Q = np.where(has_parent, _kill(up_Q, at_parent(dead)), INF)
        dn_P = pst_par if s < abi.NCCL_STEPS else np.maximum(pst_par, dn["D"][s - abi.NCCL_STEPS] + 1)
        dn["P"][s] = dn_P = np.where(has_parent, _kill(dn_P, at_parent(dead)), INF)
        dn_Q = pstart if s < abi.NCCL_STEPS else np.maximum(pstart, dn["U"][s - abi.NCCL_STEPS] + 1)
        dn["Q"][s] = dn_Q = np.where(has_parent, _kill(dn_Q, dead), INF)
        # --- up: leaves first ---------------------------------------------------------------
        for d in range(maxd, -1, -1):
            lv = levels[d]
            # children's reduced chunks, flushed at this node
            kids = np.full((C, N), -INF)
            kid = levels[d + 1] if d + 1 <= maxd else np.zeros((C, N), bool)
            if kid.any():
                np.maximum.at(kids, (cc[kid], par[kid]), up["F"][s][kid])
            start = np.maximum(np.maximum(xu, kids), np.where(has_parent, up_P, -INF))
            start = _kill(_kill(start, gpu_stall), dead)
            x = start + b * gpu_nspb
            xu = np.where(lv, x, xu)
            if kid.any():  # consumed the children's chunks
                up["U"][s][kid] = at_parent(xu)[kid]
            send = lv & has_parent
            if send.any():
                up["G"][s] = np.where(send, xu, up["G"][s])
                T = np.maximum(np.maximum(xu, up_Q), tprev_u)
                T = _kill(_kill(T, send_stall), dead)
                T = np.where((T >= sleep_t) & (T < sleep_t + sleep_ns), sleep_t + sleep_ns, T)
                T = np.where(send, T, up["T"][s])
                up["T"][s] = T
                tprev_u = np.where(send, T, tprev_u)
                w = np.maximum(T, wire_u) + b / bw_up
                wire_u = np.where(send, w, wire_u)
                A = np.where(T >= deliver_up, INF, w + lat)
                A = _kill(A, at_parent(dead))
                up["D"][s] = np.where(send, A + ack, up["D"][s])
                up["A"][s] = np.where(send, A, up["A"][s])
                up["F"][s] = np.where(send, A + flush, up["F"][s])
        # --- down: root first ------------------------------------------------------------------
        for d in range(0, maxd + 1):
            lv = levels[d]
            if d == 0:
                start = np.maximum(xd, xu)  # the root turns the reduced chunk around
            else:
                start = np.maximum(xd, dn["F"][s])
            kid = levels[d + 1] if d + 1 <= maxd else np.zeros((C, N), bool)
            if kid.any():  # a free slot on every child link
                slot = np.full((C, N), -INF)
                np.maximum.at(slot, (cc[kid], par[kid]), dn_P[kid])
                start = np.maximum(start, slot)
            start = _kill(_kill(start, gpu_stall), dead)
            x = start + b * gpu_nspb
            xd = np.where(lv, x, xd)
            if d > 0:
                dn["U"][s] = np.where(lv, xd, dn["U"][s])
            if kid.any():
                g = at_parent(xd)
                dn["G"][s] = np.where(kid, g, dn["G"][s])
                T = np.maximum(np.maximum(g, dn_Q), tprev_d)
                T = _kill(_kill(T, at_parent(send_stall)), at_parent(dead))
                st = at_parent(sleep_t)
                T = np.where((T >= st) & (T < st + sleep_ns), st + sleep_ns, T)
                T = np.where(kid, T, dn["T"][s])
                dn["T"][s] = T
                tprev_d = np.where(kid, T, tprev_d)
                w = np.maximum(T, wire_d) + b / bw_down
                wire_d = np.where(kid, w, wire_d)
                A = np.where(T >= deliver_down, INF, w + lat)
                A = _kill(A, dead)
                dn["D"][s] = np.where(kid, A + ack, dn["D"][s])
                dn["A"][s] = np.where(kid, A, dn["A"][s])
                dn["F"][s] = np.where(kid, A + flush, dn["F"][s])
    return {"up": up, "down": dn, "X": np.maximum(xu, xd)}


def tree_depth(parent: np.ndarray) -> np.ndarray:
    """Depth of every node (root 0) from a parent array (C, N) of column indexes (-1 = root)."""
    depth = np.zeros(parent.shape, dtype=np.int64)
    cur = parent.copy()
    for _ in range(parent.shape[1]):
        has = cur >= 0
        if not has.any():
            break
        depth += has
        cur = np.where(has, np.take_along_axis(parent, np.where(has, cur, 0), axis=1), -1)
    return depth


def tree_parents(insts, nm: int) -> np.ndarray:
    """(C, K*nm) parent column per member column for K communicators side by side (members = comm ranks)."""
    C = insts[0].comm.n_channels
    out = np.full((C, len(insts) * nm), -1, dtype=np.int64)
    for k, inst in enumerate(insts):
        for c in range(C):
            parent, _ = inst.comm.tree(c)
            out[c, k * nm:(k + 1) * nm] = np.where(parent >= 0, parent + k * nm, -1)
    return out


def tree_batch(first, insts, nm, C, parent, par, tnet, sizes, kstart, pstart, m, m_sbw, m_deliver, sleep_ns, ctx,
               owner, mem, coll_slot, model, slots, rng, predict, m_horizon=INF):
    """Tree AllReduce of a batch: times (tree.py) and the four ProxyOp kinds per link."""
    from mycroft_otel.sim.callbacks import flow_rows as _flow_rows

    net, gpu, nc = model.net, model.gpu, model.nccl
    N = len(mem)
    has = parent >= 0
    depth = tree_depth(parent)
    per_rank = has.astype(int).sum(axis=0)
    for c in range(C):
        per_rank = per_rank + np.bincount(par[c][has[c]], minlength=N)
    nic_flows = max(1, int(per_rank.max()))
    from mycroft_otel.sim.engine import log_uniform

    # NCCL's healthy variation per flow (model.NoiseModel.flow_spread); the tree has no per-step noise
    bw_net = np.minimum(net.link_bw, net.nic_bw / nic_flows) / log_uniform(rng, model.noise.flow_spread, (C, N))
    sfac_child = m_sbw                                   # child -> parent uses the child's NIC
    sfac_par = np.take_along_axis(m_sbw, par, axis=1)    # parent -> child uses the parent's NIC
    rf = m["recv_bw_factor"]
    bw_up = np.where(tnet, bw_net / (sfac_child * rf[par]), net.nvlink_bw)
    bw_dn = np.where(tnet, bw_net / (sfac_par * rf[None, :]), net.nvlink_bw)
    lat = np.where(tnet, net.net_latency_ns, net.nvlink_latency_ns)
    flush = np.where(tnet, net.flush_ns, 0.0)
    full = lambda a: np.broadcast_to(a, (C, N)).copy()  # noqa: E731
    deliver_up = np.where(tnet, m_deliver, INF)
    deliver_dn = np.where(tnet, np.take_along_axis(m_deliver, par, axis=1), INF)
    tm = tree_times(sizes, parent, depth, full(kstart), full(pstart), full(m["gpu_factor"] / gpu.reduce_bw),
                    bw_up, bw_dn, lat, flush, net.ack_latency_ns, full(m["gpu_stall_t"]),
                    full(m["send_stall_t"]), deliver_up, deliver_dn, full(m["dead_t"]),
                    full(m["proxy_sleep_t"]), sleep_ns)
    S = len(sizes)
    nsteps = np.full((C, N), S, dtype=np.int32)
    child_rank = np.broadcast_to(mem, (C, N))
    parent_rank = mem[par]
    blocks, flows = [], []
    ends = np.full((C, N), -INF)
    ps = np.broadcast_to(pstart, (C, N))
    for is_send, t, rank_pos, peer_pos, at_parent in (
            (True, tm["up"], child_rank, parent_rank, False),     # child sends its reduced chunk up
            (False, tm["up"], parent_rank, child_rank, True),     # parent receives it
            (True, tm["down"], parent_rank, child_rank, True),    # parent broadcasts down
            (False, tm["down"], child_rank, parent_rank, False)):  # child receives it
        who = par if at_parent else np.broadcast_to(np.arange(N), (C, N))
        b, f, e = _flow_rows(is_send, tnet, rank_pos, peer_pos, who, t, sizes, np.take_along_axis(ps, who, axis=1),
                             coll_slot[who], ctx[who], owner[who], nsteps, nc.step_bytes, slots, predict,
                             retry_ns=nc.peer_wait_retry_ns, horizon=m_horizon)
        for fl, (c, col) in zip(f, zip(*np.nonzero(tnet))):
            fl["inst"] = int(who[c, col] // nm)
        blocks += b
        flows += f
        for c in range(C):  # a rank's op ends with the last of its ProxyOps
            sel = tnet[c]
            np.maximum.at(ends[c], who[c][sel], e[c][sel])
    kst = np.broadcast_to(kstart, (C, N))
    kstop = np.where(np.isfinite(kst), tm["X"], INF)
    end = np.maximum(kstop.max(axis=0), ends.max(axis=0))
    return blocks, end, kstop, kst, flows
