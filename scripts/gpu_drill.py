#!/usr/bin/env python3
"""Fault drill on real NCCL (issue 15): inject each fault into a fresh 4-rank job and score the verdict.

On one GPU, four ranks pretend to be four hosts (gpu_common's NCCL_HOSTID / Socket-over-lo setup), run a
training-like loop (compute, then an all-reduce of the gradient bucket) with the plugin, while the agent and
the processor run as in production (eval's harness: real subprocesses, OTLP/gRPC into a sink here). Faults,
one fresh job each:

| fault | injected | expected verdict |
|---|---|---|
| healthy | nothing | none |
| sigstop | SIGSTOP to rank 2 at the onset | rank_absent, rank 2 |
| sigkill | SIGKILL to rank 1 at the onset | process_exited, rank 1 |
| late_rank | rank 3 sleeps 400 ms before every all-reduce from the onset | late_rank, rank 3 |
| size_mismatch | rank 2 all-reduces twice the elements at the onset | coll_mismatch, rank 2 |
| slow_gpu | rank 1's GPU kept busy by a concurrent kernel from the onset | slow_gpu, rank 1 |

Each verdict is scored like ``mycroft-otel eval`` (harness.score: culprit, category, seconds from the onset
to the first verdict). Then the overhead: per NCCL (one release per profiler ABI from nvidia-nccl wheels in
--wheels, by default the ABI test's cache, preloaded in place of torch's; and torch's own), 4-rank jobs
without and with the plugin alternated (>= 10 pairs, each job timing 1 and 16 MiB all-reduces), and per size
the medians and ranges of both and of the overhead, with the profiler ABI NCCL picked. ``--dry-run`` runs the same faults through the
simulator (``mycroft-otel sim`` with the matching catalogue faults, real plugin, agent and processor) and the
same scoring; it needs no GPU and is what CI runs (tests/evaluate/test_gpu_drill.py).

Exit status: 0 when every fault got the right culprit and category and the healthy run no verdict; 1
otherwise; 2 when PyTorch/CUDA is missing without --dry-run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_common, also when this file is loaded by path

import gpu_common  # noqa: E402  (the four-hosts job: rank_env, launching and reading the ranks)
from gpu_common import NRANKS  # noqa: E402

from mycroft_otel.evaluate import harness  # noqa: E402
from mycroft_otel.evaluate.scenarios import Scenario  # noqa: E402
from mycroft_otel.evaluate.sink import Sink  # noqa: E402

TOPOLOGY = "nodes=4,gpus=1,tp=1,dp=4"  # the simulator's picture of the same job
STALL_MS = 3000
HANG_ONSET_S, SLOW_ONSET_S = 3.0, 4.0   # simulated job: seconds after the start
GPU_ONSET_S = 8.0                       # real job: after torch import, NCCL init and the warm-up steps
SIM_SEED = 3  # the simulator's seeded choices (which collective each fault strikes)


@dataclass(frozen=True)
class Fault:
    name: str
    category: str        # expected mycroft.rca.category ("" = no verdict expected)
    culprit: int | None  # global rank
    sim: str             # the simulator's --fault spec
    hang: bool

    def sim_duration_s(self) -> float:
        # slowdowns: the detector needs a baseline, then several slow steps on a 4-rank ring (6-10 s)
        return HANG_ONSET_S + STALL_MS / 1000 + 5.0 if self.hang else 20.0


FAULTS = (
    Fault("healthy", "", None, "healthy", False),
    Fault("sigstop", "rank_absent", 2, f"sigstop:rank=2,at={HANG_ONSET_S:g}", True),
    Fault("sigkill", "process_exited", 1, f"process_exited:rank=1,at={HANG_ONSET_S:g}", True),
    Fault("late_rank", "late_rank", 3, f"late_rank:rank=3,at={SLOW_ONSET_S:g},delay_ms=400", False),
    Fault("size_mismatch", "coll_mismatch", 2, f"coll_mismatch:rank=2,at={HANG_ONSET_S:g}", True),
    Fault("slow_gpu", "slow_gpu", 1, f"slow_gpu:rank=1,at={SLOW_ONSET_S:g},factor=8", False),
)


# ------------------------------------------------------------------------------------------------
# worker: one rank of the real job (its own process)
# ------------------------------------------------------------------------------------------------
def train_worker(args: argparse.Namespace) -> int:
    """A training-like loop: a forward/backward's worth of matmuls, then the gradient all-reduce."""
    import threading

    import torch
    import torch.distributed as dist

    fault, culprit = os.environ.get("DRILL_FAULT", "healthy"), int(os.environ.get("DRILL_CULPRIT", "-1"))
    onset = int(os.environ["DRILL_ONSET_NS"])
    end = int(os.environ["DRILL_END_NS"])
    rank, _, dev = gpu_common.join_job()
    w = torch.randn(1024, 1024, device=dev)
    grad = torch.ones(1 << 20, device=dev)  # 4 MiB bucket
    me = rank == culprit
    busy_stop = threading.Event()

    def keep_gpu_busy() -> None:  # slow GPU: a concurrent kernel stream competing for the SMs
        s = torch.cuda.Stream()
        a = torch.randn(4096, 4096, device=dev)
        with torch.cuda.stream(s):
            while not busy_stop.is_set():
                a = a @ a
                a = a / a.norm()
                s.synchronize()

    busy = None
    step = 0
    while time.time_ns() < end:
        after = time.time_ns() >= onset
        if me and after and fault == "slow_gpu" and busy is None:
            busy = threading.Thread(target=keep_gpu_busy, daemon=True)
            busy.start()
        x = w
        for _ in range(4):  # "forward and backward"
            x = torch.tanh(x @ w)
        if me and after and fault == "late_rank":
            time.sleep(0.4)
        n = grad.numel()
        if me and after and fault == "size_mismatch":
            n *= 2
            dist.all_reduce(torch.ones(n, device=dev))  # its peers all-reduce half as much: nobody serves it
        else:
            dist.all_reduce(grad)
        torch.cuda.synchronize()
        step += 1
    busy_stop.set()
    print("STEPS", step, flush=True)
    dist.destroy_process_group()
    return 0


