"""Fixtures of the end-to-end tests: the real binaries (built by scripts/, cached) and a stack with the real
``mycroft-otel processor``s. As in tests/stack: with CI=true (or MYCROFT_STACK_REQUIRED=1) a binary that cannot
be built is a failure, never a skip.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from e2e_helpers import Webhook

REPO = Path(__file__).resolve().parents[2]


def _strict() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes") or os.environ.get("MYCROFT_STACK_REQUIRED") == "1"


def _build(script: str) -> Path:
    proc = subprocess.run(["bash", str(REPO / "scripts" / script)], capture_output=True, text=True, timeout=3000)
    if proc.returncode != 0:
        msg = f"scripts/{script} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
        if _strict():
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    out = Path(proc.stdout.strip().splitlines()[-1])
    return out if out.is_dir() else out.parent


@pytest.fixture(scope="session")
def e2e_bin_dir() -> Path:
    """otelcol-mycroft, the trace store and Prometheus in one directory (scripts/build_stack.sh's cache)."""
    dirs = {_build(s) for s in ("build_collector.sh", "build_jaeger.sh", "install_prometheus.sh")}
    assert len(dirs) == 1, dirs
    return dirs.pop()


@pytest.fixture(scope="session")
def alertmanager_bin(e2e_bin_dir) -> Path:
    """Alertmanager (Debian's prometheus-alertmanager), linked into the same directory."""
    d = _build("install_alertmanager.sh")
    assert d == e2e_bin_dir, (d, e2e_bin_dir)
    return d / "alertmanager"


@pytest.fixture(scope="module")
def webhook():
    """A local HTTP receiver of Alertmanager's webhook notifications."""
    hook = Webhook()
    yield hook
    hook.stop()
