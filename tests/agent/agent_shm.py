"""A numpy writer (and reader) of the shared-memory layout, for agent tests.

It writes files in exactly the layout of native/include/mycroft/shm_layout.h (the
dtypes below mirror the C structs; a test checks them against ``_native``'s when the
bindings are built), so the agent can be tested with deterministic timings and with
writer processes that are frozen or killed, independently of the plugin. The
real plugin is exercised through ``_native.Driver`` in test_plugin_e2e.py.
"""

from __future__ import annotations

import mmap
import os
import time
from pathlib import Path

import numpy as np

MAGIC = 0x315446524359434D
LAYOUT_VERSION = 4
MAX_FLOWS = 64
MAX_KERNEL_CHANNELS = 32
BAD_HANDLE_KINDS = 11

FLOW = np.dtype([
    ("version", "<u4"), ("peer", "<i4"), ("channel", "u1"), ("dir", "u1"), ("wait_state", "u1"),
    ("n_proxy_ops", "u1"), ("n_steps", "<u4"), ("posted", "<u4"), ("ready", "<u4"), ("transmitted", "<u4"),
    ("done", "<u4"), ("wait_step", "<u4"), ("chunk_size", "<u4"), ("bytes", "<u8"), ("first_ns", "<u8"),
    ("last_progress_ns", "<u8"), ("wait_since_ns", "<u8"), ("end_ns", "<u8"), ("gpu_wait_ns", "<u8"),
    ("net_wait_ns", "<u8"), ("gpu_busy_ns", "<u8"), ("net_busy_ns", "<u8"), ("peer_busy_ns", "<u8")],
    align=True)
OP = np.dtype([
    ("op_id", "<u8"), ("seq", "<u8"), ("nccl_seq", "<u8"), ("count", "<u8"), ("bytes", "<u8"), ("kind", "u1"),
    ("func", "u1"), ("datatype", "u1"), ("algo", "u1"), ("proto", "u1"), ("n_channels", "u1"), ("n_flows", "u1"),
    ("abi_version", "u1"), ("root_or_peer", "<i4"), ("flags", "<u4"), ("api_ns", "<u8"), ("start_ns", "<u8"),
    ("launch_ns", "<u8"), ("end_ns", "<u8"), ("kernel_start_ns", "<u8"), ("kernel_end_ns", "<u8"),
    ("proxy_ops_started", "<u4"), ("proxy_ops_stopped", "<u4"), ("kernel_ch_started", "<u4"),
    ("kernel_ch_stopped", "<u4"), ("last_progress_ns", "<u8"), ("user_tag", "<u8"), ("kch_valid", "<u4"),
    ("reserved", "<u4")], align=True)
KCH = np.dtype([("start_ns", "<u8"), ("end_ns", "<u8"), ("phase_start_ns", "<u8", (3,)),
                ("phase_end_ns", "<u8", (3,))], align=True)
assert FLOW.itemsize == 120 and OP.itemsize == 144 and KCH.itemsize == 64


def _pad64(dt: np.dtype) -> np.dtype:
    size = (dt.itemsize + 63) & ~63
    return np.dtype({"names": dt.names, "formats": [dt.fields[n][0] for n in dt.names],
                     "offsets": [dt.fields[n][1] for n in dt.names], "itemsize": size})


LIVE = _pad64(np.dtype([("generation", "<u4"), ("state", "<u4"), ("reserved", "<u8"), ("op", OP),
                        ("flows", FLOW, (MAX_FLOWS,)), ("kch", KCH, (MAX_KERNEL_CHANNELS,))], align=True))
RECORD = _pad64(np.dtype([("seq", "<u8"), ("reserved", "<u8"), ("op", OP), ("flows", FLOW, (MAX_FLOWS,)),
                          ("kch", KCH, (MAX_KERNEL_CHANNELS,))], align=True))
HEADER = _pad64(np.dtype([
    ("magic", "<u8"), ("layout_version", "<u4"), ("header_size", "<u4"), ("live_slots", "<u4"),
    ("ring_capacity", "<u4"), ("live_offset", "<u4"), ("ring_offset", "<u4"), ("file_size", "<u8"),
    ("job_id", "S64"), ("comm_name", "S64"), ("host", "S64"), ("plugin_version", "S16"), ("comm_hash", "<u8"),
    ("comm_id", "<u8"), ("rank", "<i4"), ("nranks", "<i4"), ("nnodes", "<i4"), ("global_rank", "<i4"),
    ("local_rank", "<i4"), ("cuda_device", "<i4"), ("pid", "<i4"), ("abi_version", "<u4"),
    ("activation_mask", "<i4"), ("reserved0", "<u4"), ("start_realtime_ns", "<u8"), ("start_mono_ns", "<u8"),
    ("ring_head", "<u8"), ("heartbeat_ns", "<u8"), ("finalized_ns", "<u8"), ("ops_started", "<u8"),
    ("ops_completed", "<u8"), ("dropped_live_full", "<u8"), ("dropped_bad_handle", "<u8"),
    ("dropped_bad_descr", "<u8"), ("dropped_flows", "<u8"), ("pxn_foreign_ops", "<u8"),
    ("p2p_send_count_total", "<u8"), ("p2p_recv_count_total", "<u8"), ("bad_handle_by_kind", "<u8", (BAD_HANDLE_KINDS,)),
    ("late_kernel_stops", "<u8"), ("nccl_version", "<u4"), ("reserved1", "<u4"), ("reserved", "<u8", (3,))], align=True))

