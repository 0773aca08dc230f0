"""The ring directory is checked, not trusted: symlinks, other users' and group-writable directories are
refused with a message naming MYCROFT_RING_DIR, nothing is written through them, and the default is per user
(the plugin and mycroft_otel.config agree on it)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from mycroft_otel import config
from mycroft_otel.native import Driver


def _declined(plugin_so: str, ring_dir: Path) -> str:
    d = Driver(plugin_so)
    with pytest.raises(RuntimeError) as exc:
        d.init("c", 0xAB, 1, 2, 0, env={"MYCROFT_RING_DIR": str(ring_dir)})
    return str(exc.value)


def test_symlinked_ring_dir_is_refused_and_its_target_untouched(plugin_so, tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    (victim / "keep").write_text("precious")
    link = tmp_path / "rings"
    link.symlink_to(victim)
    msg = _declined(plugin_so, link)
    assert "MYCROFT_RING_DIR" in msg and "symbolic link" in msg
    assert sorted(p.name for p in victim.iterdir()) == ["keep"] and (victim / "keep").read_text() == "precious"


def test_another_users_ring_dir_is_refused(plugin_so, tmp_path):
    d = tmp_path / "rings"
    d.mkdir(mode=0o700)
    os.chown(d, 4242, 4242)  # as if another user had created the shared directory first
    msg = _declined(plugin_so, d)
    assert "MYCROFT_RING_DIR" in msg and "owned by uid 4242" in msg
    assert os.listdir(d) == []


def test_group_or_world_writable_ring_dir_is_refused(plugin_so, tmp_path):
    d = tmp_path / "rings"
    d.mkdir()
    os.chmod(d, 0o777)
    msg = _declined(plugin_so, d)
    assert "MYCROFT_RING_DIR" in msg and "writable by group or others" in msg and "777" in msg
    assert os.listdir(d) == []


def test_default_ring_dir_is_per_user_and_agrees_with_config(plugin_so):
    expected = Path(config.default_ring_dir())
    assert str(expected) == f"/dev/shm/mycroft-otel-{os.geteuid()}"
    assert config.get_str("MYCROFT_RING_DIR", {}) == str(expected)
    existed = expected.exists()
    before = set(os.listdir(expected)) if existed else set()
    d = Driver(plugin_so)
    ctx = d.init("c", 0xDEF0, 1, 2, 0, env={"MYCROFT_RING_DIR": None, "NCCL_HOSTID": "per-user-default-test"})
    try:
        created = set(os.listdir(expected)) - before
        assert len(created) == 1 and next(iter(created)).startswith("per-user-default-test-")
        st = expected.lstat()
        assert st.st_uid == os.geteuid() and (st.st_mode & 0o077) == 0
    finally:
        d.finalize(ctx)
        for name in set(os.listdir(expected)) - before:
            os.unlink(expected / name)
        if not existed:
            shutil.rmtree(expected, ignore_errors=True)
