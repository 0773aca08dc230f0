"""Fixtures for the native tests: the built plugin, a recorder plugin, isolated ring directories."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # native_support.py, events.py, hostile.py

from native_support import build_recorder, built_plugin  # noqa: E402


@pytest.fixture(scope="session")
def plugin_so() -> str:
    p = built_plugin()
    if p is None:
        pytest.skip("the plugin is not built (cmake --build build/dev)")
    return str(p)


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
