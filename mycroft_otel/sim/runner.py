"""Delivering a simulation to the real plugin through the ABI driver (mycroft_otel._native.Driver).

One plugin context per (simulated rank, communicator), created with ``Driver.init`` and
the environment a launcher gives that rank (RANK, LOCAL_RANK, WORLD_SIZE,
NCCL_HOSTID=<simulated host>, MYCROFT_RING_DIR, MYCROFT_JOB_ID), so each gets its own
shared-memory file exactly as in a real job. Modes:

* accelerated: no pacing; each collective instance is delivered as soon as it is timed
  (rows in causal order, one thread), then dropped: memory stays bounded at any scale. The plugin
  runs on virtual time (the driver's clock, set to each row's simulated time before the row is
  delivered), so the rings hold the exact simulated times: virtual CLOCK_MONOTONIC =
  VIRTUAL_MONO_EPOCH_NS + the row's t_ns, CLOCK_REALTIME = the run's realtime epoch + the same;
  virtual.py advances such a job in time order for an agent and processor on the same clock;
* real-time: every row is delivered at its simulated time from the epoch (CLOCK_MONOTONIC),
  user-thread calls from one thread, ProxyOp/ProxyStep/KernelCh from a proxy thread (NCCL 2.27-2.30; see
  _kernel_thread for 2.31+), each for every simulated host (_run_streaming says why), so a live agent sees the
  job as in production; a hang
  keeps the process alive, the stalled state in shm, until the run's duration ends;
* multi-process (real-time): each simulated host is an OS process with its own Driver, so
  ``process_exited`` is a real SIGKILL and ``sigstop`` a real SIGSTOP of that process.
"""

from __future__ import annotations

import json
import os
import queue
import select
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mycroft_otel.sim.rows import KERNEL, PROXY, USER, Block, cat_rows, sort_rows
from mycroft_otel.sim.simulation import Simulation

SLOTS = 1 << 22
#: Virtual CLOCK_MONOTONIC at simulated time 0: 1000 s, a plausible uptime; never 0, which the rings
#: and the agent read as "not set".
VIRTUAL_MONO_EPOCH_NS = 1_000_000_000_000


def find_plugin() -> str:
    """The packaged plugin, else a dev build under build/ (newest)."""
    from mycroft_otel import paths

    try:
        return str(paths.plugin_path())
    except FileNotFoundError:
        root = Path(__file__).resolve().parents[2] / "build"
        found = sorted(root.glob("*/native/" + paths.PLUGIN_NAME), key=lambda p: p.stat().st_mtime)
        if found:
            return str(found[-1])
        raise


@dataclass
class RunConfig:
    ring_dir: str
    job_id: str = "sim"
    realtime: bool = False
    multiprocess: bool = False
    duration_s: float | None = None    # real time: the process lives this long from the epoch
    plugin: str | None = None
    abi_version: int | None = None
    ring_records: int | None = None    # MYCROFT_RING_RECORDS per context (small for huge jobs)
    live_slots: int | None = None
    lead_s: float = 0.3                # real time: epoch this long after the contexts exist
    extra_env: dict = field(default_factory=dict)
    on_signal: object = None           # multi-process: called (truth, pid) right after a fault's signal
    quantum_ns: int = 0                # real time: deliver in bursts at multiples of this (0: exact times)
    realtime_epoch_ns: int | None = None  # virtual time: CLOCK_REALTIME at simulated time 0 (default: now)


