"""OTLP receiver: gRPC and HTTP ingest, protocol errors, fuzzing with >= 10,000 hostile payloads."""

from __future__ import annotations

import gzip
import http.client
import random
import socket
import time

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from mycroft_otel import semconv as sc
from mycroft_otel.processor import Processor
from mycroft_otel.processor.metrics import Metrics
from mycroft_otel.processor.receiver import Receiver

from synth import Ring, kvs

METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
MAX = 256 << 10


@pytest.fixture
def rx():
    metrics = Metrics()
    proc = Processor(env={}, metrics=metrics)
    r = Receiver(proc, grpc_port=0, http_port=0, max_bytes=MAX, metrics=metrics, http_timeout_s=2.0).start()
    ch = grpc.insecure_channel(f"127.0.0.1:{r.grpc_port}",
                               options=[("grpc.max_send_message_length", 64 << 20)])
    call = ch.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
    yield r, proc, call, metrics
    ch.close()
    r.shutdown()


def _http(port: int, body: bytes, headers: dict | None = None, conn=None):
    c = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    h = {"Content-Type": "application/x-protobuf"}
    h.update(headers or {})
    c.request("POST", "/v1/traces", body=body, headers=h)
    resp = c.getresponse()
    data = resp.read()
    if resp.getheader("Connection", "").lower() == "close":
        c.close()
    return resp.status, data


def _hung_ring(seq=1) -> Ring:
    ring = Ring(8, seq=seq, comm=0x5F3A9C0E12AB0000 + seq, global_base=100 * seq)  # independent incidents
    ring.gpu_stall(3)
    return ring


def test_grpc_and_http_ingest_give_verdicts(rx):
    r, proc, call, metrics = rx
    call(_hung_ring(1).request().SerializeToString(), timeout=5)
    status, _ = _http(r.http_port, _hung_ring(2).request().SerializeToString())
    assert status == 200
    status, _ = _http(r.http_port, gzip.compress(_hung_ring(3).request().SerializeToString()),
                      {"Content-Encoding": "gzip"})
    assert status == 200
    vs = proc.tick()
    assert sorted(v.seq for v in vs) == [1, 2, 3]
    assert all(v.category == "gpu_stalled" for v in vs)
    text = metrics.text()
    assert 'mycroft_root_causes_total{category="gpu_stalled",comm="5f3a9c0e12ab0002",kind="hang"} 1.0' in text
    assert "mycroft_processor_spans_received_total 24.0" in text


def test_json_ingest(rx):
    from google.protobuf import json_format
    r, proc, _, _ = rx
    body = json_format.MessageToJson(_hung_ring(4).request()).encode()
    status, _ = _http(r.http_port, body, {"Content-Type": "application/json"})
    assert status == 200 and proc.counts["spans"] == 8


def test_unknown_shape_spans_ignored_and_counted(rx):
    r, proc, call, metrics = rx
    req = trace_service_pb2.ExportTraceServiceRequest()
    ss = req.resource_spans.add().scope_spans.add()
    ss.spans.add(trace_id=b"\1" * 16, span_id=b"\2" * 8, name="GET /index")
    ss.spans.add(trace_id=b"\1" * 15, span_id=b"\2" * 8, name="nccl.AllReduce")  # bad id length
    ss.spans.add(trace_id=b"\1" * 16, span_id=b"\2" * 8, name="nccl.AllReduce",
                 attributes=kvs({sc.RANK: 9, sc.COMM_NRANKS: 4}))  # rank out of range
    ss.spans.add(trace_id=b"\1" * 16, span_id=b"\2" * 8, name="mycroft.inflight",
                 attributes=kvs({sc.RANK: "zero", sc.COMM_NRANKS: 4}))  # wrong type
    call(req.SerializeToString(), timeout=5)
    assert proc.counts["unknown"] == 4 and len(proc.store) == 0
    assert "mycroft_processor_spans_unknown_shape_total 4.0" in metrics.text()


