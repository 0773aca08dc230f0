"""Agent test fixtures: a real OTLP gRPC receiver (agent_sink.py) and a clean OTEL_*/MYCROFT_* environment."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from agent_sink import SinkServer  # noqa: E402


@pytest.fixture
def sink_server():
    srv = SinkServer()
    yield srv
    srv.stop()


@pytest.fixture
def otel_env(sink_server, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", sink_server.endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "2")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "agent-test")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test")
    for k in list(os.environ):
        if k.startswith("MYCROFT_"):
            monkeypatch.delenv(k)
    return sink_server
