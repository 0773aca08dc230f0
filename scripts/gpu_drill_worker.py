"""The processes of the fault drill's real jobs (gpu_drill.py launches them): a rank, an overhead rank, a neighbour.

A rank runs a training-like loop on the shared GPU: four matmuls ("forward and backward"), then the all-reduce
of a 4 MiB gradient bucket, then a synchronize. It reports through lines of its stdout, which is its log:

    WARM <ns> <step>     the job has run healthy collectives: WARM_STEPS of them and WARM_S seconds of them
    ONSET <ns> <step>    the culprit's fault starts now (in-process faults: the launcher reads the truth here)
    TIMES [ms, ...]      the last TIMES_EVERY step times (the healthy rows' evidence of one or two speeds)

Faults acted in the culprit's own process, from its warm step on:

- late_rank: the host sleeps LATE_MS before every all-reduce (a compute straggler: the call comes late).
- size_mismatch: the culprit all-reduces twice the elements (its peers never serve the rest: a hang).
- slow_gpu: a spinning kernel of SLOW_GPU_MS on the culprit's own compute stream right before every all-reduce.
  torch orders its NCCL stream after the compute stream, so the culprit calls the collective on time but its
  NCCL kernel starts SLOW_GPU_MS late: data its peers sent waits for its GPU, and its sends wait for data its
  GPU has not produced (RecvGPUWait and SendGPUWait at the culprit alone). This emulates a GPU that runs the
  rank's work late (a throttled or degraded GPU, a kernel ahead of the collective overrunning) without touching
  the other ranks: the spinning kernel holds one thread block of this rank's context, and it runs while the
  other ranks are already inside the collective, so their own compute is not slowed by it. A busy stream
  running beside the collective the whole time, as the first version of the drill had it, slows every rank:
  the four ranks' contexts time-slice one GPU.

The job stops where every rank agrees: rank 0 raises a flag in the last element of the gradient bucket once the
launcher's stop file exists, and every rank leaves after the all-reduce whose sum carries it (a rank that left
one collective early would hang the others and draw a verdict of its own).

The neighbour (healthy_bimodal) is no rank: a process on the same GPU alternating NEIGHBOUR_ON_S of matmuls
with NEIGHBOUR_OFF_S idle, so every rank's collectives flip between two speeds together, as the check saw
four time-sliced ranks do on their own (docs/gpu-check.md: 14.7 ms against 28-41 ms). A healthy job under a
noisy neighbour: the detector must stay silent, since no rank is slower than its peers.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_common  # noqa: E402

WARM_STEPS, WARM_S = 30, 4.0     # healthy collectives before any fault: NCCL's init and lazy connects behind
LATE_MS = 400
SLOW_GPU_MS = 200
TIMES_EVERY = 25
NEIGHBOUR_ON_S, NEIGHBOUR_OFF_S = 2.0, 2.0


def _sleep_cycles_per_ms(torch) -> float:
    """GPU clock cycles of torch.cuda._sleep per millisecond, measured on this GPU with CUDA events."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 20_000_000
    torch.cuda._sleep(cycles // 10)  # first launch
    start.record()
    torch.cuda._sleep(cycles)
    stop.record()
    stop.synchronize()
    return cycles / max(start.elapsed_time(stop), 1e-3)


def train(fault: str, culprit: int, stop_file: Path) -> int:
    import torch
    import torch.distributed as dist

    rank, _, dev = gpu_common.join_job()
    print("NCCL", gpu_common.nccl_version(), flush=True)
    me = rank == culprit
    sleep_cycles = int(SLOW_GPU_MS * _sleep_cycles_per_ms(torch)) if me and fault == "slow_gpu" else 0
    if sleep_cycles:
        print("SLOW_GPU cycles", sleep_cycles, "for", SLOW_GPU_MS, "ms", flush=True)
    w = torch.randn(1024, 1024, device=dev)
    grad = torch.ones(1 << 20, device=dev)  # the 4 MiB bucket; its last element carries the stop flag
    step, first_ns, warm = 0, 0, False
    times: list[float] = []
    while True:
        t0 = time.perf_counter()
        if not warm and first_ns and step >= WARM_STEPS and time.time_ns() - first_ns >= WARM_S * 1e9:
            warm = True
            print("WARM", time.time_ns(), step, flush=True)
            if me and fault in ("late_rank", "size_mismatch", "slow_gpu"):
                print("ONSET", time.time_ns(), step, flush=True)
        faulty = me and warm
        x = w
        for _ in range(4):
            x = torch.tanh(x @ w)
        grad.fill_(1.0)
        grad[-1] = 1.0 if rank == 0 and stop_file.exists() else 0.0
        if faulty and fault == "late_rank":
            time.sleep(LATE_MS / 1000)
        if faulty and fault == "slow_gpu":
            torch.cuda._sleep(sleep_cycles)
        if faulty and fault == "size_mismatch":
            dist.all_reduce(torch.ones(2 * grad.numel(), device=dev))  # its peers all-reduce half: nobody serves it
        else:
            dist.all_reduce(grad)
        stop = grad[-1].item() > 0.5  # synchronizes: the step ends when the GPU is done
        step += 1
        first_ns = first_ns or time.time_ns()
        times.append(round((time.perf_counter() - t0) * 1e3, 2))
        if len(times) >= TIMES_EVERY or stop:
            print("TIMES", json.dumps(times), flush=True)
            times = []
        if stop:
            break
    print("STEPS", step, flush=True)
    dist.destroy_process_group()
    return 0


def overhead(iters: int) -> int:
    """One overhead job: 1 and 16 MiB all-reduces, the median per size (with or without the plugin: the env says).

    NCCL decides once per process whether a profiler is loaded ("none" marks the load failed for good, a
    loaded plugin stays while any communicator holds it), so baseline and plugin are separate jobs."""
    import torch
    import torch.distributed as dist

    rank, _, dev = gpu_common.join_job()
    out: dict[str, float] = {}
    for mib in (1, 16):
        x = torch.ones(mib << 18, device=dev)
        out[f"{mib}MiB"] = statistics.median(gpu_common.time_calls(lambda: dist.all_reduce(x), iters))
    gpu_common.report({"rank": rank, "nccl": gpu_common.nccl_version(), "medians_s": out})
    dist.destroy_process_group()
    return 0


def neighbour() -> int:
    """Another tenant of the GPU, on and off until killed; prints each phase's start."""
    import torch

    torch.cuda.set_device(0)
    a = torch.randn(4096, 4096, device="cuda")
    while True:
        print("NEIGHBOUR on", time.time_ns(), flush=True)
        end = time.monotonic() + NEIGHBOUR_ON_S
        while time.monotonic() < end:
            a = torch.tanh(a @ a)
            torch.cuda.synchronize()
        print("NEIGHBOUR off", time.time_ns(), flush=True)
        time.sleep(NEIGHBOUR_OFF_S)


def main(argv: list[str]) -> int:
    role = argv[0]
    if role == "train":
        return train(os.environ["DRILL_FAULT"], int(os.environ["DRILL_CULPRIT"]), Path(os.environ["DRILL_STOP_FILE"]))
    if role == "overhead":
        return overhead(int(argv[1]))
    if role == "neighbour":
        return neighbour()
    raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
