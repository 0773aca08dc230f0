"""Detection and root-cause analysis on synthetic traces of the agent's span schema."""

from __future__ import annotations

import time

import pytest

from mycroft_otel import ids
from mycroft_otel import semconv as sc
from mycroft_otel.processor import Processor


from synth import Ring, default_host


def _run(ring: Ring, now_ns: int | None = None, proc: Processor | None = None):
    proc = proc or Processor(env={}, settle_s=0.2)
    proc.ingest_request(ring.request())
    vs = proc.tick(now_ns if now_ns is not None else time.time_ns())
    if not vs and now_ns is None:  # a silent rank: the processor first waits for late evidence
        time.sleep(0.25)
        vs = proc.tick()
    return proc, vs


def _one(verdicts):
    assert len(verdicts) == 1, [v.summary() for v in verdicts]
    return verdicts[0]


@pytest.mark.parametrize("n,c", [(8, 3), (16, 0), (64, 63)])
def test_gpu_stalled(n, c):
    ring = Ring(n)
    ring.gpu_stall(c)
    _, vs = _run(ring)
    v = _one(vs)
    assert (v.kind, v.category, v.finding.ranks) == ("hang", "gpu_stalled", [c])
    assert v.finding.confidence >= 0.8
    assert v.trace_id == ring.tid.to_bytes(16, "big")
    assert v.span_id == ids.span_id(ring.tid, -1, sc.ROLE_ROOT_CAUSE, 0).to_bytes(8, "big")


@pytest.mark.parametrize("n,c", [(4, 3), (8, 0)])
def test_gpu_stalled_before_its_nvlink_kernel_started(n, c):
    # no proxy steps over NVLink: the rank whose GPU never started the kernel is what the others wait for
    ring = Ring(n)
    ring.nvlink_hang([c])
    v = _one(_run(ring)[1])
    assert (v.category, v.finding.ranks, v.finding.reason) == ("gpu_stalled", [c], "kernel_not_started")
    assert v.finding.confidence >= 0.7
    assert "never started the kernel" in v.finding.evidence


@pytest.mark.parametrize("unstarted", [[], [0, 1, 2, 3]])
def test_nvlink_hang_with_no_kernel_apart_is_a_guess(unstarted):
    # every kernel inside and waiting, or none started (all queued behind other work): nothing tells the
    # ranks apart, and the verdict says it guesses
    ring = Ring(4)
    ring.nvlink_hang(unstarted)
    v = _one(_run(ring)[1])
    assert (v.category, v.finding.reason) == ("gpu_stalled", "noflow")
    assert v.finding.confidence <= 0.3


@pytest.mark.parametrize("channel", [0, 1])
def test_net_send_stalled_one_flow(channel):
    ring = Ring(8, nch=2)
    ring.net_send_stall(5, channel)
    v = _one(_run(ring)[1])
    assert (v.category, v.finding.ranks, v.finding.channel, v.finding.peer) == ("net_send_stalled", [5], channel, 6)


def test_nic_down_aggregates_to_rank():
    ring = Ring(8, nch=4)
    ring.net_send_stall(2, None)
    v = _one(_run(ring)[1])
    assert (v.category, v.finding.ranks, v.finding.channel) == ("net_send_stalled", [2], None)


def test_net_delivery_stalled():
    ring = Ring(8, nch=2)
    ring.net_delivery_stall(4, 1)
    v = _one(_run(ring)[1])
    assert (v.category, v.finding.ranks, v.finding.channel, v.finding.peer) == ("net_delivery_stalled", [4], 1, 5)


@pytest.mark.parametrize("how,cat", [("not_entered", "rank_absent"), ("none", "rank_absent"),
                                     ("stopped", "rank_absent"), ("process_exited", "process_exited")])
def test_absent_ranks(how, cat):
    ring = Ring(8)
    ring.absent(6, how)
    v = _one(_run(ring)[1])
    assert (v.category, v.finding.ranks) == (cat, [6])
    if how != "none":
        assert v.finding.global_ranks == [6]


