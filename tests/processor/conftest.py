"""Fixtures: an OTLP/gRPC sink for root-cause spans, processor processes, free ports."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from concurrent import futures

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

sys.path.insert(0, os.path.dirname(__file__))

from processor_support import ROOT, free_port  # noqa: E402


class Sink(trace_service_pb2_grpc.TraceServiceServicer):
    """Collects the spans exported to it (decoded from real OTLP requests)."""

    def __init__(self):
        self.spans = []
        self.cond = threading.Condition()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def Export(self, request, context):
        with self.cond:
            for rs in request.resource_spans:
                for ss in rs.scope_spans:
                    self.spans.extend(ss.spans)
            self.cond.notify_all()
        return trace_service_pb2.ExportTraceServiceResponse()

    def wait(self, n: int, timeout: float = 10.0) -> list:
        end = time.monotonic() + timeout
        with self.cond:
            while len(self.spans) < n and time.monotonic() < end:
                self.cond.wait(0.1)
            return list(self.spans)

    def stop(self):
        self.server.stop(0)


@pytest.fixture
def sink():
    s = Sink()
    yield s
    s.stop()


class ProcessorProcess:
    def __init__(self, sink_port: int, extra_env: dict | None = None):
        self.grpc_port, self.http_port, self.metrics_port = free_port(), free_port(), free_port()
        env = dict(os.environ, OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{sink_port}",
                   OTEL_EXPORTER_OTLP_PROTOCOL="grpc", OTEL_EXPORTER_OTLP_INSECURE="true",
                   PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        env.update(extra_env or {})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mycroft_otel", "processor", "--bind", "127.0.0.1",
             "--grpc-port", str(self.grpc_port), "--http-port", str(self.http_port),
             "--metrics-port", str(self.metrics_port)],
            env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        line = self.proc.stderr.readline()  # the "listening" line
        assert "OTLP gRPC" in line, line + (self.proc.stderr.read() if self.proc.poll() is not None else "")
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}")
        self.stub = trace_service_pb2_grpc.TraceServiceStub(self.channel)

    def send(self, req, timeout: float = 10.0):
        return self.stub.Export(req, timeout=timeout)

    def stop(self):
        self.channel.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.fixture
def spawn(sink):
    procs = []

    def _spawn(extra_env=None):
        p = ProcessorProcess(sink.port, extra_env)
        procs.append(p)
        return p

    yield _spawn
    for p in procs:
        p.stop()
