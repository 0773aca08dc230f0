"""The processor's OTLP receivers against hostile network clients (issue 14, items 8, 9, 11).

Each test stages the attack next to a legitimate exporter and asserts the legitimate
request is answered. Client timeouts are generous (30 s): the assertion is that the
request succeeds at all, which it did not while one idle TLS client or 32 dripping ones
held the old server's threads.
"""

from __future__ import annotations

import socket
import time

import grpc
import pytest

from mycroft_otel.processor import Processor
from mycroft_otel.processor.metrics import Metrics
from mycroft_otel.processor.otlp_http import HttpLimits
from mycroft_otel.processor.receiver import Receiver

from service_helpers import Drippers, GrpcDrippers, hung_payload, make_certs, post

METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
TOKEN = "planted-bearer-0f4c2b9e"


def _receiver(**kw) -> tuple[Receiver, Processor, Metrics]:
    metrics = Metrics()
    proc = Processor(env={}, metrics=metrics)
    rx = Receiver(proc, grpc_port=0, http_port=0, metrics=metrics, **kw).start()
    return rx, proc, metrics


def _grpc_call(port: int, creds=None, token: str | None = None, payload: bytes = b"", timeout_s: float = 30.0):
    target = f"127.0.0.1:{port}"
    with (grpc.secure_channel(target, creds, options=[("grpc.ssl_target_name_override", "localhost")])
          if creds is not None else grpc.insecure_channel(target)) as ch:
        call = ch.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
        md = (("authorization", f"Bearer {token}"),) if token else None
        return call(payload, timeout=timeout_s, metadata=md)


def test_https_and_grpc_tls_ingest_beside_idle_and_half_handshaking_clients(tmp_path):
    certs = make_certs(tmp_path)
    rx, proc, _ = _receiver(tls_cert=certs.cert, tls_key=certs.key)
    idle = []
    try:
        for port in (rx.http_port, rx.grpc_port):
            for partial in (b"", b"\x16\x03\x01\x02\x00\x01"):  # nothing at all; a ClientHello cut short
                s = socket.create_connection(("127.0.0.1", port))
                s.sendall(partial)
                idle.append(s)
        time.sleep(0.5)  # the idle clients are accepted before the real exporter connects
        status, _ = post(rx.http_port, hung_payload(1), tls=certs.client_context())
        assert status == 200
        creds = grpc.ssl_channel_credentials(open(certs.ca, "rb").read())
        _grpc_call(rx.grpc_port, creds, payload=hung_payload(2))
        assert proc.counts["spans"] == 16
        assert {v.seq for v in proc.tick()} == {1, 2}
    finally:
        for s in idle:
            s.close()
        rx.shutdown()


def test_post_succeeds_beside_64_dripping_clients():
    rx, proc, metrics = _receiver(limits=HttpLimits(request_timeout_s=3.0))
    drip = Drippers(rx.http_port, 64).start()
    try:
        time.sleep(1.5)  # every dripper holds its connection and has sent a byte more
        for seq in (1, 2, 3):
            status, _ = post(rx.http_port, hung_payload(seq))
            assert status == 200
        assert {v.seq for v in proc.tick()} == {1, 2, 3}
        # the whole-request deadline cuts every dripper, header or body, however steadily it sends
        end = time.monotonic() + 30
        while drip.closed_by_server < 64 and time.monotonic() < end:
            time.sleep(0.5)
        assert drip.closed_by_server == 64
        assert rx.rejected["http"] == 0  # none of the legitimate requests was refused
    finally:
        drip.stop()
        rx.shutdown()


