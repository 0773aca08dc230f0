"""Fixtures for the reliability tests: the built plugin, a real OTLP sink, a small real tmpfs.

The helpers are the native and agent tests' own (tests/native: the ABI driver's event
builders and isolated runs; tests/agent: the OTLP sink, the layout writer, make_agent).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
for sub in ("native", "agent"):
    sys.path.insert(0, str(HERE.parent / sub))

from agent_helpers import export_to  # noqa: E402
from agent_sink import SinkServer  # noqa: E402
from native_support import built_plugin  # noqa: E402


@pytest.fixture(scope="session")
def plugin_so() -> str:
    p = built_plugin()
    if p is None:
        pytest.skip("the plugin is not built (cmake --build build/dev)")
    return str(p)


@pytest.fixture
def otel_env(monkeypatch):
    """A real OTLP gRPC receiver and an agent environment pointing at it (no MYCROFT_* from outside)."""
    srv = SinkServer()
    export_to(srv, "reliability-test", monkeypatch)
    yield srv
    srv.stop()


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A real 1 MiB tmpfs (mount -t tmpfs -o size=1m): the full /dev/shm of a crowded node, in miniature."""
    mnt = tmp_path / "shm"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "tmpfs", str(mnt)], capture_output=True,
                       text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()}); run as root or inside `unshare -rm`")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
