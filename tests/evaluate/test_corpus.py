"""mycroft-otel eval --virtual --corpus: the accuracy corpus and its report, on virtual time.

The CI subset (``--corpus ci``) runs end to end once per module and its figures are checked against one
table of expectations (``CI_EXPECTATIONS``): what the processor on main names today. A better detector
tightens the table (raise a rate, lower a count); a worse one fails here.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, replace

import pytest

from mycroft_otel.evaluate import corpus

@dataclass(frozen=True)
class Expect:
    """The least shares of a (fault, magnitude)'s ci runs whose first verdict after the onset names the true
    culprit with the true category (``named_right``), and the true culprit whatever the category (``culprit``)."""

    named_right: float
    culprit: float


#: (fault, magnitude or None) -> Expect. Every case of --corpus ci is listed (checked below), so a new case
#: needs its expectation here. Measured on main with the sequential slowdown detector (processor/detector.py);
#: an entry below 1.0 would be a known miss of it, with what it names instead (docs/algorithm.md §8).
CI_EXPECTATIONS: dict[tuple[str, float | None], Expect] = {
    **{(h, None): Expect(1.0, 1.0) for h in corpus.HANGS},        # every hang named right
    ("slow_flow", 3.0): Expect(1.0, 1.0), ("slow_flow", 10.0): Expect(1.0, 1.0),
    ("slow_nic", 3.0): Expect(1.0, 1.0), ("slow_nic", 10.0): Expect(1.0, 1.0),
    ("congestion", 3.0): Expect(1.0, 1.0),
    ("congestion", 10.0): Expect(1.0, 1.0),
    ("slow_gpu", 3.0): Expect(1.0, 1.0), ("slow_gpu", 10.0): Expect(1.0, 1.0),
    ("late_rank", 3.0): Expect(1.0, 1.0), ("late_rank", 10.0): Expect(1.0, 1.0),
    # a one-off call 1 s late (Mycroft's straggler bar): named from that one collective
    ("late_once", None): Expect(1.0, 1.0),
}
CI_FALSE_ON_HEALTHY_RUNS = 0          # verdicts on the healthy runs (the issue: 0 in CI's subset)
# before the onset, or naming a non-culprit (the mismatch's victims in its ranks' TP groups were 3 of them
# until hung collectives queued behind a named one carried its verdict)
CI_FALSE_IN_FAULT_RUNS_MAX = 0
CI_LATENCY_MEDIAN_MAX = 10            # collectives from the onset to the first right verdict (the issue's bar)
# The subset's size, so it stays a CI job (< 3 min on one core measured; docs/simulator.md "The corpus"):
# simulated seconds and ranks, which fix the work whatever the machine's speed.
CI_MAX_RUNS, CI_MAX_SIM_S, CI_MAX_WORLD = 25, 300.0, 8


def _eval(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mycroft_otel", "eval", "--virtual", *args],
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def ci(plugin, tmp_path_factory) -> dict:
    svg = tmp_path_factory.mktemp("corpus") / "curve.svg"
    r = _eval("--corpus", "ci", "--json", "--plot", str(svg))
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    out["svg"] = svg.read_text()
    return out


def test_every_ci_case_has_an_expectation():
    listed = {(c.fault, c.magnitude) for c in corpus.cases(corpus.SIZES["ci"]) if c.fault != corpus.HEALTHY}
    assert listed == set(CI_EXPECTATIONS)


def test_ci_subset_stays_small():
    todo = corpus.cases(corpus.SIZES["ci"])
    assert len(todo) <= CI_MAX_RUNS
    assert max(corpus._world(corpus.TOPOLOGIES[c.topology].spec) for c in todo) <= CI_MAX_WORLD


@pytest.mark.parametrize("key", sorted(CI_EXPECTATIONS, key=str), ids=lambda k: f"{k[0]}-x{k[1]}")
def test_ci_named_right_as_expected(ci, key):
    fault, m = key
    rows = [r for r in ci["runs"] if r["fault"] == fault and r["magnitude"] == m]
    assert rows
    seen = [(r["scenario"], r["top"] or "no verdict") for r in rows]
    assert sum(r["named_right"] for r in rows) / len(rows) >= CI_EXPECTATIONS[key].named_right, seen
    assert sum(bool(r["detected"] and r["culprit_ok"]) for r in rows) / len(rows) >= CI_EXPECTATIONS[key].culprit, seen


def test_ci_false_verdicts_and_latency(ci):
    rep = ci["report"]
    assert ci["report"]["sim_s"] <= CI_MAX_SIM_S
    assert rep["healthy_runs"] >= 2 and rep["healthy_run_collectives"] > 0
    assert rep["false_verdicts_on_healthy_runs"] == CI_FALSE_ON_HEALTHY_RUNS
    assert rep["false_verdicts_before_onset_or_wrong_culprit"] <= CI_FALSE_IN_FAULT_RUNS_MAX
    per_1e6 = round(rep["false_verdicts"] * 1e6 / rep["healthy_collectives"], 1)
    assert rep["false_per_1e6_healthy_collectives"] == per_1e6
    assert rep["latency_collectives_median"] is not None and rep["latency_collectives_median"] <= CI_LATENCY_MEDIAN_MAX
    # the counts come from the job: every fault run issued collectives before and after its onset
    for r in ci["runs"]:
        assert 0 < r["healthy_collectives"] <= r["collectives"]
        assert (r["healthy_collectives"] == r["collectives"]) == (r["fault"] == corpus.HEALTHY)


def test_ci_curve_report_and_picture(ci):
    curve = ci["report"]["curve"]
    assert set(curve) == set(corpus.SIZES["ci"].slowdowns)
    for by_m in curve.values():
        assert set(by_m) == {"3", "10"} and all(v["runs"] == 1 for v in by_m.values())
    root = ET.fromstring(ci["svg"])
    lines = root.findall("{http://www.w3.org/2000/svg}polyline")
    assert len(lines) == len(curve)
    legend = {t.text for t in root.iter("{http://www.w3.org/2000/svg}text")}
    assert set(curve) <= legend


def test_same_corpus_same_rows_with_a_process_pool(plugin, tmp_path):
    spec = tmp_path / "two.json"
    spec.write_text(json.dumps({"slowdowns": ["slow_flow"], "magnitudes": [10], "hangs": [], "late_once_ms": [],
                                "healthy_seeds": [11]}))
    a, b = _eval("--corpus", str(spec), "--json"), _eval("--corpus", str(spec), "--json", "--jobs", "2")
    assert a.returncode == 0 and b.returncode == 0, (a.stderr[-1000:], b.stderr[-1000:])
    strip = lambda out: [{k: v for k, v in r.items() if k != "wall_s"} for r in json.loads(out)["runs"]]  # noqa: E731
    assert strip(a.stdout) == strip(b.stdout) and len(strip(a.stdout)) == 2


def test_one_run_kept_replays_to_its_verdict_and_explains_each_collective(plugin, tmp_path):
    """--only picks runs of a corpus by name and --keep keeps what their processor received: replayed, that
    recording gives the run's verdict, and the report shows the decision about every collective (why the
    ones before the verdict named nothing). A name the corpus does not have is refused with the names."""
    from mycroft_otel import semconv as sc
    from mycroft_otel.processor.replay import replay
    from mycroft_otel.report import render_report

    spec = tmp_path / "two.json"
    spec.write_text(json.dumps({"slowdowns": ["slow_flow"], "magnitudes": [10], "hangs": [], "late_once_ms": [],
                                "healthy_seeds": [11]}))
    listed = _eval("--corpus", str(spec), "--list")
    name = next(line.split()[0] for line in listed.stdout.splitlines() if line.startswith("slow_flow"))
    r = _eval("--corpus", str(spec), "--only", name, "--keep", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    (run,) = json.loads(r.stdout)["runs"]
    assert run["scenario"] == name and run["named_right"], run
    _proc, verdicts = replay(run["recording"])
    assert verdicts, "the recording replayed to no verdict"
    first = verdicts[0].attributes()
    assert (first[sc.RCA_CATEGORY], list(first[sc.RCA_CULPRIT_GLOBAL_RANKS])) == \
        (run["category"], run["culprit"]), [v.summary() for v in verdicts]
    before = logging.getLogger("mycroft_otel").level
    _html, rep, problems = render_report(run["recording"], replay=True)
    assert logging.getLogger("mycroft_otel").level == before  # the replay quiets its logging for itself only
    assert not problems and rep.decision_counts.get("named") == 1 and rep.decision_counts.get("below_bar", 0) > 10, \
        rep.decision_counts
    bad = _eval("--corpus", str(spec), "--only", "no-such-run")
    assert bad.returncode == 2 and "no run named no-such-run" in bad.stderr, bad.stderr[-500:]


def test_a_slow_link_in_a_16_rank_ring_is_named_as_the_link(plugin, tmp_path):
    """Beyond the ci subset's 8 ranks: a slow link holds back every kernel upstream of it through the FIFO
    credits, so the GPU that alarms first may be several hops from the link (x3 named an upstream GPU), and a
    receiver that hears from two senders reads a slower least-waiting flow in when one of them slows (x1.5
    named its NIC). The link is named at every magnitude."""
    spec = tmp_path / "ring16.json"
    spec.write_text(json.dumps({"slowdowns": ["slow_flow"], "magnitudes": [1.5, 2.0, 3.0], "hangs": [],
                                "topologies": ["ring16"], "late_once_ms": [], "healthy_seeds": []}))
    r = _eval("--corpus", str(spec), "--json", timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    runs = json.loads(r.stdout)["runs"]
    assert len(runs) == 3
    assert [(x["scenario"], x["top"]) for x in runs if not x["named_right"] or x["false_verdicts"]] == []


def test_a_straggler_in_a_tp_dp_job_is_one_verdict(plugin, tmp_path):
    """64 ranks, TP groups of 8 inside each node, DP rings across them: a rank late into one collective holds
    back the next collective of its other communicators, and every rank held back there enters its own next
    collectives as late, in communicators the processor may not yet know to be joined (a straggler in the
    first seconds comes before the agents' cadence exports the DP rings). One late call and the healthy
    stragglers each give one verdict, not one per held-back peer (7 and 5 false verdicts before)."""
    spec = tmp_path / "tpdp64.json"
    spec.write_text(json.dumps({"slowdowns": [], "hangs": [], "topologies": ["tpdp64"], "seeds": [4],
                                "late_once_ms": [1500.0], "healthy_seeds": [14], "healthy_noises": ["stragglers"]}))
    r = _eval("--corpus", str(spec), "--json", "--jobs", "2", timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    runs = {x["fault"]: x for x in json.loads(r.stdout)["runs"]}
    assert runs["late_once"]["named_right"] and runs["late_once"]["verdicts"] == 1, runs["late_once"]
    assert runs["healthy"]["false_verdicts"] == 0, runs["healthy"]


def test_a_tp_pp_dp_job_names_the_fault_not_its_consequences(plugin, tmp_path):
    """TP x PP x DP, 16 ranks. The link between two pipeline stages slows: a stage pair transfers once per
    micro-batch, so its own history is short when the fault starts early (its siblings, the job's other
    stage pairs, judge it until then: x5 was learnt as healthy and never named), and both ends enter their
    next TP and DP collectives late, which reads as a late rank there before the transfers gather their
    evidence (x20 named the TP peer late). A rank late into its DP ring (x2 of the collective) holds back
    the GPUs before it, which block on the FIFO slots it has not freed: judged early through the siblings'
    null, the GPU before it alarmed first. Each is named right, and nothing else."""
    topo = corpus.TOPOLOGIES["tpdppp16"].spec
    scenarios = [{"name": "pp-flow-x5", "fault": "slow_flow:at=4,comm=pp,factor=5", "topology": topo, "seed": 3},
                 {"name": "pp-nic-x2", "fault": "slow_nic:at=4,comm=pp,factor=2", "topology": topo, "seed": 2},
                 {"name": "dp-late-x2", "fault": "late_rank:at=4,delay_ms=45.3454", "topology": topo,
                  "seed": 4041}]  # the corpus's late_rank x2 on tpdppp16, seed 4
    assert _wrong(tmp_path, scenarios) == []


@pytest.mark.xfail(strict=True, reason="known miss since the cadence keeps every place of the step (2026-12-06): "
                   "a DP ring's collectives at the step's second place, which the stride never kept, read a "
                   "rank's sending NIC slow (z 3.5-4.4, 4 in a row, from just before the onset), named 0.9 s after "
                   "it, before the stage pair's transfers, one per micro-batch, gather theirs (3.5 s) "
                   "(docs/algorithm.md section 8)")
def test_a_pipeline_link_20x_slower_is_named_before_anything_else(plugin, tmp_path):
    """The same job, the link between two pipeline stages 20x slower: named where it is, and nothing before."""
    topo = corpus.TOPOLOGIES["tpdppp16"].spec
    assert _wrong(tmp_path, [{"name": "pp-flow-x20", "fault": "slow_flow:at=4,comm=pp,factor=20", "topology": topo,
                              "seed": 1}]) == []


def _wrong(tmp_path, scenarios: list[dict]) -> list[tuple]:
    """(scenario, first verdict) of the scenarios whose first verdict is not the fault, or not the only one."""
    spec = tmp_path / "scenarios.json"
    spec.write_text(json.dumps({"scenarios": scenarios}))
    r = _eval("--scenarios", str(spec), "--json", timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.loads(r.stdout)["scenarios"]
    assert len(rows) == len(scenarios)
    return [(x["scenario"], x["top"]) for x in rows
            if not (x["culprit_ok"] and x["category_ok"]) or x["false_positives"] or x["verdicts"] != 1]


def test_factors_are_computed_once_per_fault_shape_and_magnitude(monkeypatch):
    calls = []

    def fake(name, target, topology, model=None, **kw):
        calls.append((name, target, topology, model.nccl.dp_algo))
        return 2.0

    monkeypatch.setattr(corpus, "factor_for_slowdown", fake)
    spec = corpus.CorpusSpec("t", slowdowns=("slow_flow",), magnitudes=(2.0,), hangs=(), topologies=("ring8", "tree8"),
                             noises=("nccl", "jittery"), seeds=(1, 2))
    todo = corpus.cases(spec)
    assert len([c for c in todo if c.fault == "slow_flow"]) == 8
    assert sorted(calls) == [("slow_flow", 2.0, corpus.TOPOLOGIES["ring8"].spec, "Ring"),
                             ("slow_flow", 2.0, corpus.TOPOLOGIES["tree8"].spec, "Tree")]
    assert len({c.scenario.name for c in todo}) == len(todo)
    assert len({(c.scenario.seed, c.topology, c.noise) for c in todo}) == len(todo)


def test_full_corpus_has_a_million_healthy_collectives(ci):
    est = corpus.estimate(corpus.SIZES["full"], ci["runs"])
    assert est["runs"] == len(corpus.cases(corpus.SIZES["full"]))
    assert est["healthy_run_collectives"] >= 1_000_000


@pytest.mark.parametrize("spec,msg", [("huge", "not a named size"), ('{"noises": ["loud"]}', "unknown noise model"),
                                      ('{"colour": 1}', "unknown keys"), ('{"magnitudes": [0.5]}', "must be > 1"),
                                      ('{"hangs": ["sigstop"]}', "not a hang that runs on virtual time")])
def test_bad_corpus_spec_is_named(tmp_path, spec, msg):
    arg = spec
    if spec.startswith("{"):
        (tmp_path / "c.json").write_text(spec)
        arg = str(tmp_path / "c.json")
    r = _eval("--corpus", arg, "--list", timeout=120)
    assert r.returncode == 2 and msg in r.stderr, r.stderr


def test_a_run_that_fails_is_reported_and_the_others_kept(monkeypatch):
    """One case raising (a full disk, a bug) must not throw away the hours the other runs took: it comes
    back as a row naming its error, the report lists it and the exit code says the corpus is incomplete."""
    spec = corpus.CorpusSpec("two", slowdowns=(), hangs=(), late_once_ms=(), healthy_seeds=(11, 12))
    todo = corpus.cases(spec)
    real = corpus.run_case

    def flaky(case, stall_ms, *args):
        if case.scenario.seed == 11:
            raise OSError(28, "No space left on device")
        return real(case, stall_ms, *args)
    monkeypatch.setattr(corpus, "run_case", flaky)
    logged: list[str] = []
    runs = corpus.run_corpus(todo, 3000, log=logged.append)
    assert [("error" in r) for r in runs] == [True, False]
    assert "No space left on device" in runs[0]["error"] and runs[1]["healthy_collectives"] > 0
    assert any("FAILED" in m and todo[0].scenario.name in m for m in logged)
    monkeypatch.setattr(corpus, "cases", lambda s, f=None: todo)
    rc, out = corpus.main_corpus("ci", 3000, 1, False, None, None, False, lambda m: None)
    assert rc == 1 and f"FAILED {todo[0].scenario.name}: OSError" in out


# --- the LLM shapes: cases and per-shape report, without running the stack ------------------------------

def _llm_cases(monkeypatch) -> tuple[list, list]:
    """The llm size's cases with calibration stubbed (factor_for_slowdown times real collectives: seconds)."""
    calls: list = []

    def fake(name, target, topology, model=None, comm="dp", **kw):
        calls.append((name, topology, comm))
        return 2.0
    monkeypatch.setattr(corpus, "factor_for_slowdown", fake)
    return corpus.cases(corpus.SIZES["llm"]), calls


def test_llm_corpus_has_every_llm_shape_with_faults_in_tp_and_dp(monkeypatch):
    from mycroft_otel.sim.topology import parse_topology

    todo, _ = _llm_cases(monkeypatch)
    shapes = {c.topology: parse_topology(corpus.TOPOLOGIES[c.topology].spec) for c in todo}
    assert set(shapes) == set(corpus.LLM_TOPOLOGIES)
    # TP 8 and 4 fill their nodes (NVLink); a tree and a pipeline stage are among them
    assert {(t.tp, t.gpus, t.dp, t.pp) for t in shapes.values()} >= {(8, 8, 2, 1), (4, 4, 4, 1), (8, 8, 8, 1),
                                                                     (4, 4, 2, 2)}
    assert any(corpus.TOPOLOGIES[t].algo == "Tree" for t in shapes)
    for topo in shapes:
        for comm in ("tp", "dp"):
            faults = {c.fault for c in todo if c.topology == topo and c.comm == comm}
            assert {"slow_gpu", "late_rank", "late_once", "rank_absent"} <= faults, (topo, comm)
        assert any(c.fault == corpus.HEALTHY for c in todo if c.topology == topo)
    assert len({c.scenario.name for c in todo}) == len(todo)


def test_tp_faults_are_named_targeted_and_calibrated_on_tp(monkeypatch):
    todo, calls = _llm_cases(monkeypatch)
    tp = [c for c in todo if c.comm == "tp"]
    assert tp and all("-tp-" in c.scenario.name and ",comm=tp" in c.scenario.fault for c in tp)
    assert "slow_gpu-x2-tp4dp4-tp-nccl-s1" in {c.scenario.name for c in tp}
    dp = [c for c in todo if c.comm == "dp" and c.fault != corpus.HEALTHY]
    assert dp and not any("comm=" in c.scenario.fault or "-dp-" in c.scenario.name for c in dp)  # names as before
    # a TP case and its DP twin draw different victims and noise
    assert not {c.scenario.seed for c in tp} & {c.scenario.seed for c in dp}
    # the magnitude is calibrated on the communicator the fault strikes
    assert ("slow_gpu", corpus.TOPOLOGIES["tp4dp4"].spec, "tp") in calls
    assert ("slow_gpu", corpus.TOPOLOGIES["tp4dp4"].spec, "dp") in calls


def test_network_faults_give_no_tp_case(monkeypatch):
    """Inside a node NCCL moves TP data over NVLink from the kernel: no NIC, proxy thread or network flow."""
    todo, _ = _llm_cases(monkeypatch)
    tp_faults = {c.fault for c in todo if c.comm == "tp"}
    assert not tp_faults & set(corpus.NETWORK_ONLY)
    assert set(corpus.NETWORK_ONLY) <= {c.fault for c in todo if c.comm == "dp"}
    assert corpus.skipped("slow_nic", "tp4dp4", "tp") == corpus.NETWORK_ONLY["slow_nic"]
    assert "no TP communicator" in corpus.skipped("slow_gpu", "ring8", "tp")
    assert corpus.skipped("slow_gpu", "tp4dp4", "tp") is None


def test_tp_faults_have_valid_ground_truth():
    """A TP-targeted fault strikes a TP collective and names a culprit inside that TP group (a short run)."""
    from mycroft_otel.sim.faults import parse_fault
    from mycroft_otel.sim.model import eval_model
    from mycroft_otel.sim.simulation import Simulation
    from mycroft_otel.sim.topology import parse_topology

    topo = parse_topology(corpus.TOPOLOGIES["tp4dp4"].spec)
    for spec in ("slow_gpu:factor=3,comm=tp", "late_rank:delay_ms=80,comm=tp", "rank_absent:comm=tp"):
        sim = Simulation(topo, eval_model().with_noise("quiet"), [parse_fault(spec)], seed=5, steps=3)
        sim.run()
        (truth,) = sim.truths()
        assert truth["comm_kind"] == "tp" and truth["comm_name"].startswith("tp"), spec
        g = truth["culprit_global_ranks"][0]
        assert truth["culprit_ranks"] == [sim.comm_of("tp", g).comm_rank(g)]
        assert truth["culprit_hosts"] == [topo.host_name(topo.host_of(g))]


def test_factor_for_slowdown_calibrates_on_the_tp_collective():
    from mycroft_otel.sim.faults import FaultError, factor_for_slowdown
    from mycroft_otel.sim.model import eval_model

    spec = corpus.TOPOLOGIES["tp8dp2"].spec
    tp = factor_for_slowdown("slow_gpu", 2.0, spec, model=eval_model(), comm="tp")
    dp = factor_for_slowdown("slow_gpu", 2.0, spec, model=eval_model(), comm="dp")
    assert tp > 1.0 and dp > 1.0 and abs(tp - dp) > 0.05  # two collectives, two answers
    # a late call's delay is mostly the CPU's run-ahead; magnitudes must still give different delays
    lates = [factor_for_slowdown("late_rank", m, spec, model=eval_model(), comm="tp") for m in (1.25, 1.5)]
    assert lates[0] < lates[1]
    with pytest.raises(FaultError):
        factor_for_slowdown("slow_nic", 1.5, spec, model=eval_model(), comm="tp")  # no NIC on NVLink
    with pytest.raises(FaultError):
        factor_for_slowdown("slow_gpu", 1.5, spec, comm="pp")


def test_a_late_rank_case_is_as_late_as_its_magnitude_under_the_runs_noise():
    """A late call first uses up the CPU's run-ahead, which differs op by op of the step and stage by stage of
    a pipeline (~53 ms before a first stage's first TP all-reduce, ~180 ms before the second stage's) and moves
    with the noise. The case pins the rank and the op of the step its calibration timed, and the delay is set
    under the run's noise: that op really runs about its magnitude slower (TP late ranks ran 0.9-1.05x before,
    their delay absorbed)."""
    import numpy as np

    from mycroft_otel.sim.faults import parse_fault
    from mycroft_otel.sim.simulation import Simulation
    from mycroft_otel.sim.topology import parse_topology

    spec = corpus.CorpusSpec("late", slowdowns=("late_rank",), magnitudes=(3.0,), hangs=(),
                             topologies=("tp4pp2dp2",), noises=("nccl",), seeds=(1,), healthy_seeds=(),
                             fault_comms=("tp",))
    (pending,) = [c for c in corpus.cases(spec) if c.fault == "late_rank"]
    assert "delay_ms" not in pending.scenario.fault  # set where the case runs: it times the job
    case = corpus.calibrated(pending, corpus.FactorCache())
    fault = parse_fault(case.scenario.fault)
    g, op = fault.params["rank"], fault.params["op"]

    def victims_op(faults: list) -> float:
        """The victim's op-th TP all-reduce of each step issued from 5 s on (the onset is at 4 s): summed time."""
        sim = Simulation(parse_topology(case.scenario.topology), case.model(), faults, seed=case.scenario.seed,
                         duration_s=9.0, predict=False)
        spans: list[float] = []

        def keep(i, res) -> None:
            if i.comm.kind == "tp" and g in i.comm.ranks and i.comm_ordinal == op and min(i.issue) >= 5e9:
                spans.append(float(np.max(res.end) - np.min(res.kstart)))
        sim.run(keep)
        assert len(spans) >= 5
        return sum(spans)

    ratio = victims_op([fault]) / victims_op([])
    assert 2.0 <= ratio <= 4.5, (case.scenario.fault, ratio)


def test_llm_final_keeps_its_seeds_apart_from_development():
    dev, final = corpus.SIZES["llm"], corpus.SIZES["llm-final"]
    assert not set(dev.seeds) & set(final.seeds) and not set(dev.healthy_seeds) & set(final.healthy_seeds)
    assert (dev.topologies, dev.fault_comms, dev.magnitudes) == (final.topologies, final.fault_comms,
                                                                 final.magnitudes)
    with pytest.raises(ValueError, match="fault_comms"):
        replace(dev, fault_comms=("pp",)).validate()


def _row(topo: str, fault: str, comm: str = "dp", m: float | None = 2.0, right: bool = True, false: int = 0,
         coll: int = 100, param: float | None = None) -> dict:
    return {"scenario": f"{fault}-{topo}-{comm}-{m}", "fault": fault, "topology": topo, "comm": comm,
            "noise": "nccl", "magnitude": m, "param": param, "named_right": right, "detected": right,
            "culprit_ok": right, "category_ok": right, "slowdown": m, "right_latency_collectives": 3 if right else None,
            "false_verdicts": false, "excused_verdicts": 0, "healthy_collectives": coll,
            "collectives": coll if fault == corpus.HEALTHY else coll * 2, "sim_s": 1.0, "wall_s": 1.0, "events": 1}


def test_report_gives_the_headline_per_shape_and_communicator():
    rows = [_row("tp4dp4", "slow_gpu", "tp", 1.25, right=False), _row("tp4dp4", "slow_gpu", "tp", 1.5),
            _row("tp4dp4", "slow_flow", "dp", 1.5), _row("tp4dp4", "rank_absent", "tp", None),
            _row("tp4dp4", corpus.HEALTHY, m=None, false=1, coll=1000),
            _row("ring8", "slow_flow", "dp", 1.25), _row("ring8", "rank_absent", "dp", None, right=False),
            _row("ring8", "late_once", "dp", None, param=1500.0),
            _row("ring8", corpus.HEALTHY, m=None, coll=4000)]
    rep = corpus.report(rows)
    tp4 = rep["per_shape"]["tp4dp4"]
    assert (tp4["named_right_ge_1.25x"], tp4["runs_ge_1.25x"]) == (0.667, 3)
    assert (tp4["named_right_ge_1.5x"], tp4["runs_ge_1.5x"]) == (1.0, 2)
    assert tp4["hangs_named_right"] == 1.0 and tp4["late_once_ge_1s_named_right"] is None
    assert tp4["false_verdicts"] == 1 and tp4["healthy_collectives"] == 1400
    assert tp4["false_per_1e6_healthy_collectives"] == round(1e6 / 1400, 1)
    assert tp4["by_comm"]["tp"]["named_right_ge_1.25x"] == 0.5 and tp4["by_comm"]["dp"]["named_right_ge_1.25x"] == 1.0
    ring = rep["per_shape"]["ring8"]
    assert set(ring["by_comm"]) == {"dp"} and ring["hangs_named_right"] == 0.0
    assert ring["late_once_ge_1s_named_right"] == 1.0 and ring["false_per_1e6_healthy_collectives"] == 0.0
    # every shape counts: the corpus's figure is its worst shape's
    worst = rep["every_shape"]
    assert worst["named_right_ge_1.25x"] == {"value": 0.667, "shape": "tp4dp4"}
    assert worst["hangs_named_right"] == {"value": 0.0, "shape": "ring8"}
    assert worst["false_per_1e6_healthy_collectives"]["shape"] == "tp4dp4"
    # a TP fault draws its own line of the curve
    assert set(rep["curve"]) == {"slow_gpu (tp)", "slow_flow"}
    out = corpus.text(rep, "t")
    assert "per shape" in out and "tp4dp4" in out and "worst shape" in out


def test_report_reads_rows_written_before_faults_could_target_tp():
    rows = [{k: v for k, v in _row("tpdp8", "slow_flow", m=3.0).items() if k != "comm"}]
    rep = corpus.report(rows)
    assert set(rep["per_shape"]["tpdp8"]["by_comm"]) == {"dp"} and set(rep["curve"]) == {"slow_flow"}