def overhead_worker(args: argparse.Namespace) -> int:
    """One overhead job: 1 and 16 MiB all-reduces, medians per size (with or without the plugin: the env says).

    NCCL decides once per process whether a profiler is loaded ("none" marks the load failed for good, a
    loaded plugin stays while any communicator holds it), so baseline and plugin are separate jobs."""
    import torch
    import torch.distributed as dist

    rank, _, dev = gpu_common.join_job()
    out: dict[str, float] = {}
    for mib in (1, 16):
        x = torch.ones(mib << 18, device=dev)
        out[f"{mib}MiB"] = statistics.median(gpu_common.time_calls(lambda: dist.all_reduce(x), args.iters))
    gpu_common.report({"rank": rank, "nccl": gpu_common.nccl_version(), "medians_s": out})
    dist.destroy_process_group()
    return 0


# ------------------------------------------------------------------------------------------------
# the real job, its injection, and the truth
# ------------------------------------------------------------------------------------------------
def run_gpu_fault(f: Fault, sink: Sink, out: Path, plugin: str, log) -> harness.Outcome:
    """One fresh 4-rank job with the fault; agent and processor started first (harness's components)."""
    work = out / "faults" / f.name
    log_dir = work / "logs"
    log_dir.mkdir(parents=True)
    # the rings (tens of MB per rank) stay out of $OUT, which travels back
    ring_dir = Path(tempfile.mkdtemp(prefix=f"mycroft-drill-{f.name}-"))
    py = [sys.executable, "-m", "mycroft_otel"]
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MYCROFT_"))}
    base.update({"MYCROFT_STALL_MS": str(STALL_MS), "OTEL_BSP_SCHEDULE_DELAY": "200", "PYTHONUNBUFFERED": "1"})
    grpc, http, metrics = harness.free_port(), harness.free_port(), harness.free_port()
    processor = harness._start("processor", py + ["processor", "--bind", "127.0.0.1", "--grpc-port", str(grpc),
                                                  "--http-port", str(http), "--metrics-port", str(metrics)],
                               dict(base, OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{sink.port}",
                                    OTEL_EXPORTER_OTLP_PROTOCOL="grpc", OTEL_SERVICE_NAME="drill-processor"),
                               str(work))
    deadline = time.monotonic() + 15
    while processor.alive() and not harness._port_open(grpc) and time.monotonic() < deadline:
        time.sleep(0.1)
    agent = harness._start("agent", py + ["agent", "--ring-dir", str(ring_dir)],
                           dict(base, OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{grpc}",
                                OTEL_EXPORTER_OTLP_PROTOCOL="grpc", MYCROFT_RING_DIR=str(ring_dir),
                                OTEL_SERVICE_NAME="drill-agent"), str(work))
    time.sleep(1.0)
    sink.take()
    t0 = time.time_ns()
    onset = t0 + int(GPU_ONSET_S * 1e9)
    end = onset + int(((STALL_MS / 1000 + 6.0) if f.hang else 12.0) * 1e9)
    port = gpu_common.free_port()
    envs = []
    for r in range(NRANKS):
        env = gpu_common.rank_env(r, port, plugin, ring_dir, log_dir, f.name)
        env.update({"DRILL_FAULT": f.name, "DRILL_CULPRIT": str(-1 if f.culprit is None else f.culprit),
                    "DRILL_ONSET_NS": str(onset), "DRILL_END_NS": str(end), "MYCROFT_JOB_ID": f"drill-{f.name}"})
        envs.append(env)
    ranks = gpu_common.launch([sys.executable, __file__, "--train-worker"], envs,
                              [log_dir / f"r{r}.out" for r in range(NRANKS)])
    if f.name in ("sigstop", "sigkill"):
        time.sleep(max(0.0, (onset - time.time_ns()) / 1e9))
        os.kill(ranks[f.culprit].proc.pid, signal.SIGSTOP if f.name == "sigstop" else signal.SIGKILL)
        log(f"  {f.name} rank {f.culprit} (pid {ranks[f.culprit].proc.pid})")
    time.sleep(max(0.0, (end - time.time_ns()) / 1e9) + 2.0)
    gpu_common.end(ranks)  # a hung job never ends on its own: that is the point
    time.sleep(1.5)
    for comp in (agent, processor):
        comp.stop()
    shutil.rmtree(ring_dir, ignore_errors=True)
    o = harness.Outcome(Scenario(f.name, f.sim if f.name != "healthy" else "healthy", TOPOLOGY))
    if f.category:
        o.truth = {"fault": f.name, "category": f.category, "culprit_global_ranks": [f.culprit],
                   "culprit_ranks": [f.culprit], "onset_ns": onset}
    else:
        o.truth = {"fault": "healthy"}
    o.verdicts = sorted(sink.take(), key=lambda v: v.received_ns)
    o.components = {c.name: c.error or "ok" for c in (processor, agent)}
    return o


