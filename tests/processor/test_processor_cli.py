"""`mycroft-otel processor` options (TLS, bad values) and `mycroft-otel demo` end to end."""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import sys
import urllib.request

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

from processor_support import ROOT
from synth import Ring


def _cert(tmp_path) -> tuple[str, str]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    cert, key = str(tmp_path / "cert.pem"), str(tmp_path / "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True)
    return cert, key


def test_tls_on_both_protocols(tmp_path):
    from mycroft_otel.processor import Processor
    from mycroft_otel.processor.receiver import Receiver

    cert, key = _cert(tmp_path)
    proc = Processor(env={})
    rx = Receiver(proc, grpc_port=0, http_port=0, tls_cert=cert, tls_key=key).start()
    try:
        ring = Ring(8, comm=0x77)
        ring.gpu_stall(4)
        creds = grpc.ssl_channel_credentials(open(cert, "rb").read())
        with grpc.secure_channel(f"127.0.0.1:{rx.grpc_port}", creds,
                                 options=[("grpc.ssl_target_name_override", "localhost")]) as ch:
            trace_service_pb2_grpc.TraceServiceStub(ch).Export(ring.request([0, 1, 2, 3]), timeout=10)
        ctx = ssl.create_default_context(cafile=cert)
        req = urllib.request.Request(f"https://localhost:{rx.http_port}/v1/traces",
                                     data=ring.request([4, 5, 6, 7]).SerializeToString(),
                                     headers={"Content-Type": "application/x-protobuf"})
        assert urllib.request.urlopen(req, context=ctx, timeout=10).status == 200
        assert proc.counts["spans"] == 8
        with pytest.raises(grpc.RpcError):  # plaintext is refused
            with grpc.insecure_channel(f"127.0.0.1:{rx.grpc_port}") as ch:
                trace_service_pb2_grpc.TraceServiceStub(ch).Export(ring.request([0]), timeout=3)
    finally:
        rx.shutdown()


def _cli(*args, env=None, timeout=60):
    e = dict(os.environ, PYTHONPATH=ROOT)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "mycroft_otel", *args], env=e, cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def test_bad_configuration_is_named():
    r = _cli("processor", "--grpc-port", "0", "--http-port", "-1", "--metrics-port", "-1",
             env={"MYCROFT_STALL_MS": "soon"})
    assert r.returncode == 2 and "MYCROFT_STALL_MS" in r.stderr
    r = _cli("processor", "--grpc-port", "0", "--http-port", "-1", "--metrics-port", "-1",
             env={"OTEL_EXPORTER_OTLP_PROTOCOL": "carrier-pigeon"})
    assert r.returncode == 2 and "OTEL_EXPORTER_OTLP_PROTOCOL" in r.stderr
    r = _cli("processor", "--tls-cert", "x.pem")
    assert r.returncode == 2 and "--tls-key" in r.stderr


def test_port_in_use_is_a_clear_error():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = _cli("processor", "--grpc-port", "-1", "--http-port", str(port), "--metrics-port", "-1")
        assert r.returncode == 1 and "processor:" in r.stderr
        r = _cli("processor", "--grpc-port", str(port), "--http-port", "-1", "--metrics-port", "-1")
        assert r.returncode == 1 and "cannot bind" in r.stderr


@pytest.mark.slow
def test_demo_names_the_culprit():
    r = _cli("demo", "--fault", "gpu_stalled", "--nodes", "4", "--gpus", "2", "--seed", "2", timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "verdict    hang: gpu_stalled" in r.stdout, r.stdout
    assert "right: culprit found, category gpu_stalled" in r.stdout, r.stdout
