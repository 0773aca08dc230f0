"""The real-NCCL job that gpu_check.py and gpu_drill.py both run: four ranks on one GPU as four hosts.

One GPU holds four ranks, and each rank claims a host of its own (NCCL_HOSTID), so NCCL connects them through
its network transport (sockets over loopback) and its proxy thread emits the ProxyOp/ProxyStep events the
plugin counts. This module holds that setup (rank_env), the launching, bounding and reaping of the four rank
processes, the RESULT line through which a rank reports back, and the pieces each torch worker repeats
(joining the process group, timing a collective). docs/gpu-check.md describes both scripts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))



def free_port() -> int:
    """A free TCP port on loopback: the evaluation harness's one port picker, imported when first needed so
    that the ranks and a plan made before the drill's dependencies are installed never import the package."""
    from mycroft_otel.evaluate.harness import free_port as pick

    return pick()

NRANKS = 4
#: What makes four ranks on one GPU talk like four hosts: the socket transport over loopback, and NCCL 2.30+'s
#: consent to several ranks per GPU (older NCCL ignores it). NCCL_HOSTID comes on top, one per rank (host_id).
FOUR_HOSTS_ENV = {"NCCL_NET": "Socket", "NCCL_SOCKET_IFNAME": "lo", "NCCL_MULTI_RANK_GPU_ENABLE": "1"}
RESULT = "RESULT "  # the stdout prefix of a rank's one JSON report


def host_id(rank: int | str) -> str:
    """The NCCL_HOSTID of a rank: distinct per rank, so NCCL neither refuses a "duplicate GPU" nor uses P2P/SHM
    (a str rank: the pattern, for the record of the settings)."""
    return f"mycroft-gpucheck-{rank}"


def rank_env(rank: int, port: int, plugin: str | None, ring_dir: Path, log_dir: Path, tag: str) -> dict[str, str]:
    """The environment of one rank: torch.distributed's rendezvous, the four-hosts setup, NCCL's INFO log per
    rank in log_dir, and the plugin writing to ring_dir (plugin None: NCCL_PROFILER_PLUGIN=none, the baseline)."""
    env = dict(os.environ)
    env.update({
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(NRANKS), "RANK": str(rank),
        "LOCAL_RANK": str(rank), "CUDA_VISIBLE_DEVICES": env.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0],
        "NCCL_HOSTID": host_id(rank), **FOUR_HOSTS_ENV,
        "NCCL_DEBUG": env.get("NCCL_DEBUG", "INFO"), "NCCL_DEBUG_SUBSYS": env.get("NCCL_DEBUG_SUBSYS", "INIT,ENV"),
        "NCCL_DEBUG_FILE": str(log_dir / f"nccl-{tag}-r{rank}.%h.%p.log"),
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "MYCROFT_JOB_ID": "gpu-check",
    })
    if plugin:
        env.update({"NCCL_PROFILER_PLUGIN": plugin, "MYCROFT_RING_DIR": str(ring_dir),
                    "MYCROFT_RING_RECORDS": "8192"})
    else:
        env["NCCL_PROFILER_PLUGIN"] = "none"
    return env


def default_out(script: str) -> str:
    """Where a script writes its results: $OUT (on a lent GPU machine, the folder that travels back), else
    runs/<script>-<time> in the checkout."""
    return os.environ.get("OUT") or str(ROOT / "runs" / f"{script}-{int(time.time())}")


def plugin_or_default(given: str | None) -> str:
    """The plugin .so to load: the one given (--plugin), else the installed one (mycroft-otel plugin-path)."""
    from mycroft_otel.paths import plugin_path

    return given or str(plugin_path())


def cuda_missing(prog: str) -> str | None:
    """Why the real job cannot run on this machine (PyTorch or a CUDA device missing), None when it can."""
    try:
        import torch
    except ImportError:
        return f"{prog}: PyTorch is not installed (pip install torch); use --dry-run without a GPU"
    if not torch.cuda.is_available():
        return f"{prog}: no CUDA device visible; use --dry-run"
    return None


def nccl_version() -> str:
    """torch's NCCL as "2.28.9"; "" when torch or its NCCL is missing."""
    try:
        import torch

        return ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:  # noqa: BLE001 - torch absent or built without NCCL
        return ""


# ------------------------------------------------------------------------------------------------
# the rank processes
# ------------------------------------------------------------------------------------------------
@dataclass
class Rank:
    proc: subprocess.Popen
    log: IO[str]
    log_path: Path


def launch(cmd: list[str], envs: list[dict[str, str]], logs: list[Path]) -> list[Rank]:
    """Starts one process per environment, its stdout and stderr into its log."""
    ranks = []
    for env, path in zip(envs, logs):
        fh = open(path, "w")
        # a session of its own: one killpg ends the rank with anything it started
        ranks.append(Rank(subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                           start_new_session=True), fh, path))
    return ranks


def end(ranks: list[Rank]) -> None:
    """Kills the ranks still running (a hung job never ends on its own), reaps them and closes their logs."""
    for rank in ranks:
        if rank.proc.poll() is None:
            try:
                os.killpg(rank.proc.pid, signal.SIGCONT)  # the drill's stopped rank too
                os.killpg(rank.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        rank.proc.wait()
        rank.log.close()


def wait(ranks: list[Rank], deadline: float) -> list[tuple[int, int | str]]:
    """Waits for the ranks until deadline (time.monotonic()), then ends the rest; (rank, exit status or
    "timeout") of each rank that did not exit 0."""
    failed: list[tuple[int, int | str]] = []
    for r, rank in enumerate(ranks):
        try:
            rc: int | str = rank.proc.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            rc = "timeout"
        if rc != 0:
            failed.append((r, rc))
    end(ranks)
    return failed


def wait_exit(ranks: list[Rank], deadline: float) -> None:
    """Waits until every rank has exited or deadline (time.monotonic()) has passed; kills none."""
    while time.monotonic() < deadline and any(rank.proc.poll() is None for rank in ranks):
        time.sleep(0.05)


def report(result: dict[str, Any]) -> None:
    """A worker's one report to the launcher: a line of its stdout, which is the rank's log."""
    print(RESULT + json.dumps(result), flush=True)


def results(ranks: list[Rank]) -> dict[int, dict[str, Any]]:
    """Each rank's report (report()), by rank; a rank that died before reporting is absent."""
    out = {}
    for r, rank in enumerate(ranks):
        for line in rank.log_path.read_text(errors="replace").splitlines():
            if line.startswith(RESULT):
                out[r] = json.loads(line[len(RESULT):])
    return out


# ------------------------------------------------------------------------------------------------
# inside a worker (torch imported there only: the launcher runs without it)
# ------------------------------------------------------------------------------------------------
def join_job() -> tuple[int, int, Any]:
    """(rank, world size, device): this rank's NCCL process group on the one GPU, from rank_env's variables."""
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(0)
    dev = torch.device("cuda", 0)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
    return rank, world, dev


def time_calls(fn: Callable[[], object], iters: int) -> list[float]:
    """Seconds of each of iters calls of fn, each until the GPU is done, after 3 untimed warm-up calls (the
    first also creates the communicator: start-up is no part of a collective's time)."""
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return times