def run_sim_fault(f: Fault, sink: Sink, log) -> harness.Outcome:
    sc = Scenario(f.name, f.sim, TOPOLOGY, seed=SIM_SEED, duration_s=f.sim_duration_s())
    return harness.run_scenario(sc, sink, STALL_MS, log=log)


def score(f: Fault, o: harness.Outcome) -> dict:
    row = harness.score(o)
    row["fault"] = f.name
    row["culprit_truth"] = f.culprit
    row["right"] = (not row["verdicts"]) if f.category == "" else bool(row["detected"] and row["culprit_ok"]
                                                                       and row["category_ok"])
    return row


def fault_table(rows: list[dict]) -> str:
    head = ["fault", "expected", "culprit", "verdict", "culprit ok", "category ok", "s to verdict", "right"]
    ok = {True: "yes", False: "no", None: "-"}
    lines = []
    for r in rows:
        broken = [f"{k} {v}"[:80] for k, v in r["components"].items() if v != "ok" and k != "workdir"]
        lines.append([r["fault"], r["expected"] or "(none)", "-" if r["culprit_truth"] is None else r["culprit_truth"],
                      (r["top"] or "no verdict") + (f" [{'; '.join(broken)}]" if broken else ""),
                      ok[r["culprit_ok"]], ok[r["category_ok"]],
                      "" if r["latency_s"] is None else f"{r['latency_s']:.1f}", ok[r["right"]]])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
    fmt = lambda v: "  ".join(str(x).ljust(w) for x, w in zip(v, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(head), fmt(["-" * w for w in widths])] + [fmt(v) for v in lines])


