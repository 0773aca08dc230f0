"""The sequential slowdown test (processor/detector.py, sequential.py): its false-alarm budget, and what it
names on synthetic collectives with a healthy spread like real NCCL's (H200 capture) and like a loaded host's."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from synth import Ring, jitter, scaled

from mycroft_otel.processor import Processor
from mycroft_otel.processor.candidates import judged_by
from mycroft_otel.processor.keys import step_of
from mycroft_otel.processor.sequential import (Cusum, CusumDesign, HitDesign, OwnSpreads, RobustNull, SequentialDesign,
                                               arl, arl_hits)
from mycroft_otel.processor.settings import Settings
from mycroft_otel.processor.spans import decode
from mycroft_otel.processor.state import TraceState

CAPTURE, LOADED = 0.15, 0.6  # healthy spread of per-step waits, log units (synth.jitter)


def test_the_design_meets_its_false_alarm_budget():
    """>= 10^6 collectives per candidate between false alarms of either test even when healthy scores have
    exponential tails (Laplace with the same MAD); a shift of 3 null scales is found in under 10 collectives
    (strong test), one of 1 scale in under 50 (mild test, where the strong one needs over 100); one
    collective, however extreme, never alarms (winsorized: it adds at most cap - k < h)."""
    d = Settings().cusum
    assert d.arl0_bound(null="laplace") >= 1e6
    assert d.arl0_bound(null="normal") >= 1e7
    assert arl(d.strong, shift=3.0) <= 10
    assert arl(d.mild, shift=1.0) <= 50 < 100 <= arl(d.strong, shift=1.0)
    for t in (d.strong, d.mild):
        assert t.cap - t.k < t.h
    with pytest.raises(ValueError):
        CusumDesign(k=1.0, h=0.5, cap=2.0)


def test_the_hit_test_meets_the_budget_and_finds_a_wait_on_some_collectives():
    """The hit test (a Bernoulli CUSUM on scores >= 2 null scales) alarms once in >= 10^7 collectives at the
    healthy hit rate 1 - Phi(2), whatever the null's tails (scores read by their place among healthy ones), and
    still once in >= 10^7 on a small null, whose top values read far out more often (its hits weigh less); a
    wait on every other collective alarms in under 20, on every third in under 40; one hit never does; a null
    too small to tell a hit from a healthy one gathers nothing."""
    d = Settings().cusum.hits
    assert arl_hits(d, d.floor) >= 1e7
    assert d.p0(512, 3) == d.floor and d.p0(63, 3) > d.floor
    assert arl_hits(d, d.p0(63, 3), p0=d.p0(63, 3)) >= 1e7
    assert arl_hits(d, 0.5) <= 20 and arl_hits(d, 1 / 3) <= 40
    assert 0 < d.steps(d.floor)[0] < d.h and d.steps(d.p0(12, 3)) == (0.0, 0.0)
    with pytest.raises(ValueError):
        HitDesign(p1=0.01)


def _collectives(seqs, inject, sigma: float, seed: int, n: int = 8, settings: Settings | None = None,
                 watch=lambda proc: None) -> list:
    """Collectives ``seqs`` of an ``n``-rank ring (healthy spread ``sigma``), each changed by
    ``inject(ring, seq, rng)`` before the processor ingests it and ``watch(processor)`` called after each;
    the verdicts as (category, ranks, channel, seq)."""
    rng = np.random.default_rng(seed)
    proc = Processor(env={}, settle_s=0.0, settings=settings)
    out = []
    for seq in seqs:
        ring = Ring(n, nch=2, seq=seq, t0=1_000_000_000_000 + seq * 20_000_000)
        jitter(ring, rng, sigma)
        inject(ring, seq, rng)
        proc.ingest_request(ring.request())
        out += [(v.category, v.finding.ranks, v.finding.channel, seq) for v in proc.tick()]
        watch(proc)
    return out


def _run(fault: str | None, factor: float, sigma: float, seed: int, onset: int = 40, total: int = 120,
         n: int = 8, settings: Settings | None = None) -> list:
    """Collectives 1..total of an 8-rank ring, healthy spread ``sigma``, the fault from ``onset``; the
    verdicts as (category, ranks, channel, collectives after the onset)."""
    def inject(ring, seq, rng):
        if fault is not None and seq >= onset:
            scaled(ring, fault, 3, factor)
    return [v[:3] + (v[3] - onset,) for v in _collectives(range(1, total + 1), inject, sigma, seed, n, settings)]


@pytest.mark.parametrize("sigma", [CAPTURE, LOADED])
@pytest.mark.parametrize("seed", [1, 2])
def test_a_healthy_job_is_silent(sigma, seed):
    assert _run(None, 1.0, sigma, seed, total=300) == []


@pytest.mark.parametrize("fault,category,channel", [("slow_gpu", "slow_gpu", None), ("slow_flow", "slow_flow", 1),
                                                    ("slow_nic", "slow_nic", None), ("late_rank", "late_rank", None),
                                                    ("slow_proxy", "slow_proxy", None)])
@pytest.mark.parametrize("factor", [1.5, 2.0, 3.0])
def test_a_mild_sustained_fault_is_named_within_a_few_collectives(fault, category, channel, factor):
    vs = _run(fault, factor, CAPTURE, seed=7)
    assert vs, "not named"
    cat, ranks, chan, after = vs[0]
    assert (cat, ranks, chan) == (category, [3], channel)
    assert 0 <= after <= 15, after


def test_a_flow_slower_by_about_one_null_scale_is_named_by_the_mild_test():
    """A link 1.2x slower moves its flow's score by about one scale of the capture-like null: the mild test
    (tuned for 1 scale) names it within 60 collectives, the strong one (tuned for 2) alone does not."""
    vs = _run("slow_flow", 1.2, CAPTURE, seed=7, total=100)
    assert vs and vs[0][:3] == ("slow_flow", [3], 1) and vs[0][3] <= 60, vs
    strong_only = replace(Settings(), cusum=SequentialDesign(mild=CusumDesign(k=0.5, h=1e9, cap=1.5)))
    assert _run("slow_flow", 1.2, CAPTURE, seed=7, total=100, settings=strong_only) == []


@pytest.mark.parametrize("fault", ["slow_gpu", "slow_flow", "slow_nic"])
def test_a_noisy_host_gets_a_wider_bar(fault):
    """On a loaded host (4x the spread) a 3x fault is still named, later; nothing before it."""
    vs = _run(fault, 3.0, LOADED, seed=3, total=160)
    assert vs and vs[0][:2] == (fault, [3]) and 0 <= vs[0][3] <= 40, vs


def test_one_outlier_alone_never_alarms():
    """A descheduled proxy thread holds one flow 1000x for one collective, now and then: no verdict."""
    def inject(ring, seq, rng):
        if seq % 9 == 0:
            ring.slow_flow(int(rng.integers(8)), 1, factor=1000)
    assert _collectives(range(1, 200), inject, CAPTURE, seed=5) == []


@pytest.mark.parametrize("share", [0.1, 0.3, 0.5])
def test_proxies_a_loaded_host_deschedules_now_and_then_are_silent(share):
    """In ``share`` of the collectives each rank's proxy posts its ready steps late by 5-50% of the
    collective (its thread descheduled), as the rank processes of a loaded host do: the proxy measure is 0 on
    the other collectives, so its null's MAD is 0, and waits as common as the healthy ones are judged by
    their place among them (not as 100 scales each), while a proxy slow on every collective still is named
    (test_a_mild_sustained_fault_is_named_within_a_few_collectives)."""
    def inject(ring, seq, rng):
        for r in range(8):
            if rng.random() < share:
                ring.slow_proxy(r, int(rng.uniform(0.05, 0.5) * ring.dur))

    # the test itself, not only the verdict (the Slower check would hide its false alarms here: every
    # collective is as slow as the waits make it)
    seen = [0.0]

    def watch(proc):
        seen[0] = max([seen[0]] + [c.s for k, c in proc.detector.mem.cusums.items() if k.measure == "proxy"])
    assert _collectives(range(1, 400), inject, CAPTURE, seed=11, watch=watch) == []
    most, h = seen[0], Settings().cusum.h
    assert most < h, most


def test_the_strong_tests_run_is_counted_apart_from_the_evidence_another_test_holds_up():
    """The Slower check's pace (a strong shift found within 2h / (cap - k) collectives) reads the strong
    test's own run: a hit test holding S above 0 over quiet collectives does not lengthen it."""
    d, c = SequentialDesign(), Cusum()
    for z in (50.0, 0.0, 0.0, 0.0, 50.0, 50.0):  # the strong test drains to 0 between the hits
        c.update(z, d, 0, 0.0, mild=False, p0=d.hits.floor)
    assert c.collectives == 6 and c.strong_run == 2 and c.strong == 2.0


