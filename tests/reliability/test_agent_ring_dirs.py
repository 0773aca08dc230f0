"""Per-user ring directories: a root agent left at the default follows every user's own directory (and only
directories whose name matches their owner), and refuses a ring directory that is a symlink or that group or
others can write."""

from __future__ import annotations

import os

from agent_shm import FakeRing
from mycroft_otel import config
from mycroft_otel.agent.discovery import Discovery
from mycroft_otel.agent.settings import AgentSettings


def test_root_agent_at_the_default_follows_every_users_directory(tmp_path):
    assert AgentSettings.from_env({}).all_users == (os.geteuid() == 0)
    assert not AgentSettings.from_env({"MYCROFT_RING_DIR": "/srv/rings"}).all_users
    assert AgentSettings.from_env({}).ring_dir.as_posix() == config.default_ring_dir()
    prefix = str(tmp_path / "mycroft-otel-")
    own = tmp_path / "mycroft-otel-0"
    alice = tmp_path / "mycroft-otel-4242"
    liar = tmp_path / "mycroft-otel-4343"     # named for uid 4343, owned by someone else
    planted = tmp_path / "mycroft-otel-4444"  # a symlink to a directory elsewhere
    elsewhere = tmp_path / "elsewhere"
    for d in (own, alice, liar, elsewhere):
        d.mkdir(mode=0o700)
    os.chown(alice, 4242, 4242)
    planted.symlink_to(elsewhere)
    for d in (own, alice, liar, elsewhere):
        FakeRing(d / "r.mycroft", rank=0, nranks=1)
    disc = Discovery(own, all_users=True, prefix=prefix)
    found = sorted(c.path for c in disc.scan().appeared)
    assert found == [str(own / "r.mycroft"), str(alice / "r.mycroft")]
    # removal stays inside those directories, of files it followed
    for p, ident in [(str(alice / "r.mycroft"), os.lstat(alice / "r.mycroft"))]:
        disc.accepted(p, (ident.st_dev, ident.st_ino))
        assert disc.remove(p) and not os.path.exists(p)
    assert not disc.remove(str(liar / "r.mycroft")) and (liar / "r.mycroft").exists()


def test_symlinked_or_shared_ring_dir_is_refused(tmp_path, caplog):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    FakeRing(real / "r.mycroft", rank=0, nranks=1)
    link = tmp_path / "link"
    link.symlink_to(real)
    assert Discovery(link).scan().appeared == []
    assert "symbolic link" in caplog.text
    os.chmod(real, 0o777)
    assert Discovery(real).scan().appeared == []
    assert "writable by group or others" in caplog.text
    os.chmod(real, 0o755)
    assert len(Discovery(real).scan().appeared) == 1