# ------------------------------------------------------------------------------------------------
# overhead per NCCL
# ------------------------------------------------------------------------------------------------
#: One release per profiler ABI: 2.27 -> v4, 2.28 -> v5, 2.29 -> v6, the newest (2.32) -> v7 (pip index versions
#: nvidia-nccl-cu12, 2026-12-01: 2.27.7, 2.28.9, 2.29.7, 2.30.7, 2.31.2, 2.32.3).
NCCL_VERSIONS = ("2.27.7", "2.28.9", "2.29.7", "2.32.3")


def nccl_libraries(wheels: Path, versions: list[str], cuda_major: str, out: Path) -> list[tuple[str, str | None]]:
    """(label, libnccl.so.2 to preload; None = torch's own, "" = no wheel for that version) per NCCL to measure.

    Wheels are read from WHEELS (nvidia_nccl_cu12/cu13-<version>-*.whl; the ABI test caches them there,
    or `pip download --no-deps nvidia-nccl-cu12==<version> -d WHEELS`); the one matching torch's CUDA major
    is preferred. Only libnccl.so.2 is extracted: the ranks preload it in place of torch's."""
    libs: list[tuple[str, str | None]] = [("torch", None)]
    for ver in versions:
        cands = sorted(wheels.glob(f"nvidia_nccl_cu1*-{ver}-*.whl")) if wheels.is_dir() else []
        cands.sort(key=lambda w: not w.name.startswith(f"nvidia_nccl_cu{cuda_major}"))
        if not cands:
            libs.append((ver, ""))
            continue
        dest = out / "nccl" / ver
        with zipfile.ZipFile(cands[0]) as z:
            member = next((n for n in z.namelist() if n.endswith("lib/libnccl.so.2")), None)
            if member is None:
                libs.append((ver, ""))
                continue
            z.extract(member, dest)
        libs.append((ver, str(dest / member)))
    return libs


def _overhead_job(args, plugin: str | None, lib: str, log_dir: Path, ring_dir: Path, tag: str) -> dict:
    """One 4-rank job; {rank: medians} of the ranks that finished."""
    port = gpu_common.free_port()
    envs = []
    for r in range(NRANKS):
        env = gpu_common.rank_env(r, port, plugin, ring_dir, log_dir, tag)
        env.update({"NCCL_DEBUG": "WARN", "MYCROFT_RING_RECORDS": "512"})
        if lib:
            env["LD_PRELOAD"] = lib
        envs.append(env)
    ranks = gpu_common.launch([sys.executable, __file__, "--overhead-worker", "--iters", str(args.iters)], envs,
                              [log_dir / f"{tag}-r{r}.out" for r in range(NRANKS)])
    gpu_common.wait(ranks, time.monotonic() + args.job_timeout_s)
    return gpu_common.results(ranks)


