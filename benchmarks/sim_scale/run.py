"""Accelerated-mode scale benchmark: one training step of a big job through the real plugin.

Reports simulated events per second (rows delivered to the plugin through the ABI driver)
and, as the in-run baseline, the same rows replayed through a plugin-less path (timing only:
the engine without delivery), so the ratio shows what delivery costs.

    python benchmarks/sim_scale/run.py                       # 4,096 ranks: nodes=512,gpus=8,tp=8,pp=8,dp=64
    python benchmarks/sim_scale/run.py --topology nodes=512,gpus=8,tp=8,dp=512 --buckets 1
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from mycroft_otel.sim import runner  # noqa: E402
from mycroft_otel.sim.model import TimingModel  # noqa: E402
from mycroft_otel.sim.simulation import Simulation  # noqa: E402
from mycroft_otel.sim.topology import parse_topology  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topology", default="nodes=512,gpus=8,tp=8,pp=8,dp=64")
    ap.add_argument("--buckets", type=int, default=2, help="DP gradient all-reduce buckets per step")
    ap.add_argument("--bucket-mb", type=int, default=32)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--ring-dir", default=None, help="default: a fresh dir under /dev/shm, removed after")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    topo = parse_topology(args.topology)
    model = TimingModel().with_step(dp_buckets=args.buckets, dp_bucket_bytes=args.bucket_mb << 20,
                                    initial_broadcast=False)
    ring_dir = args.ring_dir or tempfile.mkdtemp(prefix="mycroft-simscale-", dir="/dev/shm")
    try:
        # Baseline in the same run: the timing model alone (every row built, nothing delivered).
        t0 = time.monotonic()
        base = Simulation(topo, model, seed=1, steps=args.steps, predict=False)
        base.run(lambda inst, res: None)
        t_model = time.monotonic() - t0
        sim = Simulation(topo, model, seed=1, steps=args.steps, predict=False)
        t1 = time.monotonic()
        cpu1 = time.process_time()
        res = runner.run(sim, runner.RunConfig(ring_dir=ring_dir, job_id="simscale", ring_records=16,
                                               live_slots=8))
        t_total = time.monotonic() - t1
        cpu_total = time.process_time() - cpu1
        st = res["stats"]
        out = {
            "topology": topo.spec(), "ranks": topo.world, "contexts": res["contexts"], "steps": args.steps,
            "dp_buckets": args.buckets, "bucket_mb": args.bucket_mb,
            "events": int(res["events"]), "delivered": int(st.get("delivered", 0)),
            "driver_errors": int(st.get("errors", 0)) + int(st.get("missing_slot", 0)),
            "init_s": round(res["init_s"], 2), "model_only_s": round(t_model, 2),
            "simulate_and_deliver_s": round(res["wall_s"], 2), "total_s": round(t_total, 2),
            "cpu_s": round(cpu_total, 2), "load_avg_1m": round(os.getloadavg()[0], 2),
            "driver_replay_s": round(st.get("wall_ns", 0) / 1e9, 2),
            "ns_per_delivered_event": round(st.get("wall_ns", 0) / max(1, st.get("delivered", 1)), 1),
            "events_per_s": round(res["events"] / res["wall_s"]),
            "model_only_events_per_s": round(base.n_rows / t_model),
            "delivery_cost_ratio": round(res["wall_s"] / t_model, 2),
            "under_60s": t_total < 60,
        }
    finally:
        if args.ring_dir is None:
            shutil.rmtree(ring_dir, ignore_errors=True)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for k, v in out.items():
            print(f"{k:26s} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
