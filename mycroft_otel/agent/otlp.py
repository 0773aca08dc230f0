"""OTLP trace protobuf, written directly as bytes.

The agent's hot path turns thousands of ring records into spans per second; building
SDK span objects and then protobuf message objects per attribute and per array
element costs ~10x what the data is worth. Protobuf's wire format is plain
concatenation, so this module writes the few OTLP messages the agent sends
(``ExportTraceServiceRequest`` → ResourceSpans → ScopeSpans → Span with attributes,
links and events) straight into bytes: a generic writer for any span, and
vectorised column encoders (numpy) for the hot path in :mod:`.spans`, which encode a
whole batch of integer attributes or flow arrays in a few numpy calls.

Tests decode the output with opentelemetry-proto and compare the fast path to the
generic writer byte for byte. Field numbers: opentelemetry/proto/trace/v1/trace.proto
and common/v1/common.proto.
"""

from __future__ import annotations

import struct
from typing import Iterable, Sequence

import numpy as np

_MASK64 = (1 << 64) - 1


def varint(v: int) -> bytes:
    """Protobuf varint of a non-negative int (negative ints: two's complement 64-bit)."""
    if 0 <= v < _SMALL:
        return _VARINT_TABLE[v]
    v &= _MASK64
    parts = []
    while v >= _SMALL:  # 14 bits at a time, as two bytes that both say "more follows" (a ns time: 5 steps, not 9)
        parts.append(_VARINT_PAIRS[v & (_SMALL - 1)])
        v >>= 14
    parts.append(_VARINT_TABLE[v])
    return b"".join(parts)


def _varint_slow(v: int) -> bytes:
    out = bytearray()
    while v > 0x7F:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


_SMALL = 1 << 14
_VARINT_TABLE = [_varint_slow(i) for i in range(_SMALL)]
_VARINT_PAIRS = [bytes([(i & 0x7F) | 0x80, (i >> 7) | 0x80]) for i in range(_SMALL)]


def ld(tag: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2) with field number ``tag``."""
    n = len(payload)
    return _TAGS2[tag] + (_VARINT_TABLE[n] if n < _SMALL else varint(n)) + payload


_TAGS2 = {i: bytes([(i << 3) | 2]) for i in range(1, 16)}

# --- AnyValue -----------------------------------------------------------------------


def any_value(v: object) -> bytes:
    """Encoded AnyValue (the message body) of a Python attribute value."""
    t = type(v)  # the common exact types first: this runs for every attribute of every generic span
    if t is int:
        return b"\x18" + varint(v)
    if t is str:
        return ld(1, v.encode())
    if t is list:
        return ld(5, b"".join([ld(1, any_value(e)) for e in v]))
    if isinstance(v, bool):
        return b"\x10\x01" if v else b"\x10\x00"
    if isinstance(v, (int, np.integer)):
        return b"\x18" + varint(int(v))
    if isinstance(v, str):
        return ld(1, v.encode())
    if isinstance(v, (float, np.floating)):
        return b"\x21" + struct.pack("<d", float(v))
    if isinstance(v, bytes):
        return ld(7, v)
    if isinstance(v, (list, tuple, np.ndarray)):
        return ld(5, b"".join([ld(1, any_value(e)) for e in v]))
    raise TypeError(f"unsupported attribute value {v!r}")


_KEY_FIELDS: dict[str, bytes] = {}


def key_field(key: str) -> bytes:
    """A KeyValue's key field; memoised: attribute keys are a small fixed set (a full table starts over)."""
    b = _KEY_FIELDS.get(key)
    if b is None:
        if len(_KEY_FIELDS) >= 4096:
            _KEY_FIELDS.clear()
        b = _KEY_FIELDS[key] = ld(1, key.encode())
    return b


def key_value(key: str, value: object) -> bytes:
    """A KeyValue message body."""
    return key_field(key) + ld(2, any_value(value))


def attributes(field: int, attrs: Iterable[tuple[str, object]]) -> bytes:
    """Repeated KeyValue ``field`` (Span: 9, Resource: 1, Link: 4, Event: 3, Scope: 3); None values skipped."""
    return b"".join([ld(field, key_value(k, v)) for k, v in attrs if v is not None])


# --- spans --------------------------------------------------------------------------

SPAN_KIND_INTERNAL = 1


def link(trace_id: bytes, span_id: bytes, attrs: bytes) -> bytes:
    """A Link message body; ``attrs`` = pre-encoded repeated field 4."""
    return b"\x0a\x10" + trace_id + b"\x12\x08" + span_id + attrs


def event(time_ns: int, name: str, attrs: Iterable[tuple[str, object]]) -> bytes:
    return b"\x09" + struct.pack("<Q", time_ns) + ld(2, name.encode()) + attributes(3, attrs)


