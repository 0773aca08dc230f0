"""Deterministic trace and span ids (design §2.1-2.2).

Every rank derives the same ids without talking to its peers: one trace per
collective instance (or p2p transfer), one span id per (trace, rank, role[, n]).
The agent uses these to name its spans and to link to its peers' spans; the
processor uses them to name its root-cause span, so a replayed input can never
produce a second verdict.
"""

from __future__ import annotations

import hashlib
import struct


def _digest(size: int, *parts: bytes) -> int:
    h = hashlib.blake2b(digest_size=size, person=b"mycroft-otel")
    for p in parts:
        # Length-prefix each part so ("ab", "c") and ("a", "bc") differ.
        h.update(struct.pack("<I", len(p)))
        h.update(p)
    value = int.from_bytes(h.digest(), "big")
    return value or 1  # all-zero ids are invalid in OpenTelemetry


def coll_trace_id(job_id: str, comm_hash: int, seq: int) -> int:
    """Trace of collective number ``seq`` of communicator ``comm_hash``."""
    return _digest(16, b"coll", job_id.encode(), struct.pack("<QQ", comm_hash & (2**64 - 1), seq))


def p2p_trace_id(job_id: str, comm_hash: int, src: int, dst: int, n: int) -> int:
    """Trace of the ``n``-th transfer from ``src`` to ``dst`` (both sides count alike)."""
    return _digest(16, b"p2p", job_id.encode(), struct.pack("<QiiQ", comm_hash & (2**64 - 1), src, dst, n))


def span_id(trace_id: int, rank: int, role: str, index: int = -1) -> int:
    """Span of ``rank`` in ``trace_id`` playing ``role`` (semconv.ROLE_*), optionally numbered."""
    return _digest(8, trace_id.to_bytes(16, "big"), struct.pack("<iq", rank, index), role.encode())


def comm_hash_hex(comm_hash: int) -> str:
    """The communicator hash as span attributes carry it (uint64 does not fit an OTel int)."""
    return f"{comm_hash & (2**64 - 1):016x}"
