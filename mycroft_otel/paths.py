"""Where the installed native pieces live."""

from __future__ import annotations

from pathlib import Path

PLUGIN_NAME = "libnccl-profiler-mycroft.so"


def plugin_path() -> Path:
    """Absolute path of the NCCL profiler plugin shipped in this package."""
    path = Path(__file__).resolve().parent / "lib" / PLUGIN_NAME
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: the native build did not run (pip install . or scripts/build_native.sh)")
    return path
