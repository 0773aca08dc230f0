"""The accuracy corpus: ``mycroft-otel eval --virtual --corpus [ci|small|full|FILE.json]``.

A corpus is the cross product of slowdown faults x magnitudes ("the faulty collective takes this many
times its own time", converted into each fault's parameter by ``sim.faults.factor_for_slowdown``) x
topologies (ring, tree, TP/DP/PP with p2p) x noise models x seeds, plus the catalogue's hangs and healthy
runs. Every case runs on virtual time (evaluate/virtual.py: the real plugin, agent and processor, one
process, deterministic for its seed), scenarios spread over a process pool of ``--jobs`` workers.

The report (``report``) says, against the simulator's ground truth:

* the detection curve: per slowdown fault and magnitude, the share of runs whose first verdict after the
  onset names the true culprit with the true category ("named right"), and the share with any verdict;
* culprit and category accuracy of the first verdict, per fault;
* false verdicts per 10^6 healthy collectives: verdicts on healthy runs, verdicts before the onset of a
  fault run, and verdicts after it naming a rank that is not the culprit, over every collective (and p2p
  group) the healthy runs issued plus those the fault runs issued before their onset. A ``late_rank``
  verdict naming a rank the ``stragglers`` noise really delayed (``Simulation.noise_events``) is excused;
* collectives of the faulty communicator from the onset to the first right verdict (median, p90).

``curve_svg`` draws the curve (named-right rate against magnitude, one line per fault) as an SVG.
"""

from __future__ import annotations

import json
import math
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Callable

from mycroft_otel import semconv
from mycroft_otel.evaluate import virtual
from mycroft_otel.evaluate.harness import culprit_matches
from mycroft_otel.evaluate.scenarios import Scenario
from mycroft_otel.sim.faults import CATALOGUE, SLOWDOWN_PARAM, FaultError, factor_for_slowdown
from mycroft_otel.sim.model import NOISE_MODELS, TimingModel, eval_model


@dataclass(frozen=True)
class CorpusTopology:
    """A job shape of the corpus: the sim topology and the DP all-reduce algorithm (NCCL_ALGO)."""

    spec: str
    algo: str = "Ring"


#: name -> job shape. TP groups ride NVLink inside a node, DP rings/trees cross the network, PP stages
#: exchange p2p send/recv; faults target the DP communicator (the catalogue's default).
TOPOLOGIES: dict[str, CorpusTopology] = {
    "ring8": CorpusTopology("nodes=8,gpus=1,tp=1,dp=8"),
    "tree8": CorpusTopology("nodes=8,gpus=1,tp=1,dp=8", "Tree"),
    "tpdp8": CorpusTopology("nodes=4,gpus=2,tp=2,dp=4"),
    "ring16": CorpusTopology("nodes=16,gpus=1,tp=1,dp=16"),
    "tpdppp16": CorpusTopology("nodes=8,gpus=2,tp=2,pp=2,dp=4"),
    "tpdp64": CorpusTopology("nodes=8,gpus=8,tp=8,dp=8"),
}

#: the slowdown faults of the sweep (every one in SLOWDOWN_PARAM) and the hangs (the catalogue's hangs
#: that need no real process)
SLOWDOWNS: tuple[str, ...] = ("slow_flow", "slow_nic", "congestion", "slow_gpu", "slow_proxy", "late_rank",
                              "late_once")
HANGS: tuple[str, ...] = ("rank_absent", "gpu_stalled", "nic_down", "flow_stall", "coll_mismatch")
HEALTHY = "healthy"
MAGNITUDES: tuple[float, ...] = (1.1, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0)

# When faults strike and how long a run lasts, in simulated seconds: the eval's (scenarios.builtin): ~13
# training steps of baseline before a slowdown, ~25 slow ones after; hangs run past the stall threshold.
SLOW_AT_S = 4.0
SLOW_DURATION_S = 12.0
HANG_AT_S = 3.0
HEALTHY_DURATION_S = 12.0


