"""The simulator through the real plugin: rings hold what the timing model predicts, and every fault's signature.

Hang signatures (counters) in accelerated mode, slowdowns (times: the plugin stamps each callback with
CLOCK_MONOTONIC when it is delivered) in real-time mode, on an 8-rank job (4 nodes x 2 GPUs, tp=2, dp=4) unless the property needs more; the
culprit is global rank 3 (node 1), i.e. rank 1 of communicator dp1.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from mycroft_otel.native import WaitState
from mycroft_otel.sim import runner
from mycroft_otel.sim.model import TimingModel

from _simtools import make_sim, read_rings

TOPO = "nodes=4,gpus=2,tp=2,dp=4"
SEND, RECV = 0, 1


def run_sim(tmp_path, plugin, fault=None, steps=3, realtime=False, **kw):
    sim = make_sim(TOPO if "topology" not in kw else kw.pop("topology"), fault, steps=steps, **kw)
    res = runner.run(sim, runner.RunConfig(ring_dir=str(tmp_path), plugin=plugin, realtime=realtime))
    assert res["stats"].get("errors", 0) == 0 and res["stats"].get("missing_slot", 0) == 0
    return sim, res, read_rings(tmp_path)


def op_at(ctx, seq, live=None):
    """The op with per-communicator number ``seq``: ('live'|'done', row) or (None, None)."""
    for kind, arr in (("live", ctx.live), ("done", ctx.records)):
        if live is not None and (kind == "live") != live:
            continue
        hit = arr[arr["op"]["seq"] == seq] if len(arr) else arr
        hit = hit[hit["op"]["kind"] == 1] if len(hit) else hit
        if len(hit):
            return kind, hit[-1]
    return None, None


def flows(op, direction=None):
    f = op["flows"][: int(op["op"]["n_flows"])]
    return f if direction is None else f[f["dir"] == direction]


def test_64_rank_realtime_step_counters_match_the_model(tmp_path, plugin):
    sim, res, rings = run_sim(tmp_path, plugin, steps=1, realtime=True, topology="nodes=8,gpus=8,tp=8,dp=8")
    assert res["contexts"] == 128 and len(rings.by_key) == 128
    checked = 0
    for entry in sim.log:
        name = f"{entry['kind']}{entry['comm']}"
        for f in entry["flows"]:
            ctx = rings.get(name, f["rank"])
            kind, op = op_at(ctx, entry["seq"])
            assert kind == "done", (name, f)
            fl = flows(op, SEND if f["dir"] == "send" else RECV)
            fl = fl[fl["channel"] == f["channel"]]
            assert len(fl) == 1
            got = fl[0]
            assert int(got["peer"]) == f["peer"]
            for key in ("n_steps", "posted", "ready", "transmitted", "done"):
                assert int(got[key]) == f[key], (name, f, key, got)
            assert int(got["bytes"]) == f["bytes_done"]
            checked += 1
    # 8 DP comms x (2 all-reduces x 8 ranks + 1 broadcast x 7 hops) x 2 channels x 2 directions
    assert checked == 8 * (2 * 8 + 7) * 2 * 2
    for ctx in rings.by_key.values():
        assert len(ctx.live) == 0
        h = ctx.header
        assert h.dropped_bad_handle == 0 and h.dropped_live_full == 0
        n_ops = sum(1 for e in sim.log if f"{e['kind']}{e['comm']}" == h.comm_name)
        assert h.ops_completed == n_ops
        assert h.host == f"sim-node{h.global_rank // 8:03d}" and h.job_id == "sim"
        for rec in ctx.records:
            assert rec["op"]["kernel_ch_started"] == rec["op"]["kernel_ch_stopped"] == rec["op"]["n_channels"]


def test_healthy_run_leaves_nothing_in_flight(tmp_path, plugin):
    sim, res, rings = run_sim(tmp_path, plugin, "healthy", steps=3)
    assert res["truth"] == [] and np.isfinite(sim.ready).all()
    for ctx in rings.by_key.values():
        assert len(ctx.live) == 0 and ctx.header.ops_completed > 0
        assert ctx.header.dropped_bad_handle == 0


def _target(sim, rings):
    t = sim.truths()[0]
    ctxs = rings.comm(t["comm_name"])
    return t, ctxs, t["culprit_ranks"][0], t["coll_seq"]


def test_nic_down_flows_ready_but_not_transmitted(tmp_path, plugin):
    sim, _, rings = run_sim(tmp_path, plugin, "nic_down:rank=3,step=1")
    t, ctxs, x, seq = _target(sim, rings)
    assert t["category"] == "net_send_stalled"
    kind, op = op_at(ctxs[x], seq)
    assert kind == "live"
    sends = flows(op, SEND)
    assert np.all(sends["ready"] > sends["transmitted"])
    assert np.all(sends["wait_state"] == WaitState.SEND_PEER_WAIT if hasattr(WaitState, "SEND_PEER_WAIT")
                  else sends["wait_state"] == 2)
    # its successors wait for its data
    for f in sends:
        _, peer_op = op_at(ctxs[int(f["peer"])], seq)
        rf = flows(peer_op, RECV)
        rf = rf[(rf["channel"] == f["channel"])][0]
        assert rf["wait_state"] == 4 and rf["ready"] == f["transmitted"]


def test_flow_stall_transmitted_never_done(tmp_path, plugin):
    sim, _, rings = run_sim(tmp_path, plugin, "flow_stall:rank=3,step=1,channel=1")
    t, ctxs, x, seq = _target(sim, rings)
    assert t["category"] == "net_delivery_stalled" and t["channel"] == 1
    _, op = op_at(ctxs[x], seq, live=True)
    f = flows(op, SEND)
    f = f[f["channel"] == 1][0]
    assert f["transmitted"] > f["done"] and f["wait_state"] == 3 and int(f["peer"]) == t["peer"]
    _, pop = op_at(ctxs[t["peer"]], seq, live=True)
    rf = flows(pop, RECV)
    rf = rf[rf["channel"] == 1][0]
    assert rf["wait_state"] == 4 and rf["ready"] == f["done"]


def test_gpu_stalled_data_arrived_not_consumed(tmp_path, plugin):
    sim, _, rings = run_sim(tmp_path, plugin, "gpu_stalled:rank=3,step=1")
    t, ctxs, x, seq = _target(sim, rings)
    _, op = op_at(ctxs[x], seq, live=True)
    rf = flows(op, RECV)
    assert np.all(rf["ready"] == rf["transmitted"]) and np.all(rf["transmitted"] > rf["done"])
    assert np.all(rf["wait_state"] == 6)  # RecvGpuWait
    sf = flows(op, SEND)
    assert np.all(sf["posted"] > sf["ready"]) and np.all(sf["wait_state"] == 1)  # SendGpuWait
    assert op["op"]["kernel_ch_started"] > op["op"]["kernel_ch_stopped"]


def test_rank_absent_never_enters(tmp_path, plugin):
    sim, _, rings = run_sim(tmp_path, plugin, "rank_absent:rank=3,step=1")
    t, ctxs, x, seq = _target(sim, rings)
    assert op_at(ctxs[x], seq) == (None, None)
    assert int(ctxs[x].records["op"]["seq"].max()) == seq - 1 and len(ctxs[x].live) == 0
    for r, c in enumerate(ctxs):
        if r != x:
            kind, op = op_at(c, seq)
            assert kind == "live"
    # the predecessor has data ready and waits for the absent rank's credit
    prv = [r for r, c in enumerate(ctxs) if r != x and any(
        int(f["peer"]) == x for f in flows(op_at(c, seq)[1], SEND))]
    for r in prv:
        f = [f for f in flows(op_at(ctxs[r], seq)[1], SEND) if int(f["peer"]) == x][0]
        assert f["transmitted"] == 0 and f["wait_state"] in (1, 2)


def test_coll_mismatch_culprit_called_a_different_size(tmp_path, plugin):
    sim, _, rings = run_sim(tmp_path, plugin, "coll_mismatch:rank=3,step=1")
    t, ctxs, x, seq = _target(sim, rings)
    kind, op = op_at(ctxs[x], seq)
    assert kind == "live"
    _, other = op_at(ctxs[(x + 1) % len(ctxs)], seq)
    assert op["op"]["count"] == 2 * other["op"]["count"]
    assert np.all(flows(op)["n_steps"] > flows(other)["n_steps"])


def test_late_rank_starts_late_and_its_successor_waits(tmp_path, plugin):
    sim, _, rings = run_sim(tmp_path, plugin, "late_rank:rank=3,step=1,delay_ms=50", realtime=True)
    t, ctxs, x, seq = _target(sim, rings)
    assert t["kind"] == "slowdown"
    starts = np.array([op_at(c, seq)[1]["op"]["start_ns"] for c in ctxs], dtype=np.int64)
    others = np.delete(starts, x)
    assert starts[x] - others.max() > 40e6
    _, op = op_at(ctxs[x], seq)
    for f in flows(op, SEND):
        _, succ = op_at(ctxs[int(f["peer"])], seq)
        rf = [g for g in flows(succ, RECV) if g["channel"] == f["channel"]][0]
        assert rf["first_ns"] < starts[x] and rf["net_wait_ns"] > 30e6  # it waited in RecvWait for the culprit


def _at_seq(ctxs, seq):
    return [op_at(c, seq)[1] for c in ctxs]


def test_slow_gpu_culprit_consumes_slowly(tmp_path, plugin):
    sim, _, rings = run_sim(tmp_path, plugin, "slow_gpu:rank=3,step=1,factor=10", realtime=True)
    t, ctxs, x, seq = _target(sim, rings)
    # Only at the culprit do both directions wait on the GPU: its received data waits to be consumed
    # (RecvGpuWait) while its sends wait to be produced (SendGpuWait). Upstream ranks' received data also
    # waits (their GPU has no free send slot: credit), but their sends do not wait on their GPU.
    both = [min(int(flows(op, RECV)["gpu_wait_ns"].sum()), int(flows(op, SEND)["gpu_wait_ns"].sum()))
            for op in _at_seq(ctxs, seq)]
    assert both[x] > 3 * np.median(np.delete(both, x))  # medians: robust to real-time delivery hiccups


def test_slow_flow_one_channel_of_the_culprit(tmp_path, plugin):
    sim, _, rings = run_sim(tmp_path, plugin, "slow_flow:rank=3,step=1,channel=0,factor=10", realtime=True)
    t, ctxs, x, seq = _target(sim, rings)
    nw = {(r, int(f["channel"])): int(f["net_wait_ns"]) for r, op in enumerate(_at_seq(ctxs, seq))
          for f in flows(op, SEND)}
    rest = [v for k, v in nw.items() if k != (x, 0)]
    assert nw[(x, 0)] > 3 * np.median(rest)  # medians: robust to real-time delivery hiccups
    assert nw[(x, 0)] > 3 * nw[(x, 1)]       # its sibling channel is not slow


def test_slow_nic_all_flows_of_the_culprit(tmp_path, plugin):
    sim, _, rings = run_sim(tmp_path, plugin, "slow_nic:rank=3,step=1,factor=10", realtime=True)
    t, ctxs, x, seq = _target(sim, rings)
    nw = {(r, int(f["channel"])): int(f["net_wait_ns"]) for r, op in enumerate(_at_seq(ctxs, seq))
          for f in flows(op, SEND)}
    mine = [v for (r, _), v in nw.items() if r == x]
    rest = [v for (r, _), v in nw.items() if r != x]
    assert min(mine) > 3 * np.median(rest)


def test_congestion_slows_every_flow_into_the_receiver(tmp_path, plugin):
    sim, _, rings = run_sim(tmp_path, plugin, "congestion:rank=3,step=1,factor=10", realtime=True)
    t, ctxs, x, seq = _target(sim, rings)
    assert t["category"] == "slow_nic"
    into = [int(f["net_wait_ns"]) for op in _at_seq(ctxs, seq) for f in flows(op, SEND) if int(f["peer"]) == x]
    rest = [int(f["net_wait_ns"]) for op in _at_seq(ctxs, seq) for f in flows(op, SEND) if int(f["peer"]) != x]
    assert min(into) > 3 * np.median(rest)


def test_slow_proxy_sleeps_a_second_between_ready_and_transmit(tmp_path, plugin):
    sim, _, rings = run_sim(tmp_path, plugin, "slow_proxy:rank=3,step=1,p=0", realtime=True)
    t, ctxs, x, seq = _target(sim, rings)
    assert t["category"] == "slow_proxy" and t["kind"] == "slowdown"
    op = op_at(ctxs[x], seq)[1]["op"]
    assert op["end_ns"] - op["start_ns"] > 0.9e9
    before = op_at(ctxs[x], seq - 1)[1]["op"]
    assert before["end_ns"] - before["start_ns"] < 0.1e9


# --- multi-process mode: real signals ---------------------------------------------------------------

def _proc_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


@pytest.mark.parametrize("fault,sig", [("process_exited", signal.SIGKILL), ("sigstop", signal.SIGSTOP)])
def test_multiprocess_really_signals_the_host_process(tmp_path, plugin, fault, sig):
    seen = {}

    def on_signal(truth, pid):
        time.sleep(0.05)
        seen["state"] = _proc_state(pid) if os.path.exists(f"/proc/{pid}") else "gone"
        seen["pid"] = pid

    sim = make_sim("nodes=2,gpus=2,tp=2,dp=2", f"{fault}:rank=1,step=1", steps=3)
    res = runner.run(sim, runner.RunConfig(ring_dir=str(tmp_path), plugin=plugin, realtime=True,
                                           multiprocess=True, duration_s=1.0, on_signal=on_signal))
    t = res["truth"][0]
    assert t["signal"] == sig.name and t["pid"] == seen["pid"]
    assert seen["state"] in (("Z", "gone", "X") if sig == signal.SIGKILL else ("T", "t"))
    host = 0  # rank 1 lives on node 0
    assert os.WIFSIGNALED(res["exit_status"][host]) and os.WTERMSIG(res["exit_status"][host]) == signal.SIGKILL
    rings = read_rings(tmp_path)
    dead = [c for c in rings.by_key.values() if c.header.pid == seen["pid"]]
    assert len(dead) == 4  # both ranks of the host, TP and DP contexts
    assert any(len(c.live) for c in dead)  # its in-flight state survived the process


def test_a_host_that_starts_late_is_signalled_once_it_has_caught_up(tmp_path, plugin, monkeypatch):
    # A loaded machine can fork a simulated host so late that the fault's onset has passed before its
    # contexts exist; the replay then catches up at full speed. A process fault is a kill mid-collective,
    # so the host is signalled once it has replayed up to the onset, not as soon as its contexts exist.
    init = runner._init_contexts

    def slow_init(driver, sim, ctxs, cfg):
        time.sleep(2.0)  # far past the epoch and the onset (step 1 of a 3-step job)
        return init(driver, sim, ctxs, cfg)

    monkeypatch.setattr(runner, "_init_contexts", slow_init)  # inherited by the forked hosts
    sim = make_sim("nodes=2,gpus=2,tp=2,dp=2", "process_exited:rank=1,step=1", steps=3)
    res = runner.run(sim, runner.RunConfig(ring_dir=str(tmp_path), plugin=plugin, realtime=True,
                                           multiprocess=True, duration_s=1.0))
    pid = res["truth"][0]["pid"]
    dead = [c for c in read_rings(tmp_path).by_key.values() if c.header.pid == pid]
    assert len(dead) == 4 and any(len(c.live) for c in dead)


def test_tree_allreduce_through_the_plugin(tmp_path, plugin):
    sim, res, rings = run_sim(tmp_path, plugin, steps=2, topology="nodes=8,gpus=1,tp=1,dp=8",
                              model=TimingModel().with_nccl(dp_algo="Tree"))
    for ctx in rings.comm("dp0"):
        assert len(ctx.live) == 0 and ctx.header.dropped_bad_handle == 0
        ar = ctx.records[ctx.records["op"]["func"] == 4]
        assert len(ar) == 4 and set(ar["op"]["algo"].tolist()) == {0}  # Tree
        for rec in ar:
            f = flows(rec)
            assert np.all(f["done"] == f["n_steps"])


@pytest.mark.parametrize("version", [4, 5, 6])
def test_older_abi_versions_see_a_consistent_job(tmp_path, plugin, version):
    """The driver translates rows as NCCL's adapters do (v4: no API events, Group is the Coll parent)."""
    sim = make_sim(TOPO, steps=1)
    res = runner.run(sim, runner.RunConfig(ring_dir=str(tmp_path), plugin=plugin, abi_version=version))
    assert res["driver"].version == version and res["stats"]["errors"] == 0
    rings = read_rings(tmp_path)
    for ctx in rings.by_key.values():
        assert ctx.header.abi_version == version and len(ctx.live) == 0
        assert ctx.header.dropped_bad_handle == 0 and ctx.header.ops_completed == len(ctx.records) > 0
        if version >= 5:
            assert all(r["op"]["api_ns"] > 0 for r in ctx.records)