@pytest.mark.parametrize("n", [4, 8])
def test_an_exited_rank_outranks_the_flows_its_neighbour_froze(n):
    """Real NCCL (the GPU drill of 2026-12-04, 4 ranks, socket transport): rank 1 SIGKILLed late in an
    all-reduce; its downstream neighbour, rank 2, had its proxy stop on the broken connection with its sends
    to rank 3 transmitted but never completed, on every channel, and rank 3 waits for them. The walk read a
    network delivery stall at rank 2's NIC; the process that exited is the cause."""
    ring = Ring(n, nch=2)
    ring.absent(1, "process_exited")
    for f in ring.flows(2, True):
        f.ready, f.transmitted, f.done, f.wait = 12, 12, 10, "SendWait"
    v = _one(_run(ring)[1])
    assert (v.category, v.finding.ranks) == ("process_exited", [1])
    assert v.finding.runner_up.startswith("network flows") or v.finding.runner_up == ""


def test_mismatch():
    ring = Ring(8)
    ring.mismatch(2)
    v = _one(_run(ring)[1])
    assert (v.category, v.finding.ranks) == ("coll_mismatch", [2])
    assert "count" in v.finding.evidence


@pytest.mark.parametrize("c", [0, 1])
def test_a_mismatch_in_a_pair_names_the_rank_that_changed_its_call(c):
    """Two ranks (a DP pair) that disagree are one against one: the communicator's earlier collectives, which
    both ranks called alike, say which call is the usual one (a training step repeats its collectives)."""
    t0 = time.time_ns() - 20_000_000_000
    proc = Processor(env={}, settle_s=0.2)
    for k in range(3):
        proc.ingest_request(Ring(2, comm=0xD1, seq=20 + k, t0=t0 + k * 10_000_000).request())
    ring = Ring(2, comm=0xD1, seq=23, t0=t0 + 30_000_000)
    ring.mismatch(c)
    v = _one(_run(ring, proc=proc)[1])
    assert (v.category, v.finding.ranks) == ("coll_mismatch", [c])
    assert v.finding.confidence == 0.8


@pytest.mark.parametrize("c", [0, 1])
def test_a_completed_mismatch_in_a_pair_names_the_rank_that_changed_its_call(c):
    """The same one against one, on a collective that completed (both ranks moved the steps of their own
    count): the slowdown path asks the communicator's earlier collectives too."""
    t0 = time.time_ns() - 20_000_000_000
    proc = Processor(env={}, settle_s=0.2)
    for k in range(3):
        proc.ingest_request(Ring(2, comm=0xD1, seq=20 + k, t0=t0 + k * 10_000_000).request())
    ring = Ring(2, comm=0xD1, seq=23, t0=t0 + 30_000_000)
    ring.ranks[c].count //= 2
    for rv in ring.ranks.values():
        rv.anomaly, rv.baseline = "slow", ring.dur  # (flagged: judged as soon as it arrives)
    v = _one(_run(ring, proc=proc)[1])
    assert (v.category, v.finding.ranks) == ("coll_mismatch", [c])
    assert v.finding.confidence == 0.8


def _steps(ring, rank: int, steps: int, channels=None) -> None:
    """Rank ``rank``'s flows (on ``channels``, default all) announce ``steps`` steps, all of them moved."""
    for f in ring.ranks[rank].flows:
        if channels is None or f.channel in channels:
            f.steps = f.posted = f.ready = f.transmitted = f.done = steps


@pytest.mark.parametrize("seq", [3, 12])
def test_a_rank_whose_connections_all_disagree_on_the_steps_was_called_with_another_count(seq):
    """Every rank reports the same count, but rank 6 moves twice the steps on each of its connections (the
    conformance mismatch_count): completed, its collectives are a mismatch, not a slowdown -- warm-up or not."""
    proc = Processor(env={})
    vs = _feed(proc, [seq], lambda ring, _: _steps(ring, 6, 32))
    assert [(v.category, v.finding.ranks) for v in vs] == [("coll_mismatch", [6])]
    assert "steps" in vs[0].finding.evidence and "rank 6 32 steps, the peer 16" in vs[0].finding.evidence


