"""mycroft_otel/__init__.py: importing a stage loads no other stage, and a source tree that shadows a built copy
hands its submodules to that copy."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import mycroft_otel

PACKAGE = Path(mycroft_otel.__path__[0]).resolve()  # where the submodules come from (see the package docstring)


def _python(code: str, cwd: Path | str | None = None, env: dict[str, str] | None = None):
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_processor_import_loads_no_agent():
    res = _python("import mycroft_otel.processor, sys; "
                  "assert not any(m.startswith('mycroft_otel.agent') for m in sys.modules), "
                  "sorted(m for m in sys.modules if m.startswith('mycroft_otel.agent'))")
    assert res.returncode == 0, res.stderr


def test_instrument_is_the_agents_and_loaded_on_first_use():
    res = _python("import sys, mycroft_otel\n"
                  "assert 'mycroft_otel.agent.instrumentor' not in sys.modules\n"
                  "from mycroft_otel import instrument\n"
                  "from mycroft_otel.agent import instrumentor\n"
                  "assert instrument is instrumentor.instrument and mycroft_otel.instrument is instrument\n")
    assert res.returncode == 0, res.stderr


def test_unknown_attribute_is_an_attribute_error():
    try:
        mycroft_otel.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("no AttributeError")


def _shadowing_tree(tmp_path: Path) -> Path:
    """A directory like a checkout without its build: the package's __init__.py and nothing compiled."""
    shadow = tmp_path / "mycroft_otel"
    shadow.mkdir()
    shutil.copy(PACKAGE / "__init__.py", shadow / "__init__.py")
    return tmp_path


def test_module_entry_points_run_the_built_copy_from_a_source_tree(tmp_path):
    """``python -m mycroft_otel.<module>`` in a checkout without its build runs the built copy further down
    sys.path (here: this test's own package, standing in for the installed one)."""
    if not mycroft_otel._has_extension(str(PACKAGE)):
        import pytest

        pytest.skip("the package under test has no _native extension (native build not run)")
    cwd = _shadowing_tree(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}
    env["PYTHONPATH"] = str(PACKAGE.parent)
    where = _python("import mycroft_otel, mycroft_otel._native as n, mycroft_otel.paths as p; "
                    "print(mycroft_otel.__file__); print(n.__file__); print(p.plugin_path())", cwd=cwd, env=env)
    assert where.returncode == 0, where.stderr
    init, native, plugin = where.stdout.split()
    assert Path(init).resolve() == cwd / "mycroft_otel" / "__init__.py"  # the shadowing tree did shadow
    assert Path(native).resolve().parent == PACKAGE
    assert Path(plugin).resolve().parent == PACKAGE / "lib"
    for module in ("mycroft_otel.processor.replay", "mycroft_otel.stack", "mycroft_otel"):
        res = subprocess.run([sys.executable, "-m", module, "--help"], cwd=cwd, env=env, capture_output=True,
                             text=True, timeout=120)
        assert res.returncode == 0, (module, res.stderr[-2000:])


def test_a_source_tree_with_nothing_built_elsewhere_stays_itself(tmp_path):
    """No built copy further down sys.path: the source tree runs as it is (native.py then says what to build)."""
    cwd = _shadowing_tree(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONSAFEPATH", "PYTHONPATH")}
    res = _python("import mycroft_otel; print(*mycroft_otel.__path__, sep='\\n')", cwd=cwd, env=env)
    assert res.returncode == 0, res.stderr
    (path,) = res.stdout.split()
    # where an installed copy exists (pip install . on this interpreter), that one is taken instead
    assert Path(path).resolve() == (cwd / "mycroft_otel").resolve() or mycroft_otel._has_extension(path)