def run_overhead(args, plugin: str, out: Path, deadline: float, log, save) -> list[dict]:
    """Per NCCL: baseline and plugin jobs alternated (B P B P ...), --pairs pairs."""
    import torch

    rows: list[dict] = []
    cuda_major = (torch.version.cuda or "12").split(".")[0]
    torch_nccl = gpu_common.nccl_version()
    versions = [v for v in args.nccl_versions.split(",") if v]
    libs = nccl_libraries(Path(args.wheels), versions, cuda_major, out)
    # torch's own NCCL is measured too, unless a wheel of the same release already is
    libs = [x for x in libs if x[1] is not None] + ([] if torch_nccl in versions else [("torch", None)])
    for label, lib in libs:
        if lib == "":
            rows.append({"nccl": label, "skipped": f"no nvidia-nccl wheel for {label} in {args.wheels}", "sizes": {}})
            save(rows)
            continue
        need = 2 * args.pairs * args.job_timeout_s / 4  # a job usually takes a quarter of its bound
        if time.monotonic() + need > deadline:
            rows.append({"nccl": label, "skipped": "out of time (the drill is bounded to 9 minutes; "
                                                   "--skip-faults --nccl-versions ... measures it alone)", "sizes": {}})
            save(rows)
            continue
        log_dir = out / "overhead" / label
        log_dir.mkdir(parents=True)
        ring_dir = Path(tempfile.mkdtemp(prefix=f"mycroft-drill-overhead-{label}-"))
        runs: dict[str, list[dict]] = {"baseline": [], "plugin": []}
        for pair in range(args.pairs):
            for tag in ("baseline", "plugin"):
                runs[tag].append(_overhead_job(args, plugin if tag == "plugin" else None, lib or "", log_dir,
                                               ring_dir, f"{tag}{pair}"))
        ok = [i for i in range(args.pairs) if len(runs["baseline"][i]) == NRANKS and len(runs["plugin"][i]) == NRANKS]
        abis = sorted({gpu_check_abi(p) for p in ring_dir.iterdir()})
        contexts = len(list(ring_dir.iterdir()))
        shutil.rmtree(ring_dir, ignore_errors=True)
        versions_seen = {v["nccl"] for job in runs["plugin"] + runs["baseline"] for v in job.values()}
        row = {"nccl": label, "nccl_version": ",".join(sorted(versions_seen)) or "?", "abi": abis,
               "pairs_ok": len(ok), "plugin_contexts": contexts, "sizes": {}}
        for mib in (1, 16):
            key = f"{mib}MiB"
            # per job: the slowest rank's median (a collective ends when its last rank does)
            b = [max(v["medians_s"][key] for v in runs["baseline"][i].values()) for i in ok]
            p_ = [max(v["medians_s"][key] for v in runs["plugin"][i].values()) for i in ok]
            if not ok:
                continue
            diff = [100.0 * (y - x) / x for x, y in zip(b, p_)]
            row["sizes"][key] = {
                "baseline_ms": round(1e3 * statistics.median(b), 3), "plugin_ms": round(1e3 * statistics.median(p_), 3),
                "baseline_range_ms": [round(1e3 * min(b), 3), round(1e3 * max(b), 3)],
                "plugin_range_ms": [round(1e3 * min(p_), 3), round(1e3 * max(p_), 3)],
                "overhead_pct_median": round(statistics.median(diff), 2),
                "overhead_pct_range": [round(min(diff), 2), round(max(diff), 2)], "pairs": len(diff)}
        rows.append(row)
        save(rows)
        log(f"  overhead {label}: {row}")
    return rows


def gpu_check_abi(path: Path) -> int:
    from mycroft_otel import native

    try:
        return int(native.open_ring(path).header()["abi_version"])
    except ValueError:
        return -1