def test_a_hung_rank_that_expects_more_steps_than_its_peers_sent():
    """Real NCCL: the rank called with the larger count waits for data its finished peers never send."""
    ring = Ring(8)
    ring.hang_all(16)
    for r, rv in ring.ranks.items():
        if r != 6:
            rv.kind, rv.end = "op", rv.last_progress
            for f in rv.flows:
                f.wait, f.end = "", rv.last_progress
    for f in ring.ranks[6].flows:
        f.steps = 32
    v = _one(_run(ring)[1])
    assert (v.category, v.finding.ranks) == ("coll_mismatch", [6])


def test_one_connection_alone_that_disagrees_is_no_mismatch():
    """One flow's steps off (a ProxyOp record lost) names nobody; neither do the fewer steps of a rank still
    in flight (its later ProxyOps have not started)."""
    proc = Processor(env={})
    vs = _feed(proc, [12], lambda ring, _: _steps(ring, 3, 8, channels=[1]) or ring.ranks[3].flows.pop(2))
    assert vs == []
    ring = Ring(8)
    ring.gpu_stall(3)
    for f in ring.ranks[3].flows:
        f.steps = 8
    v = _one(_run(ring)[1])
    assert (v.category, v.finding.ranks) == ("gpu_stalled", [3])


def test_no_verdict_before_stall_threshold():
    ring = Ring(8)
    when = time.time_ns() - 1_000_000_000  # stalled 1 s ago only
    ring.t0 = when - 1_000_000
    ring.gpu_stall(3)
    for rv in ring.ranks.values():
        rv.last_progress = when
        rv.start = when - 1_000_000
    proc, vs = _run(ring)
    assert vs == []
    assert len(proc.tick(when + 3_100_000_000)) == 1


def test_a_picture_taken_before_the_stall_waits_for_the_next_snapshot():
    """A waiting rank's latest snapshot older than the last progress shows a collective still moving; the
    walk waits for a newer one, for one more stall period at most (an agent that stopped sending)."""
    t = time.time_ns() - 60_000_000_000
    ring = Ring(8, t0=t)
    ring.gpu_stall(3)
    ring.ranks[5].end = t  # rank 5's snapshot: taken before the stall began
    proc, vs = _run(ring, now_ns=t + 3_500_000_000)
    assert vs == []
    assert [v.finding.ranks for v in proc.tick(t + 6_500_000_000)] == [[3]]
    proc, vs = _run(ring, now_ns=t + 3_500_000_000)
    ring.ranks[5].end = t + 3_000_000_000  # the next snapshot arrives
    proc.ingest_request(ring.request())
    assert [v.finding.ranks for v in proc.tick(t + 3_600_000_000)] == [[3]]


def test_a_collective_queued_behind_the_one_before_stalls_from_its_end():
    """NCCL runs a communicator's collectives in order: one launched early shows no progress until the one
    before completes, and that time is no stall."""
    t = time.time_ns() - 60_000_000_000
    before = Ring(8, seq=17, t0=t, dur_ns=2_000_000_000)
    ring = Ring(8, seq=18, t0=t)
    ring.gpu_stall(3, k=0)
    for rv in ring.ranks.values():
        rv.end = t + 2_500_000_000  # snapshots after the one before completed
    proc = Processor(env={}, settle_s=0.2)
    proc.ingest_request(before.request())
    proc.ingest_request(ring.request())
    assert proc.tick(t + 3_500_000_000) == []  # 3.5 s since launch, 1.5 s since it could move
    assert [(v.category, v.finding.ranks) for v in proc.tick(t + 5_100_000_000)] == [("gpu_stalled", [3])]


def test_progress_resets_stall():
    ring = Ring(8)
    ring.gpu_stall(3)
    proc, _ = _run(ring, now_ns=0)
    # now every rank completes: no hang
    done = Ring(8, t0=ring.t0)
    proc.ingest_request(done.request())
    assert proc.tick() == []


