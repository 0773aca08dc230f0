"""Install the Python dependencies named in pyproject.toml (runtime + given extras) without building us."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path


def main(extras: list[str]) -> int:
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in extras:
        reqs += project["optional-dependencies"][extra]
    reqs += list(tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
                 ["build-system"]["requires"])
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", *reqs]
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