def test_a_proxy_late_on_every_other_collective_is_named_by_the_hit_test():
    """A proxy thread that stalls once a collective posts ready steps late only where its stall fell on one:
    rank 3's proxy late by a quarter of the collective on every other one (0 on the rest) is named by how
    often it reads far out; the winsorized tests alone (the hit test's bar out of reach) never gather."""
    def inject(ring, seq, rng):
        if seq >= 40 and seq % 2:
            ring.slow_proxy(3, ring.dur // 4)

    vs = _collectives(range(1, 121), inject, CAPTURE, seed=7)
    assert vs and vs[0][:2] == ("slow_proxy", [3]) and vs[0][3] - 40 <= 40, vs
    no_hits = replace(Settings(), cusum=SequentialDesign(hits=HitDesign(h=1e9)))
    assert _collectives(range(1, 121), inject, CAPTURE, seed=7, settings=no_hits) == []


def test_own_spreads_keep_each_candidate_apart_and_wait_for_enough_scores():
    own = OwnSpreads(size=8, min_values=4)
    rows = own.rows(["quiet", "noisy"])
    assert own.stats(rows)[2].tolist() == [0, 0]  # nothing known yet: the measure's null alone
    rng = np.random.default_rng(1)
    for _ in range(3):
        own.add(rows, np.array([rng.normal(0, 0.01), rng.normal(0, 1.0)]))
    assert own.stats(rows)[1].tolist() == [0.0, 0.0]  # 3 < min_values
    for _ in range(20):  # more than the ring holds: only the last 8 count
        own.add(rows, np.array([rng.normal(2.0, 0.01), rng.normal(0, 1.0)]))
    (med_q, _), (quiet, noisy), n = own.stats(rows)
    assert 0 < quiet < 0.05 and noisy > 0.3 and n.tolist() == [8, 8] and abs(med_q - 2.0) < 0.05
    # a candidate seen later gets its own row; the others keep theirs
    again = own.rows(["noisy", "late"])
    assert again[0] == rows[1] and own.stats(again)[1][1] == 0.0


def test_own_spreads_read_the_same_median_and_spread_as_their_definition_whatever_rows_hold():
    """stats takes a faster path when every row holds as many scores (one sort, empty slots left out): it
    must read exactly the median and the median absolute deviation of each row's scores, ties and a ring
    that has wrapped included, and the rows holding fewer scores than the others too."""
    rng = np.random.default_rng(5)
    for size, adds in ((8, 3), (8, 5), (8, 8), (8, 13), (7, 20)):
        own = OwnSpreads(size=size, min_values=2)
        units = [f"u{i}" for i in range(6)]
        kept: dict[str, list[float]] = {u: [] for u in units}
        for k in range(adds):
            some = units if k % 4 else units[:4]  # the last two miss a collective now and then
            x = np.round(rng.normal(0, 1, len(some)), 1)  # rounded: ties
            own.add(own.rows(some), x)
            for u, v in zip(some, x.tolist()):
                kept[u] = (kept[u] + [v])[-size:]
        for sel in (units, units[:4]):
            med, spread, n = own.stats(own.rows(sel))
            for u, m, s, c in zip(sel, med.tolist(), spread.tolist(), n.tolist()):
                v = np.array(kept[u])
                if len(v) < 2:
                    assert (m, s, c) == (0.0, 0.0, 0)
                    continue
                assert c == len(v) and m == np.median(v), (u, m, np.median(v))
                assert s == 1.4826 * np.median(np.abs(v - np.median(v))), (u, s)


def test_a_null_borrowed_from_another_size_never_narrows_this_sizes_spread():
    """A communicator's 64 MiB all-reduces (bandwidth-bound, narrow) have taught a null; its first 16 KiB ones
    (latency-bound, 6x wider) are judged by it until they have a null of their own, at the wider of the two
    spreads, from their very first collective. The narrow null's own size keeps its spread."""
    rng = np.random.default_rng(2)
    large, small = RobustNull(), RobustNull()
    for _ in range(40):
        large.add(rng.normal(0.0, 0.05, 8))
    small.add(rng.normal(0.0, 0.3, 8))  # one collective of 8 candidates
    assert judged_by(large, small)[1] == small.location_scale()[1] > 3 * large.location_scale()[1]
    assert judged_by(large, small)[0] == large.location_scale()[0]  # where healthy scores sit: the borrowed null
    assert judged_by(large, large) == judged_by(large, None) == judged_by(large, RobustNull()) == \
        large.location_scale()
    assert judged_by(small, large) == small.location_scale()  # a narrower size never narrows a wider null


@pytest.mark.parametrize("factor,named", [(1.07, False), (1.15, True)])
def test_an_offset_from_the_jobs_start_is_named_only_at_the_pace_of_a_fault(factor, named):
    """Rank 3's flow on channel 1 waits factor x its peers' per step from the first collective, in a quiet job
    (the null's scale is its 5% floor), and no collective is slower for it. With no healthy time to compare
    with, a shift the strong test is tuned for (>= 2 scales: 1.15x) is named at its pace (h in 6 collectives),
    while one of 1.35 scales (1.07x), which only creeps to h, is what a candidate's role (a longer route)
    produces too: silent."""
    def inject(ring, seq, rng):
        for f in ring.flows(3, True, 1):
            f.net_wait = int(f.net_wait * factor)
    for seed in (1, 2, 3):
        out = _collectives(range(1, 120), inject, 0.01, seed=seed)
        assert [v[:3] for v in out[:1]] == ([("slow_flow", [3], 1)] if named else []), (seed, out)


@pytest.mark.parametrize("twin", [False, True])
def test_an_offset_from_the_jobs_start_that_repeats_on_ranks_apart_is_a_role(twin):
    """Rank 0's GPU waits 1.5x its peers' per step from the first collective in a quiet job, and the
    collectives take no longer than at their first (nothing to compare with). Alone, that is a fault
    present from the start, named at the strong test's pace (its ring neighbours feel it too). Repeated on
    rank 4, which has no neighbour in common with it (as a double binary tree's two roots), it is the
    algorithm's role: silent."""
    def inject(ring, seq, rng):
        for r in (0, 4) if twin else (0,):
            for f in ring.flows(r, False):
                f.gpu_wait = int(f.gpu_wait * 1.5)
    vs = _collectives(range(1, 120), inject, 0.01, seed=4)
    assert [v[:2] for v in vs[:1]] == ([] if twin else [("slow_gpu", [0])]), vs


@pytest.mark.parametrize("factor", [None, 1.5])
def test_ranks_whose_role_sets_them_apart_are_judged_against_their_own_offset(factor):
    """In a tree the inner ranks reduce what their children send while the leaves only receive the
    broadcast: on a quiet job (the simulator's tree8 without noise) half the GPUs read 1.9x-2.4x the leaves'
    in every collective. The roots sit above the collective's median by more than the (bimodal) null's
    scale each time, so without their own offset their evidence creeps up to an alarm. It is their role, not
    a fault: silent. A 1.5x slowdown of a root's GPU later is still named."""
    def inject(ring, seq, rng):
        for r, role in ((0, 2.4), (7, 2.4), (1, 1.9), (6, 1.9)):
            scaled(ring, "slow_gpu", r, role)
        if factor is not None and seq >= 100:
            scaled(ring, "slow_gpu", 0, factor)
    vs = _collectives(range(1, 200), inject, 0.01, seed=4)
    if factor is None:
        assert vs == []
    else:
        assert vs and vs[0][:2] == ("slow_gpu", [0]) and 100 <= vs[0][3] <= 115, vs


@pytest.mark.parametrize("slower", [False, True])
def test_a_verdict_needs_the_collectives_to_be_slower(slower):
    """For 30 collectives rank 3's flows out wait 1.6x their peers' per step. When the collectives take no
    longer for it (a healthy ring is paced by whichever link is slowest at the moment), that is chance, not
    a slowdown: silent. When they take 1.6x as long, its NIC is named."""
    def inject(ring, seq, rng):
        if 40 <= seq < 70:
            for f in ring.flows(3, True):
                f.net_wait = int(f.net_wait * 1.6)
            if slower:
                ring.stretch(int(0.6 * ring.dur))
    vs = _collectives(range(1, 120), inject, CAPTURE, seed=6)
    if slower:
        assert vs and vs[0][:2] == ("slow_nic", [3]) and 40 <= vs[0][3] <= 55, vs
    else:
        assert vs == []


@pytest.mark.parametrize("fault,category,channel", [("slow_nic", "slow_nic", None), ("slow_flow", "slow_flow", 1)])
def test_a_slow_link_is_named_not_the_gpu_its_bursts_hold_up(fault, category, channel):
    """A link that delivers late delivers in bursts (the steps in flight land together once the window is
    full): its receiver's data then waits while the GPU reduces and forwards the ones before it, so rank 4's
    GPU reads 3x while the link from rank 3 into it reads 1.6x. The GPU crosses h first; the verdict is the
    link into it, and nothing after it."""
    def inject(ring, seq, rng):
        if seq >= 40:
            scaled(ring, fault, 3, 1.6)
            scaled(ring, "slow_gpu", 4, 3.0)
    out = _collectives(range(1, 100), inject, CAPTURE, seed=11)
    assert out and out[0][:3] == (category, [3], channel), out
    assert all(v[1] == [3] for v in out), out


def test_a_slow_gpus_upstream_waiting_for_credit_is_not_read_as_a_proxy():
    """Behind a slow GPU its upstream neighbour's ready steps wait for credit (the GPU holds the buffers), as
    long as the GPU held them: that wait is the GPU's, and the verdict too. (Every receiver also waits in
    RecvWait for its upstream's data most of a collective, as in a real ring, so only the GPU's busy time
    can explain the credit wait.)"""
    def inject(ring, seq, rng):
        for r in ring.ranks:
            for f in ring.flows(r, False):
                f.net_wait += ring.dur
        if seq >= 40:
            held = sum(f.gpu_wait for f in ring.flows(3, False))
            scaled(ring, "slow_gpu", 3, 2.0)
            held = sum(f.gpu_wait for f in ring.flows(3, False)) - held
            for f in ring.flows(2, True):
                f.end += held // len(ring.flows(2, True))
                f.peer_wait += held // len(ring.flows(2, True))
    out = _collectives(range(1, 100), inject, CAPTURE, seed=5)
    assert out and out[0][:2] == ("slow_gpu", [3]), out
    assert ("slow_proxy", [2]) not in [v[:2] for v in out], out


@pytest.mark.parametrize("far", [6, 7, 0])
def test_a_slow_gpu_is_named_itself_while_a_proxy_far_from_it_gathers(far):
    """Rank 3's GPU 2x slower while the proxy of a rank three or four hops away posts late on every third
    collective, gathering evidence half way without alarming first. A proxy holds back the GPU of its own
    rank and of its neighbours in the flows (slots its unposted sends fill, credit it returns late); a
    farther one reaches this GPU only through the GPUs between them: the GPU alarm is the GPU's."""
    def inject(ring, seq, rng):
        if seq >= 30 and seq % 3 == 0:
            ring.slow_proxy(far, ring.dur // 4)
        if seq >= 40:
            scaled(ring, "slow_gpu", 3, 2.0)
    out = _collectives(range(1, 100), inject, CAPTURE, seed=5)
    assert out and out[0][:2] == ("slow_gpu", [3]), out


def test_a_late_rank_is_judged_at_a_size_the_processor_has_rarely_seen():
    """A job alternates two message sizes, and the processor saw the smaller one only 4 times before rank 3
    starts late in 8 collectives (the agents export a sample): each of the 8 counts, the rarer size's judged
    against the communicator's other size until it has a history of its own."""
    def inject(ring, seq, rng):
        for rv in ring.ranks.values():
            rv.count = 1 << 14 if seq % 2 == 0 else 1 << 20
        if 40 <= seq < 48:
            scaled(ring, "late_rank", 3, 3.0)
    exported = [seq for seq in range(1, 60) if seq >= 40 or seq % 2 or seq % 10 == 0]
    out = _collectives(exported, inject, CAPTURE, seed=3)
    assert [v[:2] for v in out[:1]] == [("late_rank", [3])], out


def test_a_late_rank_is_judged_before_its_communicators_null_is_learnt():
    """The agents exported 2 healthy collectives of a communicator (its first seconds: the cadence measures
    the rate first) when rank 3 starts 8 collectives late, flagged by its peers: the lateness is judged
    against the prior (0, 0.2) and named; the same job's healthy collectives before it name nothing."""
    def inject(ring, seq, rng):
        if seq >= 40:
            scaled(ring, "late_rank", 3, 2.0)
    out = _collectives((20, 30) + tuple(range(40, 48)), inject, CAPTURE, seed=4)
    assert [v[:2] for v in out] == [("late_rank", [3])] and out[0][3] >= 45, out


@pytest.mark.parametrize("places", [True, False])
def test_a_rank_late_into_one_place_of_the_step_is_judged_there(places):
    """A training step of 4 collectives on the communicator; from collective 40 rank 3 starts the third of each
    step late. Kept per place of the step (the agents' mycroft.coll.step_index) its evidence gathers once a
    step and it is named; kept over all places, the three collectives it is on time into drain what each late
    one adds, and it never is."""
    def inject(ring, seq, rng):
        for rv in ring.ranks.values():
            rv.step_index = seq % 4 if places else None
        if seq >= 40 and seq % 4 == 2:
            scaled(ring, "late_rank", 3, 3.0)
    out = _collectives(range(1, 121), inject, CAPTURE, seed=5)
    if places:
        assert [v[:2] for v in out[:1]] == [("late_rank", [3])] and out[0][3] <= 40 + 4 * 8, out
    else:
        assert out == []


@pytest.mark.parametrize("value, place", [(2, 2), (0, 0), (63, 63), (64, -1), (-3, -1), (1 << 62, -1),
                                          ("2", -1), (True, -1), (2.0, -1)])
def test_a_place_in_the_step_is_read_from_the_span_and_hostile_ones_are_refused(value, place):
    """The first completed span's mycroft.coll.step_index is the collective's place; a value no agent writes
    (beyond the places told apart, negative, another type) reads as no place: a client cannot multiply the
    processor's keys."""
    ring = Ring(4, seq=7)
    for rv in ring.ranks.values():
        rv.step_index = value
    st = TraceState(b"t" * 16)
    for ref in decode(ring.request().SerializeToString()).refs:
        st.add(ref, 0.0)
    assert step_of(st) == place
