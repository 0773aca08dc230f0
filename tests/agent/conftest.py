"""Agent test fixtures: a real OTLP gRPC receiver (agent_sink.py) and a clean OTEL_*/MYCROFT_* environment."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from agent_helpers import export_to  # noqa: E402
from agent_sink import SinkServer  # noqa: E402


@pytest.fixture
def sink_server():
    srv = SinkServer()
    yield srv
    srv.stop()


@pytest.fixture
def otel_env(sink_server, monkeypatch):
    export_to(sink_server, "agent-test", monkeypatch)
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test")
    return sink_server
