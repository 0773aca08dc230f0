"""Building EVENT_DTYPE rows in bulk: blocks of rows plus who delivers them.

A :class:`Block` is a set of rows with the same shape of call (e.g. "every ProxyStep
START of this collective") and, per row, the global rank whose process makes the call
and the thread (user or proxy) it is made on. Blocks are emitted in causal order
(START before its RECORDs before its STOP, parents before children), so delivering
the blocks of one collective in order is already a valid NCCL call sequence per
context; real-time delivery sorts each thread's rows by time (stable, so ties keep
this order).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mycroft_otel.sim.abi import EVENT_DTYPE

# Calling thread of a row: the user thread (API, Group, Coll/P2p), the proxy progress thread (ProxyOp,
# ProxyStep) and the thread that reports kernel channels (KernelCh): NCCL's proxy thread up to 2.30, a
# dedicated profiler thread from 2.31. The runner delivers KERNEL rows from the proxy thread (runner._kernel_thread).
USER, PROXY, KERNEL = 0, 1, 2


@dataclass
class Block:
    rows: np.ndarray    # EVENT_DTYPE; t_ns holds the time, ctx the global context id
    owner: np.ndarray   # int64 global rank per row
    thread: int         # USER | PROXY | KERNEL
    t: np.ndarray       # float64 time per row (inf = never happens)


def block(t, owner, thread: int, **fields) -> Block | None:
    """Rows for every finite ``t``; other fields broadcast against ``t`` (scalars or arrays)."""
    t = np.asarray(t, dtype=np.float64)
    shape = t.shape
    fin = np.isfinite(t)
    n = int(fin.sum())
    if n == 0:
        return None
    if n == fin.size:  # the common case: write every field straight through numpy broadcasting, no copies
        rows = np.zeros(shape, dtype=EVENT_DTYPE)
        # In slices of the first axis of ~32k rows, so that all fields of a slice are written while it is in
        # cache (each field write walks the 96-byte records).
        per = max(1, n // shape[0]) if len(shape) else n
        step = max(1, 32768 // per) if len(shape) else 1
        vals = {k: np.asarray(v) for k, v in fields.items()}
        for a in range(0, shape[0] if len(shape) else 1, step):
            sl = slice(a, a + step) if len(shape) else ...
            r = rows[sl]
            r["t_ns"] = np.maximum(t[sl], 0).astype(np.uint64) + 1
            for name, v in vals.items():
                r[name] = np.broadcast_to(v, shape)[sl] if v.ndim else v
        own = np.broadcast_to(np.asarray(owner, dtype=np.int64), shape).reshape(-1)
        return Block(rows.reshape(-1), own, thread, t.reshape(-1))
    keep = fin.ravel()
    rows = np.zeros(n, dtype=EVENT_DTYPE)
    tk = t.ravel()[keep]
    rows["t_ns"] = np.maximum(tk, 0).astype(np.uint64) + 1
    for name, value in fields.items():
        v = np.asarray(value)
        rows[name] = np.broadcast_to(v, shape)[fin] if v.ndim else v
    own = np.broadcast_to(np.asarray(owner, dtype=np.int64), shape)[fin]
    return Block(rows, own, thread, tk)


def _u64(rows: np.ndarray) -> np.ndarray:
    return rows.view(np.uint64).reshape(-1, EVENT_DTYPE.itemsize // 8)


def cat_rows(parts: list) -> np.ndarray:
    """np.concatenate for EVENT_DTYPE arrays through a uint64 view (numpy's structured copy is ~20x slower)."""
    if len(parts) == 1:
        return parts[0].copy()
    return np.concatenate([_u64(p) for p in parts]).view(EVENT_DTYPE).reshape(-1)


def sort_rows(rows: np.ndarray) -> np.ndarray:
    """Rows stably sorted by t_ns (ties keep causal order), gathered through a uint64 view."""
    idx = np.argsort(rows["t_ns"], kind="stable")
    return _u64(rows)[idx].view(EVENT_DTYPE).reshape(-1)


class SlotAllocator:
    """Handle-table slots: every START takes the next one, modulo the driver's table size.

    A slot is reused only after ``modulo`` more STARTs, long after its event ended (or hung for good:
    a hung event gets no more rows).
    """

    def __init__(self, modulo: int = 1 << 22) -> None:
        self.next = 0
        self.modulo = modulo

    def take(self, n: int) -> np.ndarray:
        out = (np.arange(self.next, self.next + n, dtype=np.int64) % self.modulo).astype(np.uint32)
        self.next += n
        return out

    def reset(self) -> None:
        self.next = 0
