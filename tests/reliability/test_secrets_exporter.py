"""The agent's OTLP transports: public APIs only, OTEL_* honoured, tokens delivered and never logged (item 14).

They send to the processor's own receivers with TLS and a bearer token, so the
certificate, header, compression and endpoint settings are checked by a server that
refuses anything else.
"""

from __future__ import annotations

import ast
import logging
import threading
import time
from pathlib import Path

import pytest

from mycroft_otel.agent.transport import OtlpConfig, otlp_transport
from mycroft_otel.processor import Processor
from mycroft_otel.processor.receiver import Receiver

from service_helpers import ROOT, hung_payload, make_certs

TOKEN = "plantedExportToken4e2a91"


@pytest.fixture
def secured(tmp_path):
    certs = make_certs(tmp_path)
    proc = Processor(env={})
    rx = Receiver(proc, grpc_port=0, http_port=0, tls_cert=certs.cert, tls_key=certs.key, token=TOKEN).start()
    yield certs, proc, rx
    rx.shutdown()


def _env(protocol: str, port: int, ca: str, token: str, compression: str = "gzip") -> dict:
    if protocol == "grpc":
        return {"OTEL_EXPORTER_OTLP_ENDPOINT": f"https://127.0.0.1:{port}", "OTEL_EXPORTER_OTLP_CERTIFICATE": ca,
                "OTEL_EXPORTER_OTLP_HEADERS": f"Authorization=Bearer%20{token}",
                "OTEL_EXPORTER_OTLP_COMPRESSION": compression, "OTEL_EXPORTER_OTLP_TIMEOUT": "5"}
    return {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"https://127.0.0.1:{port}/v1/traces",
            "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": ca,
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS": f"authorization=Bearer {token},x-tenant=a",
            "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": compression, "OTEL_EXPORTER_OTLP_TIMEOUT": "5"}


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
@pytest.mark.parametrize("compression", ["gzip", "none"])
def test_transport_delivers_over_tls_with_the_token(secured, protocol, compression):
    certs, proc, rx = secured
    port = rx.grpc_port if protocol == "grpc" else rx.http_port
    t = otlp_transport(protocol, _env(protocol, port, certs.ca, TOKEN, compression))
    try:
        assert t.send(hung_payload(1), 8) and t.send(hung_payload(2), 8)  # (the second reuses the connection)
    finally:
        t.shutdown()
    assert proc.counts["spans"] == 16 and sum(rx.rejected.values()) == 0


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_refused_token_fails_at_once_and_is_not_logged(secured, protocol, caplog):
    certs, proc, rx = secured
    port = rx.grpc_port if protocol == "grpc" else rx.http_port
    wrong = TOKEN[::-1]
    t = otlp_transport(protocol, _env(protocol, port, certs.ca, wrong))
    caplog.set_level(logging.DEBUG)
    try:
        t0 = time.monotonic()
        assert not t.send(hung_payload(1), 8)
        assert time.monotonic() - t0 < 4.5  # not retried until the 5 s timeout: a refusal is final
    finally:
        t.shutdown()
    assert proc.counts["spans"] == 0
    assert "export of 8 spans" in caplog.text
    assert wrong not in caplog.text and TOKEN not in caplog.text


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_transport_retries_until_the_server_is_up(tmp_path, protocol):
    from processor_support import free_port

    certs = make_certs(tmp_path)
    port = free_port()
    proc = Processor(env={})
    rx = Receiver(proc, grpc_port=port if protocol == "grpc" else None, http_port=port if protocol != "grpc" else None,
                  tls_cert=certs.cert, tls_key=certs.key, token=TOKEN)
    env = _env(protocol, port, certs.ca, TOKEN)
    env["OTEL_EXPORTER_OTLP_TIMEOUT"] = "20"
    starter = threading.Timer(1.0, rx.start)
    starter.start()
    t = otlp_transport(protocol, env)
    try:
        assert t.send(hung_payload(1), 8)
    finally:
        t.shutdown()
        starter.join()
        rx.shutdown()
    assert proc.counts["spans"] == 8


def test_shutdown_cuts_the_backoff_short():
    from processor_support import free_port

    t = otlp_transport("grpc", {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}",
                                "OTEL_EXPORTER_OTLP_TIMEOUT": "60"})
    threading.Timer(1.0, t.shutdown).start()
    t0 = time.monotonic()
    assert not t.send(hung_payload(1), 8)
    assert time.monotonic() - t0 < 30


def test_endpoint_defaults_follow_the_specification():
    c = OtlpConfig.from_env("http/protobuf", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://gw:4318/"})
    assert c.endpoint == "http://gw:4318/v1/traces" and c.compression == "none" and c.timeout_s == 10.0
    c = OtlpConfig.from_env("grpc", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://gw:4317"})
    assert c.insecure
    c = OtlpConfig.from_env("grpc", {"OTEL_EXPORTER_OTLP_ENDPOINT": "gw:4317"})
    assert not c.insecure  # no scheme, no OTEL_EXPORTER_OTLP_INSECURE: TLS
    c = OtlpConfig.from_env("grpc", {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://gw:4317",
                                     "OTEL_EXPORTER_OTLP_INSECURE": "true"})
    assert not c.insecure  # https wins
    c = OtlpConfig.from_env("grpc", {"OTEL_EXPORTER_OTLP_HEADERS": "a=1",
                                     "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "Authorization=Bearer%20x%2Cy"})
    assert c.headers == (("authorization", "Bearer x,y"),)  # the per-signal list wins, URL-decoded


def test_agent_export_uses_no_private_opentelemetry_api():
    """The agent's export modules reach into no underscore name of any opentelemetry module or object."""
    for name in ("exporter.py", "transport.py"):
        tree = ast.parse((Path(ROOT) / "mycroft_otel" / "agent" / name).read_text())
        otel = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("opentelemetry"):
                assert not any(a.name.startswith("_") for a in node.names), (name, node.module)
                assert "._" not in node.module, (name, node.module)
                otel |= {a.asname or a.name for a in node.names}
            elif isinstance(node, ast.ClassDef):
                assert not any(isinstance(b, ast.Name) and b.id in otel for b in node.bases), (name, node.name)
        assert not otel, (name, otel)  # no opentelemetry SDK class at all: grpcio and http.client only
