"""Discrete-event timing of one collective instance, and the NCCL callbacks it produces.

Three shapes cover what a training job runs:

* **ring** (AllReduce, AllGather, ReduceScatter on a ring; per channel a ring order):
  each rank's GPU runs NCCL's primitive sequence per loop -- send, then m-1 times
  recv+reduce/copy+send, then recv -- over m = 2(n-1) (AllReduce) or n-1 stages. The
  SIMPLE protocol moves each stage's chunk as chunkSteps/sliceSteps = 2 slices, and each
  slice is one ProxyStep, so send slice k of stage j needs recv slice k of stage j-1
  consumed. Steps per ProxyOp = nLoops x m x 2. A slice holds sliceSteps = 2 of the
  connection's NCCL_STEPS = 8 FIFO slots, so 4 slices are in flight per connection.
* **chain** (Broadcast along the ring from the root, and point-to-point Send/Recv as a
  chain of two): recv step s and send step s of a rank are one GPU op.
* **kernel-only** (every hop inside a node: NVLink/P2P, no network ProxyOps): Coll and
  KernelCh events only; the collective ends when the last rank has arrived plus the
  transfer time.

Per flow (channel, sender -> receiver) and step s, with a window of W steps in flight
(NCCL_STEPS / sliceSteps: 4 ring slices, 8 chain steps):
  send posted P_s = max(ProxyOp start, done_{s-W})
  recv posted Q_s = max(ProxyOp start, consumed_{s-W})       (receiver's free slots)
  GPU ready   G_s = GPU op end (needs P_s: a free FIFO slot, and the data it forwards)
  transmit    T_s = max(G_s, Q_s at the receiver, T_{s-1})   (credit back-pressure; SendPeerWait if Q_s > G_s)
  arrival     A_s = max(T_s, wire busy) + bytes/bw + latency;  done D_s = A_s + ack
  flushed     F_s = A_s + flush;  consumed U_s = GPU op end that reads it
Faults set thresholds (a time after which something never happens: +inf) and factors;
+inf propagates through max/+, which is how a stall back-pressures its sender and
starves the ranks downstream.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mycroft_otel.sim import abi
from mycroft_otel.sim.model import TimingModel
from mycroft_otel.sim.callbacks import flow_rows as _flow_rows
from mycroft_otel.sim.callbacks import user_rows as _user_rows
from mycroft_otel.sim.rows import KERNEL, Block, SlotAllocator, block
from mycroft_otel.sim.topology import Comm

INF = np.inf
RING_STEPS_PER_LOOP = {"AllReduce": lambda n: 2 * (n - 1), "AllGather": lambda n: n - 1,
                       "ReduceScatter": lambda n: n - 1}
#: NCCL's SIMPLE ring collectives (AllReduce, AllGather, ReduceScatter): a chunk spans CHUNK_STEPS FIFO slots
#: and moves as slices of SLICE_STEPS slots; the proxy posts one ProxyStep per slice. Broadcast, the tree and
#: point-to-point move one slot per step (their chunk and slice are one step).
RING_CHUNK_STEPS = abi.NCCL_STEPS // 2
RING_SLICE_STEPS = abi.NCCL_STEPS // 4
SLICES_PER_CHUNK = RING_CHUNK_STEPS // RING_SLICE_STEPS
#: ProxySteps in flight per ring connection: each slice holds RING_SLICE_STEPS of the NCCL_STEPS slots.
RING_WINDOW = abi.NCCL_STEPS // RING_SLICE_STEPS


def chunk_bytes(func: str, step_bytes: int) -> int:
    """Bytes of one chunk (what the ProxyOp reports as chunkSize) for a FIFO step of ``step_bytes``."""
    return step_bytes * (RING_CHUNK_STEPS if func in RING_STEPS_PER_LOOP else 1)


def data_bytes_per_channel(func: str, count: int, dtsize: int, n: int, n_channels: int) -> int:
    """Bytes one channel moves through its ring: AllGather/ReduceScatter counts are per rank."""
    total = count * dtsize * (n if func in ("AllGather", "ReduceScatter") else 1)
    return -(-total // n_channels)


def step_sizes(func: str, count: int, dtsize: int, n: int, n_channels: int, chunk: int) -> np.ndarray:
    """Bytes of each ProxyStep of one channel's send (and recv) ProxyOp; its length is the op's nSteps.

    ``chunk`` is the chunk size the ProxyOp reports (``chunk_bytes``). Ring: per loop every rank handles a
    chunk of min(chunk, remaining/n) bytes in each of m stages, each chunk as SLICES_PER_CHUNK slices (the
    first ones rounded up), nLoops = ceil(bytes_per_channel / (n * chunk)): nLoops x m x 2 steps. Chain
    (Broadcast, Send/Recv): ceil(bytes_per_channel / chunk) steps of chunk bytes (the last one shorter).
    """
    per_ch = data_bytes_per_channel(func, count, dtsize, n, n_channels)
    if func in RING_STEPS_PER_LOOP:
        m = RING_STEPS_PER_LOOP[func](n)
        loop = n * chunk
        nloops = max(1, -(-per_ch // loop))
        sizes = []
        for lp in range(nloops):
            rem = per_ch - lp * loop
            c = max(1, min(chunk, -(-rem // n)))
            piece = -(-c // SLICES_PER_CHUNK)
            slices = [max(1, min(piece, c - k * piece)) for k in range(SLICES_PER_CHUNK)]
            sizes += slices * m
        return np.asarray(sizes, dtype=np.int64)
    nsteps = max(1, -(-per_ch // chunk))
    sizes = np.full(nsteps, chunk, dtype=np.int64)
    sizes[-1] = max(1, per_ch - chunk * (nsteps - 1))
    return sizes


@dataclass
class Mods:
    """What faults do to one collective instance; arrays indexed by comm rank (flows: [channel, rank])."""

    n: int
    C: int
    absent: np.ndarray = None          # bool: never calls this collective
    issue_delay: np.ndarray = None     # ns added before the call (late rank)
    launch_delay: np.ndarray = None    # ns between the call and its launch (warm-up: lazy connection setup)
    gpu_factor: np.ndarray = None      # GPU time per chunk multiplier
    send_bw_factor: np.ndarray = None  # [C, n]: flow rank -> its ring successor, bandwidth divided by
    recv_bw_factor: np.ndarray = None  # all flows into the rank, bandwidth divided by
    gpu_stall_t: np.ndarray = None     # GPU never starts an op at or after this time
    send_stall_t: np.ndarray = None    # NIC down: nothing transmitted at or after
    deliver_stall_t: np.ndarray = None  # [C, n]: transmitted at or after, never completes
    dead_t: np.ndarray = None          # process gone / frozen: nothing at or after
    proxy_sleep_t: np.ndarray = None   # proxy thread sleeps proxy_sleep_ns from this time
    proxy_sleep_ns: float = 1e9
    mismatch: dict = field(default_factory=dict)  # comm rank -> (func, count)
    horizon: float = INF                # end of the run: repeated records of a wait that never ends stop here

    def __post_init__(self) -> None:
        n, C = self.n, self.C
        self.absent = np.zeros(n, bool)
        self.issue_delay = np.zeros(n)
        self.launch_delay = np.zeros(n)
        self.gpu_factor = np.ones(n)
        self.send_bw_factor = np.ones((C, n))
        self.recv_bw_factor = np.ones(n)
        for name in ("gpu_stall_t", "send_stall_t", "dead_t", "proxy_sleep_t"):
            setattr(self, name, np.full(n, INF))
        self.deliver_stall_t = np.full((C, n), INF)


@dataclass
class Instance:
    """One collective (or p2p transfer) on one communicator, as the ranks will call it."""

    comm: Comm
    members: np.ndarray      # comm ranks taking part (all, or [src, dst] for p2p)
    seq: int                 # collective number, or p2p transfer n
    func: str                # "AllReduce", ..., "Send" (p2p: src sends, dst receives)
    count: int
    issue: np.ndarray        # per member: time the rank calls NCCL (inf: never)
    kready: np.ndarray = None  # per member: earliest kernel start (its GPU stream is free; None: no bound)
    root: int = -1           # Broadcast root (comm rank)
    step: int = 0            # training step
    ordinal: int = 0         # index among this comm kind's instances in the step
    comm_ordinal: int = 0    # index among its communicator's instances in the step: a member's k-th collective of
                             # that kind (a rank is in one communicator of each kind; a pipeline stage runs
                             # only its share of the step's TP collectives, so ``ordinal`` would skip its first)
    algo: str = "Ring"
    nccl_seq: int = -1       # NCCL's coll.seqNumber: per communicator and function (-1: p2p, none)

    @property
    def is_p2p(self) -> bool:
        return self.func == "Send"


@dataclass
class Result:
    end: np.ndarray          # per member: time the rank's op completed (inf: never)
    blocks: list             # [Block] in causal order
    flows: list              # predicted per-flow counters (dicts), for tests and ground truth
    kstart: np.ndarray       # per member: kernel start
    issue: np.ndarray = None  # per member: when the rank actually called (after late/absent faults; inf: never)


@dataclass
class StepNoise:
    """Healthy per-step variation of one batch (arrays (S, C, positions); None: none), drawn from NoiseModel."""

    gpu: np.ndarray | None = None    # GPU time multiplier of each step
    wire: np.ndarray | None = None   # wire time multiplier of each step
    proxy: np.ndarray | None = None  # ns the proxy thread hands each send step to the network late (OS jitter)


def _kill(t: np.ndarray, thr: np.ndarray) -> np.ndarray:
    return np.where(t >= thr, INF, t)


def lognormal(rng: np.random.Generator, sigma: float, shape) -> np.ndarray | float:
    """Time multipliers with mean 1 (lognormal, log-sigma ``sigma``); 1.0 when sigma is 0."""
    if not sigma:
        return 1.0
    return np.exp(rng.normal(-sigma * sigma / 2, sigma, shape))


def log_uniform(rng: np.random.Generator, width: float, shape) -> np.ndarray | float:
    """Time multipliers spread log-uniformly over [1/sqrt(width), sqrt(width)]; 1.0 when width <= 1.

    A bounded spread: the capture's slowest flow sits at a steady ~1.5x of the median with a thin tail
    (p99 1.83x), which a lognormal cannot give (its max-of-n tail grows with sigma)."""
    if width <= 1.0:
        return 1.0
    h = np.log(width) / 2
    return np.exp(rng.uniform(-h, h, shape))


def step_noise(noise, rng: np.random.Generator, shape: tuple, net_hop: np.ndarray) -> StepNoise | None:
    """Per-step GPU, wire and proxy-thread variation of a batch of shape (S, C, positions)."""
    if not noise.any_step_noise:
        return None
    out = StepNoise()
    if noise.gpu_step_sigma:
        out.gpu = lognormal(rng, noise.gpu_step_sigma, shape)
    if noise.wire_sigma:
        out.wire = lognormal(rng, noise.wire_sigma, shape)
    if noise.os_p:
        hit = (rng.random(shape) < noise.os_p) & net_hop[None]
        late = np.minimum(noise.os_median_ns * np.exp(rng.normal(0.0, noise.os_sigma, shape)), noise.os_cap_ns)
        out.proxy = np.where(hit, late, 0.0)
    return out


def flow_waits(tm: dict) -> dict:
    """Per flow (C, positions) the time its steps spent waiting on the GPU and on the network, summed, as the
    plugin counts them: send GPU = SendGPUWait (posted -> ready), send net = SendWait (transmitted -> done);
    recv net = RecvWait (posted -> arrived), recv GPU = RecvGPUWait (flushed -> consumed)."""
    def total(a, b):
        with np.errstate(invalid="ignore"):  # inf - inf: a step that never got there waited nothing yet
            d = tm[b] - tm[a]
        return np.where(np.isfinite(d), d, 0.0).sum(axis=0)

    return {"send": (total("P", "G"), total("T", "D")), "recv": (total("F", "U"), total("Q", "A"))}


def _ring_index(K: int, L: int) -> tuple[np.ndarray, np.ndarray]:
    """(next, prev) column of every position when K rings of L positions sit side by side."""
    base = np.repeat(np.arange(K) * L, L)
    p = np.tile(np.arange(L), K)
    return base + (p + 1) % L, base + (p - 1) % L


def ring_times(m: int, sizes: np.ndarray, kstart, pstart, gpu_nspb, bw, lat, flush, ack,
               gpu_stall, send_stall, deliver_stall, dead, sleep_t, sleep_ns, K: int = 1,
               noise: "StepNoise | None" = None) -> dict:
    """Times of every step of K rings side by side, position space: arrays (S, C, K*L); hop p -> p+1 (mod L).

    ``sizes`` holds m x SLICES_PER_CHUNK steps per loop: stage j's slice k is step (loop*m + j)*2 + k, and the
    GPU handles a stage's slices in order before the next stage.
    """
    S = len(sizes)
    C, n = kstart.shape
    spc = SLICES_PER_CHUNK
    W = RING_WINDOW
    nxt, prv = _ring_index(K, n // K)
    out = {k: np.full((S, C, n), INF) for k in ("P", "G", "T", "D", "Q", "A", "F", "U")}
    P_, G_, T_, D_, Q_, A_, F_, U_ = (out[k] for k in ("P", "G", "T", "D", "Q", "A", "F", "U"))
    X = kstart.copy()
    wire = np.full((C, n), -INF)
    tprev = np.full((C, n), -INF)
    flush_in = flush[:, prv]
    gj, wj, pd = (noise.gpu, noise.wire, noise.proxy) if noise is not None else (None, None, None)
    for lp in range(S // (m * spc)):
        for j in range(m + 1):
            for k in range(spc):
                sr = (lp * m + j - 1) * spc + k if j >= 1 else -1
                s = (lp * m + j) * spc + k if j < m else -1
                b = float(sizes[s if s >= 0 else sr])
                gpu_ns = b * gpu_nspb if gj is None else b * gpu_nspb * gj[s if s >= 0 else sr]
                if s < 0:  # the last stage only receives
                    start = _kill(_kill(np.maximum(X, F_[sr]), gpu_stall), dead)
                    X = start + gpu_ns
                    U_[sr] = X
                    continue
                # +1 ns: the slot's previous step stops strictly before the next one starts
                P = pstart if s < W else np.maximum(pstart, D_[s - W] + 1)
                P_[s] = P = _kill(P, dead)
                Q = pstart if s < W else np.maximum(pstart, U_[s - W] + 1)
                Q_[s] = Q = _kill(Q, dead)
                start = np.maximum(X, P)
                if sr >= 0:
                    start = np.maximum(start, F_[sr])
                start = _kill(_kill(start, gpu_stall), dead)
                X = start + gpu_ns
                G_[s] = X
                if sr >= 0:
                    U_[sr] = X
                T = np.maximum(np.maximum(X, Q[:, nxt]), tprev)
                if pd is not None:
                    T = T + pd[s]
                T = _kill(_kill(T, send_stall), dead)
                T = np.where((T >= sleep_t) & (T < sleep_t + sleep_ns), sleep_t + sleep_ns, T)
                T_[s] = tprev = T
                wire = np.maximum(T, wire) + (b / bw if wj is None else b / bw * wj[s])
                A = np.where(T >= deliver_stall, INF, wire + lat)
                D_[s] = A + ack
                A_[s] = Ar = _kill(A[:, prv], dead)
                F_[s] = Ar + flush_in
    out["X"] = X
    return out


def chain_times(sizes: np.ndarray, kstart, pstart, gpu_nspb, bw, lat, flush, ack,
                gpu_stall, send_stall, deliver_stall, dead, sleep_t, sleep_ns, K: int = 1,
                noise: "StepNoise | None" = None) -> dict:
    """Times of K chains side by side (position 0 = root/sender, L-1 = last receiver), arrays (S, C, K*L)."""
    S = len(sizes)
    C, KL = kstart.shape
    L = KL // K
    cols = [np.arange(K) * L + p for p in range(L)]
    out = {k: np.full((S, C, KL), INF) for k in ("P", "G", "T", "D", "Q", "A", "F", "U")}
    P_, G_, T_, D_, Q_, A_, F_, U_ = (out[k] for k in ("P", "G", "T", "D", "Q", "A", "F", "U"))
    X = kstart.copy()
    wire = np.full((C, KL), -INF)
    tprev = np.full((C, KL), -INF)
    gj, wj, pd = (noise.gpu, noise.wire, noise.proxy) if noise is not None else (None, None, None)
    for s in range(S):
        b = float(sizes[s])
        for pi in range(L):
            p = cols[pi]
            start = X[:, p].copy()
            if pi < L - 1:
                Pp = (pstart[:, p] if s < abi.NCCL_STEPS
                      else np.maximum(pstart[:, p], D_[s - abi.NCCL_STEPS][:, p] + 1))
                P_[s][:, p] = Pp = _kill(Pp, dead[:, p])
                start = np.maximum(start, Pp)
            if pi > 0:
                start = np.maximum(start, F_[s][:, p])
            start = _kill(_kill(start, gpu_stall[:, p]), dead[:, p])
            Xp = start + b * gpu_nspb[:, p] * (1.0 if gj is None else gj[s][:, p])
            X[:, p] = Xp
            if pi > 0:
                U_[s][:, p] = Xp
            if pi < L - 1:
                G_[s][:, p] = Xp
                q = cols[pi + 1]
                Qq = (pstart[:, q] if s < abi.NCCL_STEPS
                      else np.maximum(pstart[:, q], U_[s - abi.NCCL_STEPS][:, q] + 1))
                Q_[s][:, q] = Qq = _kill(Qq, dead[:, q])
                T = np.maximum(np.maximum(Xp, Qq), tprev[:, p])
                if pd is not None:
                    T = T + pd[s][:, p]
                T = _kill(_kill(T, send_stall[:, p]), dead[:, p])
                T = np.where((T >= sleep_t[:, p]) & (T < sleep_t[:, p] + sleep_ns), sleep_t[:, p] + sleep_ns, T)
                T_[s][:, p] = tprev[:, p] = T
                wire[:, p] = np.maximum(T, wire[:, p]) + b / bw[:, p] * (1.0 if wj is None else wj[s][:, p])
                A = np.where(T >= deliver_stall[:, p], INF, wire[:, p] + lat[:, p])
                D_[s][:, p] = A + ack
                A_[s][:, q] = Ar = _kill(A, dead[:, q])
                F_[s][:, q] = Ar + flush[:, p]
    out["X"] = X
    return out


def simulate(inst: Instance, mods: Mods, model: TimingModel, slots: SlotAllocator, ctx_base: int,
             rng: np.random.Generator, predict: bool = True) -> Result:
    """Times and callbacks of one instance for all its members."""
    return simulate_batch([inst], [mods], model, slots, [ctx_base], rng, predict)[0]


def _shape(inst: Instance) -> tuple[np.ndarray, bool]:
    """(perm, chain): members in ring/chain order per channel (indexes into inst.members)."""
    comm = inst.comm
    C = comm.n_channels
    midx = np.full(comm.nranks, -1, dtype=np.int64)
    midx[inst.members] = np.arange(len(inst.members))
    if inst.is_p2p:
        return np.tile(np.arange(2), (C, 1)), True
    orders = comm.ring_orders()
    if inst.func in RING_STEPS_PER_LOOP:
        return midx[orders], False
    perm = np.stack([np.roll(o, -int(np.nonzero(o == inst.root)[0][0])) for o in orders])
    return midx[perm], True


def simulate_batch(insts: list, mods_list: list, model: TimingModel, slots: SlotAllocator, ctx_bases: list,
                   rng: np.random.Generator, predict: bool = True) -> list:
    """Time K instances of one schedule entry together (same function, size, communicator shape).

    Positions of the K rings/chains sit side by side (column k*L + p), members likewise (k*nm + i):
    one pass of vectorised numpy per step serves all of them.
    """
    K = len(insts)
    first = insts[0]
    comm0, nc, gpu, net = first.comm, model.nccl, model.gpu, model.net
    nm = len(first.members)
    C = comm0.n_channels
    dtsize = abi.DATATYPE_SIZES[abi.DATATYPE[nc.datatype]]
    cat = np.concatenate
    mem = cat([i.members for i in insts])                      # comm rank per member
    owner = cat([i.comm.ranks[i.members] for i in insts])      # global rank per member
    ctx = cat([(b + i.members) for i, b in zip(insts, ctx_bases)]).astype(np.uint32)
    m_absent = cat([m.absent[i.members] for i, m in zip(insts, mods_list)])
    m = {k: cat([getattr(md, k)[i.members] for i, md in zip(insts, mods_list)])
         for k in ("issue_delay", "launch_delay", "gpu_factor", "recv_bw_factor", "gpu_stall_t", "send_stall_t",
                   "dead_t", "proxy_sleep_t")}
    m_sbw = cat([md.send_bw_factor[:, i.members] for i, md in zip(insts, mods_list)], axis=1)
    m_deliver = cat([md.deliver_stall_t[:, i.members] for i, md in zip(insts, mods_list)], axis=1)
    # the sleep of the instances whose proxy thread sleeps: a sibling's unused default (1 s) must not stretch
    # a calibrated short sleep when the communicators of one schedule entry are timed as one batch
    sleep_ns = max((md.proxy_sleep_ns for md in mods_list if np.isfinite(md.proxy_sleep_t).any()), default=0.0)
    horizon = min(md.horizon for md in mods_list)
    issue = cat([np.asarray(i.issue, dtype=np.float64) for i in insts]) + m["issue_delay"]
    issue = np.where(m_absent, INF, issue)
    issue = _kill(issue, m["dead_t"])
    noise = model.noise
    launch = issue + 9 * gpu.api_gap_ns + m["launch_delay"]
    kstart = launch + gpu.kernel_launch_ns
    if any(i.kready is not None for i in insts):  # the kernel waits for the stream (earlier work on the GPU)
        kready = cat([np.asarray(i.kready if i.kready is not None else np.zeros(nm), dtype=np.float64)
                      for i in insts])
        kstart = np.maximum(kstart, kready)
    # A GPU that stalled runs no kernel it had not started: NCCL's KernelCh start comes from the GPU's own work
    # counter (the proxy reads workStarted), so no KernelCh either. The host still posts the ProxyOps.
    kstart = _kill(kstart, m["gpu_stall_t"])
    pstart = launch + gpu.proxy_post_ns
    funcs = [first.func] * (K * nm)
    counts = np.full(K * nm, first.count, dtype=np.uint64)
    peers = np.full(K * nm, -1, dtype=np.int32)
    if first.is_p2p:
        funcs = ["Send", "Recv"] * K
        peers = np.tile(np.asarray([first.members[1], first.members[0]], dtype=np.int32), K)
    hang_members = []
    for k, (i, md) in enumerate(zip(insts, mods_list)):
        for r, (f, cnt) in md.mismatch.items():
            hit = np.nonzero(i.members == r)[0]
            if len(hit):
                funcs[k * nm + hit[0]] = f
                counts[k * nm + hit[0]] = cnt
                hang_members.append(k * nm + hit[0])
    seqs = np.repeat([i.seq for i in insts], nm)
    nccl_seqs = np.repeat([i.nccl_seq for i in insts], nm)
    roots = np.repeat([i.root for i in insts], nm)
    blocks, coll_slot = _user_rows(first, issue, model, slots, ctx, owner, funcs, counts, peers, mem, seqs,
                                   nccl_seqs, roots)
    chunk = chunk_bytes(first.func, nc.step_bytes)
    sizes = step_sizes(first.func if not first.is_p2p else "Send", first.count, dtsize,
                       comm0.nranks if not first.is_p2p else 2, C, chunk)
    perms, chain = zip(*(_shape(i) for i in insts))
    chain = chain[0]
    L = perms[0].shape[1]
    perm = cat([p + k * nm for k, p in enumerate(perms)], axis=1)            # (C, K*L) global member index
    host_m = cat([i.comm.hosts[i.members] for i in insts])
    hosts = host_m[perm]
    nxt_i, prv_i = _ring_index(K, L)
    net_hop = hosts != hosts[:, nxt_i]
    last_col = np.arange(K) * L + L - 1
    first_col = np.arange(K) * L
    if chain:
        net_hop[:, last_col] = False
    end = np.full(K * nm, -INF)
    flows: list = []
    ch_m = np.broadcast_to(np.arange(C, dtype=np.uint8)[:, None], (C, K * nm))
    tree = first.algo == "Tree" and first.func == "AllReduce" and not first.is_p2p
    if tree:
        from mycroft_otel.sim.tree import tree_batch as _tree
        from mycroft_otel.sim.tree import tree_parents

        parent = tree_parents(insts, nm)                                  # (C, K*nm) column of the parent
        par = np.where(parent >= 0, parent, 0)
        tnet = (parent >= 0) & (host_m[None, :] != host_m[par])
        sizes = step_sizes("Broadcast", first.count, dtsize, comm0.nranks, C, nc.step_bytes)
    if tree and tnet.any():
        blocks_t, end, kstop, kst, flows = _tree(first, insts, nm, C, parent, par, tnet, sizes, kstart, pstart, m,
                                                 m_sbw, m_deliver, sleep_ns, ctx, owner, mem, coll_slot, model,
                                                 slots, rng, predict, horizon)
        blocks += blocks_t
    elif not net_hop.any() or tree:
        # Kernel-only (NVLink/P2P): everyone arrives, then the data moves at NVLink speed.
        total = sizes.sum() * C
        mm = RING_STEPS_PER_LOOP[first.func](comm0.nranks) if first.func in RING_STEPS_PER_LOOP else 1
        base = (mm * total / max(1, (comm0.nranks if not chain else 1)) / net.nvlink_bw + mm * net.nvlink_latency_ns)
        ks = kstart.reshape(K, nm)
        t_end = ks.max(axis=1) + base * m["gpu_factor"].reshape(K, nm).max(axis=1)
        bad = (m["gpu_stall_t"].reshape(K, nm) < t_end[:, None]).any(axis=1) | \
            (m["dead_t"].reshape(K, nm) < t_end[:, None]).any(axis=1)
        t_end = np.where(bad, INF, t_end)
        end = np.where(np.isfinite(kstart), np.repeat(t_end, nm), INF)
        kst = np.broadcast_to(kstart, (C, K * nm))
        kstop = np.where(np.isfinite(kst), np.broadcast_to(end, (C, K * nm)), INF)
    else:
        pos = perm
        gpu_nspb = (m["gpu_factor"] * log_uniform(rng, noise.gpu_spread, len(mem)) / gpu.reduce_bw)[pos]
        nic_flows = max(1, int(net_hop[:, :L].sum(axis=0).max()))  # a rank's net send flows share its NIC
        bw_net = np.minimum(net.link_bw, net.nic_bw / nic_flows) / log_uniform(rng, noise.flow_spread, pos.shape)
        sfac = np.take_along_axis(m_sbw, pos, axis=1)
        rfac = m["recv_bw_factor"][pos[:, nxt_i]]
        bw = np.where(net_hop, bw_net / (sfac * rfac), net.nvlink_bw)
        lat = np.where(net_hop, net.net_latency_ns, net.nvlink_latency_ns)
        flush = np.where(net_hop, net.flush_ns, 0.0)
        send_stall = np.where(net_hop, m["send_stall_t"][pos], INF)
        deliver = np.where(net_hop, np.take_along_axis(m_deliver, pos, axis=1), INF)
        sleep_t = np.where(net_hop, m["proxy_sleep_t"][pos], INF)
        args = (kstart[pos], pstart[pos], gpu_nspb, bw, lat, flush, net.ack_latency_ns,
                m["gpu_stall_t"][pos], send_stall, deliver, m["dead_t"][pos], sleep_t, sleep_ns)
        sn = step_noise(noise, rng, (len(sizes),) + pos.shape, net_hop)
        if chain:
            tm = chain_times(sizes, *args, K=K, noise=sn)
        else:
            tm = ring_times(RING_STEPS_PER_LOOP[first.func](comm0.nranks), sizes, *args, K=K, noise=sn)
        ctx_pos, own_pos, rank_pos, cslot_pos = ctx[pos], owner[pos], mem[pos], coll_slot[pos]
        S = len(sizes)
        nsteps = np.full(pos.shape, S, dtype=np.int32)
        hang = np.isin(pos, hang_members) if hang_members else np.zeros(pos.shape, bool)
        nsteps[hang] = S + abi.NCCL_STEPS
        send_mask = net_hop.copy()
        recv_mask = net_hop[:, prv_i]
        if chain:
            send_mask[:, last_col] = False
            recv_mask[:, first_col] = False
        peer_send = rank_pos[:, nxt_i]
        peer_recv = rank_pos[:, prv_i]
        bs, fs, send_end = _flow_rows(True, send_mask, rank_pos, peer_send, pos, tm, sizes, pstart[pos],
                                      cslot_pos, ctx_pos, own_pos, nsteps, chunk, slots, predict, hang,
                                      nc.peer_wait_retry_ns, horizon)
        br, fr, recv_end = _flow_rows(False, recv_mask, rank_pos, peer_recv, pos, tm, sizes, pstart[pos],
                                      cslot_pos, ctx_pos, own_pos, nsteps, chunk, slots, predict, hang)
        waits = flow_waits(tm)
        for f, (c, col) in zip(fs, zip(*np.nonzero(send_mask))):
            f["inst"] = int(col // L)
            f["gpu_wait_ns"], f["net_wait_ns"] = waits["send"][0][c, col], waits["send"][1][c, col]
        for f, (c, col) in zip(fr, zip(*np.nonzero(recv_mask))):
            f["inst"] = int(col // L)
            f["gpu_wait_ns"], f["net_wait_ns"] = waits["recv"][0][c, col], waits["recv"][1][c, col]
        flows = fs + fr
        inv = np.argsort(pos, axis=1)                               # column of member j on channel c
        xf = np.take_along_axis(tm["X"], inv, axis=1)               # (C, K*nm)
        kst = np.broadcast_to(kstart, (C, K * nm))
        kstop = np.where(np.isfinite(kst), xf, INF)
        op_end = np.maximum(np.where(send_mask, send_end, -INF), np.where(recv_mask, recv_end, -INF))
        end = np.maximum(kstop.max(axis=0), np.take_along_axis(op_end, inv, axis=1).max(axis=0))
        blocks += bs + br
    for j in hang_members:  # a rank that called something else never completes
        end[j] = INF
        kstop = np.array(kstop)
        kstop[:, j] = INF
    owner_c = np.broadcast_to(owner, (C, K * nm))
    ctx_c = np.broadcast_to(ctx, (C, K * nm))
    rk = np.broadcast_to(mem, (C, K * nm))
    kslot = slots.take(C * K * nm).reshape(C, K * nm)
    par = np.broadcast_to(coll_slot, (C, K * nm))
    blocks += [b for b in (
        block(kst, owner_c, KERNEL, op=abi.OP_START, type=abi.KERNEL_CH, slot=kslot, parent_slot=par, ctx=ctx_c,
              channel=ch_m, rank=rk, ptimer=np.where(np.isfinite(kst), kst, 0).astype(np.uint64)),
        block(kstop, owner_c, KERNEL, op=abi.OP_RECORD, slot=kslot, state=abi.S_KERNEL_CH_STOP, ctx=ctx_c, rank=rk,
              ptimer=np.where(np.isfinite(kstop), kstop, 0).astype(np.uint64)),
        block(kstop, owner_c, KERNEL, op=abi.OP_STOP, slot=kslot, ctx=ctx_c, rank=rk),
    ) if b is not None]
    # Nothing happens in a process after it died or froze.
    if np.isfinite(m["dead_t"]).any():
        dead_g = np.full(int(owner.max()) + 1, INF)
        dead_g[owner] = m["dead_t"]
        kept = []
        for b in blocks:
            ok = b.t < dead_g[b.owner]
            if ok.all():
                kept.append(b)
            elif ok.any():
                kept.append(Block(b.rows[ok], b.owner[ok], b.thread, b.t[ok]))
        blocks = kept
        end = np.where(end >= m["dead_t"], INF, end)
    results = []
    for k in range(K):
        sl = slice(k * nm, (k + 1) * nm)
        results.append(Result(end=end[sl], blocks=blocks if k == 0 else [],
                              flows=[f for f in flows if f["inst"] == k], kstart=kstart[sl], issue=issue[sl]))
    return results

