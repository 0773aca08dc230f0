# Test deps (pip): pytest, pyelftools (pyelftools only for the full check, MYCROFT_ABI_FULL=1)
"""Our NCCL profiler ABI declarations (native/include/mycroft/nccl_profiler_abi.h) against NCCL's real binary.

Fast tests (always): compile tests/abi/layout_dump.cc with g++, compare its JSON with the committed fixture
tests/abi/nccl_abi_fixture.json (extracted from libnccl.so.2's DWARF by scripts/abi/extract_nccl_abi.py), and
prove the comparison can fail by perturbing copies of the header and of the fixture.

Full test (MYCROFT_ABI_FULL=1, CI): make sure the NCCL wheels are cached (downloading them when missing; no
network is a failure, not a skip), re-extract v4..v7 from the real binaries and compare with our header and
with the committed fixture.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HEADER = REPO / "native" / "include" / "mycroft" / "nccl_profiler_abi.h"
DUMP_SRC = REPO / "tests" / "abi" / "layout_dump.cc"
FIXTURE = REPO / "tests" / "abi" / "nccl_abi_fixture.json"
EXTRACTOR = REPO / "scripts" / "abi" / "extract_nccl_abi.py"
VERSIONS = ("v4", "v5", "v6", "v7")
COMPARED = ("Profiler", "EventDescr", "StateArgs", "EventType", "State")


def _extractor():
    if "extract_nccl_abi" in sys.modules:
        return sys.modules["extract_nccl_abi"]
    spec = importlib.util.spec_from_file_location("extract_nccl_abi", EXTRACTOR)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["extract_nccl_abi"] = mod  # its worker processes pickle functions by module name
    spec.loader.exec_module(mod)
    return mod


def _dump_layout(include_dir: Path, workdir: Path) -> dict:
    cxx = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler (g++) on PATH")
    exe = workdir / "layout_dump"
    proc = subprocess.run([cxx, "-std=c++17", "-Wall", "-Wextra", "-Werror", f"-I{include_dir}", str(DUMP_SRC),
                           "-o", str(exe)], capture_output=True, text=True)
    assert proc.returncode == 0, f"layout_dump.cc failed to compile:\n{proc.stderr}"
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def normalize(doc: dict) -> dict:
    """The comparable part of a layout document (ours or NCCL's)."""
    return {
        "shared": {k: doc["shared"][k] for k in ("Result", "LogLevel", "LogSubsys", "DebugLogger")},
        "versions": {v: {k: doc["versions"][v][k] for k in COMPARED} for v in VERSIONS if v in doc["versions"]},
    }


def diff(ours, theirs, path: str = "") -> list[str]:
    """Human-readable differences; empty when equal. Lists are compared element by element (member order)."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        out = []
        for k in sorted(set(ours) | set(theirs), key=str):
            p = f"{path}.{k}" if path else str(k)
            if k not in ours:
                out.append(f"{p}: missing in our header (NCCL has {theirs[k]!r})")
            elif k not in theirs:
                out.append(f"{p}: not in NCCL (ours is {ours[k]!r})")
            else:
                out += diff(ours[k], theirs[k], p)
        return out
    if isinstance(ours, list) and isinstance(theirs, list):
        out = []
        for i in range(max(len(ours), len(theirs))):
            if i >= len(ours):
                out.append(f"{path}[{i}]: missing in our header (NCCL has {theirs[i]!r})")
            elif i >= len(theirs):
                out.append(f"{path}[{i}]: not in NCCL (ours is {ours[i]!r})")
            else:
                out += diff(ours[i], theirs[i], f"{path}[{i}]")
        return out
    return [] if ours == theirs else [f"{path}: ours {ours!r} != NCCL {theirs!r}"]


@pytest.fixture(scope="module")
def fixture_doc() -> dict:
    return json.loads(FIXTURE.read_text())


@pytest.fixture(scope="module")
def our_layout(tmp_path_factory) -> dict:
    return _dump_layout(REPO / "native" / "include", tmp_path_factory.mktemp("abi"))


def test_fixture_covers_v4_to_v7_from_real_binaries(fixture_doc):
    assert fixture_doc["reference"] == "nvidia-nccl-cu13==2.32.3"
    assert set(VERSIONS) <= set(fixture_doc["versions"]), "fixture lacks a profiler ABI version"
    assert fixture_doc["disagreements"] == [], "NCCL releases disagree on a version's layout"
    # Each version's enums come from the release where it was the newest ABI (its exact event/state set).
    for v in VERSIONS:
        assert fixture_doc["releases"][fixture_doc["versions"][v]["enums_from"]] == v, v


def test_header_matches_fixture(our_layout, fixture_doc):
    problems = diff(normalize(our_layout), normalize(fixture_doc))
    assert not problems, "our header differs from NCCL's DWARF:\n" + "\n".join(problems)


def test_diff_catches_perturbed_fixture(our_layout, fixture_doc):
    base = normalize(fixture_doc)
    perturbations = {
        "member offset": lambda d: d["versions"]["v7"]["EventDescr"]["union"]["variants"]["coll"]["members"][-1]
        .__setitem__("offset", 96),
        "init parameter order": lambda d: d["versions"]["v5"]["Profiler"]["members"][1]["sig"]
        .__setitem__(slice(2, 4), ["ptr", "u64"]),
        "missing variant": lambda d: d["versions"]["v6"]["EventDescr"]["union"]["variants"].pop("ceColl"),
        "enum value": lambda d: d["versions"]["v4"]["State"].__setitem__("KernelChStop", 23),
        "extra enumerator": lambda d: d["versions"]["v5"]["EventType"].__setitem__("CeColl", 4096),
        "descriptor size": lambda d: d["versions"]["v4"]["EventDescr"].__setitem__("size", 112),
    }
    for what, perturb in perturbations.items():
        bad = copy.deepcopy(base)
        perturb(bad)
        assert diff(normalize(our_layout), bad), f"a perturbed fixture ({what}) went unnoticed"


@pytest.mark.parametrize("what,old,new", [
    ("v4 one-byte type", "  uint8_t type;  // one EventType bit (v4 only: a single byte)", "  uint64_t type;"),
    ("v5 init order", "using InitFn = Result (*)(void** context, uint64_t commId, int* eActivationMask,",
     "using InitFn = Result (*)(void** context, int* eActivationMask, uint64_t commId,"),
    ("v7 state value", "  KernelPhaseStop = 31,", "  KernelPhaseStop = 32,"),
])
def test_diff_catches_perturbed_header(tmp_path, fixture_doc, what, old, new):
    text = HEADER.read_text()
    assert text.count(old) == 1, f"perturbation anchor for {what} not found once in the header"
    inc = tmp_path / "include" / "mycroft"
    inc.mkdir(parents=True)
    (inc / HEADER.name).write_text(text.replace(old, new))
    layout = _dump_layout(tmp_path / "include", tmp_path)
    assert diff(normalize(layout), normalize(fixture_doc)), f"a perturbed header ({what}) went unnoticed"


@pytest.mark.skipif(os.environ.get("MYCROFT_ABI_FULL") != "1",
                    reason="full DWARF check against real NCCL wheels runs with MYCROFT_ABI_FULL=1")
def test_header_matches_real_nccl_binary(our_layout, fixture_doc):
    try:
        import elftools  # noqa: F401  (pip: pyelftools)
    except ImportError:
        pytest.fail("MYCROFT_ABI_FULL=1 needs pyelftools: pip install pyelftools")
    ext = _extractor()
    t0 = time.monotonic()
    try:
        wheels = [ext.ensure_wheel(pkg, ver) for pkg, ver in ext.DEFAULT_RELEASES]
    except ext.AbiExtractError as e:
        pytest.fail(f"cannot get the NCCL wheels for the ABI check: {e}")
    live = ext.extract_wheels(wheels, log=lambda m: print(m))
    print(f"full ABI check: wheels + extraction took {time.monotonic() - t0:.1f}s")
    assert live["disagreements"] == [], live["disagreements"]
    assert live["releases"]["nvidia-nccl-cu13==2.32.3"] == "v7"
    assert set(VERSIONS) <= set(live["versions"])
    problems = diff(normalize(our_layout), normalize(live))
    assert not problems, "our header differs from the real libnccl.so.2:\n" + "\n".join(problems)
    stale = diff(normalize(live), normalize(fixture_doc))
    assert not stale, "committed fixture is stale; rerun scripts/abi/extract_nccl_abi.py:\n" + "\n".join(stale)
