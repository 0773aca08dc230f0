"""Shared fixtures of the evaluation tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def plugin() -> str:
    """The built NCCL profiler plugin the virtual-time runs drive (skipped without the native build)."""
    try:
        from mycroft_otel.sim.runner import find_plugin

        return find_plugin()
    except (ImportError, FileNotFoundError) as exc:
        pytest.skip(f"native build missing: {exc}")
