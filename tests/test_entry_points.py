"""Every command the docs name works from a checkout and from the built wheel, each in a fresh venv.

The docs (README.md, docs/*.md) are read for the commands in their code: ``mycroft-otel VERB``, ``python -m
mycroft_otel...`` and ``scripts/...``/``benchmarks/...`` files. The repository (its committed state) is cloned
and two fresh virtual environments (``python -m venv``, nothing inherited) are made:

* checkout: ``pip install .`` in the clone, each command run from the clone's root, whose source tree (no
  compiled extension) shadows the installed package (``mycroft_otel/__init__.py`` hands the submodules over);
* wheel: ``pip wheel . -w dist/`` in the clone (our platform wheel and its dependencies' wheels), then
  ``pip install dist/*.whl`` with no compiler, CMake or package index reachable, each command run from an
  empty directory.

Each command must answer ``--help`` with exit status 0, and the cheap ones do their real job (the plugin's
path, the configuration table, a small simulated job through the installed plugin, the GPU drill's plan).
Packages come from a local wheelhouse (build/wheelhouse: the runtime and build dependencies, fetched from the
package index the first time only), never from the index during the test's installs.
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from mycroft_otel.cli import VERBS
from packaging_support import ROOT, clean_env, fill_wheelhouse, new_venv, run_nice
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

#: modules run with ``python -m`` that the docs name only by file (docs/algorithm.md: processor/replay.py)
EXTRA_MODULES = {"mycroft_otel.processor.replay", "mycroft_otel.stack"}
#: modules whose --help is not argparse's, and what they do instead (checked as a real action below)
NO_USAGE = {"mycroft_otel.config": "prints the README's configuration table"}
#: modules that need an optional extra (the docs say so beside them): installed in the checkout's venv, where
#: they run; in the wheel's venv (no extras) they must say which extra to install, not raise a traceback
NEEDS_EXTRA = {"mycroft_otel.grafana.dashboards": "dashboards"}
#: documented files under scripts/ and benchmarks/ run with a real, cheap action instead of --help
SCRIPT_ACTIONS = {"scripts/gpu_drill.sh": ["--plan"]}
#: documented files that are not run here, and why (each is run by scripts/test.sh or on a GPU machine)
NOT_RUN = {
    "scripts/test.sh": "the whole suite",
    "scripts/build_stack.sh": "builds the Collector and Jaeger (minutes); tests/stack runs it",
    "scripts/build_collector.sh": "builds the Collector; tests/stack runs it",
    "scripts/build_jaeger.sh": "builds Jaeger; tests/stack runs it",
    "scripts/install_prometheus.sh": "installs a Debian package; tests/stack runs it",
    "scripts/install_alertmanager.sh": "installs a Debian package; tests/e2e runs it",
    "scripts/gpu_check.sh": "builds in place and runs NCCL; tests/evaluate/test_gpu_drill.py covers --dry-run",
    "scripts/gpu_drill_worker.py": "a rank of a torchrun job that gpu_drill.py starts, not a command",
    "benchmarks/plugin_hot_path/run.sh": "builds and times the plugin (a benchmark, not a test)",
}


def _code_of(path: Path) -> list[str]:
    text = path.read_text()
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M)
    inline = re.findall(r"`([^`\n]+)`", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M))
    return blocks + inline


def documented() -> tuple[set[str], set[str], set[str]]:
    """(verbs, modules, files) named in the code of the docs."""
    verbs, modules, files = set(), set(), set()
    for doc in DOCS:
        for code in _code_of(doc):
            verbs.update(re.findall(r"(?<![\w/.-])mycroft-otel\s+([a-z][a-z-]*)", code))
            modules.update(re.findall(r"python3?\s+-m\s+(mycroft_otel[\w.]*)", code))
            files.update(re.findall(r"(?<![\w/])((?:scripts|benchmarks)/[\w/.-]+\.(?:sh|py))", code))
    return verbs, modules, files


def test_the_docs_name_only_real_verbs_and_files():
    """Cheap and always run: a documented verb exists, a documented file is in the repository."""
    verbs, modules, files = documented()
    assert verbs and modules and files
    assert verbs <= set(VERBS), sorted(verbs - set(VERBS))
    assert not [f for f in files if not (ROOT / f).is_file()]
    for module in modules | EXTRA_MODULES:
        rel = module.replace(".", "/")
        assert (ROOT / f"{rel}.py").is_file() or (ROOT / rel / "__main__.py").is_file(), module
    assert set(NOT_RUN) | set(SCRIPT_ACTIONS) <= files, sorted((set(NOT_RUN) | set(SCRIPT_ACTIONS)) - files)


# -- the two installs ----------------------------------------------------------------------------------------

@dataclass
class Install:
    name: str
    venv: Path
    cwd: Path     # where the commands run: the clone's root (checkout) or an empty directory (wheel)
    env: dict[str, str]

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")

    @property
    def cli(self) -> str:
        return str(self.venv / "bin" / "mycroft-otel")

    def run(self, argv: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(argv, cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("entry-points")
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    dst = base / "mycroft-otel"
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(dst)], check=True)
    subprocess.run(["git", "-C", str(dst), "checkout", "--quiet", "--detach", head], check=True)
    fill_wheelhouse(tuple(sorted(set(NEEDS_EXTRA.values()))))
    return dst


@pytest.fixture(scope="module")
def wheel_install(clone) -> tuple[Install, list[Path]]:
    """`pip wheel . -w dist/` in the clone, installed into a fresh venv that has no compiler to call."""
    builder = new_venv(clone.parent / "venv-builder")
    res = run_nice([str(builder / "bin" / "python"), "-m", "pip", "wheel", "-q", ".", "-w", "dist/"], clone,
               clean_env(VIRTUAL_ENV=str(builder)))  # fmt: skip
    assert res.returncode == 0, f"pip wheel . -w dist/ failed:\n{res.stdout[-2000:]}\n{res.stderr[-4000:]}"
    wheels = sorted((clone / "dist").glob("*.whl"))
    ours = [w for w in wheels if w.name.startswith("mycroft_otel-")]
    assert len(ours) == 1, wheels
    env_dir = new_venv(clone.parent / "venv-wheel")
    # no compiler, no CMake, no index: PATH holds only the venv, CC/CXX refuse to run
    bare = clean_env(PATH=str(env_dir / "bin"), CC="/bin/false", CXX="/bin/false", VIRTUAL_ENV=str(env_dir))
    res = subprocess.run([str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q",
                          *glob.glob(str(clone / "dist" / "*.whl"))],
                         cwd=clone.parent, env=bare, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert res.returncode == 0, f"pip install dist/*.whl failed:\n{res.stderr[-4000:]}"
    empty = clone.parent / "elsewhere"
    empty.mkdir()
    env = clean_env(PATH=f"{env_dir / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}", VIRTUAL_ENV=str(env_dir))
    return Install("wheel", env_dir, empty, env), ours


@pytest.fixture(scope="module")
def checkout_install(clone, wheel_install) -> Install:
    """`pip install .` (README) in the clone, into a fresh venv; commands run from the clone's root."""
    env_dir = new_venv(clone.parent / "venv-checkout")
    env = clean_env(PATH=f"{env_dir / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}", VIRTUAL_ENV=str(env_dir))
    res = run_nice([str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q", "."], clone, env)
    assert res.returncode == 0, f"pip install . failed:\n{res.stdout[-2000:]}\n{res.stderr[-4000:]}"
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    res = run_nice([str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q",
                *(r for extra in NEEDS_EXTRA.values() for r in extras[extra])], clone, env)  # fmt: skip
    assert res.returncode == 0, f"installing the extras {sorted(NEEDS_EXTRA.values())} failed:\n{res.stderr[-3000:]}"
    return Install("checkout", env_dir, clone, env)


# -- the commands ---------------------------------------------------------------------------------------------

def _help_commands(inst: Install) -> list[list[str]]:
    verbs, modules, _ = documented()
    cmds = [[inst.cli, "--help"], [inst.python, "-m", "mycroft_otel", "--help"]]
    cmds += [[inst.cli, verb, "--help"] for verb in VERBS]
    cmds.append([inst.cli, "grafana", "provision", "--help"])
    cmds += [[inst.python, "-m", module, "--help"] for module in sorted(modules | EXTRA_MODULES)]
    return cmds


def _check_install(inst: Install, tmp_path: Path, extras: bool) -> None:
    failed = []
    for argv in _help_commands(inst):
        res = inst.run(argv)
        module = argv[-2]
        if module in NEEDS_EXTRA and not extras:
            hint = f"pip install 'mycroft-otel[{NEEDS_EXTRA[module]}]'"
            if res.returncode == 0 or hint not in res.stderr or "Traceback" in res.stderr:
                failed.append(f"{' '.join(argv)} without its extra -> {res.returncode}, not naming it: "
                              f"{res.stderr.strip()[-600:]}")
            continue
        answered = "usage:" in res.stdout or module in NO_USAGE
        if res.returncode != 0 or not answered:
            failed.append(f"{' '.join(argv)} -> {res.returncode}: {res.stderr.strip()[-600:]}")
    assert not failed, f"{inst.name}:\n" + "\n".join(failed)
    # the plugin's path: a file inside the venv
    res = inst.run([inst.cli, "plugin-path"])
    assert res.returncode == 0, res.stderr
    plugin = Path(res.stdout.strip())
    assert plugin.name == "libnccl-profiler-mycroft.so" and plugin.is_file()
    assert plugin.resolve().is_relative_to(inst.venv.resolve()), plugin
    # the configuration table of the README
    res = inst.run([inst.python, "-m", "mycroft_otel.config"])
    assert res.returncode == 0 and "| `MYCROFT_RING_DIR` |" in res.stdout, res.stderr
    # a 2-rank job through the installed plugin and the _native bindings (accelerated time: ~1 s)
    rings = tmp_path / f"rings-{inst.name}"
    res = inst.run([inst.cli, "sim", "--topology", "nodes=1,gpus=2,tp=2,dp=1", "--ring-dir", str(rings),
                    "--no-progress"], timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout)
    assert out["world"] == 2 and out["stats"]["errors"] == 0 and out["events"] > 0
    assert any(rings.iterdir())


@pytest.mark.slow
@pytest.mark.timeout(2700)
def test_wheel_ships_the_plugin_and_extension_and_runs_every_command(wheel_install, tmp_path):
    inst, (wheel,) = wheel_install
    # a platform wheel: the plugin and the extension inside, tagged for this interpreter and platform
    assert not wheel.name.endswith("-none-any.whl"), wheel.name
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    assert "mycroft_otel/lib/libnccl-profiler-mycroft.so" in names
    assert any(re.fullmatch(r"mycroft_otel/_native\..*\.so", n) for n in names), names
    assert "mycroft_otel/docs/runbook.md" in names  # what the processor serves at /runbook
    res = inst.run([inst.python, "-c", "import mycroft_otel, mycroft_otel._native as n; print(n.__file__)"])
    assert res.returncode == 0 and res.stdout.strip().startswith(str(inst.venv)), res.stderr
    res = inst.run([inst.python, "-c", "from mycroft_otel import paths; p = paths.runbook_path(); "
                    "print(p.is_file(), p)"])
    assert res.returncode == 0 and res.stdout.startswith(f"True {inst.venv}"), res.stdout + res.stderr
    assert res.stdout.strip().endswith("mycroft_otel/docs/runbook.md"), res.stdout
    _check_install(inst, tmp_path, extras=False)


@pytest.mark.slow
@pytest.mark.timeout(2700)
def test_checkout_runs_every_command_and_script_after_pip_install(checkout_install, tmp_path):
    inst = checkout_install
    # run from the clone's root: its source tree comes first on sys.path and has no compiled extension
    assert not glob.glob(str(inst.cwd / "mycroft_otel" / "_native*.so"))
    _check_install(inst, tmp_path, extras=True)
    # the dashboards generator finds the checkout's dashboards/ (not the installed copy's surroundings)
    res = inst.run([inst.python, "-m", "mycroft_otel.grafana.dashboards", "--check"])
    assert res.returncode == 0, res.stderr[-2000:]
    res = inst.run([inst.python, "-m", "mycroft_otel.stack", "--help"])
    assert res.returncode == 0 and "cannot import name '_native'" not in res.stderr
    _, _, files = documented()
    failed = []
    for rel in sorted(files - set(NOT_RUN)):
        args = SCRIPT_ACTIONS.get(rel, ["--help"])
        argv = (["bash", rel] if rel.endswith(".sh") else [inst.python, rel]) + args
        res = inst.run(argv, timeout=120)
        if res.returncode != 0:
            failed.append(f"{' '.join([rel, *args])} -> {res.returncode}: {res.stderr.strip()[-600:]}")
    assert not failed, "\n".join(failed)
    plan = inst.run(["bash", "scripts/gpu_drill.sh", "--plan"])
    assert "planned within" in plan.stdout, plan.stdout[-2000:]
