"""Typed Python face of the native core (``mycroft_otel._native``): import native things from here.

Two halves, mirroring ``native/bindings``:

* reading a plugin context's shared memory: :class:`RingReader` (header, live snapshot, completion
  ring with a cursor), :class:`ShmHeader` (the header as a dataclass), clock conversion
  (:func:`mono_to_realtime`; every shm timestamp is CLOCK_MONOTONIC ns) and name decoding;
* driving a profiler plugin exactly as NCCL does: :class:`Driver` and the event-row helpers
  (:func:`new_events`, :class:`EventType`, :class:`State`, :class:`Op`). Event rows use NCCL's newest
  (v7) event-type bits and state values; the Driver translates them for the ABI version it loaded.

Row conventions (``native/include/mycroft/driver_event.h``) beyond the header's comments:
``parent_slot = NO_SLOT`` for a NULL parent; a Coll/P2p START row carries its Group's handle slot in
``size`` as ``slot + 1`` (0 = none) -- v5+ pass it as ``parentGroup``, v4 as the parent;
``pid = 0`` means the driver's own pid; GroupApi ``step`` is the group depth (default 1);
KernelPhase ``step`` is the phase id; NetPlugin ``seq`` is the plugin's ``id``.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Iterator

import numpy as np

try:
    from mycroft_otel import _native
except ImportError as exc:  # pragma: no cover - depends on the build
    raise ImportError(
        "mycroft_otel._native is not built: run `pip install .` or the dev build "
        "(cmake -S . -B build/dev -G Ninja -DMYCROFT_INPLACE=ON && cmake --build build/dev)") from exc

RingReader = _native.RingReader
Driver = _native.Driver
log_messages = _native.log_messages
monotonic_ns = _native.monotonic_ns

HEADER_DTYPE: np.dtype = _native.HEADER_DTYPE
LIVE_OP_DTYPE: np.dtype = _native.LIVE_OP_DTYPE
RING_RECORD_DTYPE: np.dtype = _native.RING_RECORD_DTYPE
FLOW_DTYPE: np.dtype = _native.FLOW_DTYPE
OP_INFO_DTYPE: np.dtype = _native.OP_INFO_DTYPE
EVENT_DTYPE: np.dtype = _native.EVENT_DTYPE

FUNC_NAMES: tuple[str, ...] = _native.FUNC_NAMES
DATATYPE_NAMES: tuple[str, ...] = _native.DATATYPE_NAMES
DATATYPE_SIZES: tuple[int, ...] = _native.DATATYPE_SIZES
ALGO_NAMES: tuple[str, ...] = _native.ALGO_NAMES
PROTO_NAMES: tuple[str, ...] = _native.PROTO_NAMES
WAIT_STATE_NAMES: tuple[str, ...] = _native.WAIT_STATE_NAMES
OP_KIND_NAMES: tuple[str, ...] = _native.OP_KIND_NAMES
DIR_NAMES: tuple[str, ...] = _native.DIR_NAMES

MAX_FLOWS: int = _native.MAX_FLOWS
UNKNOWN_INDEX: int = _native.UNKNOWN_INDEX
NO_SLOT: int = _native.NO_SLOT
ABI_VERSIONS: tuple[int, ...] = _native.ABI_VERSIONS
RING_SUFFIX = ".mycroft"

#: OpInfo.flags bits
FLAG_FLOWS_TRUNCATED: int = _native.OP_FLAGS["FLOWS_TRUNCATED"]
FLAG_KERNEL_TIMES: int = _native.OP_FLAGS["KERNEL_TIMES"]
FLAG_ABORTED: int = _native.OP_FLAGS["ABORTED"]

EventType = enum.IntFlag("EventType", dict(_native.EVENT_TYPES), module=__name__)
EventType.__doc__ = "NCCL's profiler event-type bits (ncclProfileColl = 1 << 1, ...), newest ABI."
State = enum.IntEnum("State", dict(_native.STATES), module=__name__)
State.__doc__ = "NCCL's profiler event states (ncclProfilerProxyStepSendGPUWait = 8, ...), newest ABI."


class Op(enum.IntEnum):
    """What an event row does."""

    START = _native.OP_START
    STOP = _native.OP_STOP
    RECORD = _native.OP_RECORD


class OpKind(enum.IntEnum):
    NONE = 0
    COLL = 1
    P2P_SEND = 2
    P2P_RECV = 3


class WaitState(enum.IntEnum):
    NONE = 0
    SEND_GPU_WAIT = 1
    SEND_PEER_WAIT = 2
    SEND_WAIT = 3
    RECV_WAIT = 4
    RECV_FLUSH_WAIT = 5
    RECV_GPU_WAIT = 6


# --- names -----------------------------------------------------------------------------------------
def _name(table: tuple[str, ...], index: int) -> str:
    index = int(index)
    return table[index] if 0 <= index < len(table) else "unknown"


def func_name(index: int) -> str:
    return _name(FUNC_NAMES, index)


def datatype_name(index: int) -> str:
    return _name(DATATYPE_NAMES, index)


def datatype_size(index: int) -> int:
    index = int(index)
    return DATATYPE_SIZES[index] if 0 <= index < len(DATATYPE_SIZES) else 0


def algo_name(index: int) -> str:
    return _name(ALGO_NAMES, index)


def proto_name(index: int) -> str:
    return _name(PROTO_NAMES, index)


def wait_state_name(index: int) -> str:
    return _name(WAIT_STATE_NAMES, index)


def op_kind_name(index: int) -> str:
    return _name(OP_KIND_NAMES, index)


def dir_name(index: int) -> str:
    return _name(DIR_NAMES, index)


def index_of(table: tuple[str, ...], name: str) -> int:
    """Index of NAME in a name table (FUNC_NAMES, ...), UNKNOWN_INDEX when absent."""
    try:
        return table.index(name)
    except ValueError:
        return UNKNOWN_INDEX


# --- the header ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ShmHeader:
    """The ShmHeader of one plugin context (one file per process x communicator x rank)."""

    magic: int
    layout_version: int
    header_size: int
    live_slots: int
    ring_capacity: int
    live_offset: int
    ring_offset: int
    file_size: int
    job_id: str
    comm_name: str
    host: str
    plugin_version: str
    comm_hash: int
    comm_id: int
    rank: int
    nranks: int
    nnodes: int
    global_rank: int
    local_rank: int
    cuda_device: int
    pid: int
    abi_version: int
    activation_mask: int
    start_realtime_ns: int
    start_mono_ns: int
    ring_head: int
    heartbeat_ns: int
    finalized_ns: int
    ops_started: int
    ops_completed: int
    dropped_live_full: int
    dropped_bad_handle: int
    dropped_bad_descr: int
    dropped_flows: int
    pxn_foreign_ops: int
    p2p_send_count_total: int
    p2p_recv_count_total: int
    #: dropped_bad_handle by the callback it came in (names: shm_layout.h kBadHandleKindNames)
    bad_handle_by_kind: dict[str, int]
    #: KernelCh stops that came after a later launch had started; kept (the op waited for them)
    late_kernel_stops: int
    #: ncclGetVersion() of the NCCL that loaded the plugin (X*10000 + Y*100 + Z), 0 = unknown
    nccl_version: int

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ShmHeader":
        return cls(**{f.name: d[f.name] for f in fields(cls)})

    @property
    def comm_hash_hex(self) -> str:
        """The communicator hash as semconv writes it: 16 lowercase hex digits."""
        return f"{self.comm_hash & (2**64 - 1):016x}"

    @property
    def finalized(self) -> bool:
        return self.finalized_ns != 0

    def to_realtime(self, mono_ns):
        """CLOCK_MONOTONIC ns of this writer -> realtime (Unix epoch) ns; 0 stays 0. Arrays welcome."""
        return mono_to_realtime(mono_ns, self.start_realtime_ns, self.start_mono_ns)

    def writer_alive(self) -> bool:
        """Whether the writer's pid still exists on this host (False once it has died)."""
        return pid_alive(self.pid)


