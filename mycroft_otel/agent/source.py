"""One shared-memory file (a rank context): its header, its ring cursor, its process.

A source wraps a reader with the ``_native.RingReader`` interface (``header()``,
``live()``, ``read(cursor, max_records)``, ``ring_head``, ``close()``), reads the
static header once (identity, clock pair, rank and communicator), drains the ring
from a cursor, snapshots the live table, and answers whether the training process
that writes it is running, stopped (SIGSTOP) or gone.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from mycroft_otel import ids
from mycroft_otel.agent.provenance import Provenance

ReaderFactory = Callable[[str], Any]


def default_reader_factory(path: str) -> Any:
    from mycroft_otel import _native  # the bindings; imported lazily so tests can inject readers

    return _native.RingReader(path)


PROC_RUNNING, PROC_STOPPED, PROC_EXITED = "running", "stopped", "exited"


def process_state(pid: int) -> str:
    """running | stopped (SIGSTOP, /proc state T) | exited (kill(pid, 0) -> ESRCH)."""
    if pid <= 0:
        return PROC_RUNNING
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return PROC_EXITED
    except PermissionError:
        return PROC_RUNNING  # another user's process (or another pid namespace): alive as far as we know
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        state = stat[stat.rindex(b")") + 2:stat.rindex(b")") + 3]
        if state in (b"T", b"t"):
            return PROC_STOPPED
        if state in (b"Z", b"X"):
            return PROC_EXITED  # a zombie no longer runs NCCL
    except (OSError, ValueError):
        pass
    return PROC_RUNNING


@dataclass
class Identity:
    """What makes a ring file the same context across agent restarts."""
    pid: int
    comm_hash: int
    rank: int
    start_mono_ns: int

    @property
    def key(self) -> str:
        return f"{self.pid}-{self.comm_hash:016x}-{self.rank}-{self.start_mono_ns}"


class RingSource:
    def __init__(self, path: str, reader: Any, cursor: int = 0):
        self.path = path
        self.reader = reader
        h = reader.header()
        self.header = h
        self.job_id: str = h.get("job_id", "") or ""
        self.comm_hash: int = int(h["comm_hash"])
        self.comm_hex = ids.comm_hash_hex(self.comm_hash)
        self.comm_name: str = h.get("comm_name", "") or ""
        self.rank: int = int(h["rank"])
        self.nranks: int = int(h["nranks"])
        self.nnodes: int = int(h["nnodes"])
        self.global_rank: int = int(h.get("global_rank", -1))
        self.local_rank: int = int(h.get("local_rank", -1))
        self.cuda_device: int = int(h.get("cuda_device", -1))
        self.host: str = h.get("host", "") or ""
        self.pid: int = int(h["pid"])
        self.abi_version: int = int(h.get("abi_version", 0))
        self.plugin_version: str = h.get("plugin_version", "") or ""
        self.start_mono_ns: int = int(h["start_mono_ns"])
        #: add to a CLOCK_MONOTONIC timestamp of the writer to get CLOCK_REALTIME
        self.mono_to_real: int = int(h["start_realtime_ns"]) - self.start_mono_ns
        self.identity = Identity(self.pid, self.comm_hash, self.rank, self.start_mono_ns)
        #: the job key trace ids are hashed with (salted with the ring's owner once its provenance is known)
        self.trace_job: str = self.job_id
        self.provenance: Provenance | None = None
        self.cursor = int(cursor)
        self.capacity: int = int(h.get("ring_capacity", 0))
        self.closed = False
        #: why the reader gave up on the file (it shrank, stopped being a regular file, faulted); '' while usable
        self.broken = ""

    def apply(self, prov: Provenance) -> None:
        """Carry what the ring's owner can vouch for (provenance.py) instead of the header's claims."""
        self.provenance = prov
        self.job_id, self.host, self.trace_job = prov.job_id, prov.host, prov.trace_job

    # --- reading ---------------------------------------------------------------------
    # The reader raises ValueError once the file is no longer what was validated at open
    # (shm_reader.h); the source remembers it so the agent retires the ring instead of
    # failing on it every poll.
    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except ValueError as exc:
            self.broken = str(exc)
            raise

    def read(self, max_records: int) -> tuple[np.ndarray, int]:
        """New completion records since the cursor (advances it) and how many were overwritten."""
        records, nxt, overwritten = self._call(self.reader.read, self.cursor, max_records)
        self.cursor = int(nxt)
        return records, int(overwritten)

    def live(self) -> np.ndarray:
        return self._call(self.reader.live)

    def refresh_header(self) -> dict:
        self.header = self._call(self.reader.header)
        return self.header

    @property
    def backlog(self) -> int:
        try:  # at most a ring's capacity (fixed at open): a rewritten head must not read as 2^62 waiting
            return min(max(0, int(self.reader.ring_head) - self.cursor), self.capacity)
        except Exception:
            return 0

    def process_state(self) -> str:
        return process_state(self.pid)

    def to_real(self, mono_ns: int) -> int:
        return mono_ns + self.mono_to_real if mono_ns else 0

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self.reader.close()
            except Exception:
                pass

