"""The conformance scenarios and their ground truth (designed here, independent of the simulator's catalogue).

Default job: 8 ranks on 2 "nodes" (NCCL_HOSTID node0 / node1) in 5 OS processes [[0,1],[2,3],[4,5],[6],[7]]:
several ranks per process and single-rank processes; two communicators per rank (a 4-channel ring for AllReduce,
grouped 3 at a time in a quarter of the iterations, and a 2-channel "pp" communicator with a Send/Recv pair in one
group every third iteration); 3 launches outstanding per rank. A ring rank r sends to r+1 and receives from r-1
on every channel, so flow (r -> r+1, channel c) has ends {r, r+1}.

The long slowdown runs (late_rank, slow_flow, slow_nic, slow_gpu) leave the "pp" traffic out so that the p2p finding
(rca.check_mismatch on Send/Recv, see test_scenarios.D_P2P) does not mask what they test; pp_slow_transfer and
the healthy runs cover p2p.
"""

from __future__ import annotations

from harness import Scenario

AT = 12  # hangs start at this iteration: ~1.5-2 s of healthy traffic before
AT_SLOW = 36  # slowdowns: enough healthy history for the agent's baselines (warm-up 8 ops per size bucket)

SCENARIOS = [
    Scenario("healthy_jittery", kind="healthy", iters=45, expect=None),
    Scenario("healthy_v4_growing_steps", kind="healthy", iters=35, version=4, step_numbering="growing", expect=None),
    Scenario("rank_never_enters", fault={"kind": "absent", "rank": 5, "at_iter": AT},
             expect={"category": "rank_absent", "ranks": [5]}),
    Scenario("sigkill_mid_collective", fault={"kind": "sigkill", "rank": 6, "at_iter": AT},
             expect={"category": "process_exited", "ranks": [6]}),
    Scenario("sigstop_mid_collective", fault={"kind": "sigstop", "rank": 7, "at_iter": AT},
             expect={"category": "rank_absent", "ranks": [7]}),
    Scenario("gpu_stall", fault={"kind": "gpu_stall", "rank": 2, "at_iter": AT},
             expect={"category": "gpu_stalled", "ranks": [2]}),
    Scenario("flow_send_stalled", fault={"kind": "send_stall", "rank": 3, "channel": 2, "at_iter": AT},
             expect={"category": "net_send_stalled", "channel": 2, "flow": [3, 4]}),
    Scenario("flow_delivery_stalled", fault={"kind": "delivery_stall", "rank": 1, "channel": 1, "at_iter": AT},
             expect={"category": "net_delivery_stalled", "channel": 1, "flow": [1, 2]}),
    Scenario("nic_down", fault={"kind": "nic_down", "rank": 4, "at_iter": AT},
             expect={"category": "net_send_stalled", "ranks": [4]}),
    Scenario("mismatch_func", iters=AT + 6, fault={"kind": "mismatch_func", "rank": 3, "at_iter": AT},
             expect={"category": "coll_mismatch", "ranks": [3]}),
    Scenario("mismatch_count", iters=AT + 6, fault={"kind": "mismatch_count", "rank": 6, "at_iter": AT},
             expect={"category": "coll_mismatch", "ranks": [6]}),
    # Sustained slowdowns of the size: the all-reduces run 2-4x slower than before (the summary line
    # prints the measured ratio; a step's time is a small part of a collective's here, so the factors on a
    # step are large). Measured on a 2-core host: slow_flow 2.0-2.5x, slow_nic 2.1-2.9x, slow_gpu 2.5-3.1x,
    # late_rank 2.6-3.7x (late in every iteration, as the others are slow in every one).
    Scenario("late_rank", kind="slowdown", pp_every=0, iters=AT_SLOW + 16,
             fault={"kind": "late", "rank": 4, "at_iter": AT_SLOW, "late_ms": 150, "n_late": 16},
             expect={"category": "late_rank", "ranks": [4]}),
    Scenario("slow_flow", kind="slowdown", pp_every=0, iters=AT_SLOW + 16,
             fault={"kind": "slow_flow", "rank": 5, "channel": 3, "at_iter": AT_SLOW, "factor": 800},
             expect={"category": "slow_flow", "channel": 3, "flow": [5, 6]}),
    # every flow rank 3 sends on the ring (4 channels), across the node boundary: its NIC, not one flow
    Scenario("slow_nic", kind="slowdown", pp_every=0, iters=AT_SLOW + 16,
             fault={"kind": "slow_nic", "rank": 3, "at_iter": AT_SLOW, "factor": 800},
             expect={"category": "slow_nic", "ranks": [3]}),
    Scenario("slow_gpu", kind="slowdown", pp_every=0, iters=AT_SLOW + 16,
             fault={"kind": "slow_gpu", "rank": 0, "at_iter": AT_SLOW, "factor": 80},
             expect={"category": "slow_gpu", "ranks": [0]}),
    # NCCL 2.28 (v5: KernelCh on the proxy thread), 16 channels, step numbers growing across ProxyOps
    Scenario("gpu_stall_v5_16ch", version=5, nch=16, step_numbering="growing",
             fault={"kind": "gpu_stall", "rank": 6, "at_iter": AT},
             expect={"category": "gpu_stalled", "ranks": [6]}),
    # pipeline-parallel: the Send of rank 2 to rank 3 on the "pp" communicator is slow (both channels). A
    # transfer every iteration, as a pipeline moves one per micro-batch: the sequential test learns the pair's
    # healthy transfers first (its first 8 are NCCL's connection warm-up, then 8 to trust the null)
    Scenario("pp_slow_transfer", kind="slowdown", iters=AT_SLOW + 24, pp_every=1,
             fault={"kind": "slow_p2p", "rank": 2, "at_iter": AT_SLOW, "factor": 2000},
             expect={"category": ["slow_flow", "slow_nic"], "ranks": [2, 3]}),
]

