"""``mycroft-otel plugin-path``: the value for NCCL_PROFILER_PLUGIN."""

from __future__ import annotations

import argparse
import sys

from mycroft_otel.paths import plugin_path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    del parser  # no options


def run(args: argparse.Namespace) -> int:
    del args
    try:
        print(plugin_path())
    except FileNotFoundError as exc:
        print(f"mycroft-otel plugin-path: {exc}", file=sys.stderr)
        return 1
    return 0
