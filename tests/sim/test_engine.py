"""The simulator's event streams against NCCL's documented behaviour (no plugin needed)."""

from __future__ import annotations

import numpy as np
import pytest

from mycroft_otel.sim import abi
from mycroft_otel.sim.engine import RING_STEPS_PER_LOOP, RING_WINDOW, SLICES_PER_CHUNK, chunk_bytes, step_sizes
from mycroft_otel.sim.rows import KERNEL, PROXY, USER
from mycroft_otel.sim.topology import Topology, TopologyError, build_comms, parse_topology

from _simtools import make_sim


def collect(sim):
    got = []
    sim.run(lambda inst, res: got.append((inst, res)))
    return got


def rows_of(results, thread=None):
    blocks = [b for _, r in results for b in r.blocks if thread is None or b.thread == thread]
    rows = np.concatenate([b.rows for b in blocks])
    return rows[np.argsort(rows["t_ns"], kind="stable")]


@pytest.mark.parametrize("func,n,nch,nbytes,chunk", [
    ("AllReduce", 8, 2, 64 << 20, 2 << 20), ("AllReduce", 4, 2, 3 << 20, 2 << 20),
    ("AllGather", 8, 2, 1 << 20, 2 << 20), ("ReduceScatter", 16, 4, 1 << 20, 1 << 20),
    ("AllReduce", 4, 2, (1 << 20) + 6, 2 << 20),
    ("Broadcast", 8, 2, 5 << 20, 512 << 10), ("Send", 2, 1, 4 << 20, 512 << 10), ("AllReduce", 64, 2, 1 << 20, 2 << 20),
])
def test_step_counts_follow_nccl_formula(func, n, nch, nbytes, chunk):
    """NCCL's SIMPLE ring: per loop each of the m stages moves a chunk of min(chunk, remaining/n) bytes as
    chunkSteps/sliceSteps = 2 slices, one ProxyStep each; Broadcast and p2p move one step per chunk."""
    count = nbytes // 2
    sizes = step_sizes(func, count, 2, n, nch, chunk)
    per_ch = -(-(count * 2 * (n if func in ("AllGather", "ReduceScatter") else 1)) // nch)
    if func in RING_STEPS_PER_LOOP:
        m = {"AllReduce": 2 * (n - 1)}.get(func, n - 1)
        loops = max(1, -(-per_ch // (n * chunk)))
        assert SLICES_PER_CHUNK == 2 and RING_WINDOW == abi.NCCL_STEPS // 2
        assert len(sizes) == loops * m * SLICES_PER_CHUNK
        per_loop = sizes.reshape(loops, m, SLICES_PER_CHUNK)
        # the two slices of a chunk split it (the first rounded up) and every stage of a loop moves the same
        assert np.all(per_loop[..., 0] >= per_loop[..., 1]) and np.all(per_loop[..., 0] - per_loop[..., 1] <= 1)
        assert np.all(per_loop == per_loop[:, :1, :])
        assert per_loop.sum(axis=2).max() <= chunk
        # one stage's chunks, from every rank, cover the channel's data
        assert per_loop[:, 0, :].sum() * n >= per_ch
    else:
        assert len(sizes) == -(-per_ch // chunk)
        assert sizes.sum() == per_ch


def test_ring_chunk_is_four_fifo_slots_and_chains_one():
    assert chunk_bytes("AllReduce", 512 << 10) == 2 << 20 and chunk_bytes("ReduceScatter", 512 << 10) == 2 << 20
    assert chunk_bytes("Broadcast", 512 << 10) == 512 << 10 and chunk_bytes("Send", 512 << 10) == 512 << 10


def test_topology_parsing_and_comms():
    t = parse_topology("nodes=8,gpus=8,tp=8,pp=2,dp=4")
    assert (t.world, t.tp, t.pp, t.dp) == (64, 8, 2, 4)
    with pytest.raises(TopologyError):
        parse_topology("nodes=2,gpus=8,tp=3")
    with pytest.raises(TopologyError):
        Topology(nodes=2, gpus=8, tp=8, pp=1, dp=3)
    comms = build_comms(t, seed=1)
    assert len(comms["tp"]) == 8 and len(comms["dp"]) == 16 and len(comms["pp"]) == 32
    for c in comms["tp"]:
        assert c.n_nodes == 1  # TP stays in a node
    for c in comms["dp"]:
        assert c.n_nodes == 4
    hashes = [c.comm_hash for lst in comms.values() for c in lst]
    assert len(set(hashes)) == len(hashes)


def test_ring_orders_consistent_across_ranks():
    comms = build_comms(parse_topology("nodes=8,gpus=8,tp=4,dp=16"), seed=3, dp_channels=4)
    for c in comms["dp"]:
        prv, nxt = c.ring_neighbours()
        for ch in range(c.n_channels):
            assert np.all(nxt[ch][prv[ch]] == np.arange(c.nranks))
            # a ring visits every rank once
            seen, r = set(), 0
            for _ in range(c.nranks):
                seen.add(r)
                r = nxt[ch][r]
            assert len(seen) == c.nranks and r == 0
        assert np.all(nxt[1] == prv[0])  # odd channels run the reverse order


def test_proxy_op_peers_are_ring_neighbours():
    sim = make_sim("nodes=4,gpus=2,tp=2,dp=4", steps=1)
    res = collect(sim)
    rows = rows_of(res)
    ops = rows[(rows["op"] == abi.OP_START) & (rows["type"] == abi.PROXY_OP)]
    for c in sim.comms["dp"]:
        prv, nxt = c.ring_neighbours()
        base = sim.ctx_base[("dp", c.index)]
        mine = ops[(ops["ctx"] >= base) & (ops["ctx"] < base + c.nranks)]
        assert len(mine)
        for o in mine:
            want = nxt if o["is_send"] else prv
            assert o["root_or_peer"] == want[o["channel"], o["rank"]]


def _per_slot_sequences(rows):
    """slot -> list of (op, state, t) for ProxySteps (slots are unique within a short run)."""
    steps = {}
    started = set(rows["slot"][(rows["op"] == abi.OP_START) & (rows["type"] == abi.PROXY_STEP)].tolist())
    for r in rows:
        if int(r["slot"]) in started:
            steps.setdefault(int(r["slot"]), []).append((int(r["op"]), int(r["state"]), int(r["t_ns"]),
                                                         int(r["size"])))
    return steps


def test_proxy_step_state_order_and_sizes():
    sim = make_sim("nodes=4,gpus=2,tp=2,dp=4", steps=1)
    rows = rows_of(collect(sim))
    seqs = _per_slot_sequences(rows)
    assert len(seqs) > 100
    send_orders = {(abi.S_SEND_GPU_WAIT, abi.S_SEND_WAIT), (abi.S_SEND_GPU_WAIT, abi.S_SEND_PEER_WAIT, abi.S_SEND_WAIT)}
    recv_order = (abi.S_RECV_WAIT, abi.S_RECV_FLUSH_WAIT, abi.S_RECV_GPU_WAIT)
    for seq in seqs.values():
        assert seq[0][0] == abi.OP_START and seq[-1][0] == abi.OP_STOP
        states = tuple(s for op, s, _, _ in seq if op == abi.OP_RECORD)
        assert states in send_orders or states == recv_order
        times = [t for _, _, t, _ in seq]
        assert times == sorted(times)
        for op, s, _, size in seq:  # transSize only where NCCL sets it
            assert (size > 0) == (s in (abi.S_SEND_WAIT, abi.S_RECV_FLUSH_WAIT))


def test_credit_window_never_exceeded():
    sim = make_sim("nodes=4,gpus=2,tp=2,dp=4", steps=1, model=None)
    for inst, res in collect(sim):
        if inst.comm.kind != "dp" or not res.blocks:  # a batch's rows ride on its first instance
            continue
        rows = np.concatenate([b.rows for b in res.blocks])
        rows = rows[np.argsort(rows["t_ns"], kind="stable")]
        op_of = {}
        for r in rows[(rows["type"] == abi.PROXY_STEP) & (rows["op"] == abi.OP_START)]:
            op_of[int(r["slot"])] = int(r["parent_slot"])
        live: dict[int, int] = {}
        worst = 0
        for r in rows:
            s = int(r["slot"])
            if s not in op_of:
                continue
            if r["op"] == abi.OP_START:
                live[op_of[s]] = live.get(op_of[s], 0) + 1
                worst = max(worst, live[op_of[s]])
            elif r["op"] == abi.OP_STOP:
                live[op_of[s]] -= 1
        # a ring slice holds 2 of the 8 FIFO slots: 4 ProxySteps in flight (Broadcast: 8 one-slot steps)
        assert 1 <= worst <= (RING_WINDOW if inst.func in RING_STEPS_PER_LOOP else abi.NCCL_STEPS)


def test_send_waits_for_receiver_credit():
    """Send step s is transmitted only after the receiver posted recv step s (its buffer slot is free)."""
    from mycroft_otel.sim.engine import chain_times

    C, n, S = 1, 2, 32
    z = np.zeros((C, n))
    gpu = np.ones((C, n)) / 400
    gpu[0, 1] *= 50  # the receiver's GPU consumes slowly: the sender runs out of credit
    inf = np.full((C, n), np.inf)
    tm = chain_times(np.full(S, 1 << 19), z, z, gpu, np.full((C, n), 25.0), np.full((C, n), 4e3),
                     np.full((C, n), 1e3), 2e3, inf, inf, inf, inf, inf, 1e9)
    T, Q, G, U = tm["T"][:, 0, 0], tm["Q"][:, 0, 1], tm["G"][:, 0, 0], tm["U"][:, 0, 1]
    assert np.all(T >= Q)                       # never transmitted before the receiver posted the buffer
    assert np.any(T > G)                        # ... so the sender waited in SendPeerWait
    assert np.all(Q[abi.NCCL_STEPS:] > U[:-abi.NCCL_STEPS])  # recv step s posted after step s-8 consumed
    assert np.all(tm["P"][abi.NCCL_STEPS:, 0, 0] > tm["D"][:-abi.NCCL_STEPS, 0, 0])  # 8 sends in flight at most


def test_user_thread_order_is_nccl_228():
    sim = make_sim("nodes=2,gpus=2,tp=2,dp=2", steps=1)
    res = collect(sim)
    inst, r = next((i, r) for i, r in res if i.comm.kind == "dp" and r.blocks)
    user = np.concatenate([b.rows for b in r.blocks if b.thread == USER])
    user = user[np.argsort(user["t_ns"], kind="stable")]
    one = user[user["ctx"] == user["ctx"][0]]
    got = [(int(x["op"]), int(x["type"]) if x["op"] == abi.OP_START else int(x["state"])) for x in one]
    S, R, P = abi.OP_START, abi.OP_RECORD, abi.OP_STOP
    assert [g[0] for g in got] == [S, R, S, P, R, S, P, S, S, P, P, P]
    assert [g[1] for g in got if g[0] == S] == [abi.GROUP_API, abi.COLL_API, abi.KERNEL_LAUNCH, abi.GROUP, abi.COLL]
    assert [g[1] for g in got if g[0] == R] == [abi.S_GROUP_START_API_STOP, abi.S_GROUP_END_API_START]
    coll = one[(one["op"] == S) & (one["type"] == abi.COLL)][0]
    grp = one[(one["op"] == S) & (one["type"] == abi.GROUP)][0]
    api = one[(one["op"] == S) & (one["type"] == abi.COLL_API)][0]
    assert coll["parent_slot"] == api["slot"] and coll["size"] == grp["slot"] + 1
    # proxy-thread events: ProxyOp, ProxyStep; KernelCh on the kernel-reporting thread
    proxy = np.concatenate([b.rows for b in r.blocks if b.thread == PROXY])
    starts = proxy[proxy["op"] == S]
    assert set(starts["type"].tolist()) == {abi.PROXY_OP, abi.PROXY_STEP}
    kern = np.concatenate([b.rows for b in r.blocks if b.thread == KERNEL])
    assert set(kern["type"][kern["op"] == S].tolist()) == {abi.KERNEL_CH}
    assert not set(user["type"][user["op"] == S].tolist()) & {abi.PROXY_OP, abi.PROXY_STEP, abi.KERNEL_CH}


def test_tp_is_kernel_only_and_dp_uses_network():
    sim = make_sim("nodes=2,gpus=4,tp=4,dp=2", steps=1)
    for inst, r in collect(sim):
        if not r.blocks:
            continue
        rows = np.concatenate([b.rows for b in r.blocks])
        types = set(rows["type"][rows["op"] == abi.OP_START].tolist())
        if inst.comm.kind == "tp":
            assert abi.PROXY_OP not in types and abi.KERNEL_CH in types
        else:
            assert abi.PROXY_STEP in types


def test_pipeline_p2p_and_sequence_parallel_functions():
    from mycroft_otel.sim.model import TimingModel

    sim = make_sim("nodes=4,gpus=2,tp=2,pp=2,dp=2", steps=1,
                   model=TimingModel().with_step(tp_mode="sp", dp_mode="zero"))
    funcs = {i.func for i, _ in collect(sim)}
    assert {"Send", "AllGather", "ReduceScatter", "Broadcast"} <= funcs
    assert np.isfinite(sim.ready).all()


def test_deterministic_for_a_seed():
    a = rows_of(collect(make_sim("nodes=2,gpus=2,tp=2,dp=2", steps=2, seed=5)))
    b = rows_of(collect(make_sim("nodes=2,gpus=2,tp=2,dp=2", steps=2, seed=5)))
    c = rows_of(collect(make_sim("nodes=2,gpus=2,tp=2,dp=2", steps=2, seed=6)))
    assert np.array_equal(a, b)
    assert len(a) != len(c) or not np.array_equal(a["t_ns"], c["t_ns"])


def test_stuck_dp_rank_never_issues_its_next_tp_collective():
    """Propagation across communicators: the culprit hangs in DP; its TP peers wait in their next TP op."""
    sim = make_sim("nodes=2,gpus=2,tp=2,dp=2", "nic_down:rank=1,step=1", steps=3)
    res = collect(sim)
    truth = sim.truths()[0]
    assert truth["culprit_global_ranks"] == [1]
    tp = [(i, r) for i, r in res if i.comm.kind == "tp" and 1 in i.comm.ranks]
    k = list(tp[0][0].comm.ranks).index(1)
    first_missed = next((i, r) for i, r in tp if not np.isfinite(r.kstart[k]))
    i, r = first_missed
    assert i.step >= 1
    assert np.isfinite(r.kstart[1 - k])          # its TP peer called it ...
    assert not np.isfinite(r.end).any()          # ... and waits there for ever


def test_double_binary_tree_shape():
    comms = build_comms(parse_topology("nodes=16,gpus=1,tp=1,dp=16"), seed=1)
    c = comms["dp"][0]
    leaves = []
    for ch in (0, 1):
        parent, children = c.tree(ch)
        assert (parent < 0).sum() == 1 and all(len(k) <= 2 for k in children)
        for r in range(c.nranks):  # every rank reaches the root
            seen, x = 0, r
            while parent[x] >= 0 and seen <= c.nranks:
                x, seen = parent[x], seen + 1
            assert parent[x] < 0
        leaves.append({r for r in range(c.nranks) if not children[r]})
    assert not (leaves[0] & leaves[1])  # a leaf of one tree is interior in the other


def test_tree_allreduce_flows_follow_the_tree_and_complete():
    from mycroft_otel.sim.model import TimingModel

    sim = make_sim("nodes=8,gpus=1,tp=1,dp=8", steps=1, model=TimingModel().with_nccl(dp_algo="Tree"))
    res = collect(sim)
    ar = [(i, r) for i, r in res if i.func == "AllReduce"]
    assert ar and all(i.algo == "Tree" for i, _ in ar)
    assert np.isfinite(sim.ready).all()
    i, r = ar[0]
    rows = np.concatenate([b.rows for b in r.blocks])
    ops = rows[(rows["op"] == abi.OP_START) & (rows["type"] == abi.PROXY_OP)]
    coll = rows[(rows["op"] == abi.OP_START) & (rows["type"] == abi.COLL)]
    assert set(coll["algo"].tolist()) == {abi.ALGO["Tree"]}
    for ch in range(i.comm.n_channels):
        parent, children = i.comm.tree(ch)
        mine = ops[ops["channel"] == ch]
        for o in mine:
            rk, peer = int(o["rank"]), int(o["root_or_peer"])
            assert peer == parent[rk] or peer in children[rk]
        # every tree edge carries 2 ProxyOps per end (up and down): 4 per edge
        assert len(mine) == 4 * (i.comm.nranks - 1)
    steps = rows[(rows["op"] == abi.OP_START) & (rows["type"] == abi.PROXY_STEP)]
    assert len(steps) == 4 * (i.comm.nranks - 1) * i.comm.n_channels * int(ops["n_steps"][0])


def test_tree_hang_propagates_from_a_stalled_nic():
    from mycroft_otel.sim.model import TimingModel

    sim = make_sim("nodes=8,gpus=1,tp=1,dp=8", "nic_down:rank=3,step=1", steps=3,
                   model=TimingModel().with_nccl(dp_algo="Tree"))
    collect(sim)
    assert not np.isfinite(sim.ready).any()


def test_event_dtype_and_name_tables_match_the_native_module():
    from mycroft_otel.sim.abi import native_dtype_matches

    ok = native_dtype_matches()
    if ok is None:
        pytest.skip("native module not built")
    from mycroft_otel import _native

    assert ok
    assert tuple(_native.FUNC_NAMES) == abi.FUNC_NAMES and tuple(_native.ALGO_NAMES) == abi.ALGO_NAMES
    assert tuple(_native.PROTO_NAMES) == abi.PROTO_NAMES and tuple(_native.DATATYPE_NAMES) == abi.DATATYPE_NAMES
    assert _native.EVENT_TYPES["ProxyStep"] == abi.PROXY_STEP and _native.STATES["KernelChStop"] == abi.S_KERNEL_CH_STOP
    assert _native.STATES["ProxyStepSendPeerWait"] == abi.S_SEND_PEER_WAIT
    assert _native.STATES["GroupEndApiStart"] == abi.S_GROUP_END_API_START


def test_refused_isend_repeats_send_peer_wait_until_the_end_of_the_run():
    """NCCL records SendPeerWait again on every refused isend: a sender waiting for an absent receiver's
    credit keeps recording it (every NcclModel.peer_wait_retry_ns) on its oldest step, until the run ends."""
    sim = make_sim("nodes=4,gpus=1,tp=1,dp=4", "rank_absent:rank=2,step=1", steps=3, duration_s=None)
    res = collect(sim)
    rows = rows_of(res)
    peer = rows[(rows["op"] == abi.OP_RECORD) & (rows["state"] == abi.S_SEND_PEER_WAIT)]
    slots, counts = np.unique(peer["slot"], return_counts=True)
    assert counts.max() > 1000  # ~10 s of retries at 1 ms
    busiest = peer[peer["slot"] == slots[counts.argmax()]]
    gaps = np.diff(busiest["t_ns"].astype(np.int64))
    assert np.all(np.abs(gaps - 1_000_000) <= 1)
    assert len(np.unique(busiest["step"])) == 1  # only the oldest step retries


def test_cpu_runs_ahead_collectives_queue_behind_a_hung_one():
    """Frameworks launch the next collectives before the previous completed (StepModel.max_outstanding):
    behind a hung all-reduce the next one is called (Coll events, ProxyOps, recvs posted) but its kernel
    never starts; the call after that is never made."""
    sim = make_sim("nodes=4,gpus=1,tp=1,dp=4", "nic_down:rank=1,step=1", steps=3)
    res = collect(sim)
    t = sim.truths()[0]
    dp = [(i, r) for i, r in res if i.comm.kind == "dp"]
    k = next(n for n, (i, _) in enumerate(dp) if i.seq == t["coll_seq"])
    hung, queued = dp[k], dp[k + 1]
    assert not np.isfinite(hung[1].end).any()
    assert np.isfinite(queued[1].issue).all() and not np.isfinite(queued[1].kstart).any()
    rows = np.concatenate([b.rows for b in queued[1].blocks])
    st = rows[rows["op"] == abi.OP_START]
    assert (st["type"] == abi.COLL).sum() == 4 and (st["type"] == abi.PROXY_OP).sum() > 0
    recv_posted = rows[(rows["op"] == abi.OP_RECORD) & (rows["state"] == abi.S_RECV_WAIT)]
    assert len(recv_posted) > 0 and not (rows["state"] == abi.S_SEND_WAIT).any()
    if k + 2 < len(dp):
        assert not np.isfinite(dp[k + 2][1].issue).any()
