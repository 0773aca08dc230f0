"""Record what the processor receives in each eval scenario, for offline replay (development tool).

    python benchmarks/processor/record_eval.py OUTDIR [NAME ...]

Runs the eval harness (real sim, agent and processor subprocesses) with the processor started with
``--record OUTDIR/<scenario>.otlp``, and writes the ground truth and the live verdicts next to it.
Replay a recording with ``python -m mycroft_otel.processor.replay OUTDIR/<scenario>.otlp``.
"""

from __future__ import annotations

import json
import os
import sys

from mycroft_otel.evaluate import harness, scenarios
from mycroft_otel.evaluate.sink import Sink


def main() -> int:
    out = os.path.abspath(sys.argv[1])
    only = set(sys.argv[2:])
    os.makedirs(out, exist_ok=True)
    orig = harness._start
    current = {}

    def start(name, argv, env, workdir):
        if name == "processor":
            argv = argv + ["--record", os.path.join(out, current["name"] + ".otlp")]
        return orig(name, argv, env, workdir)

    harness._start = start
    sink = Sink()
    sink.start()
    for sc in scenarios.builtin():
        if only and sc.name not in only:
            continue
        current["name"] = sc.name
        path = os.path.join(out, sc.name + ".otlp")
        if os.path.exists(path):
            os.unlink(path)
        o = harness.run_scenario(sc, sink, 3000, log=print)
        row = harness.score(o)
        with open(os.path.join(out, sc.name + ".json"), "w") as f:
            json.dump(row, f, indent=1, default=str)
        print(sc.name, row.get("expected"), "->", row.get("top"), "culprit", row.get("culprit_ok"),
              "category", row.get("category_ok"), "latency", row.get("latency_s"), "FP", row.get("false_positives"),
              flush=True)
    sink.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
