"""One OS process of a conformance job: one or more ranks, each on one or more communicators, driven like NCCL.

    python rankproc.py CONFIG.json PROC_INDEX

Per (communicator, rank) context, threads shaped like NCCL's:
  * the user thread (one per rank) enqueues collectives: GroupApi -> CollApi/P2pApi -> KernelLaunch -> Group ->
    Coll/P2p start -> (ops handed to the proxy) -> Coll/P2p stop -> Group stop -> GroupApi stop, all at launch,
    keeping up to ``async_depth`` launches outstanding (a CUDA stream does not wait);
  * one proxy progress thread per context: ProxyOp start -> ProxyOpInProgress -> ProxySteps, with net.cc's
    shapes: a send step starts and enters SendGPUWait at once, records SendPeerWait on every isend attempt the
    peer refuses (the peer has not posted its irecv), SendWait when posted, stops when the network completed; a
    recv step is STARTED AGAIN while irecv is refused (the old handle never stopped), RecvWait, RecvFlushWait
    (data arrived), RecvGPUWait, stop when the GPU consumed it. transSize is passed on every state (stale except at
    SendWait / RecvFlushWait). Step numbers are per-op (0..n-1, NCCL 2.19+) or, with step_numbering=growing, keep
    growing across ProxyOps of a connection (older releases' base+posted);
  * KernelCh events in GPU-clock nanoseconds: on the proxy thread for v4/v5, on a separate thread for v7.

A communicator spans the world ranks in its ``members`` (default: every rank), in its rank order: a training
job's TP groups and DP rings (harness.tpdp_job). In such a ``layout`` a GPU runs the kernels of all its
communicators one after another, in launch order, as a training step's stream does.

Ranks exchange data through a shared file of counters (per communicator, channel and sending rank): transmitted
steps, irecv-posted steps, received steps, and when the last transmitted step becomes deliverable. So a fault on
one rank propagates to the others exactly as data dependencies say, across processes.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
import time

import mmap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nccl_ctypes as N  # noqa: E402

NEVER = 1 << 62
SLOW_LINKS = ("slow_flow", "slow_p2p", "slow_nic", "nic_both")  # faults that lengthen a step's time on the network
GPU_CLOCK_OFFSET = 987_654_321_000  # %globaltimer is not CLOCK_MONOTONIC: make that obvious
TX, RPOST, RECVD, AVAIL = 0, 1, 2, 4  # AVAIL..AVAIL+7: when step k (slot k % 8) is deliverable
NF = 12


def mono() -> int:
    return time.monotonic_ns()


class Job:
    def __init__(self, cfg: dict, proc_index: int) -> None:
        self.cfg = cfg
        self.proc_index = proc_index
        self.R = cfg["nranks"]
        self.comms = cfg["comms"]
        self.maxch = max(c["nch"] for c in self.comms)
        fd = os.open(cfg["net_file"], os.O_RDWR)
        self._mm = mmap.mmap(fd, 0)
        os.close(fd)
        self.net = memoryview(self._mm).cast("q")  # flat [comm][channel][src][field] int64 counters
        self.fault = cfg.get("fault") or {}
        self.rng = random.Random(cfg.get("seed", 1) * 1000 + proc_index)
        self.onset_lock = threading.Lock()
        self.stop_all = threading.Event()
        self.frozen_ranks: set[int] = set()
        self.durations: list = []
        self.ticks = self.tick_ns = 0
        # the proxy thread's pace: (wall ns, ms) of every pass that came PACE_GAP_MS or more after the one
        # before (the host gave this process no CPU): the report says whether the host slowed anybody else
        self.gaps: list[tuple[int, float]] = []
        # one CUDA stream per GPU across its communicators (a layout): a kernel starts when the previous
        # launch of that GPU, of any communicator, has finished, as ops ordered on a training step's stream do
        self.last_launch: dict[int, list] = {}
        self.fault_on = threading.Event()  # the culprit reached the fault's iteration (slow_proxy)

    def mark_onset(self, what: str) -> None:
        """The fault's first effect, once per job: several rank processes may reach it together (a NIC slow
        both ways slows its upstream's sends and its own), so each writes a file of its own and the first
        to link it in place wins (a link never replaces; a shared temporary name raced, and the loser's
        proxy thread died of the missing file, hanging its rank)."""
        with self.onset_lock:
            path = os.path.join(self.cfg["out_dir"], "onset.json")
            if os.path.exists(path):
                return
            tmp = f"{path}.{os.getpid()}"
            with open(tmp, "w") as f:
                json.dump({"onset_ns": time.time_ns(), "what": what}, f)
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass
            os.unlink(tmp)

    def row(self, cidx: int, ch: int, src: int) -> int:
        return ((cidx * self.maxch + ch) * self.R + src) * NF

    def is_culprit(self, rank: int) -> bool:
        """``rank``: a world rank (the launcher's RANK), as faults name them."""
        return self.fault.get("rank") == rank


# --- per-op state on one context -----------------------------------------------------------------------------

class Sub:
    """One ProxyOp (one channel, one direction) with net.cc's counters."""

    def __init__(self, op, ch: int, is_send: bool, peer: int, nsteps: int, base: int) -> None:
        self.op, self.ch, self.is_send, self.peer, self.n, self.base = op, ch, is_send, peer, nsteps, base
        self.posted = self.received = self.transmitted = self.done = 0
        self.handle = None
        self.steps: dict[int, int] = {}  # slot -> step handle
        self.trans_size = 0
        self.started = False
        self.peer_waited = -1


class Chan:
    """The GPU's view of one (op, channel): what the kernel produced (sends) and consumed (recvs)."""

    def __init__(self, nsend: int, nrecv: int, chained: bool) -> None:
        self.nsend, self.nrecv, self.chained = nsend, nrecv, chained
        self.produced = self.consumed = 0
        self.free_at = 0
        self.start_ns = 0  # GPU clock
        self.end_ns = 0
        self.ready_at = NEVER  # set when the previous kernel work on this channel finished
        self.kc_handle = None
        self.kc_started = self.kc_stopped = False


class Op:
    def __init__(self, ctx: "RankComm", handle, func: str, iteration: int, steps: int, nch: int, kind: str,
                 peer_send: int | None = None, peer_recv: int | None = None) -> None:
        self.ctx, self.handle, self.func, self.iteration = ctx, handle, func, iteration
        self.kind = kind
        self.subs: list[Sub] = []
        self.chans: dict[int, Chan] = {}
        self.done = threading.Event()
        self.nch = nch
        self.steps = steps
        self.t_launch = mono()
        self.gpu_done = False
        self.gpu_left = nch


def members(job: Job, cidx: int) -> list[int]:
    """The world ranks of communicator ``cidx``, in communicator-rank order (default: every rank)."""
    return job.comms[cidx].get("members") or list(range(job.R))


class RankComm:
    """One (communicator, rank) context: plugin context, proxy thread, kernel-channel emitter. ``rank`` is the
    rank in the communicator (what NCCL gives the profiler), ``world`` the process's global rank."""

    def __init__(self, job: Job, plugin: N.Plugin, cidx: int, world: int) -> None:
        c = job.comms[cidx]
        self.members = members(job, cidx)
        self.job, self.cidx, self.world, self.rank = job, cidx, world, self.members.index(world)
        self.spec = c
        self.R = len(self.members)
        self.nch = c["nch"]
        node_of = {r: i for i, rs in enumerate(job.cfg["nodes"]) for r in rs}
        nnodes = len({node_of[r] for r in self.members})
        self.ctx = plugin.init(int(c["hash"], 16), self.R, self.rank, nnodes, c.get("name"))
        self.v = plugin.version
        self.lock = threading.Lock()
        self.pending: list[Op] = []   # handed over, not yet picked up by the proxy
        self.active: list[Op] = []    # proxy's ops
        self.kernel_queue: list[Op] = []  # launch order (one stream)
        self.send_base = [0] * self.nch
        self.recv_base = [0] * self.nch
        self.chan_free = [0] * self.nch  # GPU clock when the channel's previous work ended (mono ns)
        self.seq = {}
        self.launches = 0
        self.gpu_step_ns = job.cfg["gpu_step_us"] * 1000
        self.net_step_ns = job.cfg["net_step_us"] * 1000
        self.kc_lock = threading.Lock()

    def fault_comm(self) -> bool:
        """Whether the fault acts on this communicator: the one it names (``comm``) or else the first."""
        want = self.job.fault.get("comm")
        return self.cidx == 0 if want is None else self.spec.get("name") == want

    # ---- user thread side ----
    def launch(self, items: list[dict], iteration: int) -> list[Op]:
        """One ncclGroupStart/End: items are {'func','count','steps'} or {'func':'Send'/'Recv','peer',...}."""
        ctx = self.ctx
        gapi = ctx.group_api_start(depth=1)
        if gapi:
            ctx.record(gapi, N.ST_GROUP_START_API_STOP)
        apis = []
        for it in items:
            if it["func"] in ("Send", "Recv"):
                apis.append(ctx.p2p_api(gapi, it["func"], it["count"], "ncclFloat32"))
            else:
                apis.append(ctx.coll_api(gapi, it["func"], it["count"], "ncclBfloat16"))
        if gapi:
            ctx.record(gapi, N.ST_GROUP_END_API_START)
        kl = ctx.kernel_launch(gapi)
        grp = ctx.group_start()
        self.launches += 1
        ops: list[Op] = []
        for it, api in zip(items, apis):
            if it["func"] in ("Send", "Recv"):
                nch = it["nch"]
                h = ctx.p2p_start(api, grp, it["func"], it["peer"], it["count"], "ncclFloat32", nch)
                op = Op(self, h, it["func"], iteration, it["steps"], nch, "p2p")
                for ch in range(nch):
                    if it["func"] == "Send":
                        op.chans[ch] = Chan(it["steps"], 0, False)
                        op.subs.append(Sub(op, ch, True, it["peer"], it["steps"], 0))
                    else:
                        op.chans[ch] = Chan(0, it["steps"], False)
                        op.subs.append(Sub(op, ch, False, it["peer"], it["steps"], 0))
            else:
                f = it["func"]
                seq = self.seq.get(f, 0)
                self.seq[f] = seq + 1
                h = ctx.coll_start(api, grp, seq, f, it["count"], "ncclBfloat16", self.nch)
                op = Op(self, h, f, iteration, it["steps"], self.nch, "ring")
                for ch in range(self.nch):
                    op.chans[ch] = Chan(it["steps"], it["steps"], True)
                    op.subs.append(Sub(op, ch, False, (self.rank - 1) % self.R, it["steps"], 0))
                    op.subs.append(Sub(op, ch, True, (self.rank + 1) % self.R, it["steps"], 0))
            op.launch = self.launches
            op.after = []
            op.by_ch = {ch: (next((s for s in op.subs if s.ch == ch and s.is_send), None),
                             next((s for s in op.subs if s.ch == ch and not s.is_send), None)) for ch in op.chans}
            ops.append(op)
        if self.job.cfg.get("layout"):  # a training job's GPU: one stream for all its communicators
            with self.job.onset_lock:
                before = self.job.last_launch.get(self.world, [])
                self.job.last_launch[self.world] = ops
            for op in ops:
                op.after = before
        with self.lock:  # proxy ops are appended before the task events stop
            self.pending.extend(ops)
            self.kernel_queue.extend(ops)
        for op in ops:
            ctx.stop(op.handle)  # Coll/P2p stop at launch, before their children are done
        ctx.stop(grp)
        ctx.stop(kl)
        ctx.stop(gapi)
        return ops

    # ---- device model (called from the proxy thread) ----
    def gpu_tick(self, now: int) -> None:
        job = self.job
        if self.world in self.job.frozen_ranks:
            return
        step_ns = self.gpu_step_ns
        f = job.fault
        if f.get("kind") == "slow_gpu" and job.is_culprit(self.world):
            step_ns = step_ns * f.get("factor", 6)  # (applied from the fault's iteration on, below)
        with self.lock:
            queue = list(self.kernel_queue)
        cur_launch = None
        for op in queue:
            if op.gpu_done:
                continue
            if cur_launch is None:
                cur_launch = op.launch
            elif op.launch != cur_launch:
                break  # one stream: the next kernel starts when every channel of this one has finished
            if any(not o.gpu_done for o in op.after):
                break  # the stream's previous kernel (another communicator's) still runs
            slow = f.get("kind") == "slow_gpu" and job.is_culprit(self.world) and op.iteration >= f["at_iter"]
            sns = step_ns if slow else self.gpu_step_ns
            if slow:
                job.mark_onset("slow gpu")
            for ch, cs in op.chans.items():
                if cs.end_ns:
                    continue
                if cs.ready_at == NEVER:
                    # this channel runs when the previous op on this stream finished it (one kernel at a time)
                    if self.chan_free[ch] < 0:
                        break
                    cs.ready_at = max(self.chan_free[ch], now) + 20_000
                    self.chan_free[ch] = -1  # busy
                if now < cs.ready_at:
                    continue
                if not cs.start_ns:
                    cs.start_ns = time.time_ns() + GPU_CLOCK_OFFSET
                    cs.free_at = now
                send, recv = op.by_ch[ch]
                progressed = True
                while progressed and now >= cs.free_at:
                    progressed = False
                    if self.gpu_frozen_now(op, cs):
                        return
                    # consume a flushed recv step (reduce) first, then produce the next send
                    if recv is not None and cs.consumed < recv.transmitted:
                        cs.consumed += 1
                        cs.free_at = max(cs.free_at, now) + sns
                        progressed = True
                        continue
                    can_produce = send is not None and cs.produced < cs.nsend and cs.produced < send.posted
                    if can_produce and cs.chained and cs.produced > cs.consumed:
                        can_produce = False  # ring: send k carries what recv k-1 brought
                    if can_produce:
                        cs.produced += 1
                        cs.free_at = max(cs.free_at, now) + sns
                        progressed = True
                if cs.produced >= cs.nsend and cs.consumed >= cs.nrecv and now >= cs.free_at:
                    cs.end_ns = time.time_ns() + GPU_CLOCK_OFFSET
                    self.chan_free[ch] = now
                    op.gpu_left -= 1
                    op.gpu_done = op.gpu_left == 0
            # next op only on channels this op has finished
        return

    def gpu_frozen_now(self, op: Op, cs: Chan) -> bool:
        f = self.job.fault
        if f.get("kind") == "gpu_stall" and self.job.is_culprit(self.world) and op.kind == "ring" \
                and op.iteration >= f["at_iter"] and self.fault_comm() and cs.consumed >= 2:
            self.job.frozen_ranks.add(self.world)
            self.job.mark_onset("gpu_stall")
            return True
        return False

    # ---- kernel channel events ----
    def kernel_tick(self) -> None:
        with self.kc_lock:
            with self.lock:
                queue = list(self.kernel_queue)
            for op in queue:
                for ch, cs in op.chans.items():
                    if cs.start_ns and not cs.kc_started:
                        cs.kc_handle = self.ctx.kernel_ch_start(op.handle, ch, cs.start_ns)
                        cs.kc_started = True
                    if cs.end_ns and cs.kc_started and not cs.kc_stopped:
                        self.ctx.kernel_ch_stop(cs.kc_handle, cs.end_ns)
                        cs.kc_stopped = True
            self.retire()

    def retire(self) -> None:
        with self.lock:
            keep = []
            for op in self.kernel_queue:
                kdone = all(cs.kc_stopped for cs in op.chans.values())
                pdone = all(s.done >= s.n and s.started for s in op.subs)
                if kdone and pdone:
                    op.done.set()
                    self.job.durations.append((op.func, op.steps, (mono() - op.t_launch) / 1e6, op.iteration,
                                               self.spec["hash"]))
                else:
                    keep.append(op)
            self.kernel_queue = keep

    # ---- proxy thread ----
    def proxy_tick(self, now: int) -> bool:
        busy = False
        with self.lock:
            new, self.pending = self.pending, []
        for op in new:  # ProxyOp start when the proxy picks the op up, then in progress
            for s in op.subs:
                if s.is_send:
                    s.base, self.send_base[s.ch] = self.send_base[s.ch], self.send_base[s.ch] + s.n
                else:
                    s.base, self.recv_base[s.ch] = self.recv_base[s.ch], self.recv_base[s.ch] + s.n
                s.handle = self.ctx.proxy_op_start(op.handle, s.ch, s.peer, s.n, self.job.cfg["chunk"], s.is_send)
                s.started = True
            for s in op.subs:
                self.ctx.record(s.handle, N.ST_PROXY_OP_IN_PROGRESS)
            self.active.append(op)
        for op in list(self.active):
            for s in op.subs:
                if s.done >= s.n:
                    continue
                busy |= (self.send_progress(s, now) if s.is_send else self.recv_progress(s, now))
            if all(s.done >= s.n for s in op.subs):
                for s in op.subs:  # NCCL stops all subs' ProxyOps together when args->done == nsubs
                    if s.handle is not None:
                        self.ctx.stop(s.handle)
                        s.handle = None
                self.active.remove(op)
        return busy

    def step_no(self, s: Sub, k: int) -> int:
        return s.base + k if self.job.cfg.get("step_numbering") == "growing" else k

    def flow_fault(self, s: Sub, kind: str) -> bool:
        f = self.job.fault
        if f.get("kind") != kind or s.op.iteration < f["at_iter"]:
            return False
        if kind == "nic_both":  # the culprit's NIC at a lower rate, both ways: what it sends and receives
            return self.fault_comm() and s.op.kind == "ring" and (
                self.job.is_culprit(self.world) or self.job.is_culprit(self.members[s.peer]))
        if not self.job.is_culprit(self.world):
            return False
        if kind == "nic_down":
            return True
        if kind == "slow_p2p":
            return self.cidx == 1 and s.op.kind == "p2p"
        if kind == "slow_nic":  # every flow the rank sends on the ring communicator, all channels
            return self.fault_comm() and s.op.kind == "ring"
        return self.fault_comm() and s.ch == f.get("channel", 0) and s.op.kind == "ring"

    def send_progress(self, s: Sub, now: int) -> bool:
        ctx, net, job = self.ctx, self.job.net, self.job
        row = job.row(self.cidx, s.ch, self.rank)
        busy = False
        if s.posted < s.n and s.posted < s.done + 8:
            k = s.posted
            s.steps[k % 8] = ctx.proxy_step_start(s.handle, self.step_no(s, k))
            s.posted += 1
            ctx.record(s.steps[k % 8], N.ST_SEND_GPU_WAIT, s.trans_size)  # stale transSize
            return True
        cs = s.op.chans[s.ch]
        if s.transmitted < s.posted and s.transmitted < cs.produced:
            k = s.transmitted
            h = s.steps.get(k % 8)
            if not (job.cfg.get("peerwait_once") and s.peer_waited == k):  # NCCL: on every attempt
                ctx.record(h, N.ST_SEND_PEER_WAIT, s.trans_size)
                s.peer_waited = k
            gk = s.base + k
            accept = net[row + RPOST] > gk and job.rng.random() > 0.1
            if accept and (self.flow_fault(s, "send_stall") or self.flow_fault(s, "nic_down")):
                if k >= 2 or s.op.iteration > job.fault["at_iter"]:
                    job.mark_onset("send refused")
                    accept = False
            if accept:
                s.trans_size = job.cfg["chunk"]
                s.transmitted += 1
                ctx.record(h, N.ST_SEND_WAIT, s.trans_size)
                lat = self.net_step_ns * (0.7 + 0.6 * job.rng.random())
                if any(self.flow_fault(s, kind) for kind in SLOW_LINKS):
                    lat *= job.fault.get("factor", 8)
                    job.mark_onset("slow flow")
                avail = now + int(lat)
                if self.flow_fault(s, "delivery_stall") and (k >= 2 or s.op.iteration > job.fault["at_iter"]):
                    job.mark_onset("delivery stalled")
                    avail = NEVER
                net[row + AVAIL + gk % 8] = avail
                net[row + TX] = gk + 1
                busy = True
        if s.done < s.transmitted:
            k = s.done
            if net[row + RECVD] > s.base + k:  # the network completed: the receiver has it
                ctx.stop(s.steps.pop(k % 8, None))
                s.done += 1
                busy = True
                self.maybe_signal(s)
        return busy

    def recv_progress(self, s: Sub, now: int) -> bool:
        ctx, job = self.ctx, self.job
        src = s.peer
        net = job.net
        row = job.row(self.cidx, s.ch, src)
        busy = False
        if s.posted < s.n and s.posted < s.done + 8:
            k = s.posted
            s.steps[k % 8] = ctx.proxy_step_start(s.handle, self.step_no(s, k))  # (re)start: old handle dropped
            if job.rng.random() < 0.25:
                return False  # irecv refused: NCCL will start this step again next round
            s.posted += 1
            net[row + RPOST] = max(net[row + RPOST], s.base + s.posted)
            ctx.record(s.steps[k % 8], N.ST_RECV_WAIT, s.trans_size)
            busy = True
        if s.received < s.posted:
            k = s.received
            gk = s.base + k
            if net[row + TX] > gk and now >= net[row + AVAIL + gk % 8]:
                s.received += 1
                s.trans_size = job.cfg["chunk"]
                h = s.steps.get(k % 8)
                ctx.record(h, N.ST_RECV_FLUSH_WAIT, s.trans_size)
                net[row + RECVD] = gk + 1
                s.transmitted += 1  # flushed (no GDR flush needed): handed to the GPU
                ctx.record(h, N.ST_RECV_GPU_WAIT, s.trans_size)
                busy = True
        if s.done < s.transmitted and s.op.chans[s.ch].consumed > s.done:
            k = s.done
            ctx.stop(s.steps.pop(k % 8, None))
            s.done += 1
            busy = True
        return busy

    def maybe_signal(self, s: Sub) -> None:
        f = self.job.fault
        if f.get("kind") in ("sigkill", "sigstop") and self.job.is_culprit(self.world) and self.fault_comm() \
                and s.op.kind == "ring" and s.op.iteration >= f["at_iter"] and s.ch == 0 and s.done >= s.n // 2:
            self.job.mark_onset(f["kind"])
            os.kill(os.getpid(), signal.SIGKILL if f["kind"] == "sigkill" else signal.SIGSTOP)


PACE_GAP_MS = 20  # a proxy pass this long after the previous one: the process was off the CPU (tick: 1 ms)


# --- threads ---------------------------------------------------------------------------------------------------

def proxy_loop(job: Job, rcs: list[RankComm], with_kernel: bool) -> None:
    """The rank's proxy progress thread (shared by its communicators, as NCCL shares it with split children).

    slow_proxy: from the fault's iteration on, the culprit's proxy thread gets the CPU only every ``sleep_ms``
    (a thread starved by other work on its core): its network steps are posted and completed late, while the
    GPU (modelled on this thread too, gpu_tick) keeps its pace."""
    f = job.fault
    starve_ns = int(f.get("sleep_ms", 0) * 1e6) if f.get("kind") == "slow_proxy" and \
        any(job.is_culprit(rc.world) for rc in rcs) else 0
    resume_at = 0
    # the pause between passes while ops are active: a real proxy spins; a job of many rank processes on a
    # small test host pauses longer so that its threads do not starve each other (the pace of every step)
    tick_s = job.cfg.get("proxy_tick_us", 300) / 1e6
    last = 0
    while not job.stop_all.is_set():
        t_tick = mono()
        if last and t_tick - last >= PACE_GAP_MS * 1e6:
            job.gaps.append((time.time_ns(), (t_tick - last) / 1e6))
        last = t_tick
        active = False
        for _ in range(2):  # NCCL's proxy loops over its ops as long as something moves
            busy = False
            now = mono()
            starving = starve_ns and job.fault_on.is_set()
            starved = starving and now < resume_at
            for rc in rcs:
                rc.gpu_tick(now)
                if not starved:
                    busy |= rc.proxy_tick(now)
            if starving and not starved:
                job.mark_onset("slow proxy")
                resume_at = now + starve_ns
            if not busy:
                break
        for rc in rcs:
            if with_kernel:
                rc.kernel_tick()
            else:
                rc.retire()
            active |= bool(rc.kernel_queue or rc.active)
        job.ticks += 1
        job.tick_ns += mono() - t_tick
        time.sleep(tick_s if active else 0.002)


def _profiled(fn):
    def run(*a):
        if not os.environ.get("CONF_PROFILE"):
            return fn(*a)
        import cProfile
        import pstats
        pr = cProfile.Profile()
        pr.enable()
        try:
            fn(*a)
        finally:
            pr.disable()
            pstats.Stats(pr, stream=sys.stderr).sort_stats("tottime").print_stats(12)
    return run


def kernel_loop(job: Job, rcs: list[RankComm]) -> None:  # NCCL 2.31+: the profiler thread polls the device
    while not job.stop_all.is_set():
        for rc in rcs:
            rc.kernel_tick()
        time.sleep(0.0005)


def user_loop(job: Job, rank: int, rcs: list[RankComm], done: threading.Event) -> None:
    cfg, f = job.cfg, job.fault
    R = job.R
    rng = random.Random(cfg.get("seed", 1))  # same schedule on every rank
    jit = random.Random(cfg.get("seed", 1) * 7919 + rank)
    outstanding: list[Op] = []
    depth = cfg.get("async_depth", 3)
    iters = cfg["iters"]
    world = rcs[0]
    for it in range(iters):
        culprit = job.is_culprit(rank) and it >= f.get("at_iter", 1 << 30)
        if culprit:
            job.fault_on.set()
        if culprit and f["kind"] == "absent":
            job.mark_onset("absent")
            while not job.stop_all.is_set():
                time.sleep(0.1)
            return
        if culprit and f["kind"] == "late" and it < f["at_iter"] + f.get("n_late", 6):
            time.sleep(f.get("late_ms", 150) / 1000)
            job.mark_onset("late")
        n_ar = 3 if rng.random() < cfg.get("group_prob", 0.25) else 1
        m = rng.choice([1, 1, 2])
        items = []
        for _ in range(n_ar):
            func, steps = "AllReduce", 2 * (R - 1) * m
            if culprit and f["kind"] == "mismatch_func":
                func, steps = "AllGather", (R - 1) * m
                job.mark_onset("mismatch")
            elif culprit and f["kind"] == "mismatch_count":
                steps = 2 * (R - 1) * (m + 1)
                job.mark_onset("mismatch")
            items.append({"func": func, "count": 1 << (20 + m), "steps": steps})
        if cfg.get("layout"):  # a training step: the all-reduces of every communicator, in order (TP, then DP)
            for rc in rcs:
                outstanding += rc.launch([dict(x, steps=x["steps"] // (R - 1) * (rc.R - 1)) for x in items], it)
        else:
            outstanding += world.launch(items, it)
        if not cfg.get("layout") and len(rcs) > 1 and cfg.get("pp_every", 3) and \
                it % cfg.get("pp_every", 3) == 1 % cfg.get("pp_every", 3):
            pp = rcs[1]
            pn = pp.nch
            items = [{"func": "Send", "peer": (rank + 1) % R, "count": 1 << 18, "steps": 3, "nch": pn},
                     {"func": "Recv", "peer": (rank - 1) % R, "count": 1 << 18, "steps": 3, "nch": pn}]
            outstanding += pp.launch(items, it)
        while len(outstanding) > depth and not job.stop_all.is_set():
            if outstanding[0].done.wait(0.05):
                outstanding.pop(0)
            outstanding = [o for o in outstanding if not o.done.is_set()] if len(outstanding) > depth else outstanding
        time.sleep(jit.uniform(0.001, 0.006))  # compute between iterations
    while outstanding and not job.stop_all.is_set():
        if outstanding[0].done.wait(0.05):
            outstanding.pop(0)
    done.set()


def main() -> int:
    cfg = json.load(open(sys.argv[1]))
    pidx = int(sys.argv[2])
    ranks = cfg["procs"][pidx]
    job = Job(cfg, pidx)

    def write_pace(*_signal) -> None:
        with open(os.path.join(cfg["out_dir"], f"pace.{pidx}"), "w") as fh:
            json.dump({"ranks": ranks, "gaps": job.gaps}, fh)
        if _signal:  # the harness stops a job that hangs: its pace says whether the host starved it
            os._exit(0)

    signal.signal(signal.SIGTERM, write_pace)
    plugin = N.Plugin(cfg["version"], cfg.get("plugin"))
    rank_comms: dict[int, list[RankComm]] = {}
    threads = []
    for r in ranks:  # communicator creation: every comm of every rank of this process (one mask int)
        rank_comms[r] = [RankComm(job, plugin, ci, r) for ci in range(len(cfg["comms"])) if r in members(job, ci)]
    with open(os.path.join(cfg["out_dir"], f"ready.{pidx}"), "w") as fh:
        fh.write(str(os.getpid()))
    while time.time() < cfg["t0"]:
        time.sleep(0.005)
    sep_kernel = cfg["version"] >= 7
    for r, rcs in rank_comms.items():
        threads.append(threading.Thread(target=_profiled(proxy_loop), args=(job, rcs, not sep_kernel), daemon=True))
        if sep_kernel:
            threads.append(threading.Thread(target=kernel_loop, args=(job, rcs), daemon=True))
    dones = []
    for r, rcs in rank_comms.items():
        d = threading.Event()
        dones.append(d)
        threads.append(threading.Thread(target=user_loop, args=(job, r, rcs, d), daemon=True))
    for t in threads:
        t.start()
    for d in dones:
        while not d.wait(0.2):
            pass
    job.stop_all.set()
    time.sleep(0.05)
    for rcs in rank_comms.values():  # ncclCommDestroy
        for rc in rcs:
            rc.ctx.finalize()
    with open(os.path.join(cfg["out_dir"], f"done.{pidx}"), "w") as fh:
        json.dump(job.durations, fh)
    write_pace()
    print("ticks", job.ticks, "avg us", job.tick_ns / max(1, job.ticks) / 1000, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