@dataclass(frozen=True)
class CorpusSpec:
    """What a corpus holds: the slowdown sweep, hangs and healthy runs over topologies, noises and seeds."""

    name: str
    slowdowns: tuple[str, ...] = SLOWDOWNS
    magnitudes: tuple[float, ...] = MAGNITUDES
    hangs: tuple[str, ...] = HANGS
    topologies: tuple[str, ...] = ("tpdp8",)
    noises: tuple[str, ...] = ("nccl",)
    seeds: tuple[int, ...] = (1,)
    healthy_seeds: tuple[int, ...] = (11,)
    healthy_topologies: tuple[str, ...] = ()   # default: the same as topologies
    healthy_noises: tuple[str, ...] = ()       # default: the same as noises
    # one-off late calls of a fixed lateness besides the sweep: Mycroft's straggler bar is everybody waiting
    # >= 1 s, which the sweep's "x of the collective's time" does not reach on short collectives
    late_once_ms: tuple[float, ...] = (1000.0, 1500.0, 3000.0)

    def validate(self) -> None:
        for t in self.topologies + self.healthy_topologies:
            if t not in TOPOLOGIES:
                raise ValueError(f"corpus {self.name}: unknown topology {t!r}; known: {', '.join(TOPOLOGIES)}")
        for n in self.noises + self.healthy_noises:
            if n not in NOISE_MODELS:
                raise ValueError(f"corpus {self.name}: unknown noise model {n!r}; known: {', '.join(NOISE_MODELS)}")
        for f in self.slowdowns:
            if f not in SLOWDOWN_PARAM:
                raise ValueError(f"corpus {self.name}: {f!r} is not a slowdown fault; known: "
                                 f"{', '.join(SLOWDOWN_PARAM)}")
        for f in self.hangs:
            if CATALOGUE.get(f, ("", ""))[1] != "hang" or CATALOGUE[f][3]:
                raise ValueError(f"corpus {self.name}: {f!r} is not a hang that runs on virtual time; known: "
                                 f"{', '.join(HANGS)}")
        for ms in self.late_once_ms:
            if not ms > 0:
                raise ValueError(f"corpus {self.name}: late_once_ms {ms} must be > 0")
        for m in self.magnitudes:
            if not m > 1.0:
                raise ValueError(f"corpus {self.name}: magnitude {m} must be > 1 (x of the collective's time)")


#: named sizes. ``ci``: a handful of deterministic 8-rank scenarios (tests/evaluate/test_corpus.py);
#: ``small``: the baseline curve (every fault at every magnitude on three 8-rank shapes); ``full``: the
#: issue's corpus (every shape, every noise model, 3 seeds, healthy runs for >= 10^6 healthy collectives).
SIZES: dict[str, CorpusSpec] = {
    "ci": CorpusSpec("ci", slowdowns=("slow_flow", "slow_nic", "congestion", "slow_gpu", "late_rank"),
                     magnitudes=(3.0, 10.0), hangs=HANGS, topologies=("tpdp8",), noises=("nccl",), seeds=(1,),
                     healthy_seeds=(11, 12), healthy_noises=("nccl", "jittery")),
    "small": CorpusSpec("small", topologies=("tpdp8", "ring8", "tree8"), noises=("nccl",), seeds=(1,),
                        healthy_seeds=(11,), healthy_topologies=("tpdp8", "ring8", "tree8", "tpdppp16"),
                        healthy_noises=("nccl", "jittery", "stragglers", "warmup", "mixed", "bubbles")),
    "full": CorpusSpec("full", topologies=tuple(TOPOLOGIES), noises=tuple(NOISE_MODELS), seeds=(1, 2, 3),
                       healthy_seeds=tuple(range(11, 41))),
}


def load_spec(spec: str) -> CorpusSpec:
    """A named size, or a JSON file with CorpusSpec's fields (lists for the tuples)."""
    if spec in SIZES:
        return SIZES[spec]
    path = Path(spec)
    if not path.suffix == ".json" or not path.exists():
        raise ValueError(f"corpus {spec!r}: not a named size ({', '.join(SIZES)}) nor a .json file")
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{spec}: a corpus file is one JSON object with CorpusSpec's fields")
    known = {f.name for f in fields(CorpusSpec)}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"{spec}: unknown keys {sorted(unknown)} (known: {', '.join(sorted(known))})")
    data.setdefault("name", path.stem)
    out = CorpusSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})
    out.validate()
    return out