def mono_to_realtime(mono_ns, start_realtime_ns: int, start_mono_ns: int):
    """Convert CLOCK_MONOTONIC ns to realtime ns with the header's (realtime, monotonic) pair.

    Works on ints and numpy arrays; zero (\"not set\") stays zero.
    """
    if isinstance(mono_ns, np.ndarray):
        m = mono_ns.astype(np.int64)
        out = m - np.int64(start_mono_ns) + np.int64(start_realtime_ns)
        return np.where(m == 0, 0, out).astype(np.int64)
    mono_ns = int(mono_ns)
    return 0 if mono_ns == 0 else mono_ns - int(start_mono_ns) + int(start_realtime_ns)


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_header(reader: RingReader) -> ShmHeader:
    return ShmHeader.from_dict(reader.header())


def open_ring(path: str | os.PathLike[str]) -> RingReader:
    """Open one shm file read-only (ValueError naming the problem for a bad file)."""
    return RingReader(os.fspath(path))


def ring_files(ring_dir: str | os.PathLike[str]) -> list[Path]:
    """The plugin's shm files in RING_DIR (sorted; missing dir -> [])."""
    d = Path(ring_dir)
    if not d.is_dir():
        return []
    return sorted(p for p in d.iterdir() if p.name.endswith(RING_SUFFIX) and p.is_file())