def span_head(trace_id: bytes, span_id: bytes, name_field: bytes, start_ns: int, end_ns: int) -> bytes:
    """Span fields 1,2,5,6,7,8; ``name_field`` = ``ld(5, name)`` (cache it)."""
    return (b"\x0a\x10" + trace_id + b"\x12\x08" + span_id + name_field + b"\x30\x01"
            + b"\x39" + struct.pack("<Q", start_ns & _MASK64) + b"\x41" + struct.pack("<Q", end_ns & _MASK64))


def span(trace_id: bytes, span_id: bytes, name: str, start_ns: int, end_ns: int,
         attrs: Iterable[tuple[str, object]] = (), links: Sequence[bytes] = (),
         events: Sequence[bytes] = ()) -> bytes:
    """A complete Span message body (generic path).

    ``events`` and ``links`` are encoded span fields: ``ld(11, event(...))``, ``ld(13, link(...))``.
    """
    return (span_head(trace_id, span_id, ld(5, name.encode()), start_ns, end_ns) + attributes(9, attrs)
            + b"".join(events) + b"".join(links))


def resource(attrs: Iterable[tuple[str, object]]) -> bytes:
    """A Resource message body."""
    return attributes(1, attrs)


def scope(name: str, version: str) -> bytes:
    return ld(1, name.encode()) + ld(2, version.encode())


def request(groups: Iterable[tuple[bytes, bytes, Sequence[bytes]]]) -> bytes:
    """ExportTraceServiceRequest from (resource body, scope body, [span bodies]) groups."""
    out = []
    for res, scp, spans in groups:
        scope_spans = ld(1, scp) + b"".join([ld(2, s) for s in spans])
        out.append(ld(1, ld(1, res) + ld(2, scope_spans)))
    return b"".join(out)


# --- vectorised column encoders (hot path) ----------------------------------------------

_SHIFTS = np.arange(10, dtype=np.uint64) * np.uint64(7)
_THRESH = np.array([1 << (7 * i) for i in range(1, 10)], dtype=np.uint64)


def _groups(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n, 10) uint8 varint bytes (continuation bits set) and their lengths (n,)."""
    v = np.ascontiguousarray(values).astype(np.uint64, copy=False).reshape(-1)
    lens = 1 + (v[:, None] >= _THRESH[None, :]).sum(axis=1)
    g = ((v[:, None] >> _SHIFTS[None, :]) & np.uint64(0x7F)).astype(np.uint8)
    cont = np.arange(10)[None, :] < (lens[:, None] - 1)
    g |= (cont * 0x80).astype(np.uint8)
    return g, lens


def encode_with_prefix(values: np.ndarray, prefix: bytes, len_positions: Sequence[tuple[int, int]]
                       ) -> tuple[bytes, np.ndarray]:
    """Encode ``prefix + varint(v)`` for every v.

    ``len_positions``: (position in prefix, base) pairs whose byte is ``base + len(varint)``
    (the enclosing length fields; all must stay < 128). Returns the concatenation and the
    end offset of each element in it.
    """
    n = values.size
    if n == 0:
        return b"", np.zeros(0, dtype=np.int64)
    g, lens = _groups(values)
    p = len(prefix)
    mat = np.empty((n, p + 10), dtype=np.uint8)
    mat[:, :p] = np.frombuffer(prefix, dtype=np.uint8)
    for pos, base in len_positions:
        mat[:, pos] = base + lens
    mat[:, p:] = g
    mask = np.arange(p + 10)[None, :] < (p + lens)[:, None]
    ends = np.cumsum(p + lens)
    return mat[mask].tobytes(), ends


def int_attr_column(key: str, values: np.ndarray) -> tuple[bytes, np.ndarray]:
    """Span attribute fields (tag 9) ``key = int`` for every value: concatenation + end offsets."""
    kf = key_field(key)
    assert len(kf) < 100
    # 0x4a len | key field | 0x12 len | 0x18 varint
    prefix = b"\x4a\x00" + kf + b"\x12\x00\x18"
    return encode_with_prefix(values, prefix, ((1, len(kf) + 3), (len(kf) + 3, 1)))


def int_array_elements(values: np.ndarray) -> tuple[bytes, np.ndarray]:
    """ArrayValue element fields (``values``: AnyValue{int}) for every value."""
    return encode_with_prefix(values, b"\x0a\x00\x18", ((1, 1),))


def split(blob: bytes, ends: np.ndarray, counts: np.ndarray) -> list[bytes]:
    """Split ``blob`` of per-element encodings into per-record chunks of ``counts`` elements each."""
    cs = np.cumsum(counts)
    stops = np.zeros(len(counts), dtype=np.int64)
    nz = cs > 0
    stops[nz] = ends[cs[nz] - 1]
    stops = stops.tolist()
    out, start = [], 0
    for stop in stops:
        out.append(blob[start:stop])
        start = stop
    return out


def array_attr(key_field_bytes: bytes, elements: bytes) -> bytes:
    """Span attribute field ``key = [elements]`` from pre-encoded ArrayValue elements."""
    av = ld(5, elements)  # AnyValue.array_value
    return ld(9, key_field_bytes + ld(2, av))