def test_p2p_transfer_numbers_agree_on_both_sides(tmp_path, plugin):
    sim, _, rings = run_sim(tmp_path, plugin, steps=2, topology="nodes=4,gpus=2,tp=2,pp=2,dp=2")
    pp = [k for k in rings.by_key if k[0].startswith("pp")]
    assert pp
    for name in {k[0] for k in pp}:
        src, dst = rings.get(name, 0), rings.get(name, 1)
        sends = sorted(int(r["op"]["seq"]) for r in src.records if r["op"]["kind"] == 2)
        recvs = sorted(int(r["op"]["seq"]) for r in dst.records if r["op"]["kind"] == 3)
        assert sends == recvs == list(range(2))  # one forward activation per step, n = 0, 1 on both sides
        back_s = sorted(int(r["op"]["seq"]) for r in dst.records if r["op"]["kind"] == 2)
        back_r = sorted(int(r["op"]["seq"]) for r in src.records if r["op"]["kind"] == 3)
        assert back_s == back_r == list(range(2))


def test_kernel_channels_complete_with_their_ops_in_real_time(tmp_path, plugin):
    sim, res, rings = run_sim(tmp_path, plugin, steps=1, realtime=True, topology="nodes=2,gpus=2,tp=2,dp=2")
    for ctx in rings.by_key.values():
        assert len(ctx.live) == 0
        for rec in ctx.records:
            assert rec["op"]["kernel_ch_started"] == rec["op"]["kernel_ch_stopped"] == rec["op"]["n_channels"]