def test_replay_gives_no_second_verdict():
    ring = Ring(8)
    ring.gpu_stall(1)
    proc, vs = _run(ring)
    assert len(vs) == 1
    proc.ingest_request(ring.request())
    proc.ingest_request(ring.request())
    assert proc.tick() == []
    assert len(proc.verdicts) == 1


def test_healthy_completed_no_verdict():
    ring = Ring(16)
    proc, vs = _run(ring)
    assert vs == [] and proc.tick(time.time_ns() + 10**10) == []


def _repeat(make, seqs=range(17, 37)) -> list:
    """A slowdown is named once its evidence accumulated (detector.py): the collectives ``seqs`` of one
    communicator; none of the first few can be an incident on its own."""
    proc = Processor(env={})
    out = []
    for i, seq in enumerate(seqs):
        proc.ingest_request(make(seq).request())
        out += proc.tick() or _settle(proc)
        if i < 5:
            assert out == [], "one slow collective is not yet an incident"
    return out


def test_late_rank():
    def make(seq):
        ring = Ring(8, seq=seq)
        ring.late(5, 400_000_000)
        return ring
    v = _one(_repeat(make))
    assert (v.kind, v.category, v.finding.ranks) == ("slowdown", "late_rank", [5])


def test_a_straggler_everybody_waited_a_second_for_is_named_at_once():
    """Mycroft's straggler bar: a rank >= 1 s late with every other rank waiting is named from one
    collective (an absolute bar: a second lost per rank matters whatever the job's spread)."""
    ring = Ring(8, seq=30)
    ring.late(5, 1_200_000_000)
    proc, vs = _run(ring)
    v = _one(vs or _settle(proc))
    assert (v.category, v.finding.ranks) == ("late_rank", [5])


def _settle(proc):
    time.sleep(proc.settle_s + 0.05)
    return proc.tick()


def _feed(proc, seqs, fault) -> list:
    """8-rank, 2-channel collectives ``seqs`` of one communicator, ``fault(ring, seq)`` applied to each, one at
    a time; the verdicts."""
    vs = []
    for seq in seqs:
        ring = Ring(8, nch=2, seq=seq)
        fault(ring, seq)
        proc.ingest_request(ring.request())
        vs += proc.tick() or _settle(proc)
    return vs


@pytest.mark.parametrize("fault,cat,chan", [("slow_flow", "slow_flow", 1), ("slow_nic", "slow_nic", None),
                                            ("slow_gpu", "slow_gpu", None)])
def test_slowdowns(fault, cat, chan):
    def make(seq):
        ring = Ring(8, nch=2, seq=seq)
        if fault == "slow_flow":
            ring.slow_flow(3, 1)
        elif fault == "slow_nic":
            ring.slow_nic(3)
        else:
            ring.slow_gpu(3)
        return ring
    v = _one(_repeat(make))
    assert (v.kind, v.category, v.finding.ranks, v.finding.channel) == ("slowdown", cat, [3], chan)


def test_a_flow_into_a_named_slow_gpu_is_its_symptom():
    """Once rank 3's slow GPU is named, a slow flow into rank 3 (the GPU drains it slowly) is that incident,
    while a slow flow between two other ranks is a fault of its own (both slow the ring as the GPU did:
    compared with its healthy time before the GPU's fault)."""
    def make(seq):
        ring = Ring(8, nch=2, seq=seq)
        if seq >= 30:
            ring.slow_gpu(3)
        return ring
    proc = Processor(env={})
    vs = []
    for seq in range(10, 50):
        proc.ingest_request(make(seq).request())
        vs += proc.tick() or _settle(proc)
    assert [(v.category, v.finding.ranks) for v in vs] == [("slow_gpu", [3])]
    deduped = proc.counts["deduped"]
    for seq, sender in [(s, 2) for s in range(50, 60)] + [(s, 5) for s in range(60, 70)]:
        ring = Ring(8, nch=2, seq=seq)
        ring.slow_flow(sender, 1)
        proc.ingest_request(ring.request())
        vs += proc.tick() or _settle(proc)
    assert [(v.category, v.finding.ranks, v.finding.peer) for v in vs[1:]] == [("slow_flow", [5], 6)]
    assert proc.counts["deduped"] >= deduped + 1