def test_protocol_errors(rx):
    r, proc, call, _ = rx
    with pytest.raises(grpc.RpcError) as e:
        call(b"\xff\xff\xff\xff", timeout=5)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as e:
        call(b"\0" * (MAX + 10), timeout=5)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert _http(r.http_port, b"\xff\xff\xff")[0] == 400
    assert _http(r.http_port, b"\0" * (MAX + 1))[0] == 413
    assert _http(r.http_port, gzip.compress(b"\0" * (4 * MAX)), {"Content-Encoding": "gzip"})[0] == 413
    assert _http(r.http_port, b"abc", {"Content-Encoding": "br"})[0] == 415
    assert _http(r.http_port, b"abc", {"Content-Type": "text/plain"})[0] == 415
    assert _http(r.http_port, b"{not json", {"Content-Type": "application/json"})[0] == 400
    c = http.client.HTTPConnection("127.0.0.1", r.http_port, timeout=5)
    c.request("GET", "/v1/traces")
    assert c.getresponse().status == 405


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _ld(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def _nested(depth: int) -> bytes:
    """A span attribute nested ``depth`` arrays deep (built by hand: protobuf refuses to build it)."""
    v = b"\x18\x01"  # AnyValue{int_value: 1}
    for _ in range(depth):
        v = _ld(5, _ld(1, v))  # AnyValue{array_value: ArrayValue{values: [v]}}
    kv = _ld(1, sc.FLOW_CHANNEL.encode()) + _ld(2, v)
    span = trace_pb2.Span(trace_id=b"\1" * 16, span_id=b"\2" * 8, name="nccl.AllReduce").SerializeToString()
    span += _ld(9, kv)
    return _ld(1, _ld(2, _ld(2, span)))


def _hostile_valid(rng: random.Random) -> bytes:
    """Valid protobuf, hostile content: wrong types, huge/negative numbers, odd arrays, bad ids."""
    ring = Ring(rng.choice([2, 4, 8]), nch=rng.choice([1, 2]))
    getattr(ring, rng.choice(["gpu_stall", "absent", "mismatch"]))(rng.randrange(ring.n))
    req = ring.request()
    values = [2 ** 63 - 1, -2 ** 63, -1, 0, 10 ** 9, "x" * rng.choice([0, 1, 300]), 1.5, float("nan"), True,
              [1, "a", 2.5], [], ["SendWait"] * 300]
    for rs in req.resource_spans:
        for ss in rs.scope_spans:
            for span in ss.spans:
                for kv in span.attributes:
                    if rng.random() < 0.3:
                        kv.value.CopyFrom(synth_av(rng.choice(values)))
                if rng.random() < 0.1:
                    span.trace_id = bytes(rng.randrange(256) for _ in range(rng.choice([0, 8, 16, 17])))
                if rng.random() < 0.1:
                    span.start_time_unix_nano, span.end_time_unix_nano = 2 ** 64 - 1, 0
                if rng.random() < 0.1:
                    span.name = rng.choice(["", "nccl.", "mycroft.status", "mycroft.root_cause", "\u2603" * 100])
    return req.SerializeToString()


def synth_av(v):
    from synth import _av
    return _av(v)


def _cases(n: int, seed: int = 7):
    rng = random.Random(seed)
    valid = [_hung_ring(s).request().SerializeToString() for s in range(4)]
    nested = _nested(300)
    for i in range(n):
        kind = (i // 2) % 6  # every kind reaches both gRPC (even i) and HTTP (odd i)
        if kind == 0:
            yield bytes(rng.randrange(256) for _ in range(rng.randrange(0, 600)))
        elif kind == 1:
            b = rng.choice(valid)
            yield b[:rng.randrange(len(b))]
        elif kind == 2:
            b = bytearray(rng.choice(valid))
            for _ in range(rng.randrange(1, 20)):
                b[rng.randrange(len(b))] = rng.randrange(256)
            yield bytes(b)
        elif kind == 3:
            yield _hostile_valid(rng)
        elif kind == 4:
            yield nested if rng.random() < 0.05 else rng.choice(valid) + bytes([rng.randrange(256)]) * rng.randrange(1, 9)
        else:
            yield b"\x0a" + bytes([0xff, 0xff, 0xff, 0xff, 0x0f]) + b"short"  # length far beyond the data


def test_fuzz_10000_payloads_never_crash_or_wedge(rx):
    r, proc, call, _ = rx
    grpc_ok = grpc_err = http_ok = http_err = 0
    bad_codes = []
    conn = http.client.HTTPConnection("127.0.0.1", r.http_port, timeout=10)
    t0 = time.monotonic()
    for i, payload in enumerate(_cases(10_200)):
        if i % 2:
            try:
                status, _ = _http(r.http_port, payload, conn=conn)
            except (http.client.HTTPException, OSError):
                conn = http.client.HTTPConnection("127.0.0.1", r.http_port, timeout=10)
                status, _ = _http(r.http_port, payload, conn=conn)
            if status == 200:
                http_ok += 1
            elif status in (400, 413, 415):
                http_err += 1
            else:
                bad_codes.append(("http", status))
            if conn.sock is None:
                conn = http.client.HTTPConnection("127.0.0.1", r.http_port, timeout=10)
        else:
            try:
                call(payload, timeout=10)
                grpc_ok += 1
            except grpc.RpcError as e:
                if e.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED):
                    grpc_err += 1
                else:
                    bad_codes.append(("grpc", e.code()))
        if i % 500 == 0:
            proc.tick()  # analysis runs over whatever hostile state got in
    elapsed = time.monotonic() - t0
    assert not bad_codes, bad_codes[:10]
    assert grpc_ok + grpc_err + http_ok + http_err == 10_200
    assert grpc_err > 1000 and http_err > 500, (grpc_ok, grpc_err, http_ok, http_err)
    proc.tick()
    # still alive and answering quickly, and still analysing correctly
    ring = Ring(8, seq=999, comm=0x1234, global_base=5000)
    ring.net_send_stall(2, 1)
    t1 = time.monotonic()
    call(ring.request().SerializeToString(), timeout=5)
    assert time.monotonic() - t1 < 2.0
    assert [v.category for v in proc.tick() if v.seq == 999] == ["net_send_stalled"]
    print(f"fuzz: {elapsed:.1f}s grpc ok/err {grpc_ok}/{grpc_err} http ok/err {http_ok}/{http_err}")


def test_slow_and_broken_http_clients_do_not_wedge(rx):
    r, proc, call, _ = rx
    # a client that declares a body and never sends it, and one that sends half and hangs
    socks = []
    for body in (b"", b"\x0a\x05ab"):
        s = socket.create_connection(("127.0.0.1", r.http_port))
        s.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
                  b"Content-Length: 1000\r\n\r\n" + body)
        socks.append(s)
    s = socket.create_connection(("127.0.0.1", r.http_port))
    s.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n\x0a\x05")
    s.shutdown(socket.SHUT_WR)  # truncated body, then EOF
    socks.append(s)
    # the servers keep serving others meanwhile
    assert _http(r.http_port, _hung_ring(5).request().SerializeToString())[0] == 200
    call(_hung_ring(6).request().SerializeToString(), timeout=5)
    assert {v.seq for v in proc.tick()} == {5, 6}
    for s in socks:
        s.close()


