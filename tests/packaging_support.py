"""Fresh virtual environments fed from a local wheelhouse, for the tests that build and install the package
(tests/test_entry_points.py, tests/deploy/test_container.py).

build/wheelhouse holds the runtime and build dependencies (pyproject.toml) and the extras those tests need:
resolved offline when it already holds them, else completed from the package index, the only time the index
is used. Installs then run with PIP_NO_INDEX and the wheelhouse as their only source, which pip's isolated
build environments inherit.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WHEELHOUSE = ROOT / "build" / "wheelhouse"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def requirements(extras: tuple[str, ...] = ()) -> list[str]:
    """Runtime and build dependencies plus ``extras``; cmake/ninja wheels only where the machine has none,
    as scikit-build-core then asks for them."""
    project = PYPROJECT["project"]
    reqs = [*project["dependencies"], *PYPROJECT["build-system"]["requires"]]
    reqs += [r for extra in extras for r in project["optional-dependencies"][extra]]
    reqs += [tool for tool in ("cmake", "ninja") if shutil.which(tool) is None]
    return reqs


def fill_wheelhouse(extras: tuple[str, ...] = ()) -> Path:
    WHEELHOUSE.mkdir(parents=True, exist_ok=True)
    base = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--only-binary=:all:",
            "-d", str(WHEELHOUSE), *requirements(extras)]
    offline = subprocess.run([*base, "--no-index", "--find-links", str(WHEELHOUSE)], capture_output=True, text=True,
                             timeout=600)
    if offline.returncode != 0:
        online = subprocess.run(base, capture_output=True, text=True, timeout=1200)
        assert online.returncode == 0, f"cannot fill {WHEELHOUSE}:\n{online.stderr[-3000:]}"
    return WHEELHOUSE


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without anything that would leak the running interpreter's packages or
    our own settings into a child, and pip pointed at the wheelhouse only."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSAFEPATH", "PYTHONSTARTUP", "VIRTUAL_ENV")
           and not k.startswith(("MYCROFT_", "OTEL_", "PIP_"))}  # fmt: skip
    env.update(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(WHEELHOUSE), PIP_DISABLE_PIP_VERSION_CHECK="1",
               PIP_CONFIG_FILE=os.devnull, PIP_NO_INPUT="1", PYTHONUNBUFFERED="1",
               CMAKE_BUILD_PARALLEL_LEVEL=str(min(os.cpu_count() or 2, 4)))
    env.update(extra)
    return env


def new_venv(path: Path) -> Path:
    """``python -m venv PATH``: nothing inherited from this interpreter's site-packages."""
    venv.EnvBuilder(with_pip=True, clear=True, system_site_packages=False).create(path)
    return path


def run_nice(argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 1500) -> subprocess.CompletedProcess:
    """A build step at low priority (the machine is shared)."""
    return subprocess.run(["nice", "-n", "10", *argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
