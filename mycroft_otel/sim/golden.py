"""Golden comparison: what a real NCCL run left in the rings (scripts/gpu_check.py's capture) against the model.

``compare(capture)`` checks the properties the simulator reproduces and returns the differences
(empty = agreement): per completed ring collective, each flow's step count against
``engine.step_sizes`` for the recorded (function, count, datatype, ranks, channels, chunk size);
completed flows with posted = ready = transmitted = done = nSteps; one KernelCh per channel; and
ring orders consistent across ranks (the recv peer of my send peer is me, per channel and op).
Run it on a capture with ``python -m mycroft_otel.sim.golden gpu_check.json``.

``spreads(capture)`` measures the healthy variation the noise model is calibrated to (model.NoiseModel):
per collective instance seen by every rank, the slowest send flow's wait per step against the median send
flow (network: SendWait time / nSteps; GPU: SendGPUWait time / nSteps) and the slowest rank's duration
against the median rank's, then the p50 and p99 of those ratios over the collectives (order statistics,
numpy's "lower" percentile). ``capture_of_log(sim)`` gives a simulated run the capture's shape, so the same
function measures the simulator (the rings of a run through the plugin, read like gpu_check.py reads
them, have that shape too).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from dataclasses import asdict, dataclass

import numpy as np

from mycroft_otel.sim import abi
from mycroft_otel.sim.engine import RING_STEPS_PER_LOOP, step_sizes


def compare(capture: dict) -> list[str]:
    diffs: list[str] = []
    sends: dict = defaultdict(dict)   # (comm, seq, channel) -> {rank: send peer}
    recvs: dict = defaultdict(dict)
    for ring in capture.get("rings", []):
        if "error" in ring:
            continue
        n = int(ring["nranks"])
        for op in ring.get("captured", []):
            if op["kind"] != "coll" or op["func"] not in RING_STEPS_PER_LOOP or op["algo"].upper() != "RING":
                continue
            where = f"{ring['comm_name'] or ring['comm_hash']} r{ring['rank']} {op['func']}#{op['seq']}"
            dts = abi.DATATYPE_SIZES[abi.DATATYPE[op["datatype"]]] if op["datatype"] in abi.DATATYPE else 4
            if op["kernel_ch"][0] != op["kernel_ch"][1]:
                diffs.append(f"{where}: kernel channels started {op['kernel_ch'][0]} != stopped {op['kernel_ch'][1]}")
            for f in op["flows"]:
                k = max(1, int(f["n_proxy_ops"]))
                want = len(step_sizes(op["func"], int(op["count"]), dts, n, int(op["n_channels"]),
                                      int(f["chunk_size"]) or 1))
                if int(f["n_steps"]) != k * want:
                    diffs.append(f"{where} ch{f['channel']} {f['dir']}: nSteps {f['n_steps']} != model {k}x{want}")
                if not (int(f["posted"]) == int(f["ready"]) == int(f["transmitted"]) == int(f["done"])
                        == int(f["n_steps"])):
                    diffs.append(f"{where} ch{f['channel']} {f['dir']}: counters {f['posted']}/{f['ready']}/"
                                 f"{f['transmitted']}/{f['done']} of {f['n_steps']} on a completed op")
                key = (ring["comm_hash"], op["seq"], f["channel"])
                (sends if f["dir"] == "send" else recvs)[key][int(ring["rank"])] = int(f["peer"])
    for key, s in sends.items():
        r = recvs.get(key, {})
        for me, peer in s.items():
            if peer in r and r[peer] != me:
                diffs.append(f"comm {key[0]} seq {key[1]} ch{key[2]}: rank {me} sends to {peer}, "
                             f"which receives from {r[peer]}")
    return diffs


@dataclass(frozen=True)
class Spreads:
    """Healthy spread of a set of collectives: p50/p99 over collectives of (slowest / median) per collective."""

    collectives: int
    flow_p50: float   # network wait per step, slowest send flow / median send flow
    flow_p99: float
    gpu_p50: float    # GPU wait per step, slowest send flow / median send flow
    gpu_p99: float
    rank_p50: float   # duration, slowest rank / median rank
    rank_p99: float

    def as_dict(self) -> dict:
        return asdict(self)


def _ratio(values: list[float]) -> float | None:
    med = float(np.median(values))
    return max(values) / med if med > 0 else None


def spreads(capture: dict) -> Spreads:
    """The capture's healthy spreads (module docstring); collectives missing a rank's record are skipped."""
    by_coll: dict = defaultdict(list)
    nranks: dict = {}
    for ring in capture.get("rings", []):
        if "error" in ring:
            continue
        nranks[ring["comm_hash"]] = int(ring["nranks"])
        for op in ring.get("captured", []):
            if op.get("kind") == "coll" and op.get("duration_ns"):
                by_coll[(ring["comm_hash"], op["func"], op["seq"])].append(op)
    flow, gpu, rank = [], [], []
    for (comm, _, _), ops in by_coll.items():
        if len(ops) < nranks[comm]:
            continue
        sends = [f for op in ops for f in op["flows"] if f["dir"] == "send" and int(f["n_steps"]) > 0]
        if len(sends) >= 2:
            for out, key in ((flow, "net_wait_ns"), (gpu, "gpu_wait_ns")):
                r = _ratio([float(f[key]) / int(f["n_steps"]) for f in sends])
                if r is not None:
                    out.append(r)
        r = _ratio([float(op["duration_ns"]) for op in ops])
        if r is not None:
            rank.append(r)
    if not rank:
        raise ValueError("no collective recorded by all of its ranks: nothing to measure a spread on")

    def pct(x: list[float], q: float) -> float:
        return float(np.percentile(x, q, method="lower")) if x else float("nan")

    return Spreads(len(rank), pct(flow, 50), pct(flow, 99), pct(gpu, 50), pct(gpu, 99), pct(rank, 50),
                   pct(rank, 99))


def capture_of_log(sim) -> dict:
    """A simulated run's collectives (Simulation.log, predict=True) in the shape gpu_check.py writes."""
    rings: dict = {}
    for e in sim.log:
        if e["func"] == "Send":
            continue
        comm = sim.comms[e["kind"]][e["comm"]]
        key = f"{e['kind']}{e['comm']}"
        by_rank: dict = defaultdict(list)
        for f in e["flows"]:
            by_rank[f["rank"]].append({"channel": f["channel"], "dir": f["dir"], "peer": f["peer"],
                                       "n_steps": f["n_steps"], "gpu_wait_ns": f.get("gpu_wait_ns", 0.0),
                                       "net_wait_ns": f.get("net_wait_ns", 0.0)})
        for r, (t0, t1) in enumerate(zip(e["issue"], e["end"])):
            if not (np.isfinite(t0) and np.isfinite(t1)):
                continue
            ring = rings.setdefault((key, r), {"comm_hash": key, "rank": r, "nranks": comm.nranks, "captured": []})
            ring["captured"].append({"kind": "coll", "func": e["func"], "seq": e["seq"],
                                     "duration_ns": t1 - t0, "flows": by_rank.get(r, [])})
    return {"rings": list(rings.values())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mycroft_otel.sim.golden",
                                 description="compare a real capture (scripts/gpu_check.py's JSON) with the "
                                             "simulator's model; print the healthy spreads")
    ap.add_argument("capture", help="gpu_check.json")
    args = ap.parse_args(argv)
    with open(args.capture) as f:
        capture = json.load(f)
    diffs = compare(capture)
    print("\n".join(diffs) if diffs else "capture agrees with the simulator's model")
    print("healthy spreads:", json.dumps(spreads(capture).as_dict()))
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
