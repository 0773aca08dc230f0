"""mycroft-otel: observable NCCL collectives.

Data path, one folder per stage:
  native/ (capture: NCCL profiler plugin -> shared memory)
  mycroft_otel/agent (export: shared memory -> OpenTelemetry spans over OTLP)
  mycroft_otel/processor (analysis: spans -> root-cause spans and metrics)
  dashboards/, collector_config/ (operations)
The simulator (mycroft_otel/sim) drives the real plugin through NCCL's ABI.

Importing this package loads no stage: ``mycroft_otel.instrument`` (the in-process agent) is
resolved on first use (PEP 562), so importing the processor never imports the agent.

A checkout's source tree shadows an installed copy whenever its root is first on ``sys.path``
(``python -m mycroft_otel.<module>`` from the checkout, scripts that put the checkout on the
path). The source tree has no compiled pieces unless the in-place build ran, so when this file
sits beside no ``_native`` extension and an installed copy with one is further down
``sys.path``, the package's submodules are taken from that installed copy: one consistent
copy runs, the same one ``mycroft-otel`` and its child processes run (:func:`mycroft_otel.cli.command`).
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
from typing import Any

__version__ = "0.1.0"

__all__ = ["__version__", "instrument"]


def _has_extension(package_dir: str) -> bool:
    """Whether ``package_dir`` holds a ``_native`` extension this interpreter can load."""
    return any(os.path.isfile(os.path.join(package_dir, "_native" + suffix))
               for suffix in importlib.machinery.EXTENSION_SUFFIXES)


def _built_copy_elsewhere(here: str) -> str | None:
    """The first other ``mycroft_otel`` directory on ``sys.path`` that carries the extension."""
    for entry in sys.path:
        candidate = os.path.realpath(os.path.join(entry or os.curdir, __name__))
        if candidate == here or not os.path.isfile(os.path.join(candidate, "__init__.py")):
            continue
        if _has_extension(candidate):
            return candidate
    return None


def _prefer_built_copy() -> None:
    here = os.path.realpath(os.path.dirname(__file__))
    if _has_extension(here):
        return  # installed, or a checkout with the in-place build: run it as it is
    built = _built_copy_elsewhere(here)
    if built is not None:
        __path__[:] = [built]


_prefer_built_copy()


def __getattr__(name: str) -> Any:
    if name == "instrument":  # the agent's thread in this process; see mycroft_otel.agent.instrumentor
        from mycroft_otel.agent.instrumentor import instrument

        globals()["instrument"] = instrument
        return instrument
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
