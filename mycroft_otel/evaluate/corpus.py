"""The accuracy corpus: ``mycroft-otel eval --virtual --corpus [ci|small|full|llm|llm-final|FILE.json]``.

A corpus is the cross product of slowdown faults x magnitudes ("the faulty collective takes this many
times its own time", converted into each fault's parameter by ``sim.faults.factor_for_slowdown``) x
topologies (ring, tree, TP/DP/PP with p2p, the LLM training shapes) x the communicators faults target
(DP, and TP where the fault means something inside a node) x noise models x seeds, plus the catalogue's
hangs and healthy runs. Every case runs on virtual time (evaluate/virtual.py: the real plugin, agent and
processor, one process, deterministic for its seed), scenarios spread over a process pool of ``--jobs``
workers. What the report says about the rows: evaluate/corpus_report.py.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Callable

import numpy as np

from mycroft_otel import semconv
from mycroft_otel.evaluate import virtual
from mycroft_otel.evaluate.corpus_report import HEALTHY, curve_svg, report, text
from mycroft_otel.evaluate.harness import culprit_matches
from mycroft_otel.evaluate.routing import BY_JOB, Routing
from mycroft_otel.evaluate.scenarios import Scenario
from mycroft_otel.sim.faults import CATALOGUE, RUN_AHEAD_FAULTS, SLOWDOWN_PARAM, FaultError, factor_for_slowdown
from mycroft_otel.sim.model import NOISE_MODELS, TimingModel, eval_model
from mycroft_otel.sim.simulation import Simulation
from mycroft_otel.sim.topology import build_comms, parse_topology


@dataclass(frozen=True)
class CorpusTopology:
    """A job shape of the corpus: the sim topology and the DP all-reduce algorithm (NCCL_ALGO)."""

    spec: str
    algo: str = "Ring"


#: name -> job shape. TP groups ride NVLink inside a node, DP rings/trees cross the network, PP stages
#: exchange p2p send/recv; faults target the communicators in CorpusSpec.fault_comms (default: DP).
TOPOLOGIES: dict[str, CorpusTopology] = {
    "ring8": CorpusTopology("nodes=8,gpus=1,tp=1,dp=8"),
    "tree8": CorpusTopology("nodes=8,gpus=1,tp=1,dp=8", "Tree"),
    "tpdp8": CorpusTopology("nodes=4,gpus=2,tp=2,dp=4"),
    "ring16": CorpusTopology("nodes=16,gpus=1,tp=1,dp=16"),
    "tpdppp16": CorpusTopology("nodes=8,gpus=2,tp=2,pp=2,dp=4"),
    "tpdp64": CorpusTopology("nodes=8,gpus=8,tp=8,dp=8"),
    # LLM training shapes (Megatron order: TP fastest, then DP, then PP). TP fills whole nodes, so its
    # all-reduces stay on NVLink (kernel-only in the simulator) while every DP ring or tree and every PP
    # send crosses the network; tpdp64 above is the 8 x 8 one (tp=8 dp=8).
    "tp8dp2": CorpusTopology("nodes=2,gpus=8,tp=8,dp=2"),
    "tp4dp4": CorpusTopology("nodes=4,gpus=4,tp=4,dp=4"),
    "tp4dp4tree": CorpusTopology("nodes=4,gpus=4,tp=4,dp=4", "Tree"),
    "tp4pp2dp2": CorpusTopology("nodes=4,gpus=4,tp=4,pp=2,dp=2"),
}

#: the slowdown faults of the sweep (every one in SLOWDOWN_PARAM) and the hangs (the catalogue's hangs
#: that need no real process)
SLOWDOWNS: tuple[str, ...] = ("slow_flow", "slow_nic", "congestion", "slow_gpu", "slow_proxy", "late_rank",
                              "late_once")
HANGS: tuple[str, ...] = ("rank_absent", "gpu_stalled", "nic_down", "flow_stall", "coll_mismatch")
#: the communicators a fault may target (CorpusSpec.fault_comms). PP is not one: a send/recv's span includes
#: the receiving stage's wait for its sender, so a magnitude ("x of its time") cannot be set on it
FAULT_COMMS: tuple[str, ...] = ("dp", "tp")
#: faults that act on the network path alone, and why each means nothing on a TP group: TP stays inside a
#: node (sim/topology.py), where NCCL's P2P transport moves the data over NVLink from the kernel itself
#: (no network ProxyOps: the simulator times such a collective kernel-only, engine.simulate_batch)
NETWORK_ONLY: dict[str, str] = {
    "slow_nic": "no NIC on an NVLink path",
    "congestion": "no NIC receive side on an NVLink path",
    "nic_down": "no NIC on an NVLink path",
    "slow_proxy": "NCCL's proxy thread drives network transfers only; NVLink copies run in the kernel",
    "slow_flow": "the simulator times an NVLink collective kernel-only, with no per-channel link to slow "
                 "(and NCCL posts no ProxySteps for it, so a link's only trace would be every rank's KernelCh)",
    "flow_stall": "the simulator times an NVLink collective kernel-only, with no per-channel link to stall",
}
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
    # the communicator kinds faults target (FAULT_COMMS); a shape without one (ring8 has no TP) and a fault
    # that means nothing there (NETWORK_ONLY on TP) give no case
    fault_comms: tuple[str, ...] = ("dp",)
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
        for c in self.fault_comms:
            if c not in FAULT_COMMS:
                raise ValueError(f"corpus {self.name}: fault_comms {c!r} is not one of {', '.join(FAULT_COMMS)} "
                                 "(a p2p transfer's time includes its pipeline wait: no magnitude to set)")
        for ms in self.late_once_ms:
            if not ms > 0:
                raise ValueError(f"corpus {self.name}: late_once_ms {ms} must be > 0")
        for m in self.magnitudes:
            if not m > 1.0:
                raise ValueError(f"corpus {self.name}: magnitude {m} must be > 1 (x of the collective's time)")


#: the LLM training shapes: TP 8 and 4 inside a node, DP rings and a DP tree across nodes, TP x PP x DP
LLM_TOPOLOGIES: tuple[str, ...] = ("tp8dp2", "tp4dp4", "tp4dp4tree", "tpdp64", "tp4pp2dp2")

#: named sizes. ``ci``: a handful of deterministic 8-rank scenarios (tests/evaluate/test_corpus.py);
#: ``small``: the baseline curve (every fault at every magnitude on three 8-rank shapes); ``full``: the
#: issue's corpus (every shape, every noise model, 3 seeds, healthy runs for >= 10^6 healthy collectives).
#: ``llm``: the LLM shapes with faults in TP and DP, for development (seed 1, healthy seed 11);
#: ``llm-final``: the same on seeds never used while fixing the detector (101-103, healthy 111-160: >= 10^6
#: healthy collectives, extrapolated): the
#: figures a release quotes come from it alone.
SIZES: dict[str, CorpusSpec] = {
    "ci": CorpusSpec("ci", slowdowns=("slow_flow", "slow_nic", "congestion", "slow_gpu", "late_rank"),
                     magnitudes=(3.0, 10.0), hangs=HANGS, topologies=("tpdp8",), noises=("nccl",), seeds=(1,),
                     healthy_seeds=(11, 12), healthy_noises=("nccl", "jittery")),
    "small": CorpusSpec("small", topologies=("tpdp8", "ring8", "tree8"), noises=("nccl",), seeds=(1,),
                        healthy_seeds=(11,), healthy_topologies=("tpdp8", "ring8", "tree8", "tpdppp16"),
                        healthy_noises=("nccl", "jittery", "stragglers", "warmup", "mixed", "bubbles")),
    "full": CorpusSpec("full", topologies=tuple(TOPOLOGIES), noises=tuple(NOISE_MODELS), seeds=(1, 2, 3),
                       healthy_seeds=tuple(range(11, 41))),
    **{name: CorpusSpec(name, magnitudes=(1.25, 1.5, 2.0, 3.0), topologies=LLM_TOPOLOGIES, noises=("nccl",),
                        seeds=seeds, healthy_seeds=healthy, healthy_noises=("nccl", "jittery", "stragglers"),
                        fault_comms=("tp", "dp"))
       for name, seeds, healthy in (("llm", (1,), (11,)), ("llm-final", (101, 102, 103), tuple(range(111, 161))))},
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
    comm: str = "dp"           # the communicator kind the fault targets (healthy runs: "dp", unused)
    # a late rank's (rank, op of the step): its delay is set where the case runs (:func:`calibrated`), since
    # that times the job itself per bisection step; until then its spec has no delay_ms
    late: tuple[int, int] | None = None

    def model(self) -> TimingModel:
        return eval_model().with_nccl(dp_algo=TOPOLOGIES[self.topology].algo).with_noise(self.noise)


def calibrated(case: Case, factors: FactorCache) -> Case:
    """``case`` with its late rank's delay set (a case without one, as it is). A magnitude the fault cannot
    reach raises FaultError (the other faults' are left out of the corpus when it is built)."""
    if case.late is None or case.param is not None:
        return case
    param = factors.get(case.fault, case.topology, case.magnitude, case.comm, case.noise, *case.late)
    if param is None:
        raise FaultError(factors.unreachable[-1])
    return replace(case, param=param,
                   scenario=replace(case.scenario, fault=_slow_spec(case.fault, param, case.comm, case.late)))


class FactorCache:
    """factor_for_slowdown per (fault, topology, magnitude, communicator): it times the targeted communicator's
    collective without noise, so one value serves every noise model and seed of a shape (the noise then varies
    around it, as on a real job). A late rank (sim.faults.RUN_AHEAD_FAULTS) is set per noise model, pipeline
    stage and op of the step as well: all three move the CPU's run-ahead its delay must first use up."""

    def __init__(self) -> None:
        self._values: dict[tuple[str, str, float, str, str, int, int], float | None] = {}
        self._ops: dict[tuple[str, str, int], int] = {}
        self.unreachable: list[str] = []  # "fault xM on topology: why", for the report

    def get(self, fault: str, topology: str, magnitude: float, comm: str = "dp", noise: str = "quiet",
            rank: int = 1, op: int = 0) -> float | None:
        """The parameter, or None where the fault cannot slow that shape's collective so much. A late call is
        set for the late ``rank``'s pipeline stage and the ``op`` of the step it is late into (a later stage's
        first collective of a step sits behind more run-ahead: it waited for the stage before it)."""
        t = TOPOLOGIES[topology]
        ahead = fault in RUN_AHEAD_FAULTS
        per_stage = _stage_size(topology)
        stage, op = (rank // per_stage, op) if ahead else (0, 0)
        key = (fault, topology, magnitude, comm, noise if ahead else "quiet", stage, op)
        if key not in self._values:
            model = eval_model().with_nccl(dp_algo=t.algo)
            try:
                self._values[key] = factor_for_slowdown(fault, magnitude, t.spec, model=model, comm=comm,
                                                        noise=key[4], rank=stage * per_stage + min(1, per_stage - 1),
                                                        op=op)
            except FaultError as exc:
                self._values[key] = None
                self.unreachable.append(f"{fault} x{magnitude:g} on {topology}{_comm_tag(comm)}: {exc}")
        return self._values[key]

    def ops_per_step(self, topology: str, comm: str, rank: int) -> int:
        """How many collectives of kind ``comm`` ``rank`` takes part in per training step."""
        stage = rank // _stage_size(topology)
        key = (topology, comm, stage)
        if key not in self._ops:
            sim = Simulation(parse_topology(TOPOLOGIES[topology].spec), eval_model().with_noise("quiet"), [],
                             steps=2, predict=False)
            ops: list = []

            def count(i, _res) -> None:
                if i.step == 1 and i.comm.kind == comm and not i.is_p2p and rank in i.comm.ranks:
                    ops.append(i.seq)
            sim.run(count)
            self._ops[key] = len(ops)
        return self._ops[key]


def _stage_size(topology: str) -> int:
    """Ranks per pipeline stage of a corpus shape (a stage is a contiguous block of global ranks)."""
    t = parse_topology(TOPOLOGIES[topology].spec)
    return t.tp * t.dp


def _comm_tag(comm: str) -> str:
    """The communicator in a case name: none for DP (the catalogue's default, names as before), else ``-tp``."""
    return "" if comm == "dp" else f"-{comm}"


def _late_call(job_seed: int, world: int, ops_of: Callable[[int], int]) -> tuple[int, int]:
    """The rank a late-call case delays and the op of the step it is late into, pinned in its spec so that
    its calibration times that op of that rank's pipeline stage: the rank is the simulator's own draw for a
    fault without ``rank`` (its fault generator's first number), the op drawn among the rank's ``ops_of(rank)``
    collectives of a step, so that late ranks into every op of a step are judged."""
    rank = int(np.random.default_rng([job_seed, 1]).integers(world))
    return rank, int(np.random.default_rng([job_seed, 2]).integers(max(1, ops_of(rank))))


def _slow_spec(fault: str, param: float | None, comm: str = "dp", late: tuple[int, int] | None = None) -> str:
    extra = ",p=1" if fault == "slow_proxy" else ""  # every collective after the onset: a sustained fault
    # a late call is late into one op of the step, and the run-ahead before each op differs (a TP group's
    # first all-reduce of a step sits behind ~70 ms of it, its last behind ~160 ms): the rank and op
    # factor_for_slowdown timed, not whichever op the onset falls on
    extra += f",rank={late[0]},op={late[1]}" if late else ""
    extra += "" if comm == "dp" else f",comm={comm}"
    value = "" if param is None else f",{SLOWDOWN_PARAM[fault]}={param:.6g}"
    return f"{fault}:at={SLOW_AT_S:g}{value}{extra}"


def _job_seed(seed: int, fault_index: int, magnitude_index: int, comm: str = "dp") -> int:
    """Each case its own job seed (hence its own victim rank, channel and noise draws), fixed by the case's
    place in the corpus: a curve over one victim and one noise draw would measure that draw. A TP case sits
    10^7 above its DP twin (DP job seeds stay below that for corpus seeds < 10,000)."""
    return seed * 1000 + fault_index * 10 + magnitude_index + 10_000_000 * FAULT_COMMS.index(comm)


def skipped(fault: str, topology: str, comm: str) -> str | None:
    """Why ``fault`` on ``topology``'s ``comm`` communicators gives no case (None: it gives one)."""
    if not build_comms(parse_topology(TOPOLOGIES[topology].spec))[comm]:
        return f"{topology} has no {comm.upper()} communicator"
    if comm == "tp" and fault in NETWORK_ONLY:
        return NETWORK_ONLY[fault]
    return None


def _fault_cases(spec: CorpusSpec, topo: str, comm: str, factors: FactorCache) -> list[Case]:
    """The slowdown sweep, the one-off late calls and the hangs of one shape, faults on its ``comm``."""
    spec_t, tag, out = TOPOLOGIES[topo].spec, _comm_tag(comm), []

    def kept(fault: str) -> bool:
        why = skipped(fault, topo, comm)
        if why is not None and (note := f"{fault} on {topo}{tag}: {why}") not in factors.unreachable:
            factors.unreachable.append(note)
        return why is None

    for noise in spec.noises:
        for seed in spec.seeds:
            for fi, fault in enumerate(spec.slowdowns):
                for mi, m in enumerate(spec.magnitudes if kept(fault) else ()):
                    job_seed = _job_seed(seed, fi, mi, comm)
                    late, param = None, None
                    if fault in RUN_AHEAD_FAULTS:  # set where it runs (calibrated)
                        late = _late_call(job_seed, _world(spec_t), lambda g: factors.ops_per_step(topo, comm, g))
                    elif (param := factors.get(fault, topo, m, comm)) is None:
                        continue
                    sc = Scenario(f"{fault}-x{m:g}-{topo}{tag}-{noise}-s{seed}",
                                  _slow_spec(fault, param, comm, late), topology=spec_t, seed=job_seed,
                                  duration_s=SLOW_DURATION_S)
                    out.append(Case(sc, fault, topo, noise, m, param, comm, late))
            for di, ms in enumerate(spec.late_once_ms if kept("late_once") else ()):
                sc = Scenario(f"late_once-{ms:g}ms-{topo}{tag}-{noise}-s{seed}",
                              f"late_once:at={SLOW_AT_S:g},delay_ms={ms:g}" + ("" if comm == "dp" else f",comm={comm}"),
                              topology=spec_t, seed=_job_seed(seed, 40, di, comm), duration_s=SLOW_DURATION_S)
                out.append(Case(sc, "late_once", topo, noise, None, ms, comm))
            for fi, fault in enumerate(spec.hangs):
                if not kept(fault):
                    continue
                sc = Scenario(f"{fault}-{topo}{tag}-{noise}-s{seed}",
                              f"{fault}:at={HANG_AT_S:g}" + ("" if comm == "dp" else f",comm={comm}"), topology=spec_t,
                              seed=_job_seed(seed, 50 + fi, 0, comm),
                              duration_s=0.0)  # run_case sets it from the stall threshold
                out.append(Case(sc, fault, topo, noise, None, comm=comm))
    return out


def cases(spec: CorpusSpec, factors: FactorCache | None = None) -> list[Case]:
    """Every run of ``spec``, in a fixed order (names unique)."""
    spec.validate()
    factors = factors or FactorCache()
    out: list[Case] = []
    for topo in spec.topologies:
        for comm in spec.fault_comms:
            out += _fault_cases(spec, topo, comm, factors)
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


#: this process's calibrations (a worker of run_corpus keeps its own)
_FACTORS = FactorCache()


def run_case(case: Case, stall_ms: int, plugin: str | None = None, processors: int = 1,
             routing: Routing = BY_JOB, keep_dir: str | None = None) -> dict:
    """Run one case on virtual time and score it: a compact row (JSON-able). ``processors``, ``routing``:
    behind a gateway (virtual.run_scenario). ``keep_dir``: the processor's input is kept there as
    ``<scenario>.otlp.rec`` (the row's ``recording``), for ``mycroft-otel report --replay``."""
    case = calibrated(case, _FACTORS)
    sc = case.scenario
    if case.fault in HANGS:
        sc = replace(sc, duration_s=HANG_AT_S + stall_ms / 1000 + 5.0)
    recording = os.path.join(keep_dir, f"{sc.name}.otlp.rec") if keep_dir else None
    o = virtual.run_scenario(sc, stall_ms, plugin=plugin, model=case.model(), processors=processors,
                             routing=routing, recording=recording)
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
        "scenario": sc.name, "fault": case.fault, "spec": sc.fault, "topology": case.topology, "comm": case.comm,
        "noise": case.noise, "seed": sc.seed, "magnitude": case.magnitude, "param": case.param, "world": o.world,
        "slowdown": o.slowdown,
        "category": truth.get("category", ""), "culprit": truth.get("culprit_global_ranks", []),
        "detected": r["detected"], "named_right": bool(r["detected"] and r["culprit_ok"] and r["category_ok"]),
        "culprit_ok": r["culprit_ok"], "category_ok": r["category_ok"], "any_right": r.get("any_right"),
        "top": r["top"], "verdicts": len(o.verdicts),
        # the first verdict's winning hypothesis over its runner-up (naming.py): how clearly it was decided
        "margin": o.verdicts[0].attrs.get(semconv.RCA_MARGIN) if o.verdicts else None,
        "runner_up": o.verdicts[0].attrs.get(semconv.RCA_RUNNER_UP) if o.verdicts else None,
        "false_verdicts": false_v, "excused_verdicts": excused,
        "latency_s": r["latency_s"],
        "right_latency_collectives": o.collectives.get(right[0].trace_id) if right else None,
        "collectives": o.n_collectives, "healthy_collectives": o.collectives_before_onset,
        "sim_s": r["sim_s"], "wall_s": round(o.wall_s, 2), "events": o.events,
        **({"recording": recording} if recording else {}),
    }


def _run_indexed(args: tuple) -> tuple[int, dict]:
    """One case; a case that raises becomes a row naming the error (the others' results are kept)."""
    i, case, stall_ms, plugin, processors, routing, keep_dir = args
    try:
        return i, run_case(case, stall_ms, plugin, processors, routing, keep_dir)
    except Exception as exc:  # noqa: BLE001 -- any failure of one run is reported with its case, not fatal
        return i, {"scenario": case.scenario.name, "fault": case.fault, "topology": case.topology,
                   "comm": case.comm, "noise": case.noise, "seed": case.scenario.seed,
                   "error": f"{type(exc).__name__}: {exc}"}


def run_corpus(todo: list[Case], stall_ms: int, jobs: int = 1, plugin: str | None = None,
               log: Callable[[str], None] = lambda m: None, processors: int = 1,
               routing: Routing = BY_JOB, keep_dir: str | None = None) -> list[dict]:
    """Rows in ``todo``'s order. ``jobs`` > 1: a process pool (one plugin per process: the virtual clock
    belongs to one ABI driver per process, so cases never share a process concurrently). ``keep_dir``: each
    run's recording is kept there (run_case)."""
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

    work = [(i, c, stall_ms, plugin, processors, routing, keep_dir) for i, c in enumerate(todo)]
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
    return parse_topology(spec).world


def _n_comms(topology: str) -> int:
    """Communicators of a corpus shape (TP, DP and PP groups): each issues its own collectives."""
    return sum(len(v) for v in build_comms(parse_topology(TOPOLOGIES[topology].spec)).values())


def main_corpus(spec_name: str, stall_ms: int, jobs: int, as_json: bool, plot: str | None,
                estimate_from: list[str] | None, list_only: bool, log: Callable[[str], None],
                only: list[str] | None = None, keep: bool = False) -> tuple[int, str]:
    """The CLI's body (cli.py parses): returns (exit code, what to print on stdout). ``only``: these runs of
    the corpus (by scenario name, as ``list_only`` prints them); ``keep``: each run's recording is kept in a
    new directory, for ``mycroft-otel report --replay`` (why each collective was named or not)."""
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
    if only:
        unknown = sorted(set(only) - {c.scenario.name for c in todo})
        if unknown:
            raise ValueError(f"corpus {spec.name} has no run named {', '.join(unknown)} (--list names them)")
        todo = [c for c in todo if c.scenario.name in only]
    if list_only:
        return 0, "\n".join(f"{c.scenario.name:48s} {c.scenario.fault}" for c in todo)
    log(f"corpus {spec.name}: {len(todo)} runs, --jobs {jobs}")
    keep_dir = tempfile.mkdtemp(prefix=f"mycroft-corpus-{spec.name}-") if keep else None
    runs = run_corpus(todo, stall_ms, jobs=jobs, log=log, keep_dir=keep_dir)
    if keep_dir:
        log(f"recordings kept in {keep_dir}: mycroft-otel report --replay {keep_dir}/<run>.otlp.rec shows "
            "the processor's decision about each collective")
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