KIND_COLL, KIND_SEND, KIND_RECV = 1, 2, 3
ALLREDUCE, SEND, RECV = 4, 6, 7


class FakeRing:
    """Writes one rank context's file. Not concurrency-safe against a reader beyond what the tests need."""

    def __init__(self, path: str | Path, *, rank: int, nranks: int, comm_hash: int = 0x5F3A9C0E12AB44D1,
                 job_id: str = "job-1", host: str = "node-0", live_slots: int = 8, ring_capacity: int = 64,
                 pid: int | None = None, global_rank: int | None = None, nnodes: int = 1, abi_version: int = 6):
        self.path = str(path)
        live_off = (HEADER.itemsize + 63) & ~63
        ring_off = live_off + live_slots * LIVE.itemsize
        size = ring_off + ring_capacity * RECORD.itemsize
        fd = os.open(self.path + ".tmp", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.ftruncate(fd, size)
        os.posix_fallocate(fd, 0, size)  # as the plugin does: every byte reserved (the agent refuses sparse files)
        self.mm = mmap.mmap(fd, size)
        os.close(fd)
        self.h = np.ndarray((), HEADER, self.mm, 0)
        self.live = np.ndarray((live_slots,), LIVE, self.mm, live_off)
        self.ring = np.ndarray((ring_capacity,), RECORD, self.mm, ring_off)
        h = self.h
        h["layout_version"] = LAYOUT_VERSION
        h["header_size"] = HEADER.itemsize
        h["live_slots"], h["ring_capacity"] = live_slots, ring_capacity
        h["live_offset"], h["ring_offset"], h["file_size"] = live_off, ring_off, size
        h["job_id"], h["host"], h["plugin_version"] = job_id.encode(), host.encode(), b"0.1.0"
        h["comm_name"] = b""
        h["comm_hash"], h["rank"], h["nranks"], h["nnodes"] = comm_hash, rank, nranks, nnodes
        h["global_rank"] = rank if global_rank is None else global_rank
        h["local_rank"] = rank
        h["cuda_device"] = rank % 8
        h["pid"] = os.getpid() if pid is None else pid
        h["abi_version"] = abi_version
        h["start_realtime_ns"] = time.time_ns()
        h["start_mono_ns"] = time.monotonic_ns()
        h["magic"] = MAGIC
        self.mm.flush()
        os.rename(self.path + ".tmp", self.path)
        self.rank, self.nranks = rank, nranks
        self.next_op_id = 1
        self.seq = {KIND_COLL: 0}

    # --- building ops --------------------------------------------------------------------
    def make_op(self, *, func: int = ALLREDUCE, kind: int = KIND_COLL, seq: int | None = None, count: int = 1 << 20,
                start_ns: int | None = None, end_ns: int = 0, peers: tuple[int, int] | None = None,
                n_channels: int = 2, peer: int = -1, steps: int = 8, done: int | None = None,
                wait_state: tuple[int, int] = (0, 0)) -> np.ndarray:
        """An op (LIVE dtype element, usable for ring records too) of a ring all-reduce (or p2p)."""
        rec = np.zeros((), LIVE)
        op = rec["op"]
        op["op_id"] = self.next_op_id
        self.next_op_id += 1
        if seq is None:
            key = kind if kind == KIND_COLL else (kind, peer)
            seq = self.seq.get(key, 0)
            self.seq[key] = seq + 1
        now = time.monotonic_ns()
        start = now if start_ns is None else start_ns
        op["seq"], op["nccl_seq"], op["count"], op["bytes"] = seq, seq, count, count * 4
        op["kind"], op["func"], op["datatype"], op["algo"], op["proto"] = kind, func, 7, 1, 2
        op["n_channels"] = n_channels
        op["abi_version"] = 6
        op["root_or_peer"] = peer
        op["api_ns"] = start
        op["start_ns"] = start + 1000
        op["launch_ns"] = start + 5000
        op["end_ns"] = end_ns
        op["proxy_ops_started"] = 2 * n_channels
        op["proxy_ops_stopped"] = 2 * n_channels if end_ns else 0
        op["kernel_ch_started"] = n_channels
        op["kernel_ch_stopped"] = n_channels if end_ns else 0
        op["last_progress_ns"] = end_ns or start + 6000
        if kind == KIND_COLL:
            prev, nxt = peers if peers else ((self.rank - 1) % self.nranks, (self.rank + 1) % self.nranks)
            flows = [(c, 0, nxt) for c in range(n_channels)] + [(c, 1, prev) for c in range(n_channels)]
        else:
            flows = [(0, 0 if kind == KIND_SEND else 1, peer)]
        op["n_flows"] = len(flows)
        d = steps if done is None else done
        for i, (c, di, p) in enumerate(flows):
            f = rec["flows"][i]
            f["peer"], f["channel"], f["dir"] = p, c, di
            f["n_proxy_ops"], f["n_steps"], f["posted"] = 1, steps, steps
            f["ready"] = min(steps, d + 1)
            f["transmitted"] = min(steps, d + 1) if di == 0 else d
            f["done"] = d
            f["wait_step"] = d if d < steps else 0
            f["wait_state"] = wait_state[di] if d < steps else 0
            f["chunk_size"], f["bytes"] = 1 << 19, d * (1 << 19)
            f["first_ns"] = start + 6000
            f["last_progress_ns"] = op["last_progress_ns"]
            f["wait_since_ns"] = op["last_progress_ns"] if d < steps else 0
            f["end_ns"] = end_ns if d >= steps else 0
            f["gpu_wait_ns"], f["net_wait_ns"] = 1000 * (i + 1), 2000 * (i + 1)
            f["gpu_busy_ns"], f["net_busy_ns"] = 1000 * (i + 1), 2000 * (i + 1)
        return rec

    def begin(self, rec: np.ndarray) -> int:
        """Put an op in the live table; returns the slot."""
        for i in range(len(self.live)):
            if self.live[i]["state"] == 0:
                self.live[i]["generation"] += 1
                self.live[i]["op"] = rec["op"]
                self.live[i]["flows"] = rec["flows"]
                self.live[i]["generation"] += 1
                self.live[i]["state"] = 1
                self.h["ops_started"] += 1
                self.h["heartbeat_ns"] = time.monotonic_ns()
                return i
        raise RuntimeError("live table full")

    def complete(self, rec: np.ndarray, slot: int | None = None) -> None:
        """Publish a completed op in the ring (and free its live slot)."""
        if slot is not None:
            self.live[slot]["state"] = 0
        head = int(self.h["ring_head"])
        r = self.ring[head % len(self.ring)]
        r["seq"] = 0
        r["op"] = rec["op"]
        r["flows"] = rec["flows"]
        r["kch"] = rec["kch"]
        r["seq"] = head + 1
        self.h["ring_head"] = head + 1
        self.h["ops_completed"] += 1

    def op_done(self, **kw) -> np.ndarray:
        """Make and publish a completed op taking ``dur_ns`` (default 1 ms), ending now."""
        dur = kw.pop("dur_ns", 1_000_000)
        now = time.monotonic_ns()
        rec = self.make_op(start_ns=now - dur, end_ns=now, **kw)
        self.complete(rec)
        return rec

    def finalize(self) -> None:
        self.h["finalized_ns"] = time.monotonic_ns()

    def close(self) -> None:
        try:
            self.mm.close()
        except (BufferError, ValueError):
            pass


class FakeReader:
    """The ``_native.RingReader`` interface over a file, in numpy (read-only mapping)."""

    def __init__(self, path: str):
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if size < HEADER.itemsize:
                raise ValueError(f"{path}: truncated")
            self.mm = mmap.mmap(fd, size, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        self.h = np.ndarray((), HEADER, self.mm, 0)
        if int(self.h["magic"]) != MAGIC:
            raise ValueError(f"{path}: bad magic")
        if int(self.h["file_size"]) > size:
            raise ValueError(f"{path}: truncated")
        self.live_arr = np.ndarray((int(self.h["live_slots"]),), LIVE, self.mm, int(self.h["live_offset"]))
        self.ring = np.ndarray((int(self.h["ring_capacity"]),), RECORD, self.mm, int(self.h["ring_offset"]))
        self.path = path

    def header(self) -> dict:
        out = {}
        for name in HEADER.names:
            v = self.h[name]
            if isinstance(v, bytes) or getattr(v, "dtype", None) is not None and v.dtype.kind == "S":
                out[name] = bytes(v).split(b"\0", 1)[0].decode()
            elif np.ndim(v) == 0:
                out[name] = int(v)
        return out

    def live(self) -> np.ndarray:
        snap = self.live_arr.copy()
        return snap[(snap["state"] == 1) & (snap["generation"] % 2 == 0)]

    @property
    def ring_head(self) -> int:
        return int(self.h["ring_head"])

    def read(self, cursor: int, max_records: int = -1):
        head = self.ring_head
        cap = len(self.ring)
        overwritten = 0
        if head - cursor > cap:
            overwritten = head - cap - cursor
            cursor = head - cap
        stop = head if max_records < 0 else min(head, cursor + max_records)
        out = []
        i = cursor
        while i < stop:
            r = self.ring[i % cap].copy()
            if int(r["seq"]) != i + 1:
                break
            out.append(r)
            i += 1
        recs = np.array(out, dtype=RECORD) if out else np.zeros(0, RECORD)
        return recs, i, overwritten

    def close(self) -> None:
        try:
            del self.h, self.live_arr, self.ring
            self.mm.close()
        except (AttributeError, BufferError):
            pass
