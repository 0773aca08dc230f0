"""What the processor has learned, kept on disk (``--state-dir``) so that a restarted processor goes on from it.

A processor restarted from nothing (a crash, a rescheduled pod, an upgrade) relearns every communicator's nulls
before it can test again (``null_min_collectives``), loses a slowdown's gathering evidence, and pages a slowdown
it had named as a new incident. So the processor's timer writes a checkpoint every :data:`SAVE_EVERY_S` (less
often when writing took long: at most :data:`MAX_SHARE` of its time) and at a clean shutdown, and a processor
started on the same directory restores it before it takes spans.

Kept: the slowdown detector's memory (``memory.JobMemory``: nulls, levels, candidates' own spreads, CUSUMs, the
slowdowns and stragglers named, long waits, the communicator graph, kernel times), the duration baselines and
stall thresholds, the incident keys that make a later finding of an incident the same incident, the open
incidents (the pages), and the trace store's process index (which process each communicator's rank is, and the
latest collective it was seen in: without it, a hang's other communicators, whose snapshots the agents re-send
after the restart, read as ranks absent from nowhere instead of waits on the culprit named before). Not kept: the traces themselves (a hung collective's agents re-send its snapshots every
MYCROFT_SNAPSHOT_MS; a completed one is judged within a second of arriving) and the verdicts' history.

The file: a header (magic, :data:`VERSION`, payload length, SHA-256 of the payload) and the payload, the tables
pickled in one pass (a named slowdown's evidence is the same object as its candidate's CUSUM, and stays so). It
is read back only from the private state directory (published.open_private_dir) and only by an unpickler that
knows the tables' own types (:data:`_TYPES`): anything else in the file is an error, never code run. Bounded
as the memory is (MYCROFT_MAX_HISTORY_BYTES). A file that is torn, of another version, made under other design
constants (Settings.design) or with tables of the wrong types is ignored with a warning: the processor starts
from nothing, as without a checkpoint.

Times: the processor's monotonic clock is per boot and per machine, so the checkpoint records the clocks when
it was written and the restore moves every kept monotonic time by the clocks' difference less the time it was
down (wall clock): evidence and incidents age through the downtime as they would have in a running processor.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import pickle
import struct
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mycroft_otel.processor.open_incidents import Member, OpenIncident
from mycroft_otel.processor.memory import Durations
from mycroft_otel.processor.published import open_private_dir
from mycroft_otel.processor.sequential import Cusum, OwnSpreads, RobustNull

if TYPE_CHECKING:
    from mycroft_otel.processor.pipeline import Processor

log = logging.getLogger("mycroft_otel.processor")

FILE = "detector-history"
MAGIC = b"mycroft-history\n"
VERSION = 7  # 2: a communicator's kernel times keep the wait and the transfer (slower.py); 3: as KernelTime;
# 4: the hung communicators (incidents.Incidents._hung_comms); 5: a lateness kept per place of the step (CandidateKey);
# 6: a communicator's kernel times keep their place of the step (KernelTime.step); 7: a candidate's hit test and
# its strong test's own run (Cusum.hits, Cusum.strong_run)
_HEADER = struct.Struct("<16sIQ32s")  # magic, version, payload bytes, SHA-256 of the payload
SAVE_EVERY_S = 1.0  # evidence lost in a crash: at most this much (a slowdown gathers over ~1-3 s of collectives)
MAX_SHARE = 0.05    # of the timer's time spent writing checkpoints (a large history is written less often)

# The detector memory's tables that are kept, and the type of their values (None: plain containers).
_MEMORY: dict[str, type | None] = {
    "nulls": RobustNull, "levels": RobustNull, "own": OwnSpreads, "cusums": Cusum, "durations": Durations,
    "named": None, "stragglers": None, "waits": None, "sibling_durations": None,
    "_joined": None, "_linked": None, "_members": None, "_comms_of": None,
}
# The incident keys (incidents.Incidents), each (monotonic time, ...) or a table of such tuples.
_INCIDENT_LISTS = ("_hang_culprits", "_slow_hosts")
_INCIDENT_TABLES = ("_named", "_slow_comms", "_flow_ends", "_hung_comms")
_SECTIONS = ("clocks", "memory", "incidents", "open", "baselines", "stall_thresholds", "processes")

# What the unpickler may build: the tables' containers, numpy arrays and scalars, our records.
_TYPES = frozenset({
    ("collections", "deque"), ("collections", "OrderedDict"), ("builtins", "set"), ("builtins", "frozenset"),
    ("numpy", "dtype"), ("numpy", "ndarray"),
    *((m, n) for m in ("numpy.core.multiarray", "numpy._core.multiarray", "numpy.core.numeric",
                       "numpy._core.numeric") for n in ("_reconstruct", "scalar", "_frombuffer")),
    ("mycroft_otel.processor.sequential", "RobustNull"), ("mycroft_otel.processor.sequential", "Cusum"),
    ("mycroft_otel.processor.sequential", "OwnSpreads"), ("mycroft_otel.processor.keys", "NullKey"),
    ("mycroft_otel.processor.keys", "CandidateKey"), ("mycroft_otel.processor.memory", "Durations"),
    ("mycroft_otel.processor.memory", "KernelTime"),
    ("mycroft_otel.processor.open_incidents", "OpenIncident"), ("mycroft_otel.processor.open_incidents", "Member"),
})


class CheckpointError(ValueError):
    """A checkpoint that cannot be restored; the message says why."""


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _TYPES:
            raise CheckpointError(f"holds a {module}.{name}, which no table of the history is made of")
        return super().find_class(module, name)


@dataclass
class _Clocks:
    """The processor's clocks when a checkpoint was written or restored."""

    mono: float      # the detector's (Processor.mono)
    incident: float  # the pages' (OpenIncidents.clock)
    wall_ns: int     # the processor's wall clock (Processor.clock_ns): what the downtime is measured on

    @classmethod
    def of(cls, p: "Processor") -> "_Clocks":
        return cls(p.mono(), p.open_incidents.clock(), p.clock_ns())


