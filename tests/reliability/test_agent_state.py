"""The agent's state is its own: symlinks planted where a root agent used to write (inside the ring directory)
or where it writes now leave their targets untouched, a state directory the agent does not own is refused
naming MYCROFT_STATE_DIR, and one corrupt entry in the state file costs that entry only."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agent_helpers import make_agent
from agent_shm import FakeRing
from mycroft_otel.agent.settings import AgentSettings
from mycroft_otel.agent.state import CursorStore
from mycroft_otel.config import ConfigError

PRECIOUS = b"root:x:0:0::/root:/bin/bash\n"


def _victim(tmp_path: Path) -> Path:
    v = tmp_path / "etc-passwd"
    v.write_bytes(PRECIOUS)
    return v


def test_default_state_dir_is_the_agents_own_not_the_ring_dirs(tmp_path):
    env = {"MYCROFT_RING_DIR": str(tmp_path / "rings"), "XDG_STATE_HOME": str(tmp_path / "xdg"), "HOME": "/nowhere"}
    assert AgentSettings.from_env(env).state_dir == tmp_path / "xdg" / "mycroft-otel"
    env = {"MYCROFT_RING_DIR": str(tmp_path / "rings"), "HOME": str(tmp_path / "home")}
    assert AgentSettings.from_env(env).state_dir == tmp_path / "home" / ".local" / "state" / "mycroft-otel"
    with pytest.raises(ConfigError, match="MYCROFT_STATE_DIR"):
        AgentSettings.from_env({"MYCROFT_STATE_DIR": "relative/state"})


def test_symlink_planted_in_the_ring_dir_is_never_written(tmp_path, otel_env, monkeypatch):
    """The old default was <ring dir>/.agent-state: the training user owns that directory."""
    ring_dir = tmp_path / "rings"
    ring_dir.mkdir(mode=0o700)
    victim = _victim(tmp_path)
    plant = ring_dir / ".agent-state"
    plant.mkdir()
    (plant / "cursors.json").symlink_to(victim)
    ring = FakeRing(ring_dir / "r0.mycroft", rank=0, nranks=1)
    ring.op_done()
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    env = dict(os.environ, MYCROFT_RING_DIR=str(ring_dir), MYCROFT_SAMPLE_RATIO="1")
    from mycroft_otel.agent.agent import Agent
    from mycroft_otel.agent.source import default_reader_factory

    agent = Agent(AgentSettings.from_env(env), reader_factory=default_reader_factory)
    agent.poll_once()
    assert agent.queue.flush(10)
    agent.poll_once()
    agent.close()
    assert victim.read_bytes() == PRECIOUS
    saved = json.loads((tmp_path / "xdg" / "mycroft-otel" / "cursors.json").read_text())
    assert [v["cursor"] for v in saved.values()] == [1]


def test_symlink_planted_in_the_state_dir_is_replaced_not_followed(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    victim = _victim(tmp_path)
    (state / "cursors.json").symlink_to(victim)
    (state / f"cursors.json.{os.getpid()}.tmp").symlink_to(victim)  # the temporary name too
    store = CursorStore(state)
    assert store.data == {}  # not read through the link
    store.update("1-00000000000000aa-0-5", cursor=7, last_seq=6, last_end=99)
    store.save()
    store.close()
    assert victim.read_bytes() == PRECIOUS
    assert not (state / "cursors.json").is_symlink()
    assert json.loads((state / "cursors.json").read_text())["1-00000000000000aa-0-5"]["cursor"] == 7
    assert (state / "cursors.json").stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("attack", ["symlink", "other-owner", "group-writable"])
def test_a_state_dir_that_is_not_the_agents_own_is_refused(tmp_path, attack):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    state = tmp_path / "state"
    if attack == "symlink":
        state.symlink_to(real)
    else:
        state.mkdir(mode=0o700)
        if attack == "other-owner":
            os.chown(state, 4242, 4242)
        else:
            os.chmod(state, 0o770)
    with pytest.raises(ConfigError, match="MYCROFT_STATE_DIR"):
        CursorStore(state)
    assert list(real.iterdir()) == []


def test_one_corrupt_entry_costs_only_that_entry(tmp_path, otel_env):
    ring_dir = tmp_path / "rings"
    ring_dir.mkdir(mode=0o700)
    a = FakeRing(ring_dir / "a.mycroft", rank=0, nranks=2)
    b = FakeRing(ring_dir / "b.mycroft", rank=1, nranks=2)
    for _ in range(3):
        a.op_done()
        b.op_done()
    first = make_agent(ring_dir, sample_ratio=1.0, idle_after_ms=600000)
    first.poll_once()
    assert first.queue.flush(10)
    first.poll_once()
    first.close()
    state_file = Path(first.s.state_dir) / "cursors.json"
    saved = json.loads(state_file.read_text())
    assert sorted(v["cursor"] for v in saved.values()) == [3, 3]
    key_b = next(k for k in saved if k.endswith(f"-{b.h['start_mono_ns']}"))
    saved[key_b] = {"cursor": 3, "last_seq": "x"}  # corrupt (int() of it failed every poll): b restarts at 0
    saved["text-cursor"] = {"cursor": "three"}
    saved["garbage"] = [1, 2, 3]
    saved["negative"] = {"cursor": -5}
    saved["boolean"] = {"cursor": True}
    state_file.write_text(json.dumps(saved))
    n_before = len(otel_env.sink.spans)
    a.op_done()
    b.op_done()
    second = make_agent(ring_dir, sample_ratio=1.0, idle_after_ms=600000)
    assert second.store.skipped == 5
    second.poll_once()
    assert second.queue.flush(10)
    second.close()
    new = [s for s in otel_env.sink.spans[n_before:] if s["name"] == "nccl.AllReduce"]
    per_rank = {}
    for s in new:
        r = s["resource"].get("mycroft.rank", s["attrs"].get("mycroft.rank"))
        per_rank[r] = per_rank.get(r, 0) + 1
    assert per_rank == {0: 1, 1: 4}  # a resumed after its 3 exported ops; b (bad entry) re-read from the start
