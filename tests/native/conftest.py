"""Fixtures for the native tests: the built plugin, a recorder plugin, isolated ring directories."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
INCLUDE = ROOT / "native" / "include"
sys.path.insert(0, str(HERE))  # events.py, hostile.py


def _built_plugin() -> Path | None:
    p = ROOT / "mycroft_otel" / "lib" / "libnccl-profiler-mycroft.so"
    return p if p.is_file() else None


@pytest.fixture(scope="session")
def plugin_so() -> str:
    p = _built_plugin()
    if p is None:
        pytest.skip("the plugin is not built (cmake --build build/dev)")
    return str(p)


def build_recorder(out: Path, versions: int = 0xF0) -> Path:
    so = out / f"recorder_{versions:x}.so"
    if not so.exists():
        cxx = os.environ.get("CXX", "g++")
        subprocess.run([cxx, "-std=c++17", "-O1", "-shared", "-fPIC", f"-DREC_VERSIONS={versions}", f"-I{INCLUDE}",
                        str(HERE / "recorder_plugin.cc"), "-o", str(so)], check=True, timeout=120)
    return so


@pytest.fixture(scope="session")
def recorder_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("recorder")


@pytest.fixture(scope="session")
def recorder_so(recorder_dir) -> str:
    return str(build_recorder(recorder_dir))


@pytest.fixture()
def ring_dir(tmp_path) -> Path:
    d = tmp_path / "rings"
    return d


def run_isolated(args: list[str], timeout: float = 60, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run a helper script in a fresh interpreter: a crash or a hang fails the test instead of pytest."""
    full_env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE)]))
    full_env.update(env or {})
    try:
        return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=full_env,
                              cwd=str(ROOT))
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{args} blocked for more than {timeout}s (a callback must never block)\n{exc.stdout}\n{exc.stderr}")
