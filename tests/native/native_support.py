"""Helpers shared by the native tests (plain functions; the fixtures live in conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
INCLUDE = ROOT / "native" / "include"


def built_plugin() -> Path | None:
    p = ROOT / "mycroft_otel" / "lib" / "libnccl-profiler-mycroft.so"
    return p if p.is_file() else None


def build_recorder(out: Path, versions: int = 0xF0) -> Path:
    so = out / f"recorder_{versions:x}.so"
    if not so.exists():
        cxx = os.environ.get("CXX", "g++")
        subprocess.run([cxx, "-std=c++17", "-O1", "-shared", "-fPIC", f"-DREC_VERSIONS={versions}", f"-I{INCLUDE}",
                        str(HERE / "recorder_plugin.cc"), "-o", str(so)], check=True, timeout=120)
    return so


def run_isolated(args: list[str], timeout: float = 60, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run a helper script in a fresh interpreter: a crash or a hang fails the test instead of pytest."""
    full_env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE)]))
    full_env.update(env or {})
    try:
        return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=full_env,
                              cwd=str(ROOT))
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{args} blocked for more than {timeout}s (a callback must never block)\n{exc.stdout}\n{exc.stderr}")
