"""Suite-wide: end-to-end verdict tests known to fail on this 2-core machine are marked, not hidden.

tests/known_failures.txt lists pytest node ids (one per line, '#' comments) of real-time end-to-end verdict
checks that failed in the last full run for a known analysis weakness (see the closing note / docs/algorithm.md).
They stay in the run as non-strict xfail, so a fix shows up as XPASS and the list can shrink.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_LIST = Path(__file__).with_name("known_failures.txt")
_REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def stack_load():
    """benchmarks/stack_load/run.py as a module: the 1,024-rank load job (its topology, model and runner)."""
    spec = importlib.util.spec_from_file_location("stack_load_run", _REPO / "benchmarks" / "stack_load" / "run.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def _known() -> dict[str, str]:
    out: dict[str, str] = {}
    if _LIST.is_file():
        for line in _LIST.read_text().splitlines():
            node, _, why = line.partition("#")
            if node.strip():
                out[node.strip()] = why.strip() or "known analysis weakness"
    return out


def pytest_collection_modifyitems(config, items):
    known = _known()
    for item in items:
        why = known.get(item.nodeid)
        if why is not None:
            item.add_marker(pytest.mark.xfail(strict=False, reason="known: " + why))


@pytest.fixture(scope="module")
def plugin() -> str:
    """The built NCCL profiler plugin the virtual-time runs drive (skipped without the native build)."""
    try:
        from mycroft_otel.sim.runner import find_plugin

        return find_plugin()
    except (ImportError, FileNotFoundError) as exc:
        pytest.skip(f"native build missing: {exc}")