@dataclass(frozen=True)
class Case:
    """One run of the corpus: a scenario plus the job shape, noise and the magnitude it stands for."""

    scenario: Scenario
    fault: str                 # catalogue name (``healthy`` for healthy runs)
    topology: str              # TOPOLOGIES key
    noise: str
    magnitude: float | None    # x of the collective's time (slowdowns), None for hangs and healthy runs
    param: float | None = None  # the fault parameter that magnitude took (SLOWDOWN_PARAM[fault])

    def model(self) -> TimingModel:
        return eval_model().with_nccl(dp_algo=TOPOLOGIES[self.topology].algo).with_noise(self.noise)


class FactorCache:
    """factor_for_slowdown per (fault, topology, magnitude): it times the collective without noise, so one
    value serves every noise model and seed of a shape (the noise then varies around it, as on a real job)."""

    def __init__(self) -> None:
        self._values: dict[tuple[str, str, float], float | None] = {}
        self.unreachable: list[str] = []  # "fault xM on topology: why", for the report

    def get(self, fault: str, topology: str, magnitude: float) -> float | None:
        """The parameter, or None where the fault cannot slow that shape's collective so much."""
        key = (fault, topology, magnitude)
        if key not in self._values:
            t = TOPOLOGIES[topology]
            model = eval_model().with_nccl(dp_algo=t.algo)
            try:
                self._values[key] = factor_for_slowdown(fault, magnitude, t.spec, model=model)
            except FaultError as exc:
                self._values[key] = None
                self.unreachable.append(f"{fault} x{magnitude:g} on {topology}: {exc}")
        return self._values[key]


def _slow_spec(fault: str, param: float) -> str:
    extra = ",p=1" if fault == "slow_proxy" else ""  # every collective after the onset: a sustained fault
    return f"{fault}:at={SLOW_AT_S:g},{SLOWDOWN_PARAM[fault]}={param:.6g}{extra}"


def _job_seed(seed: int, fault_index: int, magnitude_index: int) -> int:
    """Each case its own job seed (hence its own victim rank, channel and noise draws), fixed by the case's
    place in the corpus: a curve over one victim and one noise draw would measure that draw."""
    return seed * 1000 + fault_index * 10 + magnitude_index


def cases(spec: CorpusSpec, factors: FactorCache | None = None) -> list[Case]:
    """Every run of ``spec``, in a fixed order (names unique)."""
    spec.validate()
    factors = factors or FactorCache()
    out: list[Case] = []
    for topo in spec.topologies:
        spec_t = TOPOLOGIES[topo].spec
        for noise in spec.noises:
            for seed in spec.seeds:
                for fi, fault in enumerate(spec.slowdowns):
                    for mi, m in enumerate(spec.magnitudes):
                        param = factors.get(fault, topo, m)
                        if param is None:
                            continue
                        sc = Scenario(f"{fault}-x{m:g}-{topo}-{noise}-s{seed}", _slow_spec(fault, param),
                                      topology=spec_t, seed=_job_seed(seed, fi, mi), duration_s=SLOW_DURATION_S)
                        out.append(Case(sc, fault, topo, noise, m, param))
                for di, ms in enumerate(spec.late_once_ms):
                    sc = Scenario(f"late_once-{ms:g}ms-{topo}-{noise}-s{seed}",
                                  f"late_once:at={SLOW_AT_S:g},delay_ms={ms:g}", topology=spec_t,
                                  seed=_job_seed(seed, 40, di), duration_s=SLOW_DURATION_S)
                    out.append(Case(sc, "late_once", topo, noise, None, ms))
                for fi, fault in enumerate(spec.hangs):
                    sc = Scenario(f"{fault}-{topo}-{noise}-s{seed}", f"{fault}:at={HANG_AT_S:g}", topology=spec_t,
                                  seed=_job_seed(seed, 50 + fi, 0),
                                  duration_s=0.0)  # run_case sets it from the stall threshold
                    out.append(Case(sc, fault, topo, noise, None))
    for topo in spec.healthy_topologies or spec.topologies:
        for noise in spec.healthy_noises or spec.noises:
            for seed in spec.healthy_seeds:
                sc = Scenario(f"healthy-{topo}-{noise}-s{seed}", HEALTHY, topology=TOPOLOGIES[topo].spec,
                              seed=seed, duration_s=HEALTHY_DURATION_S)
                out.append(Case(sc, HEALTHY, topo, noise, None))
    return out