def drain(reader: RingReader, cursor: int = 0, batch: int = 4096,
          skip_unpublished: bool = False) -> Iterator[tuple[np.ndarray, int, int]]:
    """Read the ring from CURSOR to its head in batches: yields (records, next_cursor, overwritten)."""
    while True:
        recs, cursor_next, lost = reader.read(cursor, batch, skip_unpublished)
        if len(recs) == 0 and lost == 0:
            return
        yield recs, cursor_next, lost
        if cursor_next == cursor:
            return
        cursor = cursor_next


def valid_flows(op_rows: np.ndarray) -> list[np.ndarray]:
    """Per LIVE_OP/RING_RECORD row, its flows[:n_flows]."""
    return [row["flows"][: int(row["op"]["n_flows"])] for row in np.atleast_1d(op_rows)]


def ring_ops(recs: np.ndarray) -> np.ndarray:
    """The op records of RING_RECORD rows as a contiguous array of their own (a copy that keeps no ~10 KB row
    alive): byte columns sliced out of the rows, about 5x cheaper than numpy's copy of a structured field."""
    op, offset = recs.dtype.fields["op"][:2]
    if not recs.flags.c_contiguous:
        return recs["op"].copy()
    rows = recs.view(np.uint8).reshape(len(recs), recs.dtype.itemsize)
    return rows[:, offset:offset + op.itemsize].copy().view(op).ravel()


def torn_slots(live: np.ndarray) -> np.ndarray:
    """Mask of live slots that never held still within the reader's retry budget (marked with an odd generation)."""
    return (live["generation"] & 1).astype(bool)


def torn_flows(flows: np.ndarray) -> np.ndarray:
    """Mask of flows caught mid-update by a writer that stopped (odd seqlock version)."""
    return (flows["version"] & 1).astype(bool)


# --- event rows --------------------------------------------------------------------------------------
def new_events(n: int) -> np.ndarray:
    """N zeroed event rows with NULL parents (parent_slot = NO_SLOT)."""
    ev = np.zeros(n, dtype=EVENT_DTYPE)
    ev["parent_slot"] = NO_SLOT
    return ev


def plugin_path() -> str:
    """The plugin shipped in this package (what NCCL_PROFILER_PLUGIN should point at)."""
    from mycroft_otel.paths import plugin_path as _plugin_path

    return str(_plugin_path())


__all__ = [
    "ABI_VERSIONS", "ALGO_NAMES", "DATATYPE_NAMES", "DATATYPE_SIZES", "DIR_NAMES", "Driver", "EVENT_DTYPE",
    "EventType", "FLAG_ABORTED", "FLAG_FLOWS_TRUNCATED", "FLAG_KERNEL_TIMES", "FLOW_DTYPE", "FUNC_NAMES",
    "HEADER_DTYPE", "LIVE_OP_DTYPE", "MAX_FLOWS", "NO_SLOT", "OP_INFO_DTYPE", "OP_KIND_NAMES", "Op", "OpKind",
    "PROTO_NAMES", "RING_RECORD_DTYPE", "RingReader", "ShmHeader", "State", "UNKNOWN_INDEX", "WAIT_STATE_NAMES",
    "WaitState", "algo_name", "datatype_name", "datatype_size", "dir_name", "drain", "func_name", "index_of",
    "log_messages", "mono_to_realtime", "monotonic_ns", "new_events", "op_kind_name", "open_ring", "pid_alive",
    "plugin_path", "proto_name", "read_header", "ring_files", "ring_ops", "torn_flows", "torn_slots", "valid_flows", "wait_state_name",
]