def test_a_communicators_first_collectives_name_no_slowdown():
    """NCCL connects peers and registers buffers on first use: a communicator's first collectives are
    slow by construction, so their outliers are no votes (a mismatch there is still named)."""
    proc = Processor(env={})
    vs = _feed(proc, range(1, 8), lambda ring, seq: ring.slow_gpu(3))
    assert vs == []
    # from collective 8 the measure's null is learned (8 collectives), then 6 collectives of evidence
    vs += _feed(proc, range(8, 30), lambda ring, seq: ring.slow_gpu(3))
    assert [(v.category, v.finding.ranks, v.seq) for v in vs] == [("slow_gpu", [3], 21)]


def test_slow_but_no_clear_culprit_is_silent():
    ring = Ring(8)
    ring.slow()  # everybody uniformly slow: no culprit worth naming
    proc, vs = _run(ring)
    assert vs == [] and _settle(proc) == []


def test_cross_comm_propagation_one_verdict():
    """Rank 3 (global 3) is GPU-stalled in a DP ring; its TP peers wait for it in a TP collective."""
    dp = Ring(8, comm=0xD0, seq=40)
    dp.gpu_stall(3)
    tp = Ring(4, nch=1, comm=0x70, seq=90)
    tp.absent(3, "not_entered")  # TP rank 3 is the same process as DP rank 3 (global rank 3)
    for rv in dp.ranks.values():
        rv.host = f"node-{rv.rank // 8}"
    for r, rv in tp.ranks.items():
        rv.global_rank = r
        rv.host = dp.ranks[r].host
    proc = Processor(env={})
    proc.ingest_request(tp.request())
    proc.ingest_request(dp.request())
    vs = proc.tick()
    v = _one(vs)
    assert (v.comm, v.category, v.finding.ranks) == ("00000000000000d0", "gpu_stalled", [3])
    # the TP collective is explained by the DP verdict, or never analysed: its waiting ranks' GPUs are
    # still busy in the DP collective launched before it (queued on the stream)
    assert proc.tick() == [] and proc.tick() == []
    tp_state = next(st for st in proc.store.traces.values() if st.comm == "0000000000000070")
    assert proc.counts["propagated"] == 1 or proc.store.queued(tp_state)


def test_an_intra_node_collective_behind_a_stuck_one_is_its_consequence():
    """A TP all-reduce over NVLink (no network flows, so no walk) whose ranks' GPUs are stuck in a hung DP
    collective launched before it waits for that one: one verdict, the DP one; on its own it would name
    whichever rank stopped progressing first."""
    dp = Ring(8, comm=0xD0, seq=40)
    dp.gpu_stall(3)
    tp = Ring(2, nch=0, comm=0x70, seq=90)
    tp.hang_all()
    for r, rv in tp.ranks.items():  # TP ranks 0, 1 are DP ranks 4, 5 (global 4, 5), both waiting in the DP ring
        rv.global_rank, rv.host = 4 + r, default_host(4 + r)
    proc = Processor(env={})
    proc.ingest_request(tp.request())
    proc.ingest_request(dp.request())
    vs = proc.tick() + proc.tick() + proc.tick()
    assert [(v.comm, v.category, v.finding.ranks) for v in vs] == [("00000000000000d0", "gpu_stalled", [3])]
    assert proc.counts["propagated"] == 1


def test_a_collective_launched_behind_a_stuck_intra_node_one_is_its_consequence_not_its_cause():
    """The other way round: a TP all-reduce over NVLink hangs first (a GPU stalled inside it), and the DP
    rings its ranks launched after it wait on GPUs that never reach their DP kernels. A GPU runs its stream's
    kernels in launch order, so the DP hang is the TP one's consequence, never its cause: one verdict, in the
    TP communicator, and the DP collective explained by it."""
    t0 = time.time_ns() - 10_000_000_000
    tp = Ring(2, nch=0, comm=0x70, seq=90, t0=t0)
    tp.hang_all()
    for r, rv in tp.ranks.items():  # TP ranks 0, 1 are DP ranks 4, 5 (global 4, 5)
        rv.global_rank, rv.host = 4 + r, default_host(4 + r)
    dp = Ring(8, comm=0xD0, seq=40, t0=t0 + 2_000_000)  # launched 2 ms after the TP all-reduce
    dp.gpu_stall(5)
    proc = Processor(env={})
    proc.ingest_request(dp.request())
    proc.ingest_request(tp.request())
    vs = proc.tick() + proc.tick() + proc.tick()
    assert [(v.comm, v.category) for v in vs] == [("0000000000000070", "gpu_stalled")], \
        [v.summary() for v in vs]
    assert proc.counts["propagated"] == 1


