"""deploy/container/Dockerfile, checked without a container engine (none on CI machines): its stages, that every
COPY source exists in the repository and survives Dockerfile.dockerignore while host build outputs do not,
that the build stage holds all the wheel is built from, and that the entrypoints name real verbs.

The build stage's `pip wheel` is also run for real, in a fresh venv, on exactly the files its COPY lines take
(after Dockerfile.dockerignore): a file the build needs but the context lacks fails here.
What this cannot check: that the base image and apt packages resolve, and the image's own build and run.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import shutil
import subprocess
import tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from mycroft_otel.cli import VERBS
from packaging_support import clean_env, fill_wheelhouse, new_venv, run_nice

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "container" / "Dockerfile"
IGNORE = DOCKERFILE.with_name("Dockerfile.dockerignore")


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)


def parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    """(ARGs before the first FROM, stages) of a Dockerfile: comments dropped, continuation lines joined."""
    logical, buf = [], ""
    for line in text.splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        logical.append(buf + line)
        buf = ""
    assert not buf, "a continuation line ends the file"
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        op, _, rest = line.strip().partition(" ")
        op = op.upper()
        if op == "FROM":
            m = re.fullmatch(r"(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?", rest.strip(), re.I)
            assert m, line
            stages.append(Stage(m.group(1), m.group(2)))
        elif not stages:
            assert op == "ARG", f"only ARG may precede FROM: {line}"
            k, _, v = rest.partition("=")
            args[k.strip()] = v.strip()
        else:
            stages[-1].instructions.append((op, rest.strip()))
    return args, stages


def ignored(rel: str, patterns: list[str]) -> bool:
    """Whether .dockerignore semantics exclude ``rel`` (last matching pattern wins; ``!`` re-includes; a
    pattern that matches a directory matches everything under it)."""
    out = False
    parts = rel.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    for pat in patterns:
        neg = pat.startswith("!")
        p = pat[1:] if neg else pat
        p = p.rstrip("/")
        if p == "**":
            hit = True
        elif p.startswith("**/"):
            hit = any(fnmatch.fnmatchcase(part, p[3:]) for part in parts)
        else:
            hit = any(fnmatch.fnmatchcase(pre, p) for pre in prefixes)
        if hit:
            out = not neg
    return out


def ignore_patterns() -> list[str]:
    return [ln.strip() for ln in IGNORE.read_text().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def copies(stage: Stage) -> list[tuple[list[str], str, str | None]]:
    """(sources, destination, --from stage) of each COPY/ADD of a stage."""
    out = []
    for op, rest in stage.instructions:
        if op not in ("COPY", "ADD"):
            continue
        words = json.loads(rest) if rest.startswith("[") else shlex.split(rest)
        src_stage = next((w.split("=", 1)[1] for w in words if w.startswith("--from=")), None)
        words = [w for w in words if not w.startswith("--")]
        out.append((words[:-1], words[-1], src_stage))
    return out


def test_stages_build_the_wheel_then_install_only_it():
    args, stages = parse(DOCKERFILE.read_text())
    names = [s.name for s in stages]
    assert {"build", "runtime", "agent", "processor"} <= set(names), names
    assert names[-1] is None and stages[-1].base == "runtime"  # the default target is the plain runtime image
    base = {s.name: s.base for s in stages}
    # the runtime has the build's Python and glibc (the wheel's tag) but none of its compiler
    assert base["build"] == base["runtime"] == "${PYTHON_IMAGE}" and args["PYTHON_IMAGE"].startswith("python:3.")
    build = next(s for s in stages if s.name == "build")
    runtime = next(s for s in stages if s.name == "runtime")
    assert any(op == "RUN" and "pip wheel" in r and "-w /dist" in r for op, r in build.instructions)
    assert not any(op == "RUN" and re.search(r"\b(g\+\+|gcc|cmake|apt-get)\b", r) for op, r in runtime.instructions)
    (srcs, dest, frm), = copies(runtime)
    assert frm == "build" and srcs == ["/dist/"]
    assert any(op == "RUN" and "pip install" in r and "/tmp/dist/*.whl" in r for op, r in runtime.instructions)
    # every --from names an earlier stage
    for i, stage in enumerate(stages):
        for _, _, frm in copies(stage):
            assert frm is None or frm in names[:i], (stage.name, frm)


def test_copy_sources_exist_and_hold_what_the_wheel_is_built_from():
    _, stages = parse(DOCKERFILE.read_text())
    build = next(s for s in stages if s.name == "build")
    patterns = ignore_patterns()
    copied: list[str] = []
    for srcs, _, frm in copies(build):
        assert frm is None
        for src in srcs:
            rel = src.rstrip("/")
            assert (ROOT / rel).exists(), f"COPY {src}: no such path in the repository"
            assert not ignored(rel, patterns), f"COPY {src}: excluded by {IGNORE.name}"
            copied.append(rel)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    needed = {"pyproject.toml", "CMakeLists.txt", project["project"]["readme"],
              *project["tool"]["scikit-build"]["wheel"]["packages"]}
    needed |= set(re.findall(r"add_subdirectory\((\w+)\)", (ROOT / "CMakeLists.txt").read_text()))
    assert needed <= set(copied), needed - set(copied)
    # the native sources the build reads are in the context; the C++ tests (MYCROFT_BUILD_TESTS=OFF) need not be
    for src in (ROOT / "native").rglob("*"):
        rel = src.relative_to(ROOT).as_posix()
        if src.is_file() and not rel.startswith("native/tests/") and src.suffix in (".cc", ".h", ".txt"):
            assert not ignored(rel, patterns), rel


def test_host_build_outputs_stay_out_of_the_context():
    patterns = ignore_patterns()
    for rel in ("mycroft_otel/_native.cpython-311-x86_64-linux-gnu.so", "mycroft_otel/lib/libnccl-profiler-mycroft.so",
                "build/cp311-cp311-linux_x86_64/CMakeCache.txt", "dist/mycroft_otel-0.1.0-cp311-cp311-linux_x86_64.whl",
                "mycroft_otel/agent/__pycache__/agent.cpython-311.pyc", ".git/HEAD"):
        assert ignored(rel, patterns), rel
    assert not ignored("mycroft_otel/agent/agent.py", patterns)


def test_agent_and_processor_targets_run_real_verbs():
    _, stages = parse(DOCKERFILE.read_text())
    runtime = next(s for s in stages if s.name == "runtime")
    entry = [json.loads(r) for op, r in runtime.instructions if op == "ENTRYPOINT"]
    assert entry == [["mycroft-otel"]]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "mycroft-otel" in project["project"]["scripts"]
    for name, verb in (("agent", "agent"), ("processor", "processor")):
        stage = next(s for s in stages if s.name == name)
        (cmd,) = [json.loads(r) for op, r in stage.instructions if op == "CMD"]
        assert cmd[0] == verb and verb in VERBS
        # the listeners face the pod network, not loopback (the defaults of both verbs)
        assert "0.0.0.0" in cmd, cmd


def _context_of_build_stage(dst: Path) -> tuple[Path, str]:
    """The build stage's files, as its COPY lines lay them out in WORKDIR, from the repository's tracked and
    untracked-but-not-ignored files filtered by Dockerfile.dockerignore; and its `pip wheel` RUN line."""
    _, stages = parse(DOCKERFILE.read_text())
    build = next(s for s in stages if s.name == "build")
    workdir = next(r for op, r in build.instructions if op == "WORKDIR")
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True, timeout=60).stdout.decode().split("\0")
    patterns = ignore_patterns()
    files = [f for f in listed if f and (ROOT / f).is_file() and not ignored(f, patterns)]
    for srcs, dest, _ in copies(build):
        for src in srcs:
            rel = src.rstrip("/")
            for f in files:
                if f == rel:  # a file: into the destination directory under its own name
                    out = dst / dest / Path(f).name
                elif f.startswith(rel + "/"):  # a directory's contents: into the destination directory
                    out = dst / dest / f[len(rel) + 1:]
                else:
                    continue
                out.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / f, out)
    (wheel_cmd,) = [r for op, r in build.instructions if op == "RUN" and "pip wheel" in r]
    assert workdir == "/src", workdir
    return dst, wheel_cmd


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_build_stages_context_builds_the_wheel(tmp_path):
    ctx, wheel_cmd = _context_of_build_stage(tmp_path / "src")
    assert not list(ctx.rglob("*.so")) and not (ctx / "build").exists()
    fill_wheelhouse()
    env_dir = new_venv(tmp_path / "venv")
    argv = shlex.split(wheel_cmd.replace("/dist", str(tmp_path / "dist")))
    assert argv[:2] == ["pip", "wheel"], argv
    res = run_nice([str(env_dir / "bin" / "python"), "-m", *argv], ctx, clean_env(VIRTUAL_ENV=str(env_dir)))
    assert res.returncode == 0, f"{wheel_cmd} in the build stage's context failed:\n{res.stderr[-4000:]}"
    (wheel,) = (tmp_path / "dist").glob("mycroft_otel-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "mycroft_otel/lib/libnccl-profiler-mycroft.so" in names
    assert any(re.fullmatch(r"mycroft_otel/_native\..*\.so", n) for n in names), names