# --- running ---------------------------------------------------------------------------------------

def _excused(v, noise_events: list[dict]) -> bool:
    """A late_rank verdict naming a rank that a healthy straggler really delayed is right, not false."""
    if v.category != "late_rank":
        return False
    g = list(v.attrs.get(semconv.RCA_CULPRIT_GLOBAL_RANKS) or [])
    return bool(g) and int(g[0]) in {int(e["rank"]) for e in noise_events}


def run_case(case: Case, stall_ms: int, plugin: str | None = None) -> dict:
    """Run one case on virtual time and score it: a compact row (JSON-able)."""
    sc = case.scenario
    if case.fault in HANGS:
        sc = replace(sc, duration_s=HANG_AT_S + stall_ms / 1000 + 5.0)
    o = virtual.run_scenario(sc, stall_ms, plugin=plugin, model=case.model())
    r = virtual.score(o)
    truth = o.truth or {}
    healthy = case.fault == HEALTHY
    onset = truth.get("onset_ns") or 0
    false_v, excused = 0, 0
    for v in o.verdicts:
        if not healthy and v.received_ns >= onset and culprit_matches(v, truth):
            continue
        if _excused(v, o.noise_events):
            excused += 1
        else:
            false_v += 1
    right = [v for v in o.verdicts if not healthy and v.received_ns >= onset and culprit_matches(v, truth)
             and v.category == truth.get("category")]
    return {
        "scenario": sc.name, "fault": case.fault, "spec": sc.fault, "topology": case.topology, "noise": case.noise,
        "seed": sc.seed, "magnitude": case.magnitude, "param": case.param, "world": o.world,
        "slowdown": o.slowdown,
        "category": truth.get("category", ""),
        "detected": r["detected"], "named_right": bool(r["detected"] and r["culprit_ok"] and r["category_ok"]),
        "culprit_ok": r["culprit_ok"], "category_ok": r["category_ok"], "any_right": r.get("any_right"),
        "top": r["top"], "verdicts": len(o.verdicts),
        "false_verdicts": false_v, "excused_verdicts": excused,
        "latency_s": r["latency_s"],
        "right_latency_collectives": o.collectives.get(right[0].trace_id) if right else None,
        "collectives": o.n_collectives, "healthy_collectives": o.collectives_before_onset,
        "sim_s": r["sim_s"], "wall_s": round(o.wall_s, 2), "events": o.events,
    }


def _run_indexed(args: tuple) -> tuple[int, dict]:
    """One case; a case that raises becomes a row naming the error (the others' results are kept)."""
    i, case, stall_ms, plugin = args
    try:
        return i, run_case(case, stall_ms, plugin)
    except Exception as exc:  # noqa: BLE001 -- any failure of one run is reported with its case, not fatal
        return i, {"scenario": case.scenario.name, "fault": case.fault, "topology": case.topology,
                   "noise": case.noise, "seed": case.scenario.seed, "error": f"{type(exc).__name__}: {exc}"}


def run_corpus(todo: list[Case], stall_ms: int, jobs: int = 1, plugin: str | None = None,
               log: Callable[[str], None] = lambda m: None) -> list[dict]:
    """Rows in ``todo``'s order. ``jobs`` > 1: a process pool (one plugin per process: the virtual clock
    belongs to one ABI driver per process, so cases never share a process concurrently)."""
    rows: list[dict | None] = [None] * len(todo)

    def done(i: int, row: dict) -> None:
        rows[i] = row
        n = sum(r is not None for r in rows)
        if "error" in row:
            log(f"[{n}/{len(todo)}] {row['scenario']}: FAILED: {row['error']}")
            return
        log(f"[{n}/{len(todo)}] {row['scenario']}: {row['top'] or 'no verdict'}"
            f"{' (named right)' if row['named_right'] else ''}"
            f"{' false verdicts: ' + str(row['false_verdicts']) if row['false_verdicts'] else ''}"
            f" [{row['sim_s']} s simulated in {row['wall_s']} s]")

    work = [(i, c, stall_ms, plugin) for i, c in enumerate(todo)]
    if jobs <= 1:
        for w in work:
            done(*_run_indexed(w))
    else:
        import multiprocessing

        # spawn: the parent may hold threads (a fork would copy their locks mid-use)
        with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            for i, row in pool.map(_run_indexed, work, chunksize=1):
                done(i, row)
    return [r for r in rows if r is not None]