def test_two_faults_two_comms_two_verdicts():
    a = Ring(8, comm=0xA)
    a.gpu_stall(2)
    b = Ring(8, comm=0xB)
    b.net_send_stall(6, 0)
    for rv in b.ranks.values():
        rv.global_rank += 100
    proc = Processor(env={})
    proc.ingest_request(a.request())
    proc.ingest_request(b.request())
    vs = sorted(proc.tick(), key=lambda v: v.comm)
    assert [(v.category, v.finding.ranks) for v in vs] == [("gpu_stalled", [2]), ("net_send_stalled", [6])]


def test_two_jobs_on_the_same_hosts_are_two_incidents():
    """Jobs share hosts and global rank numbers; a dead process of one job explains nothing of the other."""
    a = Ring(8, comm=0xA1, job="job-a")
    a.absent(3, "process_exited")
    b = Ring(8, comm=0xB2, job="job-b")
    b.gpu_stall(3)
    proc = Processor(env={})
    proc.ingest_request(a.request())
    proc.ingest_request(b.request())
    vs = sorted(proc.tick() + proc.tick(), key=lambda v: v.comm)
    assert [(v.category, v.finding.ranks, v.finding.job) for v in vs] == [
        ("process_exited", [3], "job-a"), ("gpu_stalled", [3], "job-b")]


@pytest.mark.parametrize("late_s,apart_s,category", [(3.0, 10.0, "late_rank"), (0.0, 10.0, "slow_proxy"),
                                                     (0.0, 0.1, None)])
def test_a_stall_that_recovered_names_the_rank_waited_for(late_s, apart_s, category):
    """The others were seen waiting on rank 3 (in-flight snapshots), then the collective completed: rank 3
    started late (it launched after most of their wait: a straggler everybody waited > 1 s for, named at
    once) or its proxy did not move its flows (it launched with them: one capped score per stall, so a run
    of stalls, each after the last, is a slowdown). Stalls at once are one event (a process descheduled
    once stalls the collectives in flight together)."""
    proc = Processor(env={})
    vs = []
    base = time.time_ns() - 600_000_000_000
    for i, seq in enumerate(range(20, 28)):
        t0 = base + int(i * apart_s * 1e9)
        seen = Ring(8, nch=2, seq=seq, t0=t0)
        seen.absent(3, "none")  # snapshots 4 s into the collective: everybody else waits, rank 3 sent nothing
        done = Ring(8, nch=2, seq=seq, t0=t0)
        done.slow()
        for rv in done.ranks.values():
            rv.end += 4_100_000_000
        done.ranks[3].start += int(late_s * 1e9)
        proc.ingest_request(seen.request())
        proc.ingest_request(done.request())
        got = proc.tick() or _settle(proc)
        if category == "slow_proxy" and i < 5:
            assert got == [], "a few stalls of a proxy are what a loaded host does"
        vs += got
    assert [(v.category, v.finding.ranks) for v in vs] == ([(category, [3])] if category else [])
    assert all("stalled, then recovered" in v.finding.evidence for v in vs)