# A training job's shape: TP groups of 4 inside each of 4 hosts, DP rings of 4 across them (tp4dp4, 16 ranks, one
# per process with RANK and LOCAL_RANK set as torchrun does); each step an all-reduce in TP, then one in DP, on
# one stream per GPU (harness.tpdp_job). The faults are placed in one communicator and their effects cross into
# the others through the shared GPUs: a rank held in its DP ring starts its TP group's next all-reduce late, and
# its TP peers then wait for it. Verdicts name communicator ranks; the checks map them to world ranks by the
# communicator's members (Result.world) and require the verdict's global ranks to agree. Every hop, also inside a
# host, runs over ProxySteps here (the harness has one transport); NVLink hops, kernel-only, are the simulator's.
# 16 rank processes on a 2-core host: the proxy threads pause 1 ms between passes so that they do not starve
# each other (proxy_tick_us), which sets the pace of every step and so the factors below.
TPDP = dict(layout=(4, 4), proxy_tick_us=1000)
SCENARIOS += [
    Scenario("tpdp_healthy", kind="healthy", iters=60, expect=None, **TPDP),
    # one slow link inside one TP group (rank 5 -> rank 6 of host 1, channel 1)
    Scenario("tpdp_slow_link_tp", kind="slowdown", iters=AT_SLOW + 16, **TPDP,
             fault={"kind": "slow_flow", "rank": 5, "comm": "tp", "channel": 1, "at_iter": AT_SLOW, "factor": 800},
             expect={"category": "slow_flow", "channel": 1, "flow": [5, 6]}),
    # one slow link inside one DP ring (rank 6 -> rank 10 of the ring of local rank 2, channel 2)
    Scenario("tpdp_slow_link_dp", kind="slowdown", iters=AT_SLOW + 16, **TPDP,
             fault={"kind": "slow_flow", "rank": 6, "comm": "dp", "channel": 2, "at_iter": AT_SLOW, "factor": 800},
             expect={"category": "slow_flow", "channel": 2, "flow": [6, 10]}),
    # a slow GPU: every kernel of rank 9, in its TP group and its DP ring
    Scenario("tpdp_slow_gpu", kind="slowdown", iters=AT_SLOW + 16, **TPDP,
             fault={"kind": "slow_gpu", "rank": 9, "at_iter": AT_SLOW, "factor": 80},
             expect={"category": "slow_gpu", "ranks": [9]}),
    # a proxy thread starved of its core: rank 10's proxy runs only every 10 ms (both its communicators' steps)
    Scenario("tpdp_slow_proxy", kind="slowdown", iters=AT_SLOW + 16, **TPDP,
             fault={"kind": "slow_proxy", "rank": 10, "at_iter": AT_SLOW, "sleep_ms": 10},
             expect={"category": "slow_proxy", "ranks": [10]}),
    # a compute straggler: rank 6 calls every step 150 ms late, so its TP group waits for it first, then its DP ring
    Scenario("tpdp_late_rank", kind="slowdown", iters=AT_SLOW + 16, **TPDP,
             fault={"kind": "late", "rank": 6, "at_iter": AT_SLOW, "late_ms": 150, "n_late": 16},
             expect={"category": "late_rank", "ranks": [6]}),
    # rank 7's NIC at a lower rate (a link trained down): what it sends and receives in its DP ring. A receive
    # side alone is not this: in a ring a rank hears from one sender only, which sends to it only, so a slow
    # receiving NIC and that sender's slow sending NIC move exactly the same flows (docs/algorithm.md §8)
    Scenario("tpdp_slow_nic", kind="slowdown", iters=AT_SLOW + 16, **TPDP,
             fault={"kind": "nic_both", "rank": 7, "comm": "dp", "at_iter": AT_SLOW, "factor": 300},
             expect={"category": "slow_nic", "ranks": [7]}),
]

BY_NAME = {s.name: s for s in SCENARIOS}