# --- the report ------------------------------------------------------------------------------------

def _pct(values: list, q: float):
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))] if v else None


def _rate(rows: list[dict], key: str) -> float | None:
    return round(sum(bool(r[key]) for r in rows) / len(rows), 3) if rows else None


def report(rows: list[dict]) -> dict:
    faulty = [r for r in rows if r["fault"] != HEALTHY]
    healthy = [r for r in rows if r["fault"] == HEALTHY]
    faults = list(dict.fromkeys(r["fault"] for r in faulty))
    curve: dict[str, dict[str, dict]] = {}
    for f in faults:
        if f not in SLOWDOWN_PARAM:
            continue
        mags = sorted({r["magnitude"] for r in faulty if r["fault"] == f and r["magnitude"] is not None})
        if not mags:
            continue
        by_m: dict[str, dict] = {}
        for m in mags:
            rs = [r for r in faulty if r["fault"] == f and r["magnitude"] == m]
            measured = [r["slowdown"] for r in rs if r.get("slowdown") is not None]
            by_m[f"{m:g}"] = {"runs": len(rs), "named_right": _rate(rs, "named_right"),
                              "detected": _rate(rs, "detected"), "measured_slowdown": _pct(measured, 0.5)}
        curve[f] = by_m
    per_fault = {}
    for f in faults:
        rs = [r for r in faulty if r["fault"] == f]
        det = [r for r in rs if r["detected"]]
        lat = [r["right_latency_collectives"] for r in rs if r["right_latency_collectives"] is not None]
        per_fault[f] = {"runs": len(rs), "detected": _rate(rs, "detected"), "named_right": _rate(rs, "named_right"),
                        "culprit_accuracy": _rate(det, "culprit_ok"), "category_accuracy": _rate(det, "category_ok"),
                        "latency_collectives_median": _pct(lat, 0.5), "latency_collectives_p90": _pct(lat, 0.9)}
    healthy_coll = sum(r["healthy_collectives"] for r in rows)
    healthy_run_coll = sum(r["collectives"] for r in healthy)
    fv_healthy = sum(r["false_verdicts"] for r in healthy)
    fv_all = sum(r["false_verdicts"] for r in rows)
    lat_all = [r["right_latency_collectives"] for r in faulty if r["right_latency_collectives"] is not None]
    sustained = [r for r in faulty if r["fault"] in SLOWDOWN_PARAM and r["fault"] != "late_once"
                 and r["magnitude"] is not None]

    def per_m(rs: list[dict], lo: float) -> float | None:
        return _rate([r for r in rs if r["magnitude"] >= lo], "named_right")

    def per_measured(lo: float) -> dict:  # by how much slower the collectives really ran (the noise included)
        rs = [r for r in sustained if (r.get("slowdown") or 0.0) >= lo]
        return {"runs": len(rs), "named_right": _rate(rs, "named_right")}

    return {
        "runs": len(rows), "fault_runs": len(faulty), "healthy_runs": len(healthy),
        "hangs_named_right": _rate([r for r in faulty if r["fault"] in HANGS], "named_right"),
        # a one-off late call everybody waits >= 1 s for (Mycroft's straggler bar): the fixed late_once_ms cases
        "late_once_ge_1s_named_right": _rate([r for r in faulty if r["fault"] == "late_once" and r["magnitude"] is None
                                              and (r["param"] or 0) >= 1000.0], "named_right"),
        "sustained_named_right_ge_1_5x": per_m(sustained, 1.5),
        "sustained_named_right_ge_1_25x": per_m(sustained, 1.25),
        "sustained_named_right_ge_3x": per_m(sustained, 3.0),
        "sustained_by_measured_slowdown": {f"{lo:g}": per_measured(lo) for lo in (1.1, 1.25, 1.5, 3.0)},
        "culprit_accuracy": _rate([r for r in faulty if r["detected"]], "culprit_ok"),
        "category_accuracy": _rate([r for r in faulty if r["detected"]], "category_ok"),
        "latency_collectives_median": _pct(lat_all, 0.5), "latency_collectives_p90": _pct(lat_all, 0.9),
        "healthy_collectives": healthy_coll, "healthy_run_collectives": healthy_run_coll,
        "false_verdicts": fv_all, "false_verdicts_on_healthy_runs": fv_healthy,
        "false_verdicts_before_onset_or_wrong_culprit": fv_all - fv_healthy,
        "excused_straggler_verdicts": sum(r["excused_verdicts"] for r in rows),
        "false_per_1e6_healthy_collectives": round(fv_all * 1e6 / healthy_coll, 1) if healthy_coll else None,
        "false_per_1e6_healthy_run_collectives": (round(fv_healthy * 1e6 / healthy_run_coll, 1)
                                                  if healthy_run_coll else None),
        "false_by_noise": {n: sum(r["false_verdicts"] for r in rows if r["noise"] == n)
                           for n in dict.fromkeys(r["noise"] for r in rows)},
        "sim_s": round(sum(r["sim_s"] for r in rows), 1), "wall_s": round(sum(r["wall_s"] for r in rows), 1),
        "events": sum(r["events"] for r in rows),
        "curve": curve, "per_fault": per_fault,
    }


