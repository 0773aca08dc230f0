#!/usr/bin/env python3
"""The wheels the lent GPU machine lacks, carried to it in the working tree (docs/gpu-check.md, "One command").

The device image (Python 3.12, x86-64, no network) has torch, numpy, grpcio, protobuf and the build tools, but
none of the OpenTelemetry packages, tornado or googleapis-common-protos that the agent and the processor import.
This script keeps the list of what to carry (``scripts/gpu_wheels.lock``, one ``name==version`` per line with
the reason and the wheel's size) and fetches exactly those wheels, for the image's Python and platform, into
``.gpu-wheels/`` (ignored by git, named in the device call's ``carry``). On the device, ``--install`` installs
the project's runtime requirements from that folder alone: pip keeps every package the image already has at a
satisfying version and takes the rest from the folder.

    python3 scripts/gpu_wheels.py             # download the locked wheels (here, where the registry is reachable)
    python3 scripts/gpu_wheels.py --relock    # resolve again for the image and rewrite the lock
    python3 scripts/gpu_wheels.py --check     # the folder holds exactly the lock's wheels, within the size cap
    python3 scripts/gpu_wheels.py --install   # on the device: pip install from the folder, offline

Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WHEEL_DIR = ROOT / ".gpu-wheels"
LOCK = Path(__file__).resolve().with_name("gpu_wheels.lock")
#: The carry travels with the working tree, 64 MiB in all; the tree itself is ~4 MiB. 40 MiB leaves room.
MAX_MIB = 40.0

#: The device image (docs/gpu-check.md; the device tool's KINDS.md, pip list of 2026-11): CPython 3.12.3 on
#: x86-64 glibc. pip matches manylinux tags exactly, so each one a wheel of ours may carry is listed.
IMAGE_PYTHON = "3.12"
IMAGE_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
                   "manylinux2014_x86_64", "manylinux_2_5_x86_64", "manylinux1_x86_64")

#: Runtime requirements the image satisfies itself, so they are never carried, with what was seen there.
#: Every other requirement of the project (pyproject.toml) and of what it pulls in is in the lock: the
#: image's copy, where it has one, is kept by pip when its version satisfies, and the carried wheel is the
#: fallback when it does not (googleapis-common-protos 1.76 needs protobuf >= 6.33.5, say).
IMAGE_PROVIDES = {
    "numpy": "numpy 2.5.2 in the image's pip list; its wheel alone would be 15 MiB of the carry",
}


def canonical(name: str) -> str:
    """PEP 503's normal form: the one spelling under which a lock, a wheel and a requirement are compared."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(spec: str) -> str:
    """The distribution a requirement names ("tornado>=6.4" -> "tornado", "a[b]==1; extra" -> "a")."""
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", spec)
    if not m:
        raise ValueError(f"not a requirement: {spec!r}")
    return canonical(m.group(1))


def project_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The [project] dependencies, as written."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the lines are simple enough to read by hand
        text = pyproject.read_text()
        block = text.split("dependencies = [", 1)[1].split("]", 1)[0]
        return re.findall(r'"([^"]+)"', block)
    return list(tomllib.loads(pyproject.read_text())["project"]["dependencies"])


@dataclass(frozen=True)
class Locked:
    name: str          # canonical
    version: str
    required_by: tuple[str, ...]  # canonical names, "mycroft-otel" for the project itself
    size: int          # bytes of the wheel
    image_has: bool    # the image has some version of it: carried as the fallback

    def line(self) -> str:
        why = ("fallback, the image has one" if self.image_has else "missing in the image")
        return f"{self.name}=={self.version}  # {why}; {self.size} B; required by {', '.join(self.required_by)}"


def read_lock(path: Path = LOCK) -> list[Locked]:
    out = []
    for raw in path.read_text().splitlines():
        if not raw.strip() or raw.startswith("#"):
            continue
        m = re.fullmatch(r"(\S+)==(\S+)\s+#\s+(fallback, the image has one|missing in the image); (\d+) B; "
                         r"required by (.+)", raw.strip())
        if not m:
            raise ValueError(f"{path.name}: cannot read {raw!r}")
        out.append(Locked(m.group(1), m.group(2), tuple(x.strip() for x in m.group(5).split(",")),
                          int(m.group(4)), m.group(3).startswith("fallback")))
    return out


