"""The simulator's healthy variation against real NCCL, the job's own healthy effects, and fault magnitudes.

The capture (tests/sim/fixtures/gpu_check.json: H200, NCCL 2.28.9, 4 ranks, one GPU, socket transport) ran
back-to-back 1 MiB AllReduce / AllGather / ReduceScatter. ``calibration_job`` replays that workload on the
default timing and noise model (4 ranks, one host each, 1 MiB collectives, no compute in between), and
golden.spreads measures both the same way.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from mycroft_otel.sim import golden
from mycroft_otel.sim.engine import StepNoise, log_uniform, step_noise
from mycroft_otel.sim.faults import CALIBRATION_STEPS, RUN_AHEAD_FAULTS, SLOWDOWN_PARAM, FaultError, factor_for_slowdown
from mycroft_otel.sim.model import NOISE_MODELS, NoiseModel, NoiseModelError, TimingModel, noise_model
from mycroft_otel.sim.simulation import Simulation
from mycroft_otel.sim.topology import parse_topology

from _simtools import make_sim

FIXTURE = Path(__file__).parent / "fixtures" / "gpu_check.json"
#: every simulated spread lies within x/: this factor of the capture's (NoiseModel's docstring states it)
BAND = 1.3


def calibration_job(dp_mode: str, noise: NoiseModel | None = None, steps: int = 25, seed: int = 1) -> Simulation:
    m = TimingModel().with_step(forward_ns=0, backward_ns=0, optimizer_ns=0, dp_buckets=3, dp_bucket_bytes=1 << 20,
                                initial_broadcast=False, dp_mode=dp_mode, jitter=0.0)
    if noise is not None:
        m = replace(m, noise=noise)
    return Simulation(parse_topology("nodes=4,gpus=1,tp=1,dp=4"), m, [], seed=seed, steps=steps)


def simulated_spreads(noise: NoiseModel | None = None, steps: int = 25, seed: int = 1) -> golden.Spreads:
    rings = []
    for mode in ("allreduce", "zero"):  # AllReduce; ReduceScatter + AllGather, as the capture ran them
        sim = calibration_job(mode, noise, steps, seed)
        sim.run()
        rings += golden.capture_of_log(sim)["rings"]
    return golden.spreads({"rings": rings})


STATS = ("flow_p50", "flow_p99", "gpu_p50", "gpu_p99", "rank_p50", "rank_p99")


def test_the_captures_spreads_are_the_calibration_targets():
    """Measured on the capture: per collective, slowest / median send flow (wait per step) and rank (duration)."""
    s = golden.spreads(json.loads(FIXTURE.read_text()))
    got = {k: round(getattr(s, k), 2) for k in STATS}
    assert s.collectives == 64
    assert got == {"flow_p50": 1.53, "flow_p99": 1.83, "gpu_p50": 1.32, "gpu_p99": 1.69, "rank_p50": 1.04,
                   "rank_p99": 1.29}


def test_simulated_healthy_spreads_match_the_capture_within_the_band():
    cap = golden.spreads(json.loads(FIXTURE.read_text()))
    sim = simulated_spreads()
    assert sim.collectives == 225
    for k in STATS:
        c, s = getattr(cap, k), getattr(sim, k)
        assert abs(math.log(s / c)) <= math.log(BAND), f"{k}: simulated {s:.3f}, capture {c:.3f}"
    # ... and the spread is the noise model's: without it every flow and rank of a collective is alike
    quiet = simulated_spreads(noise_model("quiet"), steps=5)
    assert all(abs(getattr(quiet, k) - 1.0) < 1e-6 for k in STATS)


def test_log_uniform_spread_is_bounded_and_lognormal_free():
    rng = np.random.default_rng(0)
    x = log_uniform(rng, 2.7, 100_000)
    assert x.min() >= 2.7 ** -0.5 and x.max() <= 2.7 ** 0.5
    assert log_uniform(rng, 1.0, 5) == 1.0


def test_os_jitter_delays_a_few_network_steps_within_the_scheduler_bound():
    nz = replace(noise_model("jittery"), os_p=0.01)
    hop = np.zeros((2, 8), bool)
    hop[:, :4] = True
    sn = step_noise(nz, np.random.default_rng(1), (2000, 2, 8), hop)
    assert isinstance(sn, StepNoise)
    late = sn.proxy > 0
    assert not late[:, :, 4:].any()                        # only steps that go through the proxy and network
    assert 0.005 < late[:, :, :4].mean() < 0.015
    assert sn.proxy.max() <= nz.os_cap_ns and np.median(sn.proxy[late]) == pytest.approx(nz.os_median_ns, rel=0.3)


@pytest.mark.parametrize("name", list(NOISE_MODELS))
def test_every_noise_model_runs_healthy_and_deterministic(name):
    def run():
        sim = make_sim("nodes=4,gpus=2,tp=2,pp=2,dp=2", steps=2, seed=3, model=TimingModel().with_noise(name))
        sim.run()
        return sim

    a, b = run(), run()
    assert np.isfinite(a.ready).all() and np.isfinite(a.gpu).all()   # nothing hangs
    assert a.truths() == []
    for x, y in zip(a.log, b.log):
        assert x["end"] == y["end"] and x["issue"] == y["issue"]
    for e in a.log:  # every collective completed, every flow did all its steps
        assert all(np.isfinite(e["end"]))
        assert all(f["done"] == f["n_steps"] for f in e["flows"])


def test_unknown_noise_model_is_a_clear_error():
    with pytest.raises(NoiseModelError, match="unknown noise model 'loud'.*quiet"):
        noise_model("loud")


def test_stragglers_stall_one_rank_once_and_its_peers_wait():
    sim = make_sim("nodes=4,gpus=1,tp=1,dp=4", steps=30, seed=2,
                   model=TimingModel().with_noise("stragglers", straggler_p=0.05))
    sim.run()
    ev = sim.noise_events
    assert ev and all(10e6 <= e["delay_ns"] <= 2e9 for e in ev)
    # the DP collective right after a straggler: the straggler calls it late by about its stall
    e = ev[0]
    nxt = next(x for x in sim.log if x["step"] == e["step"] and e["rank"] in x["members"]
               and max(x["issue"]) - min(x["issue"]) > 0.5 * e["delay_ns"])
    assert int(np.argmax(nxt["issue"])) == nxt["members"].index(e["rank"])


def test_warmup_launches_a_communicators_first_collectives_late():
    def kstarts(noise: str) -> dict:
        sim = make_sim("nodes=4,gpus=1,tp=1,dp=4", steps=3, seed=1, model=TimingModel().with_noise(noise))
        sim.run()
        return sim, {x["seq"]: np.asarray(x["kstart"]) for x in sim.log}

    sim, warm = kstarts("warmup")
    _, plain = kstarts("nccl")
    assert (warm[0] - plain[0]).min() > 5e6       # the first call (the parameter broadcast) connects
    comm = sim.comms["dp"][0]
    members = np.arange(comm.nranks)
    d = [sim._warmup_delay(comm, k, members).mean() for k in range(5)]
    assert d[0] > d[1] > d[2] > 0 and d[3] == d[4] == 0.0


def test_mixed_sizes_follow_ddp_buckets():
    sim = make_sim("nodes=4,gpus=1,tp=1,dp=4", steps=1, model=TimingModel().with_noise("mixed"))
    sizes = sim.dp_bucket_sizes
    assert sizes[0] == 1 << 20 and len(set(sizes)) >= 2
    counts = [e.nbytes for e in sim.schedule(1) if e.kind == "dp"]
    assert counts == sizes


def test_pipeline_bubble_first_stage_waits_seconds_in_its_backward_recv():
    sim = make_sim("nodes=4,gpus=1,tp=1,pp=4,dp=1", steps=1, model=TimingModel().with_noise("bubbles"))
    sim.run()
    sends = [x for x in sim.log if x["func"] == "Send"]
    back_to_0 = [x for x in sends if x["members"][1] == 0]   # stage 1 -> stage 0 (members: [src, dst])
    assert back_to_0
    wait = back_to_0[0]["end"][1] - back_to_0[0]["issue"][1]
    stage_extra = NOISE_MODELS["bubbles"].stage_extra_ns
    assert wait >= 3 * 2 * stage_extra * 0.9                # (pp-1) x (forward + backward) of a stage
    assert np.isfinite(sim.ready).all()


# --- fault magnitudes ------------------------------------------------------------------------------------

def _dp_time(fault: str | None, step: int = 1, until: int | None = None) -> float:
    """First kernel start to last end of the first DP collective of ``step`` (quiet noise, 8 ranks); summed
    over steps ``step``..``until`` where given."""
    until = step if until is None else until
    sim = make_sim("nodes=8,gpus=1,tp=1,dp=8", fault, steps=until + 1, seed=1,
                   model=TimingModel().with_noise("quiet"))
    sim.run()
    firsts = {x["step"]: x for x in reversed(sim.log) if x["kind"] == "dp" and step <= x["step"] <= until}
    return sum(max(e["end"]) - min(e["kstart"]) for e in firsts.values())


@pytest.mark.parametrize("name", ["slow_flow", "slow_nic", "congestion", "slow_gpu", "late_rank", "late_once",
                                  "slow_proxy"])
@pytest.mark.parametrize("target", [1.5, 3.0])
def test_factor_for_slowdown_makes_the_collective_that_much_slower(name, target):
    value = factor_for_slowdown(name, target, seed=1)
    param = SLOWDOWN_PARAM[name]
    spec = f"{name}:rank=1,step=1,channel=0,p=1,{param}={value}"
    # a rank late every step is set for the job's steady state: the host gets its slack back every step
    # until the delay exceeds it, so the first late step is not the measure (faults.RUN_AHEAD_FAULTS)
    steps = (CALIBRATION_STEPS // 2, CALIBRATION_STEPS + 2) if name in RUN_AHEAD_FAULTS else (1, 1)
    got = _dp_time(spec, *steps) / _dp_time(None, *steps)
    assert got == pytest.approx(target, rel=0.05)
    if param == "factor":
        assert value > 1.0


def test_factor_for_slowdown_errors_name_the_problem():
    with pytest.raises(FaultError, match="not a slowdown fault"):
        factor_for_slowdown("nic_down", 2.0)
    with pytest.raises(FaultError, match="must be > 1"):
        factor_for_slowdown("slow_gpu", 1.0)


def test_late_once_delays_one_collective_and_its_truth_says_so():
    sim = make_sim("nodes=4,gpus=1,tp=1,dp=4", "late_once:rank=2,step=1,delay_ms=200", steps=4, seed=1,
                   model=TimingModel().with_noise("quiet"))
    sim.run()
    t = sim.truths()[0]
    assert (t["category"], t["kind"], t["culprit_global_ranks"], t["persistent"]) == ("late_rank", "slowdown", [2],
                                                                                      False)
    skew = [max(x["issue"]) - min(x["issue"]) for x in sim.log if x["kind"] == "dp"]
    assert sum(s > 100e6 for s in skew) == 1
    persistent = make_sim("nodes=4,gpus=1,tp=1,dp=4", "late_rank:rank=2,step=1,delay_ms=200", steps=4, seed=1,
                          model=TimingModel().with_noise("quiet"))
    persistent.run()
    assert persistent.truths()[0]["persistent"] is True
    skew = [max(x["issue"]) - min(x["issue"]) for x in persistent.log if x["kind"] == "dp"]
    assert sum(s > 100e6 for s in skew) == 3   # the same collective of steps 1, 2 and 3


def test_cli_takes_a_noise_model():
    import argparse

    from mycroft_otel.sim import cli

    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    assert p.parse_args([]).noise == "nccl"
    assert p.parse_args(["--noise", "stragglers"]).noise == "stragglers"
    with pytest.raises(SystemExit):
        p.parse_args(["--noise", "loud"])


def test_the_noisiest_model_through_the_real_plugin_completes_every_op(tmp_path, plugin):
    """Every noise effect at once (warm-up launch delays, stragglers, OS jitter, mixed buckets, bubbles)
    delivered to the plugin: every op of every rank completes with all its steps, nothing dropped."""
    from mycroft_otel.sim import runner

    from _simtools import read_rings

    sim = make_sim("nodes=4,gpus=2,tp=2,pp=2,dp=2", steps=3, seed=4, model=TimingModel().with_noise("everything"))
    res = runner.run(sim, runner.RunConfig(ring_dir=str(tmp_path), plugin=plugin))
    assert res["stats"].get("errors", 0) == 0 and res["stats"].get("missing_slot", 0) == 0
    rings = read_rings(tmp_path)
    assert len(rings.by_key) == len(sim.contexts)
    for ctx in rings.by_key.values():
        assert len(ctx.live) == 0 and len(ctx.records) > 0
        for rec in ctx.records:
            f = ctx.flows(rec)
            assert (f["done"] == f["n_steps"]).all()


@pytest.mark.parametrize("name,side", [("slow_nic", "send"), ("congestion", "recv")])
def test_slow_nic_truth_names_the_side(name, side):
    sim = make_sim("nodes=4,gpus=1,tp=1,dp=4", f"{name}:rank=2,step=1,factor=3", steps=2, seed=1)
    sim.run()
    t = sim.truths()[0]
    assert (t["category"], t["nic_side"], t["culprit_global_ranks"], t["persistent"]) == ("slow_nic", side, [2], True)