def text(rep: dict, spec_name: str) -> str:
    mags = sorted({float(m) for c in rep["curve"].values() for m in c}, key=float)
    lines = [f"corpus {spec_name}: {rep['runs']} runs ({rep['fault_runs']} with a fault, "
             f"{rep['healthy_runs']} healthy), "
             f"{rep['sim_s']} s simulated in {rep['wall_s']} s of wall time (summed over runs)",
             "", "named right (first verdict after the onset: true culprit and category) / any verdict, "
             "by magnitude (x of the collective's time):"]
    head = ["fault"] + [f"{m:g}x" for m in mags]
    table = [head]
    for f, by_m in rep["curve"].items():
        row = [f]
        for m in mags:
            c = by_m.get(f"{m:g}")
            row.append("" if c is None else f"{c['named_right']:.0%}/{c['detected']:.0%} (n={c['runs']})")
        table.append(row)
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    lines += ["  " + "  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in table]
    lines += ["", "how much slower the faulty communicator's collectives really ran (median over the runs of "
              "after / before the onset; the magnitude sets the fault without noise):"]
    table = [head]
    for f, by_m in rep["curve"].items():
        cells = [(by_m.get(f"{m:g}") or {}).get("measured_slowdown") for m in mags]
        table.append([f] + ["" if c is None else f"{c:.2f}x" for c in cells])
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    lines += ["  " + "  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in table]
    lines += ["", "per fault: runs, named right, detected, culprit / category accuracy of the first verdict, "
              "collectives from onset to the first right verdict (median, p90):"]
    for f, p in rep["per_fault"].items():
        fmt = lambda x: "-" if x is None else (f"{x:.0%}" if isinstance(x, float) else str(x))  # noqa: E731
        lines.append(f"  {f:14s} {p['runs']:4d}  named right {fmt(p['named_right']):>4s}  detected "
                     f"{fmt(p['detected']):>4s}  culprit {fmt(p['culprit_accuracy']):>4s}  category "
                     f"{fmt(p['category_accuracy']):>4s}  latency {p['latency_collectives_median']} / "
                     f"{p['latency_collectives_p90']} collectives")
    lines += ["",
              f"hangs named right: {rep['hangs_named_right']}; one-off late call >= 1 s named right: "
              f"{rep['late_once_ge_1s_named_right']}; sustained slowdowns named right at >= 1.25x: "
              f"{rep['sustained_named_right_ge_1_25x']}, >= 1.5x: {rep['sustained_named_right_ge_1_5x']}, >= 3x: "
              f"{rep['sustained_named_right_ge_3x']}",
              "  by how much slower the faulty collectives really ran: " + ", ".join(
                  f">= {lo}x: {c['named_right']} of {c['runs']}"
                  for lo, c in rep["sustained_by_measured_slowdown"].items()),
              f"onset to right verdict: median {rep['latency_collectives_median']}, p90 "
              f"{rep['latency_collectives_p90']} collectives of the faulty communicator",
              f"false verdicts: {rep['false_verdicts']} ({rep['false_verdicts_on_healthy_runs']} on healthy runs, "
              f"{rep['false_verdicts_before_onset_or_wrong_culprit']} before the onset or naming a non-culprit; "
              f"{rep['excused_straggler_verdicts']} naming a real straggler excused) over "
              f"{rep['healthy_collectives']} healthy collectives: {rep['false_per_1e6_healthy_collectives']} per "
              f"10^6 (healthy runs alone: {rep['false_per_1e6_healthy_run_collectives']} per 10^6 of "
              f"{rep['healthy_run_collectives']}); by noise {rep['false_by_noise']}"]
    return "\n".join(lines)


def estimate(spec: CorpusSpec, measured: list[dict], stall_ms: int = 3000) -> dict:
    """Wall time of ``spec`` on one core from measured rows (another corpus's ``--json`` runs): wall seconds
    per simulated second of the nearest measured (healthy or not, world size), scaled linearly in world size
    beyond it (the agent's polls of every ring dominate big jobs); healthy collectives from the measured
    healthy runs' collectives per simulated second and communicator, times the shape's communicators."""
    wall: dict[tuple[bool, int], list[float]] = {}
    coll: dict[int, list[float]] = {}
    for r in measured:
        if r["sim_s"]:
            wall.setdefault((r["fault"] == HEALTHY, r["world"]), []).append(r["wall_s"] / r["sim_s"])
            if r["fault"] == HEALTHY:
                coll.setdefault(r["world"], []).append(r["collectives"] / r["sim_s"] / _n_comms(r["topology"]))
    if not wall:
        raise ValueError("no measured runs to extrapolate from")

    def mean(xs: list[float]) -> float:
        return sum(xs) / len(xs)

    todo = cases(spec)
    total_s, healthy_coll = 0.0, 0.0
    for c in todo:
        world = _world(TOPOLOGIES[c.topology].spec)
        healthy = c.fault == HEALTHY
        sim_s = (c.scenario.duration_s or HANG_AT_S + stall_ms / 1000 + 5.0) + virtual.GRACE_S
        keys = [k for k in wall if k[0] == healthy] or list(wall)
        near = min(keys, key=lambda k: abs(k[1] - world))
        total_s += mean(wall[near]) * sim_s * max(1.0, world / near[1])
        if healthy and coll:
            wn = min(coll, key=lambda w: abs(w - world))
            healthy_coll += mean(coll[wn]) * sim_s * _n_comms(c.topology)
    return {"runs": len(todo), "wall_s_one_core": round(total_s), "healthy_run_collectives": int(healthy_coll)}


def _world(spec: str) -> int:
    from mycroft_otel.sim.topology import parse_topology

    return parse_topology(spec).world


def _n_comms(topology: str) -> int:
    """Communicators of a corpus shape (TP, DP and PP groups): each issues its own collectives."""
    from mycroft_otel.sim.topology import build_comms, parse_topology

    return sum(len(v) for v in build_comms(parse_topology(TOPOLOGIES[topology].spec)).values())


# --- the picture -----------------------------------------------------------------------------------

_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")


def curve_svg(rep: dict, title: str, key: str = "named_right") -> str:
    """The detection curve as a standalone SVG: x = magnitude (log scale), y = rate, one line per fault."""
    w, h, left, right, top, bottom = 640, 400, 60, 150, 40, 50
    pw, ph = w - left - right, h - top - bottom
    mags = sorted({float(m) for c in rep["curve"].values() for m in c})
    lo, hi = (math.log(min(mags)), math.log(max(mags))) if mags else (0.0, 1.0)
    span = (hi - lo) or 1.0

    def x(m: float) -> float:
        return left + (math.log(m) - lo) / span * pw

    def y(v: float) -> float:
        return top + (1.0 - v) * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
           'font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{left + pw / 2}" y="22" text-anchor="middle" font-size="14">{_esc(title)}</text>']
    for v in (0.0, 0.25, 0.5, 0.75, 1.0):
        out.append(f'<line x1="{left}" y1="{y(v):.1f}" x2="{left + pw}" y2="{y(v):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.0%}</text>')
    for m in mags:
        out.append(f'<line x1="{x(m):.1f}" y1="{top}" x2="{x(m):.1f}" y2="{top + ph}" stroke="#eee"/>')
        out.append(f'<text x="{x(m):.1f}" y="{top + ph + 16}" text-anchor="middle" font-size="10">{m:g}x</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>')
    out.append(f'<text x="{left + pw / 2}" y="{h - 10}" text-anchor="middle">slowdown of the faulty collective '
               '(x of its own time)</text>')
    out.append(f'<text x="16" y="{top + ph / 2}" text-anchor="middle" transform="rotate(-90 16 {top + ph / 2})">'
               f'{"named right" if key == "named_right" else "detected"}</text>')
    for i, (f, by_m) in enumerate(rep["curve"].items()):
        c = _COLOURS[i % len(_COLOURS)]
        pts = [(float(m), v[key]) for m, v in by_m.items() if v[key] is not None]
        pts.sort()
        if pts:
            d = " ".join(f"{x(m):.1f},{y(v):.1f}" for m, v in pts)
            out.append(f'<polyline points="{d}" fill="none" stroke="{c}" stroke-width="2"/>')
            out += [f'<circle cx="{x(m):.1f}" cy="{y(v):.1f}" r="3" fill="{c}"/>' for m, v in pts]
        ly = top + 10 + i * 18
        out.append(f'<line x1="{left + pw + 12}" y1="{ly}" x2="{left + pw + 32}" y2="{ly}" stroke="{c}" '
                   'stroke-width="2"/>')
        out.append(f'<text x="{left + pw + 36}" y="{ly + 4}">{_esc(f)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _esc(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def main_corpus(spec_name: str, stall_ms: int, jobs: int, as_json: bool, plot: str | None,
                estimate_from: list[str] | None, list_only: bool, log: Callable[[str], None]) -> tuple[int, str]:
    """The CLI's body (cli.py parses): returns (exit code, what to print on stdout)."""
    spec = load_spec(spec_name)
    if estimate_from:
        rows = []
        for path in estimate_from:
            data = json.loads(Path(path).read_text())
            if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
                raise ValueError(f"{path}: not the --json output of eval --corpus (no 'runs' list)")
            rows += [r for r in data["runs"] if "error" not in r]  # a run that failed timed nothing
        est = estimate(spec, rows, stall_ms)
        return 0, json.dumps(dict(est, corpus=spec.name), indent=2) if as_json else (
            f"corpus {spec.name}: {est['runs']} runs, about {est['wall_s_one_core']} s "
            f"({est['wall_s_one_core'] / 3600:.1f} h) on one core (divide by --jobs), "
            f"about {est['healthy_run_collectives']} collectives on its healthy runs")
    t0 = time.monotonic()
    factors = FactorCache()
    todo = cases(spec, factors)
    for u in factors.unreachable:
        log(f"left out: {u}")
    if list_only:
        return 0, "\n".join(f"{c.scenario.name:48s} {c.scenario.fault}" for c in todo)
    log(f"corpus {spec.name}: {len(todo)} runs, --jobs {jobs}")
    runs = run_corpus(todo, stall_ms, jobs=jobs, log=log)
    rows = [r for r in runs if "error" not in r]
    rep = report(rows)
    rep["failed_runs"] = {r["scenario"]: r["error"] for r in runs if "error" in r}
    rep["elapsed_s"] = round(time.monotonic() - t0, 1)
    rep["jobs"] = jobs
    if plot:
        Path(plot).write_text(curve_svg(rep, f"mycroft-otel detection curve (corpus {spec.name}, "
                                             f"{rep['fault_runs']} fault runs)"))
        log(f"detection curve written to {plot}")
    rc = 1 if rep["failed_runs"] else 0  # a corpus with a run that failed measured less than it says
    if as_json:
        return rc, json.dumps({"corpus": asdict(spec), "report": rep, "runs": runs}, indent=2, default=str)
    failed = "".join(f"\nFAILED {name}: {why}" for name, why in rep["failed_runs"].items())
    return rc, text(rep, spec.name) + failed + f"\nelapsed {rep['elapsed_s']} s with --jobs {jobs} (load average " \
                                     f"{os.getloadavg()[0]:.1f})"