def test_grpc_export_succeeds_beside_64_dripping_calls():
    rx, proc, metrics = _receiver(limits=HttpLimits(request_timeout_s=3.0))
    drip = GrpcDrippers(rx.grpc_port, connections=8, streams=8).start()
    try:
        time.sleep(1.5)  # 64 calls have their headers in and wait for the rest of their message
        for seq in (1, 2, 3):
            _grpc_call(rx.grpc_port, payload=hung_payload(seq))
        assert {v.seq for v in proc.tick()} == {1, 2, 3}
        # each dripping call is cut when its message is not in by the deadline, however steadily it sends
        end = time.monotonic() + 30
        while rx.rejected["grpc"] < 64 and time.monotonic() < end:
            time.sleep(0.5)
        assert rx.rejected["grpc"] == 64
        assert 'mycroft_processor_requests_rejected_total{protocol="grpc",reason="timeout"} 64.0' in metrics.text()
    finally:
        drip.stop()
        rx.shutdown()


def test_open_connections_are_capped_and_freed_by_the_deadline():
    rx, proc, metrics = _receiver(limits=HttpLimits(request_timeout_s=2.0, max_connections=8))
    held = [socket.create_connection(("127.0.0.1", rx.http_port)) for _ in range(8)]
    try:
        time.sleep(0.5)
        extra = socket.create_connection(("127.0.0.1", rx.http_port))
        extra.settimeout(10)
        assert extra.recv(1) == b""  # closed at accept: the cap holds
        extra.close()
        assert 'mycroft_processor_requests_rejected_total{protocol="http",reason="connections"}' in metrics.text()
        # the held connections never sent a request: the header deadline frees their places
        end = time.monotonic() + 30
        while True:
            try:
                status, _ = post(rx.http_port, hung_payload(7))
                break
            except (ConnectionError, OSError):  # still full
                if time.monotonic() > end:
                    raise
                time.sleep(0.5)
        assert status == 200
    finally:
        for s in held:
            s.close()
        rx.shutdown()


def test_bearer_token_is_required_on_both_protocols(tmp_path):
    certs = make_certs(tmp_path)
    rx, proc, metrics = _receiver(tls_cert=certs.cert, tls_key=certs.key, token=TOKEN)
    try:
        tls = certs.client_context()
        assert post(rx.http_port, hung_payload(1), tls=tls)[0] == 401
        assert post(rx.http_port, hung_payload(1), {"Authorization": "Bearer wrong"}, tls=tls)[0] == 401
        assert post(rx.http_port, hung_payload(1), {"Authorization": f"Basic {TOKEN}"}, tls=tls)[0] == 401
        assert proc.counts["spans"] == 0  # nothing of a refused request is ingested
        assert post(rx.http_port, hung_payload(1), {"Authorization": f"Bearer {TOKEN}"}, tls=tls)[0] == 200
        creds = grpc.ssl_channel_credentials(open(certs.ca, "rb").read())
        for token in (None, "wrong"):
            with pytest.raises(grpc.RpcError) as e:
                _grpc_call(rx.grpc_port, creds, token=token, payload=hung_payload(2))
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        _grpc_call(rx.grpc_port, creds, token=TOKEN, payload=hung_payload(2))
        assert proc.counts["spans"] == 16
        assert rx.rejected == {"http": 3, "grpc": 2}
        assert TOKEN not in metrics.text()
    finally:
        rx.shutdown()


def test_body_bytes_in_flight_are_bounded():
    rx, proc, _ = _receiver(limits=HttpLimits(max_body_bytes_in_flight=64 << 10))
    try:
        s = socket.create_connection(("127.0.0.1", rx.http_port))
        s.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n" + b"\0" * (128 << 10))
        s.settimeout(10)
        assert s.recv(64).startswith(b"HTTP/1.1 503")
        s.close()
        assert post(rx.http_port, hung_payload(3))[0] == 200  # its reservation was given back
    finally:
        rx.shutdown()


def test_metrics_scrape_beside_200_idle_connections_costs_no_thread_each():
    import threading
    import urllib.request

    metrics = Metrics()
    port = metrics.serve(0)
    before = threading.active_count()
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(200)]
    try:
        time.sleep(0.5)
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
        assert "mycroft_processor_spans_received_total" in text
        assert threading.active_count() <= before + 2  # (a thread per connection would be 200 more)
    finally:
        for s in idle:
            s.close()
        metrics.shutdown()
