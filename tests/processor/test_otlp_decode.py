"""The native OTLP decoder (mycroft_otel._native.ExportDecoder / AttrDecoder) against protobuf itself.

Ingest reads payloads straight from the wire, so it must see what a protobuf parser sees on every valid
payload, and refuse (ValueError) or survive whatever else arrives.
"""

from __future__ import annotations

import random

import pytest
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from mycroft_otel import _native
from mycroft_otel import semconv as sc
from mycroft_otel.processor import spans as S

from synth import Ring

KEYS, RES_KEYS = S._KEYS, S._RES_KEYS
EXPORT = _native.ExportDecoder(KEYS, RES_KEYS, "mycroft.flow.")


def _pb_value(v: common_pb2.AnyValue):
    w = v.WhichOneof("value")
    return getattr(v, w) if w in ("int_value", "string_value", "double_value", "bool_value") else None


def _expected(req: trace_service_pb2.ExportTraceServiceRequest):
    """What the export decoder must return for req, read through protobuf."""
    spans, resources = [], []
    for ri, rs in enumerate(req.resource_spans):
        r = {kv.key: _pb_value(kv.value) for kv in rs.resource.attributes}
        resources.append(tuple(r.get(k) for k in RES_KEYS))
        for ss in rs.scope_spans:
            for sp in ss.spans:
                a: dict = {}
                for kv in sp.attributes:
                    if kv.key.startswith("mycroft.flow."):
                        break
                    a[kv.key] = _pb_value(kv.value)
                spans.append((ri, sp.trace_id, sp.span_id, sp.name, sp.start_time_unix_nano, sp.end_time_unix_nano,
                              tuple(a.get(k) for k in KEYS)))
    return resources, spans


def _random_request(rng: random.Random) -> trace_service_pb2.ExportTraceServiceRequest:
    req = trace_service_pb2.ExportTraceServiceRequest()
    for _ in range(rng.randint(0, 3)):
        rs = req.resource_spans.add()
        for k in rng.sample(RES_KEYS, rng.randint(0, 3)):
            kv = rs.resource.attributes.add(key=k)
            if k == sc.PROCESS_PID:
                kv.value.int_value = rng.randint(-5, 1 << 40)
            else:
                kv.value.string_value = rng.choice(["node-1", "", "ñödé-✓"])
        for _ in range(rng.randint(0, 2)):
            ss = rs.scope_spans.add()
            ss.scope.name = "mycroft"
            for _ in range(rng.randint(0, 4)):
                sp = ss.spans.add(trace_id=rng.randbytes(rng.choice([16, 16, 3])), span_id=rng.randbytes(8),
                                  name=rng.choice([sc.INFLIGHT_SPAN, sc.STATUS_SPAN, "nccl.AllReduce", "other"]),
                                  start_time_unix_nano=rng.getrandbits(64), end_time_unix_nano=rng.getrandbits(64))
                for k in rng.sample(KEYS, rng.randint(0, len(KEYS))) + ["mycroft.flow.channel", sc.RANK]:
                    kv = sp.attributes.add(key=k)
                    which = rng.randrange(6)
                    if which == 0:
                        kv.value.int_value = rng.randint(-(1 << 63), (1 << 63) - 1)
                    elif which == 1:
                        kv.value.string_value = rng.choice(["AllReduce", "in_flight", "", "ü"])
                    elif which == 2:
                        kv.value.double_value = rng.random()
                    elif which == 3:
                        kv.value.bool_value = rng.random() < 0.5
                    elif which == 4:
                        kv.value.array_value.values.add().int_value = 3
                    # 5: no value at all
                sp.events.add(name="ignored")
                sp.links.add(trace_id=rng.randbytes(16), span_id=rng.randbytes(8))
    return req


def test_export_decoder_reads_what_protobuf_reads():
    rng = random.Random(7)
    for _ in range(400):
        req = _random_request(rng)
        data = req.SerializeToString()
        seen, resources, spans = EXPORT(data)
        want_res, want_spans = _expected(req)
        assert seen == len(want_spans)
        assert resources == want_res
        got = [s[:7] for s in spans]
        assert got == want_spans
        for s in spans:  # the kept byte range is exactly the span
            _, _, _, _, _, _, _, flows_at, off, length = s
            sp = trace_pb2.Span.FromString(data[off:off + length])
            assert (sp.trace_id, sp.span_id) == (s[1], s[2])
            assert flows_at == -1 or data[off + flows_at:off + length].find(b"mycroft.flow.") >= 0