#: Distributions the image holds (its package list of 2026-11-17): which locked wheels are fallbacks.
IMAGE_PACKAGES = frozenset({
    "certifi", "charset-normalizer", "grpcio", "idna", "numpy", "prometheus-client", "protobuf", "pyyaml",
    "requests", "typing-extensions", "urllib3", "zipp", "packaging",
})


def _pip_download(dest: Path, specs: list[str], deps: bool) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--only-binary=:all:",
           "--python-version", IMAGE_PYTHON, "--implementation", "cp", "-d", str(dest)]
    for plat in IMAGE_PLATFORMS:
        cmd += ["--platform", plat]
    if not deps:
        cmd.append("--no-deps")
    subprocess.run(cmd + specs, check=True)


def _wheel_meta(path: Path) -> tuple[str, str, list[str]]:
    """(name, version, names it requires outside extras) from a wheel's METADATA."""
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    name = version = ""
    reqs = []
    for line in text.splitlines():
        if line.startswith("Name: "):
            name = canonical(line[6:].strip())
        elif line.startswith("Version: "):
            version = line[9:].strip()
        elif line.startswith("Requires-Dist: ") and "extra ==" not in line:
            reqs.append(requirement_name(line[15:]))
        elif not line.strip():
            break
    return name, version, reqs


def relock() -> list[Locked]:
    """Resolves the project's requirements for the image (pip, with dependencies) and writes the lock."""
    with tempfile.TemporaryDirectory(prefix="mycroft-gpu-wheels-") as tmp:
        _pip_download(Path(tmp), project_requirements(), deps=True)
        metas = {p: _wheel_meta(p) for p in sorted(Path(tmp).glob("*.whl"))}
        sizes = {name: path.stat().st_size for path, (name, _, _) in metas.items()}
    by_name = {name: (path, version, reqs) for path, (name, version, reqs) in metas.items()}
    required_by: dict[str, set[str]] = {}
    for spec in project_requirements():
        required_by.setdefault(requirement_name(spec), set()).add("mycroft-otel")
    for name, (_, _, reqs) in by_name.items():
        for r in reqs:
            if r in by_name:  # what pip did not download is not needed on Python 3.12 (an environment marker)
                required_by.setdefault(r, set()).add(name)
    # keep what the project reaches other than through what the image provides
    keep: set[str] = set()
    todo = [n for n in by_name if "mycroft-otel" in required_by.get(n, ()) and n not in IMAGE_PROVIDES]
    while todo:
        n = todo.pop()
        if n in keep:
            continue
        keep.add(n)
        todo += [r for r in by_name[n][2] if r in by_name and r not in IMAGE_PROVIDES]
    locked = [Locked(n, by_name[n][1], tuple(sorted(x for x in required_by[n] if x == "mycroft-otel" or x in keep)),
                     sizes[n], n in IMAGE_PACKAGES) for n in sorted(keep)]
    header = [f"# Written by scripts/gpu_wheels.py --relock ({time.strftime('%Y-%m-%d')}): the wheels carried to the GPU",
              f"# machine (CPython {IMAGE_PYTHON}, x86-64) in .gpu-wheels/. Not carried, the image has them: "
              + ", ".join(f"{k} ({v})" for k, v in IMAGE_PROVIDES.items()) + ".",
              f"# {len(locked)} wheels, {sum(x.size for x in locked) / 2**20:.1f} MiB."]
    LOCK.write_text("\n".join(header + [x.line() for x in locked]) + "\n")
    return locked


