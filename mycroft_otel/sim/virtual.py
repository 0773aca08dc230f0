"""A simulated job on virtual time, advanced by its caller: the rings at any simulated instant.

:class:`VirtualJob` puts the plugin on the ABI driver's clock (``Driver.use_virtual_clock``) and
delivers the job's rows in time order, each at its exact simulated time, up to the time the caller
asks for (:meth:`VirtualJob.advance_to`). Between two calls nothing moves, so an agent polled and
a processor ticked at simulated instants see exactly what they would see live at those instants,
whatever the machine's load and however fast it runs: ``mycroft-otel eval --virtual`` is built on it.

Rows come from a producer thread timing the job step by step (as the real-time runner streams:
after each training step every row below the watermark, the earliest time any rank can still make
a call, is final), through a short queue, so memory stays bounded. Everything is delivered on the
caller's thread, one row at a time, so the plugin sees one causal order per run: a seed gives the
same rings, byte for byte.
"""

from __future__ import annotations

import queue
import threading
from collections import deque

import numpy as np

from mycroft_otel.sim.rows import Block, cat_rows, sort_rows
from mycroft_otel.sim.runner import RunConfig, _driver, _init_contexts, _merge_stats, virtual_epochs
from mycroft_otel.sim.simulation import Simulation

_QUEUE_CHUNKS = 4  # training steps timed ahead of delivery at most


class _Abort(Exception):
    """Raised in the producer when the job is closed early."""


class VirtualJob:
    """One simulated job on virtual time. Simulated time ``t`` (ns since the start of the job) reads
    ``mono_ns(t) = epoch_mono_ns + t`` on the plugin's (virtual) CLOCK_MONOTONIC and
    ``epoch_realtime_ns + t`` on its CLOCK_REALTIME."""

    def __init__(self, sim: Simulation, cfg: RunConfig):
        if cfg.realtime or cfg.multiprocess:
            raise ValueError("a virtual-time job is neither real-time nor multi-process")
        self.sim = sim
        self.cfg = cfg
        self.epoch_mono_ns, self.epoch_realtime_ns = virtual_epochs(cfg)
        self.driver = _driver(cfg)
        self.driver.use_virtual_clock(self.epoch_mono_ns, self.epoch_realtime_ns - self.epoch_mono_ns)
        self.ctx_map = _init_contexts(self.driver, sim, range(len(sim.contexts)), cfg)
        self.stats: dict = {}
        self.now_ns = 0            # simulated time delivered up to (inclusive)
        self._safe_ns = 0          # every row with t_ns <= this has arrived from the producer
        self._done = False         # the producer has sent everything
        self._chunks: deque[np.ndarray] = deque()  # time-sorted, time-disjoint, increasing
        self._q: queue.Queue = queue.Queue(maxsize=_QUEUE_CHUNKS)
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._produce, name="sim-virtual-producer", daemon=True)
        self._thread.start()

    # --- clocks --------------------------------------------------------------------------------
    def mono_ns(self) -> int:
        """The virtual CLOCK_MONOTONIC now (what the agent's clock reads)."""
        return self.epoch_mono_ns + self.now_ns

    def realtime_ns(self) -> int:
        """The virtual CLOCK_REALTIME now (what the processor's clock reads)."""
        return self.epoch_realtime_ns + self.now_ns

    @property
    def finished(self) -> bool:
        """Every row of the job has been delivered."""
        return self._done and not self._chunks

    # --- producer ------------------------------------------------------------------------------
    def _produce(self) -> None:
        sim = self.sim
        pending: list[Block] = []

        def put(item) -> None:
            while True:
                if self._stop.is_set():
                    raise _Abort
                try:
                    self._q.put(item, timeout=0.1)
                    return
                except queue.Full:
                    continue

        def flush(watermark: float) -> None:
            emit, keep = [], []
            for b in pending:
                ok = b.t < watermark
                if ok.all():
                    emit.append(b.rows)
                elif ok.any():
                    emit.append(b.rows[ok])
                    keep.append(Block(b.rows[~ok], b.owner[~ok], b.thread, b.t[~ok]))
                else:
                    keep.append(b)
            pending[:] = keep
            rows = sort_rows(cat_rows(emit)) if emit else None
            if rows is not None:
                rows["ctx"] = self.ctx_map[rows["ctx"]]
            # rows not emitted yet have t >= watermark, hence t_ns = floor(t) + 1 > floor(watermark)
            put((int(watermark) if np.isfinite(watermark) else None, rows))

        def on_step(_frac: float) -> None:
            fin = sim.ready[np.isfinite(sim.ready)]
            flush(float(fin.min()) if len(fin) else np.inf)

        try:
            sim.run(lambda inst, res: pending.extend(res.blocks), progress=on_step)
            flush(np.inf)
        except _Abort:
            return
        except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread
            self._error = exc
        try:
            put("end")
        except _Abort:
            pass

    def _pull(self) -> None:
        item = self._q.get()
        if item == "end":
            self._done = True
            if self._error is not None:
                raise RuntimeError(f"simulation failed: {self._error}") from self._error
            return
        safe, rows = item
        if rows is not None and len(rows):
            self._chunks.append(rows)
        self._safe_ns = safe if safe is not None else 2 ** 63

    # --- delivery ------------------------------------------------------------------------------
    def advance_to(self, t_ns: int) -> None:
        """Deliver every row up to simulated time ``t_ns`` (inclusive) at its time, then leave the clock
        at ``t_ns``. Time never goes back: an earlier ``t_ns`` only returns."""
        if self._closed:
            raise RuntimeError("the virtual job is closed")
        t_ns = int(t_ns)
        if t_ns < self.now_ns:
            return
        while not self._done and self._safe_ns < t_ns:
            self._pull()
        epoch = self.epoch_mono_ns
        while self._chunks:
            rows = self._chunks[0]
            n = int(np.searchsorted(rows["t_ns"], np.uint64(t_ns), side="right"))
            if n == 0:
                break
            _merge_stats(self.stats, self.driver.replay(rows[:n], epoch))
            if n == len(rows):
                self._chunks.popleft()
            else:
                self._chunks[0] = rows[n:]
                break
        self.now_ns = t_ns
        self.driver.time_ns = epoch + t_ns

    def truths(self) -> list[dict]:
        """The faults' ground truth, onsets on the run's (virtual) realtime."""
        out = self.sim.truths()
        for t in out:
            t["onset_ns"] = self.epoch_realtime_ns + t["onset_sim_ns"]
        return out

    def close(self) -> None:
        """Stop the producer and put the plugin back on the real clocks (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._q.get(timeout=0.05)
            except queue.Empty:
                pass
            self._thread.join(timeout=0.05)
        self._chunks.clear()
        # ncclCommDestroy finalizes each profiler context, which unmaps its ring file and frees its pools.
        # Without it a process that runs job after job (eval --corpus's workers) keeps every job's rings
        # mapped, and their files' space stays held after their directory is removed.
        for ctx in self.ctx_map:  # each once: close() runs its body once
            self.driver.finalize(int(ctx))
        self.driver.release_clock()

    def __enter__(self) -> "VirtualJob":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
