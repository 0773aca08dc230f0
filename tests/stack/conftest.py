"""Fixtures for the real-stack tests: binaries built by scripts/ (cached), never silently skipped in CI.

Each fixture runs its build script (a no-op when the cached binary is current). When the build
fails: with CI=true the test fails with the script's output; on a developer machine it is
skipped with the reason (set MYCROFT_STACK_REQUIRED=1 to make that a failure too).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"


def _strict() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes") or os.environ.get("MYCROFT_STACK_REQUIRED") == "1"


def _build(script: str) -> Path:
    """Run scripts/<script>; return the bin dir it reports (last stdout line)."""
    proc = subprocess.run(["bash", str(SCRIPTS / script)], capture_output=True, text=True, timeout=3000)
    if proc.returncode != 0:
        msg = f"scripts/{script} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
        if _strict():
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    out = Path(proc.stdout.strip().splitlines()[-1])
    return out if out.is_dir() else out.parent


@pytest.fixture(scope="session")
def otelcol_bin() -> Path:
    return _build("build_collector.sh") / "otelcol-mycroft"


@pytest.fixture(scope="session")
def jaeger_bin() -> Path:
    return _build("build_jaeger.sh") / "jaeger"


@pytest.fixture(scope="session")
def prometheus_bin_dir() -> Path:
    return _build("install_prometheus.sh")


@pytest.fixture(scope="session")
def promtool_bin(prometheus_bin_dir: Path) -> Path:
    return prometheus_bin_dir / "promtool"


@pytest.fixture(scope="session")
def stack_bin_dir(otelcol_bin: Path, jaeger_bin: Path, prometheus_bin_dir: Path) -> Path:
    """Everything LocalStack needs, in one directory."""
    assert otelcol_bin.parent == jaeger_bin.parent == prometheus_bin_dir
    return prometheus_bin_dir