def expected_files(folder: Path, locked: list[Locked]) -> tuple[list[Path], list[str], list[Path]]:
    """(wheels matching the lock, lock entries without a wheel, wheels the lock does not name)."""
    wheels = sorted(folder.glob("*.whl")) if folder.is_dir() else []
    seen: dict[tuple[str, str], Path] = {}
    for w in wheels:
        parts = w.name.split("-")
        seen[(canonical(parts[0]), parts[1])] = w
    want = {(x.name, x.version) for x in locked}
    matching = [seen[k] for k in sorted(want) if k in seen]
    missing = [f"{n}=={v}" for n, v in sorted(want) if (n, v) not in seen]
    stray = [w for k, w in sorted(seen.items()) if k not in want]
    return matching, missing, stray


def resolves_offline(folder: Path) -> list[str]:
    """Whether pip, with no index, finds everything the project needs (but what the image provides) in the
    folder for the image's Python and platform: the device's install, rehearsed here on a bare target."""
    specs = [s for s in project_requirements() if requirement_name(s) not in IMAGE_PROVIDES]
    with tempfile.TemporaryDirectory(prefix="mycroft-gpu-wheels-") as tmp:
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--dry-run",
               "--ignore-installed", "--no-index", "--find-links", str(folder), "--only-binary=:all:",
               "--python-version", IMAGE_PYTHON, "--implementation", "cp", "--target", tmp]
        for plat in IMAGE_PLATFORMS:
            cmd += ["--platform", plat]
        p = subprocess.run(cmd + specs, capture_output=True, text=True)
    return [] if p.returncode == 0 else [f"offline install for the image fails: {p.stderr.strip()[-600:]}"]


def download(folder: Path = WHEEL_DIR) -> int:
    locked = read_lock()
    folder.mkdir(exist_ok=True)
    _, missing, stray = expected_files(folder, locked)
    for w in stray:  # another version left from an earlier lock: two versions stop pip's offline install
        w.unlink()
    if missing:
        _pip_download(folder, missing, deps=False)
    return check(folder)


def check(folder: Path = WHEEL_DIR) -> int:
    locked = read_lock()
    matching, missing, stray = expected_files(folder, locked)
    total = sum(w.stat().st_size for w in matching)
    for w in matching:
        print(f"  {w.name}  {w.stat().st_size / 2**20:.2f} MiB")
    print(f"{len(matching)} wheels, {total / 2**20:.1f} MiB in {folder} (cap {MAX_MIB:g} MiB)")
    problems = [f"missing {m}" for m in missing] + [f"not in the lock: {w.name}" for w in stray]
    if not missing:
        problems += resolves_offline(folder)
    if total > MAX_MIB * 2**20:
        problems.append(f"{total / 2**20:.1f} MiB is over the {MAX_MIB:g} MiB cap")
    for p in problems:
        print("  problem:", p, file=sys.stderr)
    return 1 if problems else 0


def install(folder: Path = WHEEL_DIR) -> int:
    """On the device: the project's runtime requirements from the folder alone, no index (no network there).

    pip keeps an installed package whose version satisfies (its default upgrade strategy) and installs the
    rest from the folder; what it installed is printed, for the record of the run."""
    if not folder.is_dir():
        print(f"gpu_wheels: {folder} is missing (carry it: the device call's carry names .gpu-wheels)",
              file=sys.stderr)
        return 1
    cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-index", "--no-compile",
           "--no-cache-dir", "--find-links", str(folder), "--progress-bar", "off", *project_requirements()]
    p = subprocess.run(cmd, capture_output=True, text=True)
    print(p.stdout[-4000:], end="")
    print(p.stderr[-4000:], end="", file=sys.stderr)
    return p.returncode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--relock", action="store_true", help="resolve for the image again and rewrite the lock")
    mode.add_argument("--check", action="store_true", help="the folder holds exactly the lock's wheels")
    mode.add_argument("--install", action="store_true", help="on the device: install from the folder, offline")
    ap.add_argument("--dir", type=Path, default=WHEEL_DIR)
    args = ap.parse_args(argv)
    if args.relock:
        relock()
        shutil.rmtree(args.dir, ignore_errors=True)  # the folder follows the new lock
        return download(args.dir)
    if args.check:
        return check(args.dir)
    if args.install:
        return install(args.dir)
    return download(args.dir)


if __name__ == "__main__":
    sys.exit(main())
