"""Plugin configuration errors, the plugin-path command, exported symbols, and `pip install .`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from native_support import ROOT, run_isolated
from mycroft_otel import native
from mycroft_otel.config import VARS
from mycroft_otel.native import Driver

SYMBOLS = {"ncclProfiler_v4", "ncclProfiler_v5", "ncclProfiler_v6", "ncclProfiler_v7",
           "mycroftProfilerSetClock"}  # the last: the simulator's virtual clock (NCCL never looks it up)

BAD = [
    ("MYCROFT_LIVE_SLOTS", "0"), ("MYCROFT_LIVE_SLOTS", "lots"), ("MYCROFT_LIVE_SLOTS", "4097"),
    ("MYCROFT_RING_RECORDS", "15"), ("MYCROFT_RING_RECORDS", "1e3"), ("MYCROFT_ENABLE", "maybe"),
    ("MYCROFT_RING_DIR", "relative/dir"),
]


@pytest.mark.parametrize("name,value", BAD)
def test_bad_knob_fails_init_naming_the_variable(plugin_so, tmp_path, name, value):
    assert "plugin" in VARS[name].used_by
    d = Driver(plugin_so)
    env = {"MYCROFT_RING_DIR": str(tmp_path / "rings"), name: value}
    native.log_messages(clear=True)
    with pytest.raises(RuntimeError, match=name):
        d.init("c", 1, 1, 2, 0, env=env)
    warns = [m for m in native.log_messages(clear=True) if m["level_name"] == "WARN"]
    assert warns and name in warns[-1]["msg"]
    assert d.num_contexts == 0
    assert native.ring_files(tmp_path / "rings") == []


def test_disabled_plugin_declines_init(plugin_so, tmp_path):
    d = Driver(plugin_so)
    with pytest.raises(RuntimeError, match="init failed"):
        d.init("c", 1, 1, 2, 0, env={"MYCROFT_ENABLE": "0", "MYCROFT_RING_DIR": str(tmp_path)})


def test_bad_knob_is_logged_nccl_style(plugin_so, tmp_path):
    code = ("import sys; from mycroft_otel.native import Driver\n"
            "d = Driver(sys.argv[1])\n"
            "try:\n    d.init('c', 1, 1, 2, 0, env={'MYCROFT_LIVE_SLOTS': 'x'})\nexcept RuntimeError:\n    print('FAILED')\n")
    p = run_isolated(["-c", code, plugin_so], timeout=30, env={"NCCL_DEBUG": "WARN",
                                                                "MYCROFT_RING_DIR": str(tmp_path)})
    assert p.returncode == 0 and "FAILED" in p.stdout
    assert "NCCL WARN" in p.stderr and "MYCROFT_LIVE_SLOTS" in p.stderr


def test_good_knobs_shape_the_file(plugin_so, tmp_path):
    d = Driver(plugin_so)
    d.init("c", 1, 1, 2, 0, env={"MYCROFT_RING_DIR": str(tmp_path), "MYCROFT_LIVE_SLOTS": " 8 ",
                                 "MYCROFT_RING_RECORDS": "16", "SLURM_JOB_ID": "slurm-9", "MYCROFT_JOB_ID": None})
    (f,) = native.ring_files(tmp_path)
    h = native.read_header(native.open_ring(f))
    assert (h.live_slots, h.ring_capacity, h.job_id) == (8, 16, "slurm-9")
    assert f.stat().st_size == h.file_size


def exported_symbols(path: str) -> set[str]:
    from elftools.elf.elffile import ELFFile

    with open(path, "rb") as fh:
        dynsym = ELFFile(fh).get_section_by_name(".dynsym")
        return {s.name for s in dynsym.iter_symbols()
                if s["st_shndx"] != "SHN_UNDEF" and s["st_info"]["bind"] in ("STB_GLOBAL", "STB_WEAK")}


def test_plugin_path_command_and_symbols(plugin_so):
    p = subprocess.run([sys.executable, "-m", "mycroft_otel", "plugin-path"], capture_output=True, text=True,
                       timeout=60, cwd=str(ROOT))
    assert p.returncode == 0, p.stderr
    path = Path(p.stdout.strip())
    assert path.is_absolute() and path.is_file() and path.samefile(plugin_so)
    syms = exported_symbols(str(path))
    assert SYMBOLS <= syms
    # nothing else leaks into NCCL's process (hidden visibility), beyond the C runtime's markers
    assert not {s for s in syms - SYMBOLS if not s.startswith("_")}, syms - SYMBOLS
    if shutil.which("nm"):
        nm = subprocess.run(["nm", "-D", "--defined-only", str(path)], capture_output=True, text=True, timeout=60)
        assert SYMBOLS <= {line.split()[-1] for line in nm.stdout.splitlines() if line.strip()}


def copy_source_tree(dst: Path) -> None:
    """What a fresh clone holds: tracked and untracked-but-not-ignored files (no build outputs)."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                                capture_output=True, check=True, timeout=60).stdout.split(b"\0")
    except (OSError, subprocess.CalledProcessError):
        shutil.copytree(ROOT, dst, ignore=shutil.ignore_patterns(".git", "build", "__pycache__", "*.so", "runs"))
        return
    for rel in filter(None, listed):
        src = ROOT / rel.decode()
        if src.is_file():
            (dst / rel.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel.decode())