def test_http_server_reaches_the_receiver_only_through_its_protocol():
    """otlp_http never imports receiver (the seam runs one way); Receiver has every member IngestTarget names."""
    import subprocess
    import sys

    from mycroft_otel.processor.otlp_http import IngestTarget

    res = subprocess.run([sys.executable, "-c",
                          "import sys, mycroft_otel.processor.otlp_http; "
                          "assert 'mycroft_otel.processor.receiver' not in sys.modules"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    wanted = {n for n in vars(IngestTarget) if not n.startswith("_")} | set(IngestTarget.__annotations__)
    r = Receiver(Processor(env={}), grpc_port=None, http_port=None)
    try:
        assert {n for n in wanted if not hasattr(r, n)} == set()
    finally:
        r.shutdown()


def test_decode_export_request_reads_protobuf_and_json():
    from google.protobuf import json_format

    from mycroft_otel.processor.receiver import decode_export_request

    req = trace_service_pb2.ExportTraceServiceRequest()
    req.resource_spans.add().scope_spans.add().spans.add(name="x", trace_id=b"\x01" * 16, span_id=b"\x02" * 8)
    assert decode_export_request(req.SerializeToString()) == req
    as_json = json_format.MessageToJson(req).encode()
    assert decode_export_request(as_json, "application/json; charset=utf-8") == req
