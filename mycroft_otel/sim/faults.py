"""The fault catalogue: what each fault does to the simulated job, and its ground truth.

A fault is named (``--fault NAME[:k=v,...]``) and targets one collective instance:
the first instance of communicator kind ``comm`` (tp | dp | pp) that global rank
``rank`` takes part in at training step >= ``step`` (the ``op``-th collective of its communicator in the
step, from 0, where given), and issued at or after ``at`` seconds of simulated time. Every
parameter has a seeded random default, so ``--seed`` picks a different victim.

From that instance on the fault acts physically through the timing model (engine.py):
thresholds after which something never happens (hangs) or factors (slowdowns). The
ground truth names the category (design §4; ``slow_proxy`` is our extension), the
culprit in the communicator and globally, its host, channel/peer for flow faults, the
onset time and the collective it hit.

| fault | category | what happens |
|---|---|---|
| rank_absent | rank_absent | the rank never calls the collective (dataloader / CPU hang) |
| process_exited | process_exited | the rank's host process is SIGKILLed mid-collective (multi-process mode) |
| sigstop | rank_absent | the host process is frozen by SIGSTOP mid-collective: it goes silent, its shm stays |
| gpu_stalled | gpu_stalled | from onset the rank's GPU starts no new work: data arrives, nothing is consumed or produced |
| nic_down | net_send_stalled | from onset the rank's NIC transmits nothing: its send steps are ready, never transmitted |
| flow_stall | net_delivery_stalled | one flow (channel) of the rank: transmitted from onset, never completes |
| coll_mismatch | coll_mismatch | the rank calls the collective with twice the count: it waits for steps nobody serves |
| late_rank | late_rank | the rank calls the collective ``delay_ms`` late (compute straggler), every step from onset |
| late_once | late_rank | the rank calls one collective ``delay_ms`` late (default 1 s: Mycroft's straggler bar), once |
| slow_gpu | slow_gpu | the rank's GPU reduce/copy is ``factor`` x slower from onset |
| slow_flow | slow_flow | one channel's link from the rank is ``factor`` x slower from onset |
| slow_nic | slow_nic | every flow through the rank's NIC (send side) is ``factor`` x slower from onset |
| congestion | slow_nic | the NIC's receive side: traffic into the rank congests, every flow it receives is ``factor`` x slower |
| slow_proxy | slow_proxy | the rank's proxy thread sleeps ``sleep_ms`` (1 s), 20% into the transfer, with probability ``p`` per collective (``p=1``: every one) |
| healthy | – | nothing (the noise model only): any verdict is a false positive |

Magnitudes. ``factor_for_slowdown(name, target)`` turns "make the collective ``target`` x slower" into the
fault's own parameter (``factor``, ``delay_ms`` or ``sleep_ms``) for a given topology and timing model, by
timing the targeted collective without noise with and without the fault (bisection on the factor; the
delays are linear: the collective waits ``(target - 1) x`` its own time). ``SLOWDOWN_PARAM`` says which
parameter each slowdown fault takes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mycroft_otel import ids
from mycroft_otel.sim.engine import INF, Instance, Mods

#: name -> (category, kind, default comm kind, needs a real process)
CATALOGUE: dict[str, tuple[str, str, str, bool]] = {
    "healthy": ("", "", "dp", False),
    "rank_absent": ("rank_absent", "hang", "dp", False),
    "process_exited": ("process_exited", "hang", "dp", True),
    "sigstop": ("rank_absent", "hang", "dp", True),
    "gpu_stalled": ("gpu_stalled", "hang", "dp", False),
    "nic_down": ("net_send_stalled", "hang", "dp", False),
    "flow_stall": ("net_delivery_stalled", "hang", "dp", False),
    "coll_mismatch": ("coll_mismatch", "hang", "dp", False),
    "late_rank": ("late_rank", "slowdown", "dp", False),
    "late_once": ("late_rank", "slowdown", "dp", False),
    "slow_gpu": ("slow_gpu", "slowdown", "dp", False),
    "slow_flow": ("slow_flow", "slowdown", "dp", False),
    "slow_nic": ("slow_nic", "slowdown", "dp", False),
    "congestion": ("slow_nic", "slowdown", "dp", False),
    "slow_proxy": ("slow_proxy", "slowdown", "dp", False),
}

#: slowdown fault -> the parameter that sets its magnitude (factor_for_slowdown computes it for a target)
SLOWDOWN_PARAM: dict[str, str] = {
    "slow_gpu": "factor", "slow_flow": "factor", "slow_nic": "factor", "congestion": "factor",
    "late_rank": "delay_ms", "late_once": "delay_ms", "slow_proxy": "sleep_ms",
}

_INT = ("rank", "step", "op", "channel", "seq")
_FLOAT = ("at", "factor", "delay_ms", "frac", "p", "sleep_ms")


class FaultError(ValueError):
    """A --fault spec that names no fault or has a bad parameter."""


def with_onset(spec: str, at: float, healthy: bool = True) -> str:
    """``spec`` checked (FaultError names what is wrong), with its onset at ``at`` seconds unless it names one
    (a healthy run has none; ``healthy``: whether one is accepted at all)."""
    spec = spec.strip()
    name = spec.split(":", 1)[0].strip()
    if not healthy and name == "healthy":
        raise FaultError(f"a fault is needed, not 'healthy'; known: {', '.join(n for n in CATALOGUE if n != 'healthy')}")
    if name != "healthy" and "at=" not in spec:
        spec += (":" if ":" not in spec else ",") + f"at={at:g}"
    parse_fault(spec)
    return spec


def parse_fault(spec: str) -> "Fault":
    """``NAME[:k=v,...]``, e.g. ``nic_down:rank=3,step=2`` or ``slow_flow:factor=4,channel=1``."""
    name, _, rest = spec.partition(":")
    name = name.strip()
    if name not in CATALOGUE:
        raise FaultError(f"unknown fault {name!r}; known: {', '.join(CATALOGUE)}")
    params: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        k, eq, v = item.partition("=")
        if not eq:
            raise FaultError(f"fault parameter {item!r} is not k=v")
        if k not in _INT + _FLOAT + ("comm",):
            raise FaultError(f"unknown fault parameter {k!r} (known: comm, {', '.join(_INT + _FLOAT)})")
        try:
            if k in _INT:
                params[k] = int(v)
            elif k in _FLOAT:
                params[k] = float(v)
            elif k == "comm":
                if v not in ("tp", "dp", "pp"):
                    raise ValueError
                params[k] = v
        except ValueError:
            raise FaultError(f"bad value for fault parameter {k}: {v!r}") from None
    return Fault(name, params)


@dataclass
class Fault:
    name: str
    params: dict = field(default_factory=dict)
    truth: dict | None = None        # filled when the fault strikes
    _armed: bool = False
    _onset: float = INF
    _n_hits: int = 0

    @property
    def category(self) -> str:
        return CATALOGUE[self.name][0]

    @property
    def kind(self) -> str:
        return CATALOGUE[self.name][1]

    @property
    def needs_process(self) -> bool:
        return CATALOGUE[self.name][3]

    def resolve(self, sim) -> None:
        """Fill the seeded random defaults."""
        if self.name == "healthy":
            return
        rng = sim.rng_faults
        p = self.params
        p.setdefault("comm", CATALOGUE[self.name][2])
        if not sim.comms.get(p["comm"]):
            p["comm"] = next(k for k in ("dp", "pp", "tp") if sim.comms.get(k))
        if "rank" not in p:
            p["rank"] = int(rng.integers(sim.topo.world))
        if not 0 <= p["rank"] < sim.topo.world:
            raise FaultError(f"rank={p['rank']} is outside the job (world size {sim.topo.world})")
        p.setdefault("step", 1 if sim.max_steps is None or sim.max_steps > 1 else 0)
        p.setdefault("at", 0.0)
        p.setdefault("frac", float(rng.uniform(0.2, 0.6)))
        comm = sim.comm_of(p["comm"], p["rank"])
        p.setdefault("channel", int(rng.integers(comm.n_channels)))
        p["channel"] %= comm.n_channels
        p.setdefault("factor", 8.0)
        p.setdefault("delay_ms", 0.0)
        p.setdefault("p", 0.5)
        p.setdefault("sleep_ms", 1000.0)

    # --- called by the simulation for every instance, before it is timed ---------------------------
    def on_instance(self, sim, inst: Instance, mods: Mods) -> None:
        if self.name == "healthy":
            return
        p = self.params
        x = p["rank"]
        if inst.comm.kind != p["comm"] or x not in inst.comm.ranks[inst.members]:
            if self._armed:
                self._persist(sim, inst, mods)
            return
        r = inst.comm.comm_rank(x)
        if not self._armed:
            t_issue = float(inst.issue[list(inst.members).index(r)])
            if (inst.step < p["step"] or t_issue < p["at"] * 1e9 or ("op" in p and inst.comm_ordinal != p["op"])
                    or ("seq" in p and inst.seq != p["seq"]) or not np.isfinite(t_issue)):
                return
            self._armed = True
            self._strike(sim, inst, mods, r, t_issue)
        else:
            self._persist(sim, inst, mods)

    def _strike(self, sim, inst: Instance, mods: Mods, r: int, t_issue: float) -> None:
        p, x, name = self.params, self.params["rank"], self.name
        comm = inst.comm
        onset = t_issue
        if name in ("process_exited", "sigstop", "gpu_stalled", "nic_down", "flow_stall"):
            k0, k1 = sim.dry_run_span(inst)
            onset = k0 + p["frac"] * (k1 - k0)
        culprits = [x]
        if name in ("process_exited", "sigstop"):
            host = int(sim.topo.host_of(x))
            culprits = [g for g in range(sim.topo.world) if sim.topo.host_of(g) == host]
            sim.dead_t[culprits] = onset
        elif name == "gpu_stalled":
            sim.gpu_stall_t[x] = onset
        elif name == "nic_down":
            sim.nic_down_t[x] = onset
        elif name == "flow_stall":
            sim.deliver_stall[(comm.kind, comm.index, r, p["channel"])] = onset
        elif name == "rank_absent":
            mods.absent[r] = True
        elif name == "coll_mismatch":
            mods.mismatch[r] = (inst.func, inst.count * 2)
        elif name == "late_rank":
            p["delay_ms"] = p["delay_ms"] or max(50.0, 3 * sim.typical_ns(inst) / 1e6)
            mods.issue_delay[r] += p["delay_ms"] * 1e6
            onset = t_issue
        elif name == "late_once":
            p["delay_ms"] = p["delay_ms"] or max(1000.0, 3 * sim.typical_ns(inst) / 1e6)
            mods.issue_delay[r] += p["delay_ms"] * 1e6
            onset = t_issue
        elif name == "slow_gpu":
            sim.gpu_factor[x] = p["factor"]
        elif name == "slow_nic":
            sim.nic_factor[x] = p["factor"]
        elif name == "congestion":
            sim.recv_factor[x] = p["factor"]
        elif name == "slow_flow":
            sim.flow_factor[(comm.kind, comm.index, r, p["channel"])] = p["factor"]
        elif name == "slow_proxy":
            self._proxy_sleep(sim, inst, mods, r, force=True)
        self._onset = onset
        self._target = (comm.kind, comm.index, inst.ordinal)
        in_comm = [int(comm.comm_rank(g)) for g in culprits if comm.comm_rank(g) >= 0]
        flow = name in ("flow_stall", "slow_flow")
        peer = None
        if flow:
            _, nxt = comm.ring_neighbours()
            peer = int(nxt[p["channel"], r])
        self.truth = {
            "fault": name, "category": self.category, "kind": self.kind,
            "comm_kind": comm.kind, "comm_name": comm.name, "comm_hash": ids.comm_hash_hex(comm.comm_hash),
            "coll_seq": int(inst.seq), "coll_func": inst.func, "step": int(inst.step),
            "culprit_ranks": in_comm, "culprit_global_ranks": [int(g) for g in culprits],
            "culprit_hosts": sorted({sim.topo.host_name(int(sim.topo.host_of(g))) for g in culprits}),
            "channel": int(p["channel"]) if flow else None, "peer": peer,
            "onset_sim_ns": int(onset), "onset_ns": None,
            "signal": {"process_exited": "SIGKILL", "sigstop": "SIGSTOP"}.get(name),
            "persistent": name not in ("late_once",),
            "nic_side": {"slow_nic": "send", "congestion": "recv"}.get(name),
            "params": {k: v for k, v in p.items()},
        }

    def _persist(self, sim, inst: Instance, mods: Mods) -> None:
        p, name = self.params, self.name
        x = p["rank"]
        if x not in inst.comm.ranks[inst.members]:
            return
        r = inst.comm.comm_rank(x)
        same_target = getattr(self, "_target", None) == (inst.comm.kind, inst.comm.index, inst.ordinal)
        if name == "late_rank" and same_target:
            mods.issue_delay[r] += p["delay_ms"] * 1e6
        elif name == "slow_proxy":
            self._proxy_sleep(sim, inst, mods, r)

    def _proxy_sleep(self, sim, inst: Instance, mods: Mods, r: int, force: bool = False) -> None:
        if not (force or sim.rng_faults.random() < self.params["p"]):
            return
        mods.proxy_sleep_t[r] = proxy_sleep_start(sim, inst)
        mods.proxy_sleep_ns = self.params["sleep_ms"] * 1e6


def proxy_sleep_start(sim, inst: Instance) -> float:
    """When a slow proxy thread falls asleep: 20% into the collective's transfer (after its first kernel
    started; the call itself is made long before, while the stream still runs the compute before it)."""
    k0, k1 = sim.dry_run_span(inst)
    return k0 + 0.2 * (k1 - k0)


def _instance_time(sim, inst: Instance, x: int, name: str, value: float) -> float:
    """Span of ``inst`` (first kernel start to last end) with fault ``name`` at ``value`` on global rank ``x``."""
    from mycroft_otel.sim.rows import SlotAllocator
    from mycroft_otel.sim.engine import simulate

    saved = (sim.gpu_factor.copy(), sim.nic_factor.copy(), sim.recv_factor.copy(), dict(sim.flow_factor))
    comm = inst.comm
    r = int(comm.comm_rank(x))
    try:
        mods = sim._mods(inst)
        if name == "slow_gpu":
            sim.gpu_factor[x] = value
        elif name == "slow_nic":
            sim.nic_factor[x] = value
        elif name == "congestion":
            sim.recv_factor[x] = value
        elif name == "slow_flow":  # channel 0 of the rank: without noise every channel is alike
            sim.flow_factor[(comm.kind, comm.index, r, 0)] = value
        elif name in ("late_rank", "late_once"):
            mods.issue_delay[r] += value * 1e6
        elif name == "slow_proxy":
            mods.proxy_sleep_t[r] = proxy_sleep_start(sim, inst)
            mods.proxy_sleep_ns = value * 1e6
        sim._apply_state(inst, mods)
        res = simulate(inst, mods, sim.model, SlotAllocator(), 0, np.random.default_rng(0), predict=False)
    finally:
        sim.gpu_factor, sim.nic_factor, sim.recv_factor, sim.flow_factor = saved
    return float(np.max(res.end) - np.min(res.kstart))


#: Faults whose parameter is a host's late call. A rank enqueues its collectives while its GPU still computes
#: the work before them, so a late call first uses up that run-ahead; and a call late every step is absorbed
#: altogether while the host's step (its work plus the delay) stays shorter than the GPU's, the slack being
#: rebuilt every step. Timing one collective alone, without noise, gave delays that slowed nothing under
#: NCCL's noise (a "3x" TP late rank measured 1.0x). These are set by running the job with the fault, under
#: the run's own noise, and timing the targeted collective of CALIBRATION_STEPS steps after a transient.
#: (``late_once`` is one call: timed alone, without noise, like the factors; the corpus sets it in seconds.)
RUN_AHEAD_FAULTS = ("late_rank",)
CALIBRATION_STEPS = 8
_TRANSIENT_STEPS = 2


def factor_for_slowdown(name: str, target: float, topology: str = "nodes=8,gpus=1,tp=1,dp=8",
                        model=None, rank: int = 1, seed: int = 0, tol: float = 0.01, comm: str = "dp",
                        noise: str = "quiet", op: int = 0) -> float:
    """The parameter (``SLOWDOWN_PARAM[name]``) that makes the first collective of communicator kind ``comm``
    (tp | dp) that ``rank`` takes part in at training step 1
    ``target`` x slower (first kernel start to last end) than without the fault, on ``topology`` with
    ``model`` (default TimingModel) and no noise (``seed``: the job's compute jitter, hence the ranks'
    arrival skew). A late call (RUN_AHEAD_FAULTS) is set under ``noise`` instead, in the job it delays: the
    rank's ``op``-th collective of that kind in each of CALIBRATION_STEPS steps, together ``target`` x their
    time without the fault. Found by bisection to ``tol`` relative (in log space for factors; delays and sleeps
    in ms start from (target - 1) x the collective's span).

    A fault that cannot act on that communicator raises FaultError: a TP group inside a node moves its data
    over NVLink without network ProxyOps, so no NIC, proxy thread or network flow of it can slow it."""
    from mycroft_otel.sim.model import TimingModel
    from mycroft_otel.sim.simulation import Simulation
    from mycroft_otel.sim.topology import parse_topology

    if name not in SLOWDOWN_PARAM:
        raise FaultError(f"{name!r} is not a slowdown fault; known: {', '.join(SLOWDOWN_PARAM)}")
    if not target > 1.0:
        raise FaultError(f"target slowdown must be > 1 (got {target})")
    # PP is left out: a send/recv's span (first kernel start to last end) includes the receiving stage's wait
    # for its sender's compute, so "x of its time" would measure the pipeline's schedule, not the transfer
    if comm not in ("tp", "dp"):
        raise FaultError(f"comm must be tp or dp (got {comm!r})")
    topo = parse_topology(topology)
    model = model or TimingModel()

    def targeted(i: Instance) -> bool:  # the collective as the job calls it: its real arrival skew
        return i.comm.kind == comm and not i.is_p2p and rank in i.comm.ranks

    if name in RUN_AHEAD_FAULTS:
        model = model.with_noise(noise)
        first = _TRANSIENT_STEPS + 1

        def span(value: float) -> float:
            faults = [parse_fault(f"{name}:rank={rank},comm={comm},step=1,op={op},at=0,"
                                  f"{SLOWDOWN_PARAM[name]}={value!r}")]
            job = Simulation(topo, model, faults if value > 0 else [], seed=seed,
                             steps=first + CALIBRATION_STEPS, predict=False)
            spans: list[float] = []

            def keep(i: Instance, res) -> None:  # the step's op-th such collective: the one the fault delays
                if i.step >= first and i.comm_ordinal == op and targeted(i):
                    spans.append(float(np.max(res.end) - np.min(res.kstart)))

            job.run(keep)
            if not spans:
                raise FaultError(f"no {comm.upper()} collective #{op} of a step with rank {rank} on {topology}")
            return sum(spans) / len(spans)
    else:
        sim = Simulation(topo, model.with_noise("quiet"), [], seed=seed, steps=2, predict=False)
        found: list = []
        sim.run(lambda i, _res: found.append(i) if not found and i.step == 1 and targeted(i) else None)
        if not found:
            raise FaultError(f"no {comm.upper()} collective with rank {rank} on {topology}")

        def span(value: float) -> float:
            return _instance_time(sim, found[0], rank, name, value)

    base = span(1.0 if SLOWDOWN_PARAM[name] == "factor" else 0.0)
    want = target * base
    factor = SLOWDOWN_PARAM[name] == "factor"
    # a delay first has to use up the CPU's run-ahead (the call is made long before the stream reaches it)
    lo, hi = (1.0, 2.0) if factor else (0.0, max(1e-3, (target - 1) * base / 1e6))
    while span(hi) < want:
        lo, hi = hi, hi * 2
        if hi > 1e6:
            raise FaultError(f"{name} cannot make this collective {target}x slower")
    # A delay is mostly run-ahead: a TP all-reduce of ~0.3 ms sits behind ~70 ms of it, so tol x the delay
    # would be wider than the slowdown wanted (x1.25 and x1.5 got the same delay). Delays are also bisected
    # to a tenth of the extra time wanted.
    extra_ms = 0.1 * (target - 1) * base / 1e6
    while hi - lo > (tol * hi if factor else min(tol * hi, extra_ms)):
        mid = (lo * hi) ** 0.5 if factor else (lo + hi) / 2
        if span(mid) < want:
            lo = mid
        else:
            hi = mid
    return float(hi)
