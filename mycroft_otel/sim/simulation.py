"""A simulated training job: the schedule of a training step, run instance by instance.

Every rank runs the same program (one training step: forward with TP collectives per
layer and PP sends between stages, backward with TP collectives, DP gradient buckets
and PP sends back, optimizer). A rank issues its next call when its previous operation
completed plus the compute in between (jittered, lognormal), so a rank stuck in one
communicator never issues its next call on another one: its peers there wait for it.
Each instance is timed by engine.simulate; its callbacks go to ``sink`` in causal order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np

from mycroft_otel.sim.engine import RING_SLICE_STEPS, INF, Instance, Mods, Result, simulate, simulate_batch
from mycroft_otel.sim.faults import Fault
from mycroft_otel.sim.model import TimingModel
from mycroft_otel.sim.rows import SlotAllocator
from mycroft_otel.sim.topology import Comm, Topology, build_comms


@dataclass(frozen=True)
class Context:
    """One plugin context: (communicator, rank) in one process; index = position in Simulation.contexts."""

    kind: str
    comm_index: int
    comm_rank: int
    global_rank: int
    node: int


@dataclass(frozen=True)
class Entry:
    kind: str            # comm kind
    func: str
    nbytes: int
    compute_ns: float    # compute before the call
    stage: int = -1      # pipeline stage whose ranks run it (-1: all)
    dst_stage: int = -1  # p2p: receiving stage


class Simulation:
    def __init__(self, topo: Topology, model: TimingModel | None = None, faults: Iterable[Fault] = (),
                 seed: int = 0, steps: int | None = None, duration_s: float | None = None,
                 predict: bool = True, slots: SlotAllocator | None = None):
        self.topo = topo
        self.model = model or TimingModel()
        nc = self.model.nccl
        self.comms: dict[str, list[Comm]] = build_comms(topo, seed, nc.dp_channels, nc.pp_channels, nc.tp_channels)
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.rng_faults = np.random.default_rng([seed, 1])
        self.rng_noise = np.random.default_rng([seed, 2])  # the job's own healthy effects (model.NoiseModel)
        nz = self.model.noise
        sm = self.model.step
        # mixed gradient buckets (DDP): a 1 MiB first bucket, full buckets, and a remainder fixed for the job
        total = sm.dp_buckets * sm.dp_bucket_bytes * float(self.rng_noise.uniform(0.75, 1.0))
        self.dp_bucket_sizes: list[int] = [sm.dp_bucket_bytes] * sm.dp_buckets
        if nz.mixed_sizes:
            first = min(1 << 20, sm.dp_bucket_bytes)
            rest = max(0.0, total - first)
            full = int(rest // sm.dp_bucket_bytes)
            self.dp_bucket_sizes = [first] + [sm.dp_bucket_bytes] * full + (
                [int(rest - full * sm.dp_bucket_bytes)] if rest - full * sm.dp_bucket_bytes >= 4096 else [])
        #: one-off stragglers that struck (healthy by design; an evaluation must not count a verdict naming one
        #: as false): {"rank", "step", "delay_ns", "t_ns"}
        self.noise_events: list[dict] = []
        self._straggle: dict[int, tuple[int, float]] = {}
        self.max_steps = steps
        self.duration_ns = None if duration_s is None else duration_s * 1e9
        if steps is None and duration_s is None:
            self.max_steps = 1
        self.predict = predict
        self.slots = slots or SlotAllocator()
        w = topo.world
        self.contexts: list[Context] = []
        self.ctx_base: dict[tuple[str, int], int] = {}
        for kind in ("tp", "dp", "pp"):
            for c in self.comms[kind]:
                self.ctx_base[(kind, c.index)] = len(self.contexts)
                for i, g in enumerate(c.ranks):
                    self.contexts.append(Context(kind, c.index, i, int(g), int(topo.host_of(g))))
        self._comm_of = {(k, int(g)): c for k, lst in self.comms.items() for c in lst for g in c.ranks}
        # Global fault state, per global rank (engine thresholds are absolute sim times).
        self.dead_t = np.full(w, INF)
        self.gpu_stall_t = np.full(w, INF)
        self.nic_down_t = np.full(w, INF)
        self.gpu_factor = np.ones(w)
        self.nic_factor = np.ones(w)
        self.recv_factor = np.ones(w)
        self.flow_factor: dict[tuple, float] = {}
        self.deliver_stall: dict[tuple, float] = {}
        self.faults = list(faults)
        for f in self.faults:
            f.resolve(self)
        # Per rank: the CPU (when it can make its next NCCL call: `ready`), its GPU stream (free from `gpu`),
        # and the completion times of its last `max_outstanding` calls (the CPU runs at most that far ahead).
        self.ready = np.zeros(w)
        self.gpu = np.zeros(w)
        self.outstanding = np.full((w, max(1, self.model.step.max_outstanding)), -INF)
        self.seq: dict[tuple[str, int], int] = {}
        self.p2p_n: dict[tuple[int, int, int], int] = {}
        self.log: list[dict] = []
        self.steps_done = 0
        self.n_rows = 0
        self._entry_idx = 0

    # --- lookups ---------------------------------------------------------------------------------
    def comm_of(self, kind: str, g: int) -> Comm:
        return self._comm_of[(kind, int(g))]

    def stage_of(self, g: int) -> int:
        return self.topo.coords(g)[2]

    # --- the program ---------------------------------------------------------------------------
    def schedule(self, step: int) -> list[Entry]:
        sm, t = self.model.step, self.topo
        out: list[Entry] = []
        L = max(1, sm.layers)

        bubble = self.model.noise.stage_extra_ns if t.pp > 1 else 0.0

        def tp_ops(stage: int, compute: float) -> None:
            compute += bubble
            for _ in range(L):
                if t.tp > 1:
                    if sm.tp_mode == "sp":
                        out.append(Entry("tp", "AllGather", sm.tp_bytes // t.tp, compute / L, stage))
                        out.append(Entry("tp", "ReduceScatter", sm.tp_bytes // t.tp, 0.0, stage))
                    else:
                        out.append(Entry("tp", "AllReduce", sm.tp_bytes, compute / L, stage))
                else:
                    out.append(Entry("", "", 0, compute / L, stage))

        if step == 0 and sm.initial_broadcast and t.dp > 1:
            out.append(Entry("dp", "Broadcast", sm.dp_bucket_bytes, 0.0))
        for s in range(t.pp):
            tp_ops(s, sm.forward_ns / t.pp)
            if s + 1 < t.pp:
                out.append(Entry("pp", "Send", sm.pp_bytes, 0.0, s, s + 1))
        for s in reversed(range(t.pp)):
            tp_ops(s, sm.backward_ns / t.pp)
            if t.dp > 1:
                f = "ReduceScatter" if sm.dp_mode == "zero" else "AllReduce"
                for size in self.dp_bucket_sizes:
                    nb = size // (t.dp if f == "ReduceScatter" else 1)
                    out.append(Entry("dp", f, nb, 0.0, s))
            if s > 0:
                out.append(Entry("pp", "Send", sm.pp_bytes, 0.0, s, s - 1))
        out.append(Entry("", "", 0, sm.optimizer_ns))
        if t.dp > 1 and sm.dp_mode == "zero":
            for size in self.dp_bucket_sizes:
                out.append(Entry("dp", "AllGather", size // t.dp, 0.0))
        return out

    def _compute(self, ranks: np.ndarray, ns: float) -> np.ndarray:
        if ns <= 0:
            return np.zeros(len(ranks))
        j = self.model.step.jitter
        return ns * np.exp(self.rng.normal(-j * j / 2, j, len(ranks))) if j else np.full(len(ranks), ns)

    def _plan_stragglers(self, step: int, n_entries: int) -> None:
        """Which ranks stall once in this step (NoiseModel.straggler_p), before which entry and how long."""
        nz = self.model.noise
        self._straggle = {}
        if not nz.straggler_p or n_entries == 0:
            return
        hit = np.nonzero(self.rng_noise.random(self.topo.world) < nz.straggler_p)[0]
        lo, hi = np.log(nz.straggler_min_ns), np.log(nz.straggler_max_ns)
        for g in hit:
            entry = int(self.rng_noise.integers(n_entries))
            self._straggle[int(g)] = (entry, float(np.exp(self.rng_noise.uniform(lo, hi))))

    def _straggler_delay(self, g: np.ndarray, step: int, entry_idx: int) -> np.ndarray:
        """Host-side stall (ns) of each rank in ``g`` before this entry's call; logged as a noise event."""
        out = np.zeros(len(g))
        for i, x in enumerate(g):
            hit = self._straggle.get(int(x))
            if hit is not None and hit[0] == entry_idx:
                out[i] = hit[1]
                t = float(self.ready[x])
                self.noise_events.append({"kind": "straggler", "rank": int(x), "step": step,
                                          "delay_ns": hit[1], "t_ns": t if np.isfinite(t) else None})
        return out

    def _warmup_delay(self, comm: Comm, seq: int, members: np.ndarray) -> np.ndarray:
        """Launch delay of the ``seq``-th collective of ``comm`` (NoiseModel.warmup_*: lazy connection setup).
        Seeded by (comm, seq) alone, so a dry run of the same instance sees the same delay."""
        nz = self.model.noise
        if seq >= nz.warmup_collectives:
            return np.zeros(len(members))
        rng = np.random.default_rng([self.seed, 3, ("tp", "dp", "pp").index(comm.kind), comm.index, seq])
        return nz.warmup_ns / 4.0 ** seq * np.exp(rng.normal(0.0, 0.5, comm.nranks))[members]

    def _instances(self, step: int, entry: Entry, ordinal: dict) -> list[Instance]:
        dsz = 2  # element size used to turn bytes into counts is the model datatype's
        from mycroft_otel.sim.abi import DATATYPE, DATATYPE_SIZES
        dsz = DATATYPE_SIZES[DATATYPE[self.model.nccl.datatype]]
        out = []
        if not entry.kind:  # compute only
            g = np.arange(self.topo.world)
            if entry.stage >= 0:
                g = g[[self.stage_of(x) == entry.stage for x in g]]
            c = self._compute(g, entry.compute_ns)
            self.gpu[g] = self.gpu[g] + c
            self.ready[g] = self.ready[g] + c * self.model.step.cpu_fraction + self._straggler_delay(
                g, step, self._entry_idx)
            return out
        comms = self.comms[entry.kind]
        k = ordinal.get(entry.kind, 0)
        ordinal[entry.kind] = k + 1
        for comm in comms:
            if entry.kind == "pp":
                src, dst = entry.stage, entry.dst_stage
                members = np.asarray([src, dst])
                key = (comm.index, src, dst)
                seq = self.p2p_n.get(key, 0)
                self.p2p_n[key] = seq + 1
                count = entry.nbytes // dsz
            else:
                if entry.stage >= 0 and self.stage_of(int(comm.ranks[0])) != entry.stage:
                    continue
                members = np.arange(comm.nranks)
                seq = self.seq.get((comm.kind, comm.index), 0)
                self.seq[(comm.kind, comm.index)] = seq + 1
                nseq = self.seq.get((comm.kind, comm.index, entry.func), 0)
                self.seq[(comm.kind, comm.index, entry.func)] = nseq + 1
                count = max(1, entry.nbytes // dsz)
            kc = ordinal.get((entry.kind, comm.index), 0)
            ordinal[(entry.kind, comm.index)] = kc + 1
            g = comm.ranks[members]
            c = self._compute(g, entry.compute_ns)
            # The CPU issues the call after launching the compute before it, but never more than
            # max_outstanding calls ahead of completion; the kernel waits for the compute on the stream.
            issue = np.maximum(self.ready[g] + c * self.model.step.cpu_fraction, self.outstanding[g, 0])
            issue = issue + self._straggler_delay(g, step, self._entry_idx)
            nz = self.model.noise
            if nz.host_median_ns:  # the host thread reaches each call a little late, rank by rank
                issue = issue + nz.host_median_ns * np.exp(self.rng.normal(0.0, nz.host_sigma, len(g)))
            kready = self.gpu[g] + c
            out.append(Instance(comm, members, seq, entry.func, int(count), issue, kready=kready,
                                root=0 if entry.func ==
                                "Broadcast" else -1, step=step, ordinal=k, comm_ordinal=kc,
                                algo=self.model.nccl.dp_algo if (entry.kind == "dp" and entry.func == "AllReduce")
                                else "Ring",
                                nccl_seq=-1 if entry.kind == "pp" else nseq))
        return out

    def _mods(self, inst: Instance) -> Mods:
        mods = Mods(inst.comm.nranks, inst.comm.n_channels)
        if self.model.noise.warmup_collectives and not inst.is_p2p:
            mods.launch_delay[inst.members] = self._warmup_delay(inst.comm, inst.seq, inst.members)
        return mods

    def _apply_state(self, inst: Instance, mods: Mods) -> None:
        comm = inst.comm
        g = comm.ranks
        # a wait that never ends repeats its records until the end of the run (or 10 s past this call)
        fin = self.ready[np.isfinite(self.ready)]
        mods.horizon = self.duration_ns if self.duration_ns is not None else (
            (float(fin.max()) if len(fin) else 0.0) + 10e9)
        mods.dead_t = np.minimum(mods.dead_t, self.dead_t[g])
        mods.gpu_stall_t = np.minimum(mods.gpu_stall_t, self.gpu_stall_t[g])
        mods.send_stall_t = np.minimum(mods.send_stall_t, self.nic_down_t[g])
        mods.gpu_factor = mods.gpu_factor * self.gpu_factor[g]
        mods.send_bw_factor = mods.send_bw_factor * self.nic_factor[g][None, :]
        mods.recv_bw_factor = mods.recv_bw_factor * self.recv_factor[g]
        for (kind, idx, r, c), f in self.flow_factor.items():
            if kind == comm.kind and idx == comm.index:
                mods.send_bw_factor[c, r] *= f
        for (kind, idx, r, c), t in self.deliver_stall.items():
            if kind == comm.kind and idx == comm.index:
                mods.deliver_stall_t[c, r] = min(mods.deliver_stall_t[c, r], t)

    #: rows one batch may produce before it is split (memory bound: ~100 bytes a row)
    MAX_BATCH_ROWS = 8_000_000

    def _split(self, batch: list) -> list:
        inst = batch[0][0]
        n = len(inst.members)
        # ring slices: 2 per stage and loop, ~ bytes x 2 / (channels x slice) in all (upper bound: 4-byte items)
        slice_b = max(1, self.model.nccl.step_bytes * RING_SLICE_STEPS)
        steps = 4 * max(1, inst.comm.nranks - 1) + inst.count * 8 // (inst.comm.n_channels * slice_b)
        per = max(1, n * inst.comm.n_channels * 2 * 5 * steps)  # ranks x channels x directions x rows/step
        k = max(1, self.MAX_BATCH_ROWS // per)
        return [batch[i:i + k] for i in range(0, len(batch), k)]

    def dry_run_span(self, inst: Instance) -> tuple[float, float]:
        """(first kernel start, last end) of ``inst`` as it would run without the striking fault."""
        mods = self._mods(inst)
        self._apply_state(inst, mods)
        r = simulate(inst, mods, self.model, SlotAllocator(), 0, np.random.default_rng(0), predict=False)
        k0 = float(np.min(r.kstart))
        fin = r.end[np.isfinite(r.end)]
        k1 = float(fin.max()) if len(fin) else k0 + 1e6
        return k0, max(k1, k0 + 1.0)

    def typical_ns(self, inst: Instance) -> float:
        k0, k1 = self.dry_run_span(inst)
        return k1 - k0

    # --- running ------------------------------------------------------------------------------
    def run(self, sink: Callable[[Instance, Result], None] | None = None,
            progress: Callable[[float], None] | None = None) -> None:
        step = 0
        while True:
            if self.max_steps is not None and step >= self.max_steps:
                break
            if self.duration_ns is not None and (np.all(~np.isfinite(self.ready))
                                                 or np.nanmin(np.where(np.isfinite(self.ready), self.ready, np.nan))
                                                 >= self.duration_ns):
                break
            if not np.isfinite(self.ready).any():
                break
            ordinal: dict = {}
            sched = self.schedule(step)
            self._plan_stragglers(step, len(sched))
            for self._entry_idx, entry in enumerate(sched):
                groups: dict = {}
                for inst in self._instances(step, entry, ordinal):
                    mods = self._mods(inst)
                    for f in self.faults:
                        f.on_instance(self, inst, mods)
                    self._apply_state(inst, mods)
                    h = inst.comm.hosts[inst.members]
                    key = (inst.func, inst.count, tuple(inst.members), tuple(np.unique(h, return_inverse=True)[1]))
                    groups.setdefault(key, []).append((inst, mods))
                for whole in groups.values():
                    for batch in self._split(whole):
                        insts = [i for i, _ in batch]
                        results = simulate_batch(insts, [md for _, md in batch], self.model, self.slots,
                                                 [self.ctx_base[(i.comm.kind, i.comm.index)] for i in insts],
                                                 self.rng, self.predict)
                        for inst, res in zip(insts, results):
                            g = inst.comm.ranks[inst.members]
                            # the CPU returns from the call at launch; the stream is busy until the end
                            self.ready[g] = res.issue + 12 * self.model.gpu.api_gap_ns
                            self.gpu[g] = res.end
                            self.outstanding[g] = np.concatenate([self.outstanding[g, 1:], res.end[:, None]],
                                                                 axis=1)
                            self.n_rows += sum(len(b.rows) for b in res.blocks)
                            if self.predict:
                                self.log.append(dict(kind=inst.comm.kind, comm=inst.comm.index, seq=inst.seq,
                                                     func=inst.func, step=step, ordinal=inst.ordinal,
                                                     members=g.tolist(), issue=inst.issue.tolist(),
                                                     kstart=res.kstart.tolist(), end=res.end.tolist(),
                                                     flows=res.flows))
                            if sink is not None:
                                sink(inst, res)
            step += 1
            self.steps_done = step
            if progress is not None:
                if self.max_steps is not None:
                    progress(step / self.max_steps)
                else:
                    fin = self.ready[np.isfinite(self.ready)]
                    progress(min(1.0, (fin.min() if len(fin) else self.duration_ns) / self.duration_ns))

    def truths(self) -> list[dict]:
        return [f.truth for f in self.faults if f.truth is not None]
