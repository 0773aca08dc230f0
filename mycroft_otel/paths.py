"""Where the pieces shipped beside the Python code live: the native plugin, the runbook."""

from __future__ import annotations

from pathlib import Path

PLUGIN_NAME = "libnccl-profiler-mycroft.so"
RUNBOOK_NAME = "runbook.md"


def plugin_path() -> Path:
    """Absolute path of the NCCL profiler plugin shipped in this package."""
    path = Path(__file__).resolve().parent / "lib" / PLUGIN_NAME
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: the native build did not run (pip install . or scripts/build_native.sh)")
    return path


def runbook_path() -> Path:
    """docs/runbook.md: the wheel's copy inside the package (CMakeLists.txt installs it), else the checkout's.
    The path may not exist (a package installed without it); the caller says so."""
    package = Path(__file__).resolve().parent
    installed = package / "docs" / RUNBOOK_NAME
    return installed if installed.is_file() else package.parent / "docs" / RUNBOOK_NAME
