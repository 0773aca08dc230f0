"""The ``mycroft-otel`` command: one verb per stage, each implemented in its own module.

A verb's module exposes ``add_arguments(parser)`` and ``run(args) -> int``; it is
imported only when its verb runs, so the agent never loads the processor and so on.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from mycroft_otel.config import ConfigError

#: verb -> (module, one-line help)
VERBS: dict[str, tuple[str, str]] = {
    "plugin-path": ("mycroft_otel.cli_plugin_path", "print the absolute path of the NCCL profiler plugin"),
    "agent": ("mycroft_otel.agent.cli", "per node: discover rings and export spans over OTLP (OTEL_*)"),
    "processor": ("mycroft_otel.processor.cli", "OTLP receiver -> root-cause analysis -> root-cause spans; /metrics"),
    "sim": ("mycroft_otel.sim.cli", "simulate a training job with faults through the real plugin ABI"),
    "eval": ("mycroft_otel.evaluate.cli", "run the fault catalogue end to end; print detection/RCA accuracy"),
    "demo": ("mycroft_otel.demo", "simulated job with a fault, agent and processor in one go: verdict, report.html"),
    "drill": ("mycroft_otel.drill", "a simulated hang beside this node's agent: does the operator get paged?"),
    "report": ("mycroft_otel.report", "self-contained HTML report of a run"),
    "grafana": ("mycroft_otel.grafana", "grafana provision: push datasources, dashboards and alert rules"),
}


# The child interpreter starts with the working directory (or "" for -c) first on sys.path: a
# checkout's source tree, without its compiled extension, would shadow the installed package.
# It drops that entry and puts first the directory this very package was imported from, so
# parent and child always run the same copy (installed, or a developer's in-place build).
_CHILD_BOOT = (
    "import sys\n"
    "if not getattr(sys.flags, 'safe_path', False) and sys.path and sys.path[0] in ('', '.'):\n"
    "    del sys.path[0]\n"
    "root = sys.argv.pop(1)\n"
    "if root not in sys.path:\n"
    "    sys.path.insert(0, root)\n"
    "from mycroft_otel.cli import main\n"
    "sys.exit(main())\n"
)


def command(*args: str) -> list[str]:
    """argv that runs ``mycroft-otel ARGS`` in a child process with the package this process runs.

    Never ``python -m mycroft_otel``: that resolves the package against the child's working
    directory first."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return [sys.executable, "-c", _CHILD_BOOT, root, *args]


def build_parser(verb: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mycroft-otel", description="Observable NCCL collectives.")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    for name, (module, help_text) in VERBS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == verb:
            importlib.import_module(module).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    verb = argv[0] if argv and argv[0] in VERBS else None
    args = build_parser(verb).parse_args(argv)
    if args.verb is None:
        build_parser().print_help()
        return 2
    try:
        return int(importlib.import_module(VERBS[args.verb][0]).run(args) or 0)
    except ConfigError as exc:
        print(f"mycroft-otel {args.verb}: configuration error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