class Progress:
    """A one-line progress bar on stderr (only when it is a terminal or forced)."""

    def __init__(self, label: str, enabled: bool | None = None):
        self.label = label
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.last = -1

    def __call__(self, frac: float, note: str = "") -> None:
        if not self.enabled:
            return
        pct = int(100 * min(1.0, max(0.0, frac)))
        if pct == self.last and not note:
            return
        self.last = pct
        bar = "#" * (pct // 4) + "." * (25 - pct // 4)
        sys.stderr.write(f"\r{self.label} [{bar}] {pct:3d}% {note}   ")
        sys.stderr.flush()

    def done(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


def _ctx_env(sim: Simulation, i: int, cfg: RunConfig) -> dict:
    c = sim.contexts[i]
    env = {"RANK": str(c.global_rank), "LOCAL_RANK": str(c.global_rank % sim.topo.gpus),
           "WORLD_SIZE": str(sim.topo.world), "NCCL_HOSTID": sim.topo.host_name(c.node),
           "MYCROFT_RING_DIR": cfg.ring_dir, "MYCROFT_JOB_ID": cfg.job_id}
    if cfg.ring_records:
        env["MYCROFT_RING_RECORDS"] = str(cfg.ring_records)
    if cfg.live_slots:
        env["MYCROFT_LIVE_SLOTS"] = str(cfg.live_slots)
    env.update(cfg.extra_env)
    return env


def _init_contexts(driver, sim: Simulation, indexes, cfg: RunConfig) -> np.ndarray:
    """Create the plugin contexts of ``indexes`` (global context ids); returns global id -> driver ctx."""
    ctx_map = np.full(len(sim.contexts), 0xFFFFFFFF, dtype=np.uint32)
    for i in indexes:
        c = sim.contexts[i]
        comm = sim.comms[c.kind][c.comm_index]
        ctx_map[i] = driver.init(comm.name, comm.comm_hash, comm.n_nodes, comm.nranks, c.comm_rank,
                                 comm_id=comm.comm_hash, env=_ctx_env(sim, i, cfg))
    return ctx_map


def _stream(blocks: list[Block], quantum_ns: int = 0) -> np.ndarray:
    """One thread's rows: concatenated, stably sorted by time (ties keep causal order); ctx stays global.

    With ``quantum_ns`` the times are rounded up to its multiples after sorting (monotone: the order
    stays causal), so the replaying thread wakes once per quantum instead of once per row.
    """
    if not blocks:
        from mycroft_otel.sim.abi import EVENT_DTYPE
        return np.zeros(0, dtype=EVENT_DTYPE)
    rows = sort_rows(cat_rows([b.rows for b in blocks]))
    if quantum_ns > 1:
        q = np.uint64(quantum_ns)
        rows["t_ns"] = (rows["t_ns"] + q - np.uint64(1)) // q * q
    return rows


def _remap(rows: np.ndarray, ctx_map: np.ndarray) -> np.ndarray:
    rows["ctx"] = ctx_map[rows["ctx"]]
    return rows


def _driver(cfg: RunConfig):
    from mycroft_otel import _native

    return _native.Driver(cfg.plugin or find_plugin(), cfg.abi_version, SLOTS)


def _merge_stats(total: dict, st: dict) -> None:
    for k, v in st.items():
        if isinstance(v, (int, float)):
            total[k] = max(total.get(k, 0), v) if k.startswith("max") else total.get(k, 0) + v


def run(sim: Simulation, cfg: RunConfig, progress: Progress | None = None) -> dict:
    """Simulate and deliver; returns {"truth": [...], "stats": {...}, ...} (see cli.py for the JSON)."""
    Path(cfg.ring_dir).mkdir(parents=True, exist_ok=True, mode=0o700)
    progress = progress or Progress("sim", enabled=False)
    if not cfg.realtime:
        return _run_accelerated(sim, cfg, progress)
    return _run_realtime(sim, cfg, progress)


def virtual_epochs(cfg: RunConfig) -> tuple[int, int]:
    """(virtual CLOCK_MONOTONIC, CLOCK_REALTIME) at simulated time 0 of a run on virtual time.

    Realtime is an epoch fixed per run (the wall clock when it starts, unless the caller fixes it, as a
    deterministic evaluation does) advancing with simulated time, so spans land where a trace store
    expects a job that ran now and every ring, agent and processor of the run agrees on it.
    """
    real0 = cfg.realtime_epoch_ns if cfg.realtime_epoch_ns is not None else time.time_ns()
    return VIRTUAL_MONO_EPOCH_NS, int(real0)


def _run_accelerated(sim: Simulation, cfg: RunConfig, progress: Progress) -> dict:
    driver = _driver(cfg)
    epoch, real0 = virtual_epochs(cfg)
    driver.use_virtual_clock(epoch, real0 - epoch)  # init stamps the headers at simulated time 0
    try:
        t0 = time.monotonic()
        ctx_map = _init_contexts(driver, sim, range(len(sim.contexts)), cfg)
        t_init = time.monotonic() - t0
        stats: dict = {}

        def sink(inst, res) -> None:
            if not res.blocks:
                return
            # Causal order across blocks: a flow's step s+8 starts only after step s stopped (NCCL_STEPS).
            # Each row sets the driver's clock to epoch + t_ns: its exact simulated time (no pacing).
            rows = sort_rows(cat_rows([b.rows for b in res.blocks]))
            rows["ctx"] = ctx_map[rows["ctx"]]
            _merge_stats(stats, driver.replay(rows, epoch))

        t1 = time.monotonic()
        sim.run(sink, progress=lambda f: progress(f, f"{sim.n_rows / 1e6:.1f}M events"))
        wall = time.monotonic() - t1
    finally:
        driver.release_clock()  # the plugin must not keep reading a clock nobody advances
    progress.done()
    truths = sim.truths()
    for t in truths:
        t["onset_ns"] = real0 + t["onset_sim_ns"]
    return {"mode": "accelerated", "truth": truths, "stats": stats, "events": sim.n_rows, "init_s": t_init,
            "wall_s": wall, "contexts": len(sim.contexts), "steps": sim.steps_done, "driver": driver,
            "epoch_mono_ns": epoch, "epoch_realtime_ns": real0}


def _kernel_thread(cfg: RunConfig) -> int:
    """The thread KernelCh rows are delivered from: the proxy thread, for every ABI version.

    NCCL 2.31+ (v7) reports kernel channels from a dedicated profiler thread, but there a channel can
    only finish after its proxy transfers (the kernel waits for the data). Replayed from a third thread,
    a lagging proxy thread would let KernelCh stops overtake the ProxyOps they depend on and complete
    ops early in the plugin; on the proxy thread the rows keep NCCL's causal order.
    """
    return PROXY


def _on_thread(b: Block, kernel_thread: int) -> Block:
    """The block as the thread that replays it delivers it (KernelCh rows moved to ``kernel_thread``)."""
    return Block(b.rows, b.owner, kernel_thread, b.t) if b.thread == KERNEL and kernel_thread != KERNEL else b


def _thread_streams(blocks: list[Block], kernel_thread: int) -> dict:
    """thread -> list of blocks, every host's together."""
    out: dict = {}
    for b in blocks:
        b = _on_thread(b, kernel_thread)
        out.setdefault(b.thread, []).append(b)
    return out


def _host_streams(blocks: list[Block], world_hosts: np.ndarray, kernel_thread: int = KERNEL) -> dict:
    """(host, thread) -> list of blocks (rows split by the owner's host)."""
    out: dict = {}
    for b in blocks:
        b = _on_thread(b, kernel_thread)
        h = world_hosts[b.owner]
        for host in np.unique(h):
            sel = h == host
            part = b if sel.all() else Block(b.rows[sel], b.owner[sel], b.thread, b.t[sel])
            out.setdefault((int(host), b.thread), []).append(part)
    return out


def _run_realtime(sim: Simulation, cfg: RunConfig, progress: Progress) -> dict:
    if not cfg.multiprocess:
        return _run_streaming(sim, cfg, progress)
    blocks: list[Block] = []
    sim.run(lambda inst, res: blocks.extend(res.blocks))
    world_hosts = np.arange(sim.topo.world) // sim.topo.gpus
    streams = {key: _stream(lst, cfg.quantum_ns) for key, lst in
               _host_streams(blocks, world_hosts, _kernel_thread(cfg)).items()}
    blocks.clear()
    last_t = max((float(r["t_ns"][-1]) for r in streams.values() if len(r)), default=0.0)
    duration_ns = cfg.duration_s * 1e9 if cfg.duration_s is not None else last_t + 0.5e9
    truths = sim.truths()
    hosts_ctx: dict[int, list[int]] = {}
    for i, c in enumerate(sim.contexts):
        hosts_ctx.setdefault(c.node, []).append(i)
    return _run_multiprocess(sim, cfg, progress, streams, hosts_ctx, duration_ns, truths)


def _run_streaming(sim: Simulation, cfg: RunConfig, progress: Progress) -> dict:
    """Real time in one process, generating while delivering: memory stays bounded for long runs.

    A producer thread times the job step by step; after each training step it hands every replaying
    thread the rows that can no longer be preceded by later ones (t below the watermark = the earliest
    time any rank can issue its next call), sorted. The epoch is set once the first step is ready.
    """
    from mycroft_otel import _native

    driver = _driver(cfg)
    ctx_map = _init_contexts(driver, sim, range(len(sim.contexts)), cfg)
    # One user-thread and one proxy-thread replayer for every simulated host: the hosts share this machine's
    # cores, and a replayer of each host's own, scheduled later than the others' on a busy machine, would post
    # that host's steps late collective after collective, which is exactly a slow proxy or NIC there. Two
    # replayers delay every host alike, which the processor's comparisons across ranks cancel.
    kth = _kernel_thread(cfg)
    queues: dict = {th: queue.Queue() for th in (USER, PROXY)}
    pending: list[Block] = []
    first = threading.Event()
    state = {"last_t": 0.0, "error": None, "sim_t": 0.0}

    def flush(watermark: float) -> None:
        emit, keep = [], []
        for b in pending:
            ok = b.t < watermark
            if ok.all():
                emit.append(b)
            elif ok.any():
                emit.append(Block(b.rows[ok], b.owner[ok], b.thread, b.t[ok]))
                keep.append(Block(b.rows[~ok], b.owner[~ok], b.thread, b.t[~ok]))
            else:
                keep.append(b)
        pending[:] = keep
        if emit:
            state["last_t"] = max(state["last_t"], max(float(b.t.max()) for b in emit))
        for th, lst in _thread_streams(emit, kth).items():
            queues[th].put(_remap(_stream(lst, cfg.quantum_ns), ctx_map))

    def on_step(_frac: float) -> None:
        fin = sim.ready[np.isfinite(sim.ready)]
        state["sim_t"] = float(fin.min()) if len(fin) else np.inf
        flush(state["sim_t"])
        first.set()

    def produce() -> None:
        try:
            sim.run(lambda inst, res: pending.extend(res.blocks), progress=on_step)
            flush(np.inf)
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            state["error"] = exc
        finally:
            for q in queues.values():
                q.put(None)
            first.set()

    producer = threading.Thread(target=produce, name="sim-producer", daemon=True)
    t_start = time.monotonic()
    producer.start()
    first.wait()
    if cfg.duration_s is not None and producer.is_alive():
        # Head start: if timing the job is slower than real time on this machine, let the producer get far
        # enough ahead that it finishes about when the run does (rather than delivering late).
        rate = state["sim_t"] / max(1e-3, time.monotonic() - t_start) / 1e9  # simulated s per wall s
        ahead = cfg.duration_s * 1e9 * max(0.0, 1.0 - rate / 1.25)
        while producer.is_alive() and state["sim_t"] < ahead:
            progress(state["sim_t"] / max(1.0, ahead), "preparing")
            time.sleep(0.05)
    epoch = _native.monotonic_ns() + int(cfg.lead_s * 1e9)
    real_epoch = time.time_ns() + (epoch - _native.monotonic_ns())
    results: list[dict] = []

    def consume(q: queue.Queue) -> None:
        while True:
            rows = q.get()
            if rows is None:
                return
            if len(rows):
                results.append(driver.replay(rows, epoch))

    threads = [threading.Thread(target=consume, args=(q,), name=f"sim-{('user', 'proxy')[th]}", daemon=True)
               for th, q in queues.items()]
    for th in threads:
        th.start()
    if cfg.duration_s is not None:
        _wait_until(epoch, cfg.duration_s * 1e9, progress, lambda: False)
    else:
        producer.join()
        _wait_until(epoch, state["last_t"] + 0.5e9, progress, lambda: False)
    producer.join(timeout=5)
    for th in threads:
        th.join(timeout=5)
    if state["error"] is not None:
        raise state["error"]
    stats: dict = {}
    for st in results:
        _merge_stats(stats, st)
    truths = sim.truths()
    for t in truths:
        t["onset_ns"] = real_epoch + t["onset_sim_ns"]
    if np.isfinite(sim.gpu).all():  # a job whose streams all drained ends normally (destroy: finalize)
        for i in range(len(sim.contexts)):
            driver.finalize(int(ctx_map[i]))
    progress.done()
    return {"mode": "realtime", "truth": truths, "stats": stats, "events": sim.n_rows,
            "contexts": len(sim.contexts), "steps": sim.steps_done, "epoch_mono_ns": epoch,
            "epoch_realtime_ns": real_epoch, "driver": driver}


def _wait_until(epoch: int, duration_ns: float, progress: Progress, stop) -> None:
    from mycroft_otel import _native

    end = epoch + duration_ns
    while True:
        now = _native.monotonic_ns()
        if now >= end or stop():
            break
        progress(max(0.0, (now - epoch) / duration_ns), f"{max(0, now - epoch) / 1e9:.1f}s")
        time.sleep(min(0.2, (end - now) / 1e9))


def _wait_replayed(replayed: dict[int, int], host: int, timeout_s: float = 30.0) -> None:
    """Block until ``host`` said it has replayed all its rows (or it died, or ``timeout_s``); once per host.

    A host with a process fault has no row at or after the onset (the engine's ``dead_t``), so a host done
    replaying is one whose collectives are in flight as they were at the onset: what a kill mid-collective
    needs. On time that is just before the onset; a host forked late (a loaded machine) catches up at full
    speed first, and signalling it as soon as its contexts existed would kill it before any collective."""
    fd = replayed.get(host, -1)
    if fd < 0:
        return
    select.select([fd], [], [], timeout_s)
    os.close(fd)
    replayed[host] = -1


def _run_multiprocess(sim, cfg, progress, streams, hosts_ctx, duration_ns, truths) -> dict:
    from mycroft_otel import _native

    n_ctx_max = max(len(v) for v in hosts_ctx.values())
    epoch = _native.monotonic_ns() + int((cfg.lead_s + 0.3 + 0.002 * n_ctx_max) * 1e9)
    real_epoch = time.time_ns() + (epoch - _native.monotonic_ns())
    for t in truths:
        t["onset_ns"] = real_epoch + t["onset_sim_ns"]
    sys.stdout.flush()
    sys.stderr.flush()
    pids: dict[int, int] = {}
    pipes: dict[int, int] = {}
    replayed: dict[int, int] = {}  # host -> read end that gets one byte once it has replayed all its rows
    for host, ctxs in sorted(hosts_ctx.items()):
        rfd, wfd = os.pipe()
        replayed_r, replayed_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the simulated host: its own Driver, its ranks' contexts, two calling threads
            code = 0
            os.close(rfd)
            os.close(replayed_r)
            try:
                driver = _driver(cfg)
                ctx_map = _init_contexts(driver, sim, ctxs, cfg)
                mine = [_remap(streams[(host, th)], ctx_map) for th in (USER, PROXY, KERNEL) if (host, th) in streams]
                got: list[dict] = []
                ths = [threading.Thread(target=lambda r=rows: got.append(driver.replay(r, epoch)), daemon=True)
                       for rows in mine]
                for th in ths:
                    th.start()
                for th in ths:
                    th.join()
                os.write(replayed_w, b"1")
                st: dict = {}
                for x in got:
                    _merge_stats(st, x)
                os.write(wfd, json.dumps(st).encode())  # delivery stats for the parent (small: fits the pipe)
                while _native.monotonic_ns() < epoch + duration_ns:
                    time.sleep(0.05)
            except BaseException as exc:  # noqa: BLE001 - report and leave without running the parent's code
                print(f"sim host {host}: {exc}", file=sys.stderr)
                code = 1
            os._exit(code)
        os.close(wfd)
        os.close(replayed_w)
        pids[host] = pid
        pipes[host] = rfd
        replayed[host] = replayed_r
    # Signals for the process faults, at their onset.
    actions = []
    for t in truths:
        if t.get("signal"):
            host = int(t["culprit_hosts"][0].removeprefix("sim-node"))
            actions.append((epoch + t["onset_sim_ns"], host, getattr(signal, t["signal"]), t))
    actions.sort(key=lambda a: a[0])
    stopped = []
    end = epoch + duration_ns
    while True:
        now = _native.monotonic_ns()
        while actions and actions[0][0] <= now:
            _, host, sig, t = actions.pop(0)
            pid = pids[host]
            _wait_replayed(replayed, host)  # mid-collective, even on a host that started late
            try:
                os.kill(pid, sig)
                t["signal_sent_ns"] = time.time_ns()
                t["pid"] = pid
                if sig == signal.SIGSTOP:
                    stopped.append(pid)
                if cfg.on_signal is not None:
                    cfg.on_signal(t, pid)
            except ProcessLookupError:
                pass
        if now >= end:
            break
        progress(max(0.0, (now - epoch) / duration_ns), f"{max(0, now - epoch) / 1e9:.1f}s")
        nxt = min([end] + [a[0] for a in actions])
        time.sleep(max(0.0, min(0.1, (nxt - now) / 1e9)))
    for pid in stopped:  # a frozen host is killed at the end of the run (like a job timeout)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    codes = {}
    for host, pid in pids.items():
        deadline = time.monotonic() + 10
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                codes[host] = status
                break
            if time.monotonic() > deadline:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                deadline = float("inf")
            time.sleep(0.01)
    for fd in replayed.values():
        if fd >= 0:
            os.close(fd)
    stats: dict = {}
    for host, fd in pipes.items():
        with os.fdopen(fd, "rb") as f:
            data = f.read()
        if data:
            _merge_stats(stats, json.loads(data))
    progress.done()
    return {"mode": "multiprocess", "truth": truths, "stats": stats, "events": sim.n_rows,
            "contexts": len(sim.contexts), "steps": sim.steps_done, "epoch_mono_ns": epoch,
            "epoch_realtime_ns": real_epoch, "host_pids": pids, "exit_status": codes}