def site_dirs_of_this_interpreter() -> list[str]:
    """The site directories the running interpreter imports from, in its order: a venv's own, then what it
    inherits (system site packages, the user site), whichever of them it has."""
    out: list[str] = []
    for entry in sys.path:
        if entry and os.path.basename(entry) in ("site-packages", "dist-packages") and os.path.isdir(entry):
            if entry not in out:
                out.append(entry)
    return out


def venv_beside_this_interpreter(env_dir: Path) -> Path:
    """A fresh venv whose packages come first and that otherwise imports what the running interpreter imports
    (the build backend for --no-build-isolation, the runtime dependencies for --no-deps), whether that
    interpreter is the system's or a venv's; its python.

    ``system_site_packages`` would not do: a venv made from inside a venv inherits the base interpreter's site
    directories, not the active venv's. A path file lists ours instead; plain directory lines, so the path files
    inside them (an editable install of this package, say) are not run."""
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    Path(purelib, "running-interpreter.pth").write_text("".join(d + "\n" for d in site_dirs_of_this_interpreter()))
    return py


@pytest.mark.slow
def test_pip_install_ships_plugin_and_native(tmp_path):
    """`pip install .` into a fresh venv builds both native pieces and installs them in the package."""
    if os.environ.get("MYCROFT_SKIP_PIP_TEST"):
        pytest.skip("MYCROFT_SKIP_PIP_TEST set")
    env_dir = tmp_path / "venv"
    py = venv_beside_this_interpreter(env_dir)
    src = tmp_path / "src"
    copy_source_tree(src)
    env = dict(os.environ, PIP_NO_INPUT="1", CMAKE_BUILD_PARALLEL_LEVEL="2")
    env.pop("PYTHONPATH", None)
    p = subprocess.run([str(py), "-m", "pip", "install", "--no-build-isolation", "--no-deps", "-q", str(src)],
                       capture_output=True, text=True, timeout=1200, env=env, cwd=str(tmp_path))
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    check = ("import mycroft_otel, mycroft_otel._native as n, mycroft_otel.native as m; "
             "from mycroft_otel.paths import plugin_path; "
             "print(mycroft_otel.__file__); print(plugin_path()); print(m.Driver(str(plugin_path())).version)")
    p = subprocess.run([str(py), "-c", check], capture_output=True, text=True, timeout=60, env=env, cwd=str(tmp_path))
    assert p.returncode == 0, p.stderr
    pkg, plugin, version = p.stdout.split()
    assert str(env_dir) in pkg and str(env_dir) in plugin and version == "7"
    assert SYMBOLS <= exported_symbols(plugin)
    cli = env_dir / "bin" / "mycroft-otel"
    p = subprocess.run([str(cli), "plugin-path"], capture_output=True, text=True, timeout=60, env=env,
                       cwd=str(tmp_path))
    assert p.returncode == 0 and p.stdout.strip() == plugin
