"""``mycroft-otel sim``: simulate a training job with faults through the real plugin ABI.

Prints progress on stderr and, at the end, the run's ground truth as JSON on stdout::

    mycroft-otel sim --topology nodes=8,gpus=8,tp=8,dp=8 --fault nic_down:rank=19 --seed 7 \
        --realtime --duration 20 --ring-dir /dev/shm/mycroft-otel
"""

from __future__ import annotations

import argparse
import json
import sys

from mycroft_otel import config
from mycroft_otel.sim.faults import CATALOGUE, FaultError, parse_fault
from mycroft_otel.sim.model import DEFAULT_NOISE, NOISE_MODELS, TimingModel, eval_model, light_model
from mycroft_otel.sim import runner
from mycroft_otel.sim.runner import Progress, RunConfig
from mycroft_otel.sim.simulation import Simulation
from mycroft_otel.sim.topology import TopologyError, parse_topology


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topology", default="nodes=8,gpus=8,tp=8,dp=8",
                   help="nodes=,gpus=,tp=,pp=,dp= (default %(default)s)")
    p.add_argument("--fault", action="append", default=[], metavar="NAME[:k=v,...]",
                   help="inject a fault (repeatable): " + ", ".join(CATALOGUE))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=None, help="training steps (default 1, or as many as --duration)")
    p.add_argument("--realtime", action="store_true", help="deliver events at their wall-clock times")
    p.add_argument("--duration", type=float, default=None, metavar="S",
                   help="real time: run (and keep a hung job alive) this many seconds")
    p.add_argument("--multiprocess", action="store_true",
                   help="one OS process per simulated host (implied by process_exited/sigstop in real time)")
    p.add_argument("--ring-dir", default=None, help="shared-memory directory (default MYCROFT_RING_DIR)")
    p.add_argument("--job-id", default=None, help="MYCROFT_JOB_ID of the simulated ranks (default sim-<seed>)")
    p.add_argument("--abi", type=int, choices=(4, 5, 6, 7), default=None, help="profiler ABI version to drive")
    p.add_argument("--plugin", default=None, help="plugin .so (default: the packaged one)")
    p.add_argument("--ring-records", type=int, default=None, help="MYCROFT_RING_RECORDS for the simulated ranks")
    p.add_argument("--algo", choices=("Ring", "Tree"), default="Ring", help="DP all-reduce algorithm")
    p.add_argument("--noise", choices=tuple(NOISE_MODELS), default=DEFAULT_NOISE,
                   help="healthy variation (model.NoiseModel, docs/simulator.md): %(default)s is NCCL's own, "
                        "calibrated on a real capture")
    p.add_argument("--slow-steps", action="store_true",
                   help="the eval timing model (~0.3 s steps) instead of the default (~0.1 s)")
    p.add_argument("--light", action="store_true",
                   help="--slow-steps with 2 MiB steps: 4x fewer events (long real-time runs of 64+ ranks)")
    p.add_argument("--quantum-us", type=float, default=0.0,
                   help="real time: deliver events in bursts every this many microseconds (less CPU; default exact)")
    p.add_argument("--no-progress", action="store_true")


def run_args(args: argparse.Namespace, progress: Progress | None = None) -> dict:
    topo = parse_topology(args.topology)
    faults = [parse_fault(f) for f in args.fault]
    model: TimingModel = (light_model() if getattr(args, "light", False) else
                          eval_model() if args.slow_steps else TimingModel())
    model = model.with_nccl(dp_algo=getattr(args, "algo", "Ring") or "Ring").with_noise(
        getattr(args, "noise", DEFAULT_NOISE) or DEFAULT_NOISE)
    steps = args.steps
    duration = args.duration if args.realtime else None
    if steps is None and duration is None:
        steps = 1
    multiprocess = args.multiprocess or (args.realtime and any(f.needs_process for f in faults))
    if multiprocess and not args.realtime:
        raise FaultError("--multiprocess needs --realtime (processes are signalled at wall-clock onsets)")
    sim = Simulation(topo, model, faults, seed=args.seed, steps=steps, duration_s=duration,
                     predict=topo.world <= 256)
    ring_dir = args.ring_dir or config.get_str("MYCROFT_RING_DIR")
    job = args.job_id or f"sim-{args.seed}"
    cfg = RunConfig(ring_dir=ring_dir, job_id=job, realtime=args.realtime, multiprocess=multiprocess,
                    duration_s=args.duration, plugin=args.plugin, abi_version=args.abi,
                    ring_records=args.ring_records, quantum_ns=int(args.quantum_us * 1000))
    progress = progress or Progress("sim", enabled=not args.no_progress and sys.stderr.isatty())
    res = runner.run(sim, cfg, progress)
    return {
        "topology": topo.spec(), "world": topo.world, "seed": args.seed, "mode": res["mode"],
        "ring_dir": ring_dir, "job_id": job, "steps": res["steps"], "events": int(res["events"]),
        "contexts": res["contexts"], "hung": bool(not all(map(lambda x: x < float("inf"), sim.gpu))),
        "faults": res["truth"], "stats": {k: v for k, v in res["stats"].items()},
        "noise": model.noise.name, "noise_events": sim.noise_events,
        "epoch_realtime_ns": res.get("epoch_realtime_ns"),
    }


def run(args: argparse.Namespace) -> int:
    try:
        out = run_args(args)
    except (TopologyError, FaultError) as exc:
        print(f"mycroft-otel sim: {exc}", file=sys.stderr)
        return 2
    json.dump(out, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0
