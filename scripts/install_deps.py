"""Install the Python dependencies named in pyproject.toml (runtime + given extras + the build backend) without
building us, into the interpreter that runs this script: `python3 scripts/install_deps.py test` inside an
activated venv fills that venv (scripts/test.sh then builds and tests with the same interpreter, and
`pip install --no-build-isolation` finds scikit-build-core and pybind11 there)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path


def main(extras: list[str]) -> int:
    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    project = pyproject["project"]
    unknown = [e for e in extras if e not in project["optional-dependencies"]]
    if unknown:
        print(f"install_deps.py: unknown extra {', '.join(unknown)}; known: "
              f"{', '.join(project['optional-dependencies'])}", file=sys.stderr)
        return 2
    reqs = list(project["dependencies"])
    for extra in extras:
        reqs += project["optional-dependencies"][extra]
    reqs += list(pyproject["build-system"]["requires"])
    print(f"install_deps.py: installing into {sys.prefix} ({sys.executable})", file=sys.stderr)
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", *reqs]
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
