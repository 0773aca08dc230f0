"""Conformance harness fixtures: the plugin must be built, one OTLP sink for the session, results cached."""

from __future__ import annotations

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import nccl_ctypes  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if not os.path.exists(nccl_ctypes.default_plugin_path()):
        skip = pytest.mark.skip(reason="plugin not built: cmake -S . -B build/dev -G Ninja -DMYCROFT_INPLACE=ON "
                                "&& cmake --build build/dev")
        for it in items:
            if "conformance" in str(it.fspath):
                it.add_marker(skip)


@pytest.fixture(scope="session")
def sink():
    from harness import RootCauseSink
    s = RootCauseSink()
    yield s
    s.close()


_RESULTS: dict = {}


@pytest.fixture(scope="session")
def scenario_result(sink):
    """Runs a scenario once per session; several tests assert on the same run."""
    from harness import run
    from scenarios import BY_NAME

    def get(name: str):
        if name not in _RESULTS:
            _RESULTS[name] = run(BY_NAME[name], sink)
        return _RESULTS[name]
    return get


def pytest_terminal_summary(terminalreporter):
    if not _RESULTS:
        return
    from harness import check
    tr = terminalreporter
    tr.section("conformance scenarios")
    for name, res in _RESULTS.items():
        lat = res.latency_s()
        exp = res.scenario.expect
        tr.write_line(f"{name:28s} {'PASS' if not check(res) else 'FAIL':4s} "
                      f"expected={exp['category'] if exp else 'no verdict'} seen={res.short()} "
                      f"latency={'-' if lat is None else f'{lat:.1f}s'}"
                      + ("" if res.slowdown is None else f" {res.slowdown:.1f}x slower")
                      + f"; {res.starved()}")
        for who, log in res.logs.items():  # a rank's emulator thread that died leaves its peers hanging
            if who.startswith("rank") and "Traceback" in log:
                tr.write_line(f"{'':28s} {who}: " + log[log.rindex("Traceback"):].replace("\n", " | ")[-600:])
