"""The NCCL-faithful simulator: a training job's collective communication through the real plugin ABI.

Use it from the command line (``mycroft-otel sim``, see docs/simulator.md) or from Python::

    from mycroft_otel.sim import run_job
    out = run_job("nodes=8,gpus=8,tp=8,dp=8", faults=["nic_down:rank=19"], seed=7,
                  realtime=True, duration_s=20, ring_dir="/dev/shm/mycroft-otel")
    out["faults"][0]["culprit_global_ranks"]   # the ground truth (same JSON as the CLI prints)

Lower level: :class:`~mycroft_otel.sim.simulation.Simulation` (the job and its timing) and
:func:`mycroft_otel.sim.runner.run` (delivery to the plugin).
"""

from __future__ import annotations

import argparse
from typing import Iterable


def run_job(topology: str = "nodes=8,gpus=8,tp=8,dp=8", faults: Iterable[str] = (), seed: int = 0,
            steps: int | None = None, realtime: bool = False, duration_s: float | None = None,
            ring_dir: str | None = None, job_id: str | None = None, multiprocess: bool = False,
            progress: bool = False, slow_steps: bool = False, abi: int | None = None,
            plugin: str | None = None, quantum_us: float = 0.0, algo: str = "Ring", light: bool = False) -> dict:
    """Run a simulated job (blocking; real time lasts ``duration_s``) and return the CLI's JSON as a dict."""
    from mycroft_otel.sim import cli

    args = argparse.Namespace(topology=topology, fault=list(faults), seed=seed, steps=steps, realtime=realtime,
                              duration=duration_s, multiprocess=multiprocess, ring_dir=ring_dir, job_id=job_id,
                              abi=abi, plugin=plugin, ring_records=None, slow_steps=slow_steps,
                              no_progress=not progress, quantum_us=quantum_us, algo=algo, light=light)
    return cli.run_args(args)


__all__ = ["run_job"]
