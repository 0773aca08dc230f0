"""Golden comparison: what a real NCCL run left in the rings (scripts/gpu_check.py's capture) against the model.

``compare(capture)`` checks the properties the simulator reproduces and returns the differences
(empty = agreement): per completed ring collective, each flow's step count against
``engine.step_sizes`` for the recorded (function, count, datatype, ranks, channels, chunk size);
completed flows with posted = ready = transmitted = done = nSteps; one KernelCh per channel; and
ring orders consistent across ranks (the recv peer of my send peer is me, per channel and op).
Run it on a capture with ``python -m mycroft_otel.sim.golden gpu_check.json``.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict

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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    capture = json.load(open(argv[0]))
    diffs = compare(capture)
    print("\n".join(diffs) if diffs else "capture agrees with the simulator's model")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