def capture(p: "Processor") -> bytes:
    """The checkpoint of a processor, as the file holds it. Call under the processor's lock."""
    mem, inc = p.detector.mem, p.incidents
    state = {
        "design": repr(p.settings.design()),
        "clocks": _Clocks.of(p).__dict__,
        "memory": {name: getattr(mem, name) for name in _MEMORY},
        "incidents": {name: getattr(inc, name) for name in _INCIDENT_LISTS + _INCIDENT_TABLES},
        "open": p.open_incidents.by_job,
        "baselines": p.baselines.samples,
        "stall_thresholds": p.stall_thresholds._done,
        "processes": {"proc_of": p.store.proc_of, "seq_of": p.store.seq_of},
    }
    payload = pickle.dumps(state, protocol=5)
    return _HEADER.pack(MAGIC, VERSION, len(payload), hashlib.sha256(payload).digest()) + payload


def read(data: bytes, p: "Processor", max_bytes: int) -> dict:
    """The state a checkpoint file holds, checked against the processor that will restore it; raises
    CheckpointError naming what is wrong."""
    if len(data) < _HEADER.size:
        raise CheckpointError(f"{len(data)} bytes, shorter than its header")
    magic, version, size, digest = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CheckpointError("not a detector history (bad magic)")
    if version != VERSION:
        raise CheckpointError(f"format version {version}, this processor reads {VERSION}")
    payload = memoryview(data)[_HEADER.size:]
    if size > max_bytes or len(payload) != size:
        raise CheckpointError(f"payload of {len(payload)} bytes, header says {size} (at most {max_bytes})")
    if hashlib.sha256(payload).digest() != digest:
        raise CheckpointError("payload does not match its SHA-256 (torn or corrupt)")
    try:
        state = _Unpickler(io.BytesIO(payload)).load()
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 -- whatever a damaged pickle raises
        raise CheckpointError(f"unreadable payload ({type(exc).__name__}: {exc})") from None
    _check(state, p)
    return state


