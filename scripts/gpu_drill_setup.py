"""The fault drill as one command on a bare GPU machine: its steps, their time budget, and the two setup steps.

A device call runs ``scripts/gpu_drill.sh`` in a fresh copy of the working tree with ``.gpu-wheels`` carried
(docs/gpu-check.md, "One command"). Before the drill itself can import the agent and the processor, two steps:

1. install: the wheels the image lacks (opentelemetry-*, tornado, googleapis-common-protos; scripts/gpu_wheels.py),
   offline, from the carried folder; skipped when the image already imports them.
2. build: the plugin and the bindings in place (build/gpu, MYCROFT_INPLACE) with /usr/bin/gcc and /usr/bin/g++:
   the image's default compiler (/opt/gcc) builds an extension that segfaults at import (pybind11's
   register_structured_dtype, docs/gpu-check.md "Building on that machine"). On a warm machine the build folder
   is still there and the build is incremental.

Then the fault rows, then the overhead pairs while the budget lasts. The whole is planned for TOTAL_S (8 minutes),
inside one device call of at most 10; gpu_drill.sh kills what is left at TOTAL_S + HARD_MARGIN_S.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOTAL_S = 480.0          # the plan: install + build + rows + overhead, wall time
HARD_MARGIN_S = 20.0     # gpu_drill.sh's timeout is TOTAL_S + this: packing the evidence of a drill cut short
INSTALL_S, INSTALL_TYPICAL_S = 60.0, 10.0  # 22 wheels, 10 MiB, no index
BUILD_S, BUILD_TYPICAL_S = 150.0, 40.0     # 16 cores: configure, then 4 binding and 7 plugin sources (the largest
                                           # binding source takes ~22 s alone on this project's 2-core machines)
BUILD_DIR = ROOT / "build" / "gpu"
#: What the agent and processor import that the image lacks: present means the install step has nothing to do.
NEEDED_MODULES = ("opentelemetry.sdk", "opentelemetry.proto", "opentelemetry.exporter.otlp.proto.grpc",
                  "tornado", "google.rpc")


@dataclass(frozen=True)
class Step:
    name: str
    what: str
    budget_s: float      # the bound the drill holds it to (a row over its bound is cut, not waited for)
    typical_s: float     # what it should take


def _run(cmd: list[str], log, timeout_s: float, **kw) -> int:
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    try:
        return subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s, **kw).returncode
    except subprocess.TimeoutExpired:
        log.write(f"timed out after {timeout_s:.0f} s\n")
        return 124


def modules_present(python: str = sys.executable) -> bool:
    code = "import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]]"
    return subprocess.run([python, "-c", code, *NEEDED_MODULES], capture_output=True).returncode == 0


def install(log, timeout_s: float = INSTALL_S) -> str:
    """'' when the packages are there (already, or installed now from .gpu-wheels), else why not."""
    if modules_present():
        log.write("install: the image already imports every needed module\n")
        return ""
    rc = _run([sys.executable, str(ROOT / "scripts" / "gpu_wheels.py"), "--install"], log, timeout_s)
    if rc != 0:
        return f"installing from .gpu-wheels failed ({rc}; setup.log)"
    return "" if modules_present() else "installed, but the modules still do not import (setup.log)"


def compilers() -> list[str]:
    """The system compiler when there is one (see the module docstring), else CMake's choice."""
    if os.access("/usr/bin/g++", os.X_OK) and os.access("/usr/bin/gcc", os.X_OK):
        return ["-DCMAKE_C_COMPILER=/usr/bin/gcc", "-DCMAKE_CXX_COMPILER=/usr/bin/g++"]
    return []


def build(log, timeout_s: float = BUILD_S) -> str:
    """'' when the plugin and the extension for this Python are built in place and import, else why not."""
    t0 = time.monotonic()
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    rc = _run(["cmake", "-S", str(ROOT), "-B", str(BUILD_DIR), *gen, "-DMYCROFT_INPLACE=ON", "-DMYCROFT_BUILD_TESTS=OFF",
               "-DCMAKE_BUILD_TYPE=RelWithDebInfo", f"-DPython_EXECUTABLE={sys.executable}", *compilers()],
              log, timeout_s)
    if rc != 0:
        return f"cmake configure failed ({rc}; setup.log)"
    left = timeout_s - (time.monotonic() - t0)
    rc = _run(["cmake", "--build", str(BUILD_DIR), "-j", str(os.cpu_count() or 4)], log, max(left, 1.0))
    if rc != 0:
        return f"build failed ({rc}; setup.log)"
    rc = _run([sys.executable, "-c", "import mycroft_otel._native, mycroft_otel.paths as p; print(p.plugin_path())"],
              log, 60, cwd=str(ROOT))
    return "" if rc == 0 else f"the built extension does not import ({rc}; setup.log)"


def plan(rows: list[Step], overhead: Step | None, setup: bool) -> list[Step]:
    steps = []
    if setup:
        steps += [Step("install", "wheels the image lacks, offline from .gpu-wheels (skipped when importable)",
                       INSTALL_S, INSTALL_TYPICAL_S),
                  Step("build", f"plugin + bindings in place, {BUILD_DIR.relative_to(ROOT)}, /usr/bin/g++",
                       BUILD_S, BUILD_TYPICAL_S)]
    steps += rows
    if overhead:
        steps.append(overhead)
    return steps


def format_plan(steps: list[Step], total_s: float) -> str:
    w = max(len(s.name) for s in steps)
    lines = [f"{'step'.ljust(w)}  bound s  typical s  what", "-" * (w + 40)]
    for s in steps:
        bound = "   rest" if s.budget_s == float("inf") else f"{s.budget_s:7.0f}"
        lines.append(f"{s.name.ljust(w)}  {bound}  {s.typical_s:9.0f}  {s.what}")
    typical = sum(s.typical_s for s in steps)
    lines += ["-" * (w + 40),
              f"typical {typical:.0f} s; planned within {total_s:.0f} s wall ({total_s / 60:.0f} min): a row is started "
              f"only while its bound fits, overhead pairs only while one more pair fits; hard stop at "
              f"{total_s + HARD_MARGIN_S:.0f} s (gpu_drill.sh). Device call: timeout_s 540."]
    return "\n".join(lines)
