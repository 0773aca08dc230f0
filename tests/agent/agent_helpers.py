"""Small helpers shared by the agent tests."""

from __future__ import annotations

import os
from pathlib import Path

from mycroft_otel.agent.agent import Agent
from mycroft_otel.agent.settings import AgentSettings
from agent_shm import FakeReader


def make_agent(ring_dir: Path, reader_factory=FakeReader, transport=None, **mycroft) -> Agent:
    env = dict(os.environ)
    env["MYCROFT_RING_DIR"] = str(ring_dir)
    env.setdefault("MYCROFT_POLL_MS", "50")
    # the agent's own state directory, beside the ring directory (never inside it, never shared between tests)
    env.setdefault("MYCROFT_STATE_DIR", str(Path(ring_dir).parent / f"{Path(ring_dir).name}.agent-state"))
    for k, v in mycroft.items():
        env["MYCROFT_" + k.upper()] = str(v)
    return Agent(AgentSettings.from_env(env), transport=transport, reader_factory=reader_factory)
