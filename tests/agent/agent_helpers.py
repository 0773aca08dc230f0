"""Small helpers shared by the agent tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mycroft_otel.agent.agent import Agent
from mycroft_otel.agent.settings import AgentSettings
from agent_shm import FakeReader
from agent_sink import SinkServer


def make_agent(ring_dir: Path, reader_factory=FakeReader, transport=None, **mycroft) -> Agent:
    env = dict(os.environ)
    env["MYCROFT_RING_DIR"] = str(ring_dir)
    env.setdefault("MYCROFT_POLL_MS", "50")
    # the agent's own state directory, beside the ring directory (never inside it, never shared between tests)
    env.setdefault("MYCROFT_STATE_DIR", str(Path(ring_dir).parent / f"{Path(ring_dir).name}.agent-state"))
    for k, v in mycroft.items():
        env["MYCROFT_" + k.upper()] = str(v)
    return Agent(AgentSettings.from_env(env), transport=transport, reader_factory=reader_factory)


def export_to(sink: SinkServer, service_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Points the OTEL_* export settings at sink (OTLP/gRPC, short timeout) and drops every MYCROFT_* variable:
    a developer's own agent settings must not change what a test sees."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", sink.endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "2")
    monkeypatch.setenv("OTEL_SERVICE_NAME", service_name)
    for k in list(os.environ):
        if k.startswith("MYCROFT_"):
            monkeypatch.delenv(k)