# ------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=gpu_common.default_out("gpu_drill"))
    ap.add_argument("--dry-run", action="store_true", help="no GPU: the same faults and scoring on the simulator")
    ap.add_argument("--only", nargs="+", metavar="FAULT", choices=[f.name for f in FAULTS])
    ap.add_argument("--plugin", default=None, help="the plugin .so (default: mycroft-otel plugin-path)")
    ap.add_argument("--wheels", default=os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")),
                                                     "mycroft-otel", "wheels"),
                    help="directory of nvidia-nccl-cu12/-cu13 wheels whose libnccl.so.2 the overhead part preloads")
    ap.add_argument("--pairs", type=int, default=10, help="baseline/plugin job pairs per NCCL (>= 10)")
    ap.add_argument("--iters", type=int, default=10, help="timed all-reduces per size and communicator")
    ap.add_argument("--nccl-versions", default=",".join(NCCL_VERSIONS), help="NCCL wheels to measure besides torch's")
    ap.add_argument("--job-timeout-s", type=float, default=30.0, help="bound of one 4-rank overhead job")
    ap.add_argument("--skip-faults", action="store_true", help="only the overhead part")
    ap.add_argument("--budget-s", type=float, default=500.0,
                    help="stop starting overhead jobs past this (gpu_drill.sh kills the drill at 540 s)")
    ap.add_argument("--skip-overhead", action="store_true")
    ap.add_argument("--train-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--overhead-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.train_worker:
        return train_worker(args)
    if args.overhead_worker:
        return overhead_worker(args)
    if args.pairs < 10:
        ap.error("--pairs must be at least 10 (medians and spread need them)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plugin = gpu_common.plugin_or_default(args.plugin)
    t_start = time.monotonic()

    def log(msg: str) -> None:
        print(f"[gpu_drill {time.monotonic() - t_start:5.0f}s] {msg}", file=sys.stderr, flush=True)

    missing = None if args.dry_run else gpu_common.cuda_missing("gpu_drill")
    if missing:
        print(missing, file=sys.stderr)
        return 2
    faults = [] if args.skip_faults else [f for f in FAULTS if not args.only or f.name in args.only]
    deadline = t_start + args.budget_s
    doc = {"kind": "mycroft-otel gpu_drill", "dry_run": args.dry_run, "topology": TOPOLOGY, "stall_ms": STALL_MS,
           "faults": [asdict(f) for f in faults], "rows": [], "overhead": [], "all_right": False}

    def save(overhead_rows=None) -> None:  # after every job: a drill cut short still leaves its results
        if overhead_rows is not None:
            doc["overhead"] = overhead_rows
        doc["wall_s"] = round(time.monotonic() - t_start, 1)
        (out / "drill.json").write_text(json.dumps(doc, indent=1, default=str))

    sink = Sink()
    sink.start()
    rows = []
    try:
        for f in faults:
            log(f"fault {f.name} ({'simulator' if args.dry_run else 'real NCCL'})")
            o = run_sim_fault(f, sink, log) if args.dry_run else run_gpu_fault(f, sink, out, plugin, log)
            rows.append(score(f, o))
            doc["rows"] = rows
            save()
    finally:
        sink.stop()
    overhead = [] if (args.dry_run or args.skip_overhead) else run_overhead(args, plugin, out, deadline, log, save)
    table = fault_table(rows)
    print(("dry run on the simulator (" + TOPOLOGY + ")" if args.dry_run else "real NCCL, one GPU, 4 ranks as 4 hosts"))
    print(table)
    if overhead:
        print("\noverhead (slowest rank's median per pair; median and range over pairs)")
        for r in overhead:
            if "skipped" in r:
                print(f"  NCCL {r['nccl']}: skipped, {r['skipped']}")
                continue
            for size, s in r["sizes"].items():
                print(f"  NCCL {r['nccl_version']} ({r['nccl']}, ABI {r['abi']}) {size}: baseline {s['baseline_ms']} ms "
                      f"{s['baseline_range_ms']}, plugin {s['plugin_ms']} ms {s['plugin_range_ms']}, overhead "
                      f"{s['overhead_pct_median']}% [{s['overhead_pct_range'][0]}, {s['overhead_pct_range'][1]}] over "
                      f"{s['pairs']} pairs")
            if not r["sizes"]:
                print(f"  NCCL {r['nccl']}: no result ({r['pairs_ok']}/{args.pairs} pairs finished; logs under {out})")
    elif args.dry_run:
        print("\noverhead: needs a GPU (not measured in --dry-run)")
    right = all(r["right"] for r in rows)
    doc["all_right"] = right
    save(overhead)
    (out / "drill.txt").write_text(table + "\n")
    print(f"\n{'all verdicts right' if right else 'NOT all verdicts right'}; results in {out}")
    return 0 if right else 1


if __name__ == "__main__":
    sys.exit(main())