def test_attr_decoder_types_arrays_and_skips_what_ingest_read():
    ring = Ring(8, nch=2, comm=0x42, seq=3)
    ring.gpu_stall(2)
    data = ring.request().SerializeToString()
    _, _, spans = EXPORT(data)
    req = trace_service_pb2.ExportTraceServiceRequest.FromString(data)
    pb_spans = [sp for rs in req.resource_spans for ss in rs.scope_spans for sp in ss.spans]
    dec = _native.AttrDecoder(S._EVIDENCE_KEYS, S._STR_ARRAYS)
    flows_only = _native.AttrDecoder(S.HANG_KEYS, S._STR_ARRAYS)
    for s, sp in zip(spans, pb_spans):
        _, _, _, _, _, _, _, flows_at, off, length = s
        got = dec(data, off, length)
        want = {}
        for kv in sp.attributes:
            if kv.key not in S._EVIDENCE_KEYS:
                continue
            if kv.value.WhichOneof("value") == "array_value":
                if kv.key in S._STR_ARRAYS:
                    want[kv.key] = [x.string_value for x in kv.value.array_value.values]
                else:
                    want[kv.key] = [x.int_value for x in kv.value.array_value.values]
            else:
                want[kv.key] = _pb_value(kv.value)
        assert got == want
        if flows_at >= 0:
            tail = flows_only(data, off, length, flows_at)
            assert tail and all(k.startswith("mycroft.flow.") for k in tail)
    untyped = _native.AttrDecoder(None, None)
    assert set(untyped(data, spans[0][8], spans[0][9])) == {kv.key for kv in pb_spans[0].attributes}
    with pytest.raises(ValueError):
        dec(data, len(data) - 4, 100)


def _ld(field: int, payload: bytes) -> bytes:
    return bytes([field << 3 | 2]) + _varint(len(payload)) + payload


def _varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def test_wire_edge_cases():
    kv_rank = _ld(1, sc.RANK.encode()) + _ld(2, bytes([3 << 3]) + _varint(5))
    span = _ld(1, b"t" * 16) + _ld(2, b"s" * 8) + _ld(5, sc.INFLIGHT_SPAN.encode()) + _ld(9, kv_rank)
    good = _ld(1, _ld(2, _ld(2, span)))
    seen, _, spans = EXPORT(good)
    assert seen == 1 and spans[0][6][KEYS.index(sc.RANK)] == 5
    # a known field with the wrong wire type is an unknown field (protobuf's rule): skipped, not an error
    odd = _ld(1, _ld(2, _ld(2, bytes([5 << 3 | 0]) + _varint(7) + span)))
    assert _native.ExportDecoder(KEYS, RES_KEYS, "")(odd)[2][0][3] == sc.INFLIGHT_SPAN
    # a deprecated group among unknown fields is skipped like protobuf skips it
    group = bytes([15 << 3 | 3]) + bytes([1 << 3]) + _varint(1) + bytes([15 << 3 | 4])
    assert _native.ExportDecoder(KEYS, RES_KEYS, "")(_ld(1, _ld(2, _ld(2, group + span))))[0] == 1
    bad = {
        "truncated": good[:-3],
        "length past the end": _ld(1, b"\x12\x7f"),
        "invalid wire type": b"\x0f",
        "endless varint": b"\x08" + b"\xff" * 11,
        "field number 0": b"\x02\x00",
        "not UTF-8 name": _ld(1, _ld(2, _ld(2, _ld(5, b"\xff\xfe")))),
    }
    for what, data in bad.items():
        with pytest.raises(ValueError):
            EXPORT(data)
        with pytest.raises(DecodeError):  # protobuf refuses the same payloads
            trace_service_pb2.ExportTraceServiceRequest.FromString(data)
    # arrays longer than 4096 are cut (hostile sizes)
    arr = b"".join(_ld(1, bytes([3 << 3]) + _varint(i)) for i in range(5000))
    kv = _ld(1, b"mycroft.flow.channel") + _ld(2, _ld(5, arr))
    data = _ld(1, _ld(2, _ld(2, span + _ld(9, kv))))
    s = EXPORT(data)[2][0]
    got = _native.AttrDecoder(frozenset({"mycroft.flow.channel"}), frozenset())(data, s[8], s[9], s[7])
    assert got["mycroft.flow.channel"] == list(range(4096))


def test_mutated_payloads_never_crash():
    rng = random.Random(11)
    base = [_random_request(rng).SerializeToString() for _ in range(20)]
    base.append(Ring(16, nch=2, comm=0x9, seq=1).request().SerializeToString())
    dec = _native.AttrDecoder(S._EVIDENCE_KEYS, S._STR_ARRAYS)
    refused = 0
    for i in range(3000):
        b = bytearray(rng.choice(base))
        for _ in range(rng.randint(1, 8)):
            if not b:
                break
            op = rng.randrange(3)
            at = rng.randrange(len(b))
            if op == 0:
                b[at] = rng.randrange(256)
            elif op == 1:
                del b[at:at + rng.randint(1, 16)]
            else:
                b[at:at] = rng.randbytes(rng.randint(1, 16))
        data = bytes(b)
        try:
            _, _, spans = EXPORT(data)
        except ValueError:
            refused += 1
            continue
        for s in spans:
            try:
                dec(data, s[8], s[9], max(0, s[7]))
            except ValueError:
                pass
    assert 0 < refused < 3000