def _check(state: object, p: "Processor") -> None:
    """That an unpickled payload is a history's tables, of their types, made under ``p``'s design constants."""
    def fail(what: str) -> None:
        raise CheckpointError(f"payload's {what}")

    if not isinstance(state, dict) or not all(isinstance(state.get(k), dict) for k in _SECTIONS):
        fail("sections are not a detector history's")
    if state.get("design") != repr(p.settings.design()):
        raise CheckpointError("made under other detector design constants (Settings.design)")
    clocks = state["clocks"]
    if clocks.keys() != {"mono", "incident", "wall_ns"} or not all(isinstance(v, (int, float)) for v in clocks.values()):
        fail("clocks are not numbers")
    for name, kind in _MEMORY.items():
        table = state["memory"].get(name)
        if not isinstance(table, dict) or (kind is not None and not all(isinstance(v, kind) for v in table.values())):
            fail(f"memory table {name} is not a table of {kind.__name__ if kind else 'entries'}")
    for name in _INCIDENT_LISTS + _INCIDENT_TABLES:
        table = state["incidents"].get(name)
        entries = list(table.values()) if name in _INCIDENT_TABLES and isinstance(table, dict) else table
        if not isinstance(entries, list) or not all(
                isinstance(e, tuple) and e and isinstance(e[0], (int, float)) for e in entries):
            fail(f"incident table {name} is not (time, ...) entries")
    if not all(isinstance(v, OpenIncident) and all(isinstance(m, Member) for m in v.members)
               for v in state["open"].values()):
        fail("open incidents are not OpenIncident records")
    if not all(isinstance(state["processes"].get(k), dict) for k in ("proc_of", "seq_of")):
        fail("process index is not (communicator, rank) tables")
    for name in ("baselines", "stall_thresholds"):
        if not all(isinstance(v, deque) for v in state[name].values()):
            fail(f"{name} are not windows of durations")


def restore(p: "Processor", state: dict) -> None:
    """Put a checked state (:func:`read`) into a processor that has taken no span yet."""
    was, now = _Clocks(**state["clocks"]), _Clocks.of(p)
    down_s = max(0.0, (now.wall_ns - was.wall_ns) / 1e9)
    shift, shift_pages = now.mono - was.mono - down_s, now.incident - was.incident - down_s
    mem = p.detector.mem
    for name in _MEMORY:
        setattr(mem, name, state["memory"][name])
    for c in mem.cusums.values():
        c.updated_at += shift
    inc = p.incidents
    for name in _INCIDENT_LISTS:
        setattr(inc, name, [(t + shift, *rest) for t, *rest in state["incidents"][name]])
    for name in _INCIDENT_TABLES:
        setattr(inc, name, {k: (t + shift, *rest) for k, (t, *rest) in state["incidents"][name].items()})
    for job_inc in state["open"].values():
        job_inc.heard += shift_pages
        for m in job_inc.members:
            m.opened += shift_pages
            m.touched += shift_pages
    p.open_incidents.restore(state["open"])
    p.baselines.samples = state["baselines"]
    p.stall_thresholds._done = state["stall_thresholds"]
    p.store.restore(state["processes"]["proc_of"], state["processes"]["seq_of"])


class Checkpoint:
    """The checkpoint file of one state directory: :meth:`load` at start, :meth:`due` / :meth:`save` from the
    processor's timer."""

    def __init__(self, state_dir: str):
        self.dir_fd = open_private_dir(state_dir)
        self.next_at = 0.0  # the processor's monotonic clock at the next save

    def load(self, p: "Processor") -> bool:
        """Restore the directory's checkpoint into ``p``; False (and a warning that says why) when there is none
        to restore."""
        try:
            fd = os.open(FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.dir_fd)
        except FileNotFoundError:
            return False
        except OSError as exc:
            log.warning("detector history ignored: %s: %s", FILE, exc.strerror or exc)
            return False
        max_bytes = p.settings.max_history_bytes  # the payload's bound: the history's own
        with os.fdopen(fd, "rb") as f:
            data = f.read(_HEADER.size + max_bytes + 1)
        try:
            state = read(data, p, max_bytes)
        except CheckpointError as exc:
            log.warning("detector history ignored, starting from nothing: %s: %s", FILE, exc)
            return False
        restore(p, state)
        mem = p.detector.mem
        log.warning("detector history restored (%d bytes): %d nulls, %d candidates' evidence, %d open incidents",
                    len(data), len(mem.nulls), len(mem.cusums), len(p.open_incidents.by_job))
        return True

    def due(self, p: "Processor") -> bool:
        return p.mono() >= self.next_at

    def save(self, p: "Processor") -> None:
        """Write ``p``'s checkpoint: captured under its lock, written outside it (temporary file, then rename: a
        crash leaves the previous one whole). A failing directory (full, gone) costs the checkpoint, logged."""
        t0 = time.perf_counter()
        with p.lock:
            data = capture(p)
        tmp = f"{FILE}.{os.getpid()}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=self.dir_fd)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, FILE, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        except OSError as exc:
            log.error("cannot write the detector history to the state directory: %s", exc.strerror or exc)
        self.next_at = p.mono() + max(SAVE_EVERY_S, (time.perf_counter() - t0) / MAX_SHARE)

    def close(self) -> None:
        if self.dir_fd >= 0:
            os.close(self.dir_fd)
        self.dir_fd = -1
