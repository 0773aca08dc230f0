"""A Python writer of the shm layout (numpy memmap on the bindings' dtypes), to test the reader alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mycroft_otel import _native
from mycroft_otel.native import HEADER_DTYPE, LIVE_OP_DTYPE, RING_RECORD_DTYPE


def align(v: int) -> int:
    return (v + 63) & ~63


class FakeRing:
    def __init__(self, path: Path, live_slots: int = 4, ring_capacity: int = 8):
        self.path = Path(path)
        live_off = align(HEADER_DTYPE.itemsize)
        ring_off = align(live_off + live_slots * LIVE_OP_DTYPE.itemsize)
        size = align(ring_off + ring_capacity * RING_RECORD_DTYPE.itemsize)
        self.size = size
        self.mm = np.memmap(self.path, dtype=np.uint8, mode="w+", shape=(size,))
        self.header = self.mm[:HEADER_DTYPE.itemsize].view(HEADER_DTYPE)
        self.live = self.mm[live_off:live_off + live_slots * LIVE_OP_DTYPE.itemsize].view(LIVE_OP_DTYPE)
        self.ring = self.mm[ring_off:ring_off + ring_capacity * RING_RECORD_DTYPE.itemsize].view(RING_RECORD_DTYPE)
        h = self.header[0]
        h["magic"] = _native.MAGIC
        h["layout_version"] = _native.LAYOUT_VERSION
        h["header_size"] = HEADER_DTYPE.itemsize
        h["live_slots"] = live_slots
        h["ring_capacity"] = ring_capacity
        h["live_offset"] = live_off
        h["ring_offset"] = ring_off
        h["file_size"] = size
        h["job_id"] = b"job-1"
        h["comm_name"] = "tp\u00e9".encode()
        h["host"] = b"hostA"
        h["comm_hash"] = 0xFEEDFACECAFEBEEF
        h["rank"] = 3
        h["nranks"] = 8
        h["start_realtime_ns"] = 1_700_000_000_000_000_000
        h["start_mono_ns"] = 1_000
        self.head = 0

    def publish(self, op_id: int, seq: int | None = None) -> int:
        """Append a completed record the way the plugin does (claim, fill, publish seq = index + 1)."""
        i = self.head
        self.head += 1
        self.header[0]["ring_head"] = self.head
        r = self.ring[i % len(self.ring)]
        r["op"]["op_id"] = op_id
        r["op"]["seq"] = op_id if seq is None else seq
        r["op"]["n_flows"] = 1
        r["flows"][0]["posted"] = op_id
        r["seq"] = i + 1
        return i

    def claim(self) -> int:
        """Claim an index without publishing it (a writer inside the fill)."""
        i = self.head
        self.head += 1
        self.header[0]["ring_head"] = self.head
        return i

    def activate(self, slot: int, op_id: int, n_flows: int = 2, generation: int = 2) -> None:
        s = self.live[slot]
        s["generation"] = generation
        s["state"] = _native.SLOT_ACTIVE
        s["op"]["op_id"] = op_id
        s["op"]["n_flows"] = n_flows
        for f in range(n_flows):
            s["flows"][f]["version"] = 2
            s["flows"][f]["done"] = f + 1

    def flush(self):
        self.mm.flush()