@pytest.mark.parametrize("completed", [True, False])
def test_a_rank_held_back_in_another_communicator_is_not_named_a_straggler(completed):
    """Rank 5 waits 4 s in flight in its DP ring behind a proxy that moved nothing (rank 3 launched with
    them), then enters its TP group's collective that late, where everybody waits >= 1 s for it. It was
    not computing, it was held back: the straggler bar does not name it (the DP ring's stall is judged
    where it happened), whether the DP ring's completion reached the processor first or only its in-flight
    snapshots have. The same late start with nothing holding it back is named at once."""
    base = time.time_ns() - 600_000_000_000
    dp, tp = 0xD1, 0x71

    def run(held: bool) -> list:
        proc = Processor(env={})
        if held:
            seen = Ring(8, nch=2, comm=dp, seq=30, t0=base)
            seen.absent(3, "none")  # snapshots 4 s in: everybody waits on rank 3's flows, rank 3 sent nothing
            proc.ingest_request(seen.request())
            if completed:
                done = Ring(8, nch=2, comm=dp, seq=30, t0=base)
                done.slow()
                for rv in done.ranks.values():
                    rv.end += 4_100_000_000
                proc.ingest_request(done.request())
                assert (proc.tick() or _settle(proc)) == []  # one stall of a proxy names nothing yet
        group = Ring(8, nch=2, comm=tp, seq=30, t0=base + 10_000_000)  # the same 8 processes
        group.late(5, 4_120_000_000)
        proc.ingest_request(group.request())
        return [v for v in proc.tick() or _settle(proc) if v.finding.ranks == [5]]

    assert run(held=True) == []
    assert [(v.category, v.finding.ranks) for v in run(held=False)] == [("late_rank", [5])]


def test_outliers_spread_over_healthy_collectives_name_nobody():
    """A loaded host's jitter makes a healthy rank the outlier now and then; a fault makes its culprit the
    outlier of every collective from its onset on. Sparse outliers of rank 3 (one in seven) name nobody;
    a run of them after that names it (the sparse ones before neither help nor hinder: the CUSUM drains)."""
    proc = Processor(env={})
    vs = []
    for seq in range(10, 60):
        ring = Ring(8, nch=2, seq=seq)
        if seq in (22, 29, 36) or seq >= 45:
            ring.slow_gpu(3)
        proc.ingest_request(ring.request())
        vs += proc.tick()
        if seq == 44:
            assert vs == [], [v.summary() for v in vs]
    assert [(v.category, v.finding.ranks) for v in vs] == [("slow_gpu", [3])]
    assert 45 <= vs[0].seq <= 52


def test_a_proxy_read_idle_yields_to_direct_evidence():
    """Behind a slow GPU somebody's send steps always wait least; while rank 3's GPU accumulates evidence
    of its own (slow in 3 of 4 collectives), rank 5's idle-looking proxy is not named."""
    vs = _feed(Processor(env={}), range(10, 50),
               lambda ring, seq: ring.slow_proxy(5) if seq % 4 == 0 else ring.slow_gpu(3))
    assert [(v.category, v.finding.ranks) for v in vs][:1] == [("slow_gpu", [3])]
    assert ("slow_proxy", [5]) not in [(v.category, v.finding.ranks) for v in vs]


def test_slow_proxy_is_named():
    vs = _feed(Processor(env={}), range(10, 30), lambda ring, seq: ring.slow_proxy(5))
    assert [(v.category, v.finding.ranks) for v in vs] == [("slow_proxy", [5])]


def test_slow_collectives_during_a_stall_wait_for_its_outcome():
    """While a collective of the job stalls, slow collectives around it may be its symptoms: they wait. Once
    it completes (a stall that recovered, no hang), they count as usual and rank 3's slow GPU is named."""
    proc = Processor(env={"MYCROFT_STALL_MS": "60000"}, settle_s=0.2)
    stuck = Ring(8, nch=2, comm=0x1111, seq=30)
    stuck.gpu_stall(6)
    proc.ingest_request(stuck.request())
    vs = proc.tick()
    vs += _feed(proc, range(10, 30), lambda ring, seq: ring.slow_gpu(3))
    assert vs == [], [v.summary() for v in vs]
    proc.ingest_request(Ring(8, nch=2, comm=0x1111, seq=30).request())  # the stalled collective completes
    vs += proc.tick() + _settle(proc)
    assert [(v.category, v.finding.ranks) for v in vs] == [("slow_gpu", [3])]
