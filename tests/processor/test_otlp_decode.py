"""The native OTLP decoders (mycroft_otel._native.SpanDecoder / FlowDecoder / AttrDecoder) against protobuf.

Ingest reads payloads straight from the wire, so it must see what a protobuf parser sees on every valid
payload -- checked here against a model that reads the same payload through protobuf and applies the
span shape rules in Python -- and refuse (ValueError) or survive whatever else arrives.
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
from mycroft_otel.processor import keys as K
from mycroft_otel.processor import spans as S
from mycroft_otel.processor.state import TraceState

from synth import Ring

ATTR_KEYS, RES_KEYS = S._ATTR_KEYS, S._RES_KEYS
DECODE = S._DECODER
FLOW_PREFIX = "mycroft.flow."


def _pb_value(v: common_pb2.AnyValue):
    w = v.WhichOneof("value")
    return getattr(v, w) if w in ("int_value", "string_value", "double_value", "bool_value") else None


def _int(v, default: int) -> int:
    return v if type(v) is int else default


def _str(v) -> str:
    return v if type(v) is str else ""


def _model_span(sp: trace_pb2.Span, resource: S.Resource, shared: dict):
    """(kind, SpanRef fields but raw) of one span read through protobuf, or the kind it is counted as
    ("root_cause": ignored, "rejected"). ``shared``: its resource's attributes, which a span's own override."""
    a: dict = dict(shared)
    for kv in sp.attributes:
        a[kv.key] = _pb_value(kv.value)
        if kv.key.startswith(FLOW_PREFIX):
            break  # ingest reads up to the first flow attribute
    name = sp.name
    kind = (S.OP if name.startswith(sc.OP_SPAN_PREFIX) else S.INFLIGHT if name == sc.INFLIGHT_SPAN
            else S.STATUS if name == sc.STATUS_SPAN else S.SUMMARY if name == sc.SUMMARY_SPAN
            else "root_cause" if name == sc.ROOT_CAUSE_SPAN else "rejected")
    if kind in ("root_cause", "rejected"):
        return kind, None
    if len(sp.trace_id) != 16 or len(sp.span_id) != 8:
        return "rejected", None
    rank, nranks, comm = _int(a.get(sc.RANK), -1), _int(a.get(sc.COMM_NRANKS), -1), a.get(sc.COMM_HASH)
    if comm is not None and type(comm) is not str:
        return "rejected", None
    if kind != S.SUMMARY and (rank < 0 or nranks <= 0 or rank >= nranks or nranks > 1 << 20):
        return "rejected", None
    if kind == S.OP and a.get(sc.OP_STATE) == sc.OP_STATE_IN_FLIGHT:
        kind = S.INFLIGHT
    status = _str(a.get(sc.STATUS_KIND))
    if kind == S.STATUS and status not in sc.STATUS_KINDS:
        return "rejected", None
    func = _str(a.get(sc.COLL_FUNC)) or (name[len(sc.OP_SPAN_PREFIX):] if kind == S.OP else "")
    return kind, (
        kind, sp.trace_id, sp.span_id, name, sp.start_time_unix_nano, sp.end_time_unix_nano, rank, nranks,
        comm or "", _int(a.get(sc.COLL_SEQ), -1), func, _int(a.get(sc.SNAPSHOT_SEQ), -1), status,
        _str(a.get(sc.ANOMALY)), _int(a.get(sc.BASELINE_NS), 0), _int(a.get(sc.GLOBAL_RANK), -1),
        _int(a.get(sc.COLL_BYTES), 0),
        _int(a.get(sc.TIME_LAST_PROGRESS), sp.end_time_unix_nano if kind in (S.OP, S.INFLIGHT) else 0), resource,
        a.get(sc.PROCESS_STOPPED) is True,
        next((i for i, kv in enumerate(sp.attributes) if kv.key.startswith(FLOW_PREFIX)), None),
        _int(a.get(sc.COLL_COUNT), -1), _str(a.get(sc.COLL_DATATYPE)),
        max(0, min(_int(a.get(sc.ANOMALY_RECENT), 0), sc.RECENT_WINDOW)), _model_step(sp))


def _model_step(sp: trace_pb2.Span) -> int:
    """SpanRef.step: the span's own step attribute, the last of all (after the flows too); one under which a
    value only a full decode can judge (a string, array or list) stands leaves it unread."""
    unread, last = False, None
    for kv in sp.attributes:
        if kv.key == sc.COLL_STEP_INDEX:
            which = kv.value.WhichOneof("value")
            unread = unread or which in ("string_value", "array_value", "kvlist_value")
            last = kv.value.int_value if which == "int_value" else None
    if unread:
        return S.STEP_UNREAD
    if last is None:
        return S.STEP_NONE
    return last if 0 <= last < S.MAX_STEP_INDEX else S.STEP_BEYOND


def _model(req: trace_service_pb2.ExportTraceServiceRequest):
    """What the span decoder must return for req: (seen, SpanRef fields but raw, ignored, rejected)."""
    seen, refs, counts = 0, [], {"root_cause": 0, "rejected": 0}
    for rs in req.resource_spans:
        r = {kv.key: _pb_value(kv.value) for kv in rs.resource.attributes}
        host, pid, job, shard = (r.get(k) for k in RES_KEYS)
        res = S.Resource(host=_str(host), pid=_int(pid, -1), job=_str(job), shard=_int(shard, -1))
        shared = {k: v for k, v in r.items() if k in ATTR_KEYS}
        for ss in rs.scope_spans:
            for sp in ss.spans:
                seen += 1
                kind, fields = _model_span(sp, res, shared)
                if fields is None:
                    counts[kind] += 1
                else:
                    refs.append(fields)
    return seen, refs, counts["root_cause"], counts["rejected"]


_VALUES = {
    sc.COMM_HASH: ["0x5f3a", "", "ñödé-✓"], sc.COLL_FUNC: ["AllReduce", "", "Send"], sc.OP_STATE: ["in_flight", "completed"],
    sc.STATUS_KIND: list(sc.STATUS_KINDS) + ["odd"], sc.ANOMALY: ["slow", "", "late"], sc.COLL_DATATYPE: ["float", ""],
}


def _random_value(rng: random.Random, key: str, kv) -> None:
    which = rng.randrange(8)
    if which <= 1:
        kv.value.int_value = rng.randint(-2, 9)
    elif which == 2:
        kv.value.int_value = rng.choice([rng.randint(-(1 << 63), (1 << 63) - 1), rng.randint(60, 70)])
    elif which == 3:
        kv.value.string_value = rng.choice(_VALUES.get(key, ["x", "in_flight", "ü"]))
    elif which == 4:
        kv.value.double_value = rng.random()
    elif which == 5:
        kv.value.bool_value = rng.random() < 0.5
    elif which == 6:
        kv.value.array_value.values.add().int_value = 3
    # 7: no value at all


def _random_request(rng: random.Random) -> trace_service_pb2.ExportTraceServiceRequest:
    req = trace_service_pb2.ExportTraceServiceRequest()
    for _ in range(rng.randint(0, 3)):
        rs = req.resource_spans.add()
        for k in rng.sample(RES_KEYS, rng.randint(0, len(RES_KEYS))):
            kv = rs.resource.attributes.add(key=k)
            if k in (sc.PROCESS_PID, sc.JOB_SHARD) and rng.random() < 0.8:
                kv.value.int_value = rng.randint(-5, 1 << 40)
            else:
                kv.value.string_value = rng.choice(["node-1", "", "ñödé-✓"])
        for k in rng.sample(ATTR_KEYS, rng.randint(0, 4)):  # what a rank's spans share, as the agent sends it
            _random_value(rng, k, rs.resource.attributes.add(key=k))
        for _ in range(rng.randint(0, 2)):
            ss = rs.scope_spans.add()
            ss.scope.name = "mycroft"
            for _ in range(rng.randint(0, 5)):
                tid = rng.choice([b"T" * 16, rng.randbytes(16), rng.randbytes(3)])
                sp = ss.spans.add(trace_id=tid, span_id=rng.randbytes(rng.choice([8, 8, 5])),
                                  name=rng.choice([sc.INFLIGHT_SPAN, sc.STATUS_SPAN, sc.SUMMARY_SPAN,
                                                   sc.ROOT_CAUSE_SPAN, "nccl.AllReduce", "nccl.", "other"]),
                                  start_time_unix_nano=rng.getrandbits(64), end_time_unix_nano=rng.getrandbits(64))
                if rng.random() < 0.6:  # a plausible shape first, that the random attributes may spoil
                    sp.attributes.add(key=sc.RANK).value.int_value = rng.randint(0, 3)
                    sp.attributes.add(key=sc.COMM_NRANKS).value.int_value = 4
                    sp.attributes.add(key=sc.STATUS_KIND).value.string_value = rng.choice(sc.STATUS_KINDS)
                keys = rng.sample(ATTR_KEYS, rng.randint(0, len(ATTR_KEYS) // 2))
                keys[rng.randint(0, len(keys)):rng.randint(0, len(keys))] = [FLOW_PREFIX + "channel"]
                for _ in range(rng.choice([0, 0, 1, 2])):  # the step, before or after the flows, or twice
                    keys.insert(rng.randint(0, len(keys)), sc.COLL_STEP_INDEX)
                for k in keys + [sc.RANK]:  # a rank after the flows is not read
                    _random_value(rng, k, sp.attributes.add(key=k))
                sp.events.add(name="ignored")
                sp.links.add(trace_id=rng.randbytes(16), span_id=rng.randbytes(8))
    return req


def test_span_decoder_reads_what_protobuf_reads():
    rng = random.Random(7)
    kinds = set()
    for _ in range(400):
        req = _random_request(rng)
        data = req.SerializeToString()
        seen, refs, ignored, rejected = DECODE(data)
        want_seen, want_refs, want_ignored, want_rejected = _model(req)
        assert (seen, ignored, rejected) == (want_seen, want_ignored, want_rejected)
        assert len(refs) == len(want_refs)
        pb_spans = {sp.span_id: sp for rs in req.resource_spans for ss in rs.scope_spans for sp in ss.spans}
        for ref, want in zip(refs, want_refs):
            assert isinstance(ref, S.SpanRef)
            kinds.add(ref.kind)
            flow_index = want[20]
            assert tuple(ref[:20]) + tuple(ref[21:25]) == want[:20] + want[21:]
            if ref.step != S.STEP_UNREAD:  # the step as the analysis would read it from the bytes
                assert K._step_attribute(ref) == ref.step
            payload, off, length = ref.raw  # the kept byte range is exactly the span
            assert payload is data
            assert trace_pb2.Span.FromString(data[off:off + length]) == pb_spans[ref.span_id]
            if flow_index is None:
                assert ref.flow_at == -1
            else:  # flow_at is where the first flow attribute's field starts
                tail = trace_pb2.Span.FromString(data[off + ref.flow_at:off + length])
                assert tail.attributes[0].key.startswith(FLOW_PREFIX)
    assert kinds == {S.OP, S.INFLIGHT, S.STATUS, S.SUMMARY}


def test_span_decoder_on_real_shapes():
    ring = Ring(8, nch=2, comm=0x42, seq=3)
    ring.gpu_stall(2)
    data = ring.request().SerializeToString()
    seen, refs, ignored, rejected = DECODE(data)
    assert (seen, ignored, rejected) == (8, 0, 0) and len(refs) == 8
    assert {r.rank for r in refs} == set(range(8))
    assert all(r.flow_at > 0 and r.comm and r.trace_id == refs[0].trace_id for r in refs)
    assert refs[0].trace_id is refs[1].trace_id  # one object for the spans of one trace
    assert _native.SpanDecoder.fields == S.SpanRef._fields


def test_a_spans_resource_carries_what_its_spans_share():
    """The agent sends a rank's communicator and rank on the resource only (sc.RESOURCE_SPAN_ATTRS): a span
    without them reads them from its resource, and one of its own wins."""
    ring = Ring(4, nch=2, comm=0x42, seq=3)
    req = ring.request()
    for rs in req.resource_spans:
        sp = rs.scope_spans[0].spans[0]
        own = {kv.key: kv.value for kv in sp.attributes}
        keep = [kv for kv in sp.attributes if kv.key not in (sc.RANK, sc.COMM_NRANKS, sc.COMM_HASH)]
        del sp.attributes[:]
        sp.attributes.extend(keep)
        for k in (sc.RANK, sc.COMM_NRANKS, sc.COMM_HASH):
            rs.resource.attributes.add(key=k).value.CopyFrom(own[k])
    first = req.resource_spans[0].scope_spans[0].spans[0]
    mine = [common_pb2.KeyValue(key=sc.RANK, value=common_pb2.AnyValue(int_value=3))] + list(first.attributes)
    del first.attributes[:]
    first.attributes.extend(mine)  # (before its flows: ingest reads no further)
    seen, refs, _, rejected = DECODE(req.SerializeToString())
    assert (seen, rejected) == (4, 0)
    assert [(r.rank, r.nranks, r.comm) for r in refs] == [(3, 4, "0000000000000042")] + \
        [(r, 4, "0000000000000042") for r in (1, 2, 3)]


def _flow_model(sp: trace_pb2.Span, columns: tuple[str, ...]) -> list[list[int]]:
    """The flow table rows of one span, read through protobuf."""
    older = {v: k for k, v in sc.FLOW_ABSOLUTE.items() if k in columns}
    cols: dict[str, list] = {}
    absolute: dict[str, list] = {}
    for kv in sp.attributes:
        if kv.key in columns or kv.key in older:
            v = kv.value
            arr = list(v.array_value.values)[:4096] if v.WhichOneof("value") == "array_value" else []
            if kv.key in columns:
                cols[kv.key] = arr
            else:
                absolute[older[kv.key]] = arr
    offset = {k: bool(cols.get(k)) and k in sc.FLOW_OFFSETS for k in columns}
    for key, arr in absolute.items():  # an older agent's times, where the span has no offsets
        if not cols.get(key):
            cols[key] = arr
    for key, same in sc.FLOW_SAME_AS.items():  # an array left out (or not an array) reads as its same-as one
        if key in columns and not cols.get(key):
            cols[key], offset[key] = cols.get(same, []), offset.get(same, False)
    names = S._FLOW_NAMES

    def cell(key: str, i: int) -> int:
        col = cols.get(key, [])
        if i >= len(col):
            return 0
        x = _pb_value(col[i])
        if key in names:
            x = x if type(x) is str else ""
            return names[key].index(x) if x in names[key] else len(names[key])
        x = x if type(x) is int else 0
        if offset[key]:  # ns after the span's start (64-bit arithmetic), negative: not yet
            x = 0 if x < 0 else (sp.start_time_unix_nano + x + (1 << 63)) % (1 << 64) - (1 << 63)
        return x

    return [[cell(k, i) for k in columns] for i in range(len(cols.get(columns[0], [])))]


def _random_flows(rng: random.Random, sp: trace_pb2.Span) -> None:
    n = rng.randint(0, 6)
    keys = list(S.FLOW_COLUMNS) + list(sc.FLOW_ABSOLUTE.values())  # (an older agent's keys too)
    for k in rng.sample(keys, rng.randint(1, len(keys))) + [sc.FLOW_CHANNEL]:
        kv = sp.attributes.add(key=k)
        if rng.random() < 0.1:
            kv.value.int_value = 4  # not an array
            continue
        arr = kv.value.array_value
        for _ in range(max(0, n + rng.randint(-2, 2))):
            el = arr.values.add()
            which = rng.randrange(6)
            if which <= 2:
                el.int_value = rng.choice([0, 1, 127, 128, 1 << 40, -1, -(1 << 63)])
            elif which == 3:
                el.string_value = rng.choice(["send", "recv", "", "RecvWait", "SendPeerWait", "odd"])
            elif which == 4:
                el.double_value = 1.5
            # 5: an empty AnyValue


def test_flow_times_read_the_same_from_offsets_and_from_an_older_agents_absolute_times():
    t0 = 1_796_556_194_633_823_414
    times = {sc.FLOW_START: [t0 + 3775, t0 + 13_520], sc.FLOW_END: [t0 + 9564, 0],
             sc.FLOW_WAIT_SINCE: [0, t0 + 15_000]}
    tables = []
    for keys in ({k: k for k in times}, sc.FLOW_ABSOLUTE):
        req = trace_service_pb2.ExportTraceServiceRequest()
        sp = req.resource_spans.add().scope_spans.add().spans.add(
            trace_id=b"T" * 16, span_id=b"S" * 8, name="nccl.AllReduce", start_time_unix_nano=t0,
            end_time_unix_nano=t0 + 20_000)
        sp.attributes.add(key=sc.RANK).value.int_value = 0
        sp.attributes.add(key=sc.COMM_NRANKS).value.int_value = 2
        sp.attributes.add(key=sc.FLOW_CHANNEL).value.array_value.values.add().int_value = 0
        sp.attributes[-1].value.array_value.values.add().int_value = 1
        for key, vals in times.items():
            arr = sp.attributes.add(key=keys[key]).value.array_value
            for t in vals:
                arr.values.add().int_value = sc.flow_offset(t, t0) if keys is not sc.FLOW_ABSOLUTE else t
        tables.append(S.flow_table(DECODE(req.SerializeToString())[1])[0].tolist())
    assert tables[0] == tables[1]
    col = {k: i for i, k in enumerate(S.FLOW_COLUMNS)}
    assert [[r[col[k]] for k in times] for r in tables[0]] == [list(v) for v in zip(*times.values())]
    # a missing last progress reads as the end, in both
    assert [r[col[sc.FLOW_LAST_PROGRESS]] for r in tables[0]] == times[sc.FLOW_END]


def test_flow_decoder_reads_what_protobuf_reads():
    rng = random.Random(5)
    ring = Ring(8, nch=2, comm=0x42, seq=3)
    ring.net_send_stall(3, 1)
    requests = [ring.request()]
    for _ in range(200):
        req = trace_service_pb2.ExportTraceServiceRequest()
        ss = req.resource_spans.add().scope_spans.add()
        for _ in range(rng.randint(1, 4)):
            t0 = rng.choice([0, 1 << 60, (1 << 64) - 5])  # flow times are offsets from it
            sp = ss.spans.add(trace_id=b"T" * 16, span_id=rng.randbytes(8), name="nccl.AllReduce",
                              start_time_unix_nano=t0, end_time_unix_nano=t0)
            sp.attributes.add(key=sc.RANK).value.int_value = 0
            sp.attributes.add(key=sc.COMM_NRANKS).value.int_value = 2
            _random_flows(rng, sp)
        requests.append(req)
    for columns in (S.FLOW_COLUMNS, (sc.FLOW_STEPS, sc.FLOW_DIRECTION, sc.FLOW_NET_WAIT)):
        for req in requests:
            data = req.SerializeToString()
            refs = DECODE(data)[1]
            pb = [sp for rs in req.resource_spans for ss in rs.scope_spans for sp in ss.spans]
            table, counts = S.flow_table(refs, columns)
            want = [row for sp in pb for row in _flow_model(sp, columns)]
            assert table.tolist() == want
            assert counts.tolist() == [len(_flow_model(sp, columns)) for sp in pb]
    flows = S.flows_of(DECODE(requests[0].SerializeToString())[1][3])
    assert [f.wait_state for f in flows if f.send] and all(isinstance(f.wait_state, str) for f in flows)


def test_attr_decoder_reads_what_protobuf_reads():
    rng = random.Random(3)
    keys = frozenset({sc.STATUS_LAST_STATE, sc.TIME_API, sc.RANK, "mycroft.flow.channel"})
    dec = _native.AttrDecoder(keys)
    untyped = _native.AttrDecoder(None)
    for _ in range(200):
        req = _random_request(rng)
        data = req.SerializeToString()
        pb = [sp for rs in req.resource_spans for ss in rs.scope_spans for sp in ss.spans]
        for ref in DECODE(data)[1]:
            sp = next(x for x in pb if x.span_id == ref.span_id)
            _, off, length = ref.raw
            want = {}
            for kv in sp.attributes:
                v = kv.value
                want[kv.key] = ([_pb_value(x) for x in v.array_value.values] if v.WhichOneof("value") == "array_value"
                                else {x.key: None for x in v.kvlist_value.values}
                                if v.WhichOneof("value") == "kvlist_value" else _pb_value(v))
            assert untyped(data, off, length) == want
            assert dec(data, off, length) == {k: v for k, v in want.items() if k in keys}
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
    seen, refs, _, _ = DECODE(good)
    assert seen == 1 and refs == []  # the span lacks nranks: not our shape
    span += _ld(9, _ld(1, sc.COMM_NRANKS.encode()) + _ld(2, bytes([3 << 3]) + _varint(8)))
    good = _ld(1, _ld(2, _ld(2, span)))
    seen, refs, _, _ = DECODE(good)
    assert seen == 1 and refs[0].rank == 5 and refs[0].nranks == 8
    # a known field with the wrong wire type is an unknown field (protobuf's rule): skipped, not an error
    odd = _ld(1, _ld(2, _ld(2, bytes([5 << 3 | 0]) + _varint(7) + span)))
    assert DECODE(odd)[1][0].name == sc.INFLIGHT_SPAN
    # a deprecated group among unknown fields is skipped like protobuf skips it
    group = bytes([15 << 3 | 3]) + bytes([1 << 3]) + _varint(1) + bytes([15 << 3 | 4])
    assert DECODE(_ld(1, _ld(2, _ld(2, group + span))))[0] == 1
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
            DECODE(data)
        with pytest.raises(DecodeError):  # protobuf refuses the same payloads
            trace_service_pb2.ExportTraceServiceRequest.FromString(data)
    # arrays longer than 4096 are cut (hostile sizes)
    arr = b"".join(_ld(1, bytes([3 << 3]) + _varint(i)) for i in range(5000))
    kv = _ld(1, b"mycroft.flow.channel") + _ld(2, _ld(5, arr))
    data = _ld(1, _ld(2, _ld(2, span + _ld(9, kv))))
    ref = DECODE(data)[1][0]
    got = _native.AttrDecoder(frozenset({"mycroft.flow.channel"}))(*ref.raw, ref.flow_at)
    assert got["mycroft.flow.channel"] == list(range(4096))
    table, counts = S.flow_table([ref])
    assert counts.tolist() == [4096] and table[:, 0].tolist() == list(range(4096))


def _step_kv(value: bytes) -> bytes:
    return _ld(9, _ld(1, sc.COLL_STEP_INDEX.encode()) + _ld(2, value))


def _int_kv(key: str, v: int) -> bytes:
    return _ld(9, _ld(1, key.encode()) + _ld(2, bytes([3 << 3]) + _varint(v)))


_FLOW = _ld(9, _ld(1, b"mycroft.flow.channel") + _ld(2, _ld(5, _ld(1, bytes([3 << 3]) + _varint(0)))))


@pytest.mark.parametrize("attrs, step, malformed", [
    (_step_kv(bytes([3 << 3]) + _varint(5)), 5, False),
    (_step_kv(bytes([3 << 3]) + _varint(64)), S.STEP_BEYOND, False),
    (_step_kv(bytes([2 << 3]) + _varint(1)), S.STEP_NONE, False),  # a bool is no place
    (_step_kv(_ld(1, b"5")), S.STEP_UNREAD, False),  # a string: the analysis reads it (as no place)
    (_step_kv(bytes([3 << 3]) + _varint(5)) + _step_kv(bytes([3 << 3]) + _varint(7)), 7, False),  # the last wins
    (_step_kv(bytes([3 << 3]) + _varint(5)) + _FLOW + _step_kv(bytes([3 << 3]) + _varint(6)), 6, False),
    (_FLOW + _step_kv(bytes([3 << 3])), S.STEP_UNREAD, True),  # a truncated value after the flows
    (_step_kv(bytes([3 << 3]) + _varint(5)) + _FLOW + _ld(9, b"\x00"), S.STEP_UNREAD, True),  # field number 0
])
def test_the_step_is_read_at_ingest_or_left_to_the_analysis(attrs, step, malformed):
    """SpanRef.step is what keys.step_of would read from the span's bytes; where ingest cannot vouch for it
    (a malformed attribute after the flows, which ingest does not read otherwise) the payload is still taken
    and step_of reads the bytes, refusing them as before."""
    span = (_ld(1, b"t" * 16) + _ld(2, b"s" * 8) + _ld(5, b"nccl.AllReduce") + _int_kv(sc.RANK, 1)
            + _int_kv(sc.COMM_NRANKS, 4) + attrs)
    (ref,) = DECODE(_ld(1, _ld(2, _ld(2, span))))[1]
    assert ref.step == step
    st = TraceState(b"t" * 16)
    st.add(ref, 0.0)
    if malformed:
        with pytest.raises(ValueError):
            K.step_of(st)
    else:
        assert K.step_of(st) == max(step, -1)


def test_mutated_payloads_never_crash():
    rng = random.Random(11)
    base = [_random_request(rng).SerializeToString() for _ in range(20)]
    base.append(Ring(16, nch=2, comm=0x9, seq=1).request().SerializeToString())
    dec = _native.AttrDecoder(S._EVIDENCE_KEYS)
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
            refs = DECODE(data)[1]
        except ValueError:
            refused += 1
            continue
        for ref in refs:
            for read in (lambda: dec(*ref.raw, max(0, ref.flow_at)), lambda: S.flow_table([ref])):
                try:
                    read()
                except ValueError:
                    pass
    assert 0 < refused < 3000
