#!/usr/bin/env python3
"""Fault drill on real NCCL: inject each fault into a fresh 4-rank job and score the processor's verdict.

On one GPU, four ranks pretend to be four hosts (gpu_common's NCCL_HOSTID / Socket-over-lo setup) and run a
training-like loop (gpu_drill_worker.py) with the plugin, while the agent and the processor run as in production
(eval's components, OTLP/gRPC into a sink here). Every fault starts once the job has run healthy collectives
(the worker's WARM line), never inside NCCL's init on a cold start. One fresh job per row:

| row | injected at the onset | expected verdict |
|---|---|---|
| healthy | nothing | none |
| healthy_bimodal | nothing; a neighbour process flips the whole GPU between two speeds | none |
| sigstop | SIGSTOP to rank 2 | rank_absent, rank 2 |
| sigkill | SIGKILL to rank 1; peers keep their collective in flight (no async error handling) | process_exited, rank 1 |
| late_rank | rank 3's host sleeps 400 ms before every all-reduce | late_rank, rank 3 |
| size_mismatch | rank 2 all-reduces twice the elements (a hang) | coll_mismatch, rank 2 |
| slow_gpu | a 200 ms spinning kernel on rank 1's stream before every all-reduce | slow_gpu, rank 1 |

Each verdict is scored like ``mycroft-otel eval`` (harness.score: culprit, category, seconds from the onset to
the first verdict), each row printed as it is scored. Then the plugin's overhead: 4-rank jobs without and with
the plugin alternated, per NCCL (torch's own; preloaded nvidia-nccl wheels where a machine has them), while the
budget lasts. ``--plan`` prints the steps and their time budget; ``--dry-run`` runs the same rows through the
simulator (CI: tests/evaluate/test_gpu_drill.py). On a GPU machine the drill first installs the carried wheels
and builds in place (gpu_drill_setup.py), then runs itself again with what it installed.

Results in --out (default $OUT, whose files travel back from a device call: at most 8, two folders deep):
drill.json (rows, truth, verdicts, step times, overhead), drill.txt (the table), setup.log, evidence.tar.gz
(every log of every job) and recordings.tar.gz (every OTLP payload each job's processor received: replayed
offline, deterministically, with ``python -m mycroft_otel.processor.replay``, they let a verdict seen on the GPU
be studied and turned into regression data without one), each rewritten after every job so a drill cut short
keeps what it measured.

Exit status: 0 when every row got the right culprit and category and the healthy rows no verdict; 1 otherwise;
2 when PyTorch/CUDA is missing (without --dry-run or --plan); 3 when the setup failed.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import signal
import statistics
import sys
import tarfile
import tempfile
import time
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gpu_common  # noqa: E402  (the four-hosts job: rank_env, launching and reading the ranks)
import gpu_drill_setup as setup  # noqa: E402
import gpu_drill_worker as worker  # noqa: E402
from gpu_common import NRANKS  # noqa: E402

TOPOLOGY = "nodes=4,gpus=1,tp=1,dp=4"  # the simulator's picture of the same job
STALL_MS = 3000
HANG_ONSET_S, SLOW_ONSET_S = 3.0, 4.0   # simulated job: seconds after the start
SIM_SEED = 3  # the simulator's seeded choices (which collective each fault strikes)
#: Real job: bound on reaching WARM (torch import, NCCL init on a cold GPU, WARM_STEPS and WARM_S of steps).
WARM_TIMEOUT_S = 60.0
JOB_START_S = 12.0        # typical: four torch imports and NCCL's init on one GPU, then warm-up
WIND_DOWN_S = 5.0         # the agreed stop, spans in flight, components stopped
#: What keeps a rank's peers alive and in flight after the rank dies or stops (the state the processor diagnoses
#: from). With asynchronous error handling on, torch's watchdog aborts each peer's communicator and tears the
#: process down once NCCL reports the dead socket, so every rank would look exited.
KEEP_PEERS_ALIVE = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0", "TORCH_NCCL_ENABLE_MONITORING": "0",
                    "TORCH_NCCL_PROPAGATE_ERROR": "0", "TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}


@dataclass(frozen=True)
class Fault:
    name: str
    category: str         # expected mycroft.rca.category ("" = no verdict expected)
    culprit: int | None   # global rank
    sim: str | None       # the simulator's --fault spec (None: no simulator counterpart, GPU only)
    kind: str             # "healthy", "hang" or "slow"
    injected: str

    def window_s(self) -> float:
        """Seconds the real job runs after the onset: hangs past the stall threshold, slowdowns for many steps."""
        return STALL_MS / 1000 + 6.0 if self.kind == "hang" else 12.0

    def sim_duration_s(self) -> float:
        # slowdowns: the detector needs a baseline, then several slow steps on a 4-rank ring (6-10 s)
        return HANG_ONSET_S + STALL_MS / 1000 + 5.0 if self.kind == "hang" else 20.0

    def typical_s(self) -> float:
        return 3.0 + JOB_START_S + worker.WARM_S + self.window_s() + WIND_DOWN_S

    def bound_s(self) -> float:
        return 3.0 + WARM_TIMEOUT_S + self.window_s() + WIND_DOWN_S + 10.0


FAULTS = (
    Fault("healthy", "", None, "healthy", "healthy", "nothing"),
    Fault("healthy_bimodal", "", None, None, "healthy",
          f"a neighbour process on the GPU, {worker.NEIGHBOUR_ON_S:g} s busy / {worker.NEIGHBOUR_OFF_S:g} s idle"),
    Fault("sigstop", "rank_absent", 2, f"sigstop:rank=2,at={HANG_ONSET_S:g}", "hang", "SIGSTOP to rank 2"),
    Fault("sigkill", "process_exited", 1, f"process_exited:rank=1,at={HANG_ONSET_S:g}", "hang", "SIGKILL to rank 1"),
    Fault("late_rank", "late_rank", 3, f"late_rank:rank=3,at={SLOW_ONSET_S:g},delay_ms=400", "slow",
          f"rank 3's host sleeps {worker.LATE_MS} ms before every all-reduce"),
    Fault("size_mismatch", "coll_mismatch", 2, f"coll_mismatch:rank=2,at={HANG_ONSET_S:g}", "hang",
          "rank 2 all-reduces twice the elements"),
    Fault("slow_gpu", "slow_gpu", 1, f"slow_gpu:rank=1,at={SLOW_ONSET_S:g},factor=8", "slow",
          f"a {worker.SLOW_GPU_MS} ms spinning kernel on rank 1's stream before every all-reduce"),
)

Log = Callable[[str], None]


# ------------------------------------------------------------------------------------------------
# one real job per row
# ------------------------------------------------------------------------------------------------
def _lines(path: Path, prefix: str) -> list[list[str]]:
    try:
        return [ln.split(" ", 2)[1:] for ln in path.read_text(errors="replace").splitlines() if ln.startswith(prefix + " ")]
    except OSError:
        return []


def _await_line(rank: gpu_common.Rank, prefix: str, deadline: float) -> int | None:
    """The ns stamp of the rank's first PREFIX line, waiting until deadline; None if it died or never wrote one."""
    while time.monotonic() < deadline:
        got = _lines(rank.log_path, prefix)
        if got:
            return int(got[0][0])
        if rank.proc.poll() is not None:
            return None
        time.sleep(0.05)
    return None


def step_times(log_path: Path) -> dict[str, Any]:
    """A rank's step times (TIMES lines), as percentiles; the steps are not time-stamped one by one, so those
    before and after the onset are told apart by the WARM step count."""
    times = [t for x in _lines(log_path, "TIMES") for t in json.loads(" ".join(x))]
    warm = _lines(log_path, "WARM")
    split = int(warm[0][1]) if warm else len(times)

    def pct(xs: list[float]) -> dict[str, float] | None:
        if not xs:
            return None
        s = sorted(xs)
        q = lambda f: s[min(len(s) - 1, int(f * len(s)))]  # noqa: E731
        return {"n": len(s), "p10_ms": q(0.1), "p50_ms": q(0.5), "p90_ms": q(0.9), "max_ms": s[-1]}

    return {"before_onset": pct(times[:split]), "after_onset": pct(times[split:])}


def ring_facts(ring_dir: Path) -> dict[str, Any]:
    from mycroft_otel import native

    abis = set()
    for p in ring_dir.iterdir():
        try:
            abis.add(int(native.open_ring(p).header()["abi_version"]))
        except (ValueError, OSError, KeyError):
            abis.add(-1)
    return {"abi": sorted(abis), "ring_files": len(list(ring_dir.iterdir()))}


def run_gpu_fault(f: Fault, sink, work: Path, plugin: str, nccl_lib: str, log: Log):
    """One fresh 4-rank job with the fault; agent and processor started first (the eval harness's components)."""
    from mycroft_otel.cli import command
    from mycroft_otel.evaluate import harness
    from mycroft_otel.evaluate.scenarios import Scenario

    job = work / "faults" / f.name
    job.mkdir(parents=True)
    ring_dir = Path(tempfile.mkdtemp(prefix=f"mycroft-drill-{f.name}-"))  # tens of MB per rank: not evidence
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MYCROFT_"))}
    base.update({"MYCROFT_STALL_MS": str(STALL_MS), "OTEL_BSP_SCHEDULE_DELAY": "200", "PYTHONUNBUFFERED": "1"})
    grpc, http, metrics = harness.free_port(), harness.free_port(), harness.free_port()
    processor = harness._start("processor", command("processor", "--bind", "127.0.0.1", "--grpc-port", str(grpc),
                                                    "--http-port", str(http), "--metrics-port", str(metrics),
                                                    "--record", str(job / RECORDING)),
                               dict(base, OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{sink.port}",
                                    OTEL_EXPORTER_OTLP_PROTOCOL="grpc", OTEL_SERVICE_NAME="drill-processor"), str(job))
    deadline = time.monotonic() + 15
    while processor.alive() and not harness._port_open(grpc) and time.monotonic() < deadline:
        time.sleep(0.1)
    agent = harness._start("agent", command("agent", "--ring-dir", str(ring_dir)),
                           dict(base, OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{grpc}",
                                OTEL_EXPORTER_OTLP_PROTOCOL="grpc", MYCROFT_RING_DIR=str(ring_dir),
                                OTEL_SERVICE_NAME="drill-agent"), str(job))
    time.sleep(1.0)
    sink.take()
    stop_file = job / "stop"
    port = gpu_common.free_port()
    envs = []
    for r in range(NRANKS):
        env = gpu_common.rank_env(r, port, plugin, ring_dir, job, f.name)
        env.update(KEEP_PEERS_ALIVE)
        env.update({"DRILL_FAULT": f.name, "DRILL_CULPRIT": str(-1 if f.culprit is None else f.culprit),
                    "DRILL_STOP_FILE": str(stop_file), "MYCROFT_JOB_ID": f"drill-{f.name}"})
        if nccl_lib:
            env["LD_PRELOAD"] = nccl_lib
        envs.append(env)
    ranks = gpu_common.launch([sys.executable, str(HERE / "gpu_drill_worker.py"), "train"], envs,
                              [job / f"r{r}.out" for r in range(NRANKS)])
    neighbour = None
    if f.name == "healthy_bimodal":
        neighbour = gpu_common.launch([sys.executable, str(HERE / "gpu_drill_worker.py"), "neighbour"],
                                      [dict(os.environ, PYTHONUNBUFFERED="1")], [job / "neighbour.out"])
    watched = ranks[f.culprit if f.culprit is not None else 0]
    error = ""
    warm_ns = _await_line(watched, "WARM", time.monotonic() + WARM_TIMEOUT_S)
    onset: int | None = None
    if warm_ns is None:
        error = f"the job never warmed up within {WARM_TIMEOUT_S:.0f} s (logs: faults/{f.name}/)"
    elif f.name in ("sigstop", "sigkill"):
        onset = time.time_ns()
        os.kill(watched.proc.pid, signal.SIGSTOP if f.name == "sigstop" else signal.SIGKILL)
        log(f"  {f.name} rank {f.culprit} (pid {watched.proc.pid})")
    elif f.culprit is not None:
        onset = _await_line(watched, "ONSET", time.monotonic() + 5.0)
        error = "" if onset else "the culprit never started its fault"
    else:
        onset = warm_ns
    if onset is not None:
        time.sleep(max(0.0, (onset + f.window_s() * 1e9 - time.time_ns()) / 1e9))
    stop_file.touch()  # rank 0 raises the stop flag; a job that still steps leaves after that all-reduce
    gpu_common.wait_exit(ranks, time.monotonic() + 5.0)
    time.sleep(1.5)  # spans in flight through the agent and the processor batchers
    agent.stop()     # before the hung ranks are killed: their end is no evidence of this row
    gpu_common.end(ranks + (neighbour or []))
    processor.stop()
    facts = ring_facts(ring_dir)
    shutil.rmtree(ring_dir, ignore_errors=True)
    o = harness.Outcome(Scenario(f.name, f.sim or "healthy", TOPOLOGY))
    if f.category:
        o.truth = {"fault": f.name, "category": f.category, "culprit_global_ranks": [f.culprit],
                   "culprit_ranks": [f.culprit], "onset_ns": onset or 0}
    else:
        o.truth = {"fault": "healthy"}
    o.sim_error = error
    o.verdicts = sorted(sink.take(), key=lambda v: v.received_ns)
    o.components = {c.name: c.error or "ok" for c in (processor, agent)}
    nccl = sorted({x[0] for r in ranks for x in _lines(r.log_path, "NCCL")})
    extra = {"nccl": ",".join(nccl), **facts, "step_times_rank0": step_times(ranks[0].log_path),
             "onset_after_warm_s": round((onset - warm_ns) / 1e9, 2) if onset and warm_ns else None}
    if f.culprit is not None:
        extra["step_times_culprit"] = step_times(watched.log_path)
    return o, extra


def run_sim_fault(f: Fault, sink, log: Log):
    from mycroft_otel.evaluate import harness
    from mycroft_otel.evaluate.scenarios import Scenario

    sc = Scenario(f.name, f.sim or "healthy", TOPOLOGY, seed=SIM_SEED, duration_s=f.sim_duration_s())
    return harness.run_scenario(sc, sink, STALL_MS, log=log), {}


def score(f: Fault, o) -> dict:
    from mycroft_otel.evaluate import harness

    row = harness.score(o)
    row["fault"] = f.name
    row["culprit_truth"] = f.culprit
    right = (not row["verdicts"]) if f.category == "" else bool(row["detected"] and row["culprit_ok"]
                                                               and row["category_ok"])
    row["right"] = right and not row["sim_error"]
    return row


def table_line(r: dict) -> list[str]:
    ok = {True: "yes", False: "no", None: "-"}
    broken = [f"{k} {v}"[:80] for k, v in r["components"].items() if v != "ok" and k != "workdir"]
    if r["sim_error"]:
        broken.append(r["sim_error"][:80])
    return [r["fault"], r["expected"] or "(none)", "-" if r["culprit_truth"] is None else str(r["culprit_truth"]),
            (r["top"] or "no verdict") + (f" [{'; '.join(broken)}]" if broken else ""),
            ok[r["culprit_ok"]], ok[r["category_ok"]],
            "" if r["latency_s"] is None else f"{r['latency_s']:.1f}", ok[r["right"]]]


HEAD = ["fault", "expected", "culprit", "verdict", "culprit ok", "category ok", "s to verdict", "right"]


def fault_table(rows: list[dict]) -> str:
    lines = [table_line(r) for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(HEAD, *lines)]
    fmt = lambda v: "  ".join(str(x).ljust(w) for x, w in zip(v, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(HEAD), fmt(["-" * w for w in widths])] + [fmt(v) for v in lines])


# ------------------------------------------------------------------------------------------------
# overhead per NCCL
# ------------------------------------------------------------------------------------------------
#: One release per profiler ABI: 2.27 -> v4, 2.28 -> v5, 2.29 -> v6, 2.31+ -> v7 (nvidia-nccl-cu12/-cu13 on
#: the registry, 2026-12-03: 2.27.7, 2.28.9, 2.29.7, 2.30.7, 2.31.2, 2.32.3; cu13 also 2.32.6). Each wheel is
#: 200-250 MB (libnccl.so.2 alone ~290 MB, its fatbins already compressed), far over a device call's 64 MiB
#: carry: on the lent machine only torch's own NCCL runs unless a wheel is there already (--wheels).
NCCL_VERSIONS = ("2.27.7", "2.28.9", "2.29.7", "2.32.3")
OVERHEAD_JOB_S = 7.0      # typical 4-rank overhead job: four torch imports, NCCL init, 2 x 13 all-reduces


def nccl_libraries(wheels: Path, versions: list[str], cuda_major: str, out: Path) -> list[tuple[str, str]]:
    """(version, libnccl.so.2 extracted from its wheel; "" = no wheel for that version) per version asked for.

    Wheels are read from WHEELS (nvidia_nccl_cu12/cu13-<version>-*.whl; `pip download --no-deps
    nvidia-nccl-cu13==<version> -d WHEELS`); the one matching torch's CUDA major is preferred. Only libnccl.so.2
    is extracted: the ranks preload it in place of torch's."""
    libs: list[tuple[str, str]] = []
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


def overhead_plan(torch_nccl: str, wheel_libs: list[tuple[str, str]]) -> list[tuple[str, str | None]]:
    """The NCCLs the overhead part measures, in order: (label, library to preload; None = torch's own, "" = no
    wheel, reported as skipped). Torch's own NCCL comes first and is always measured: a wheel of the same release
    stands in for it only when there is one, and a release with no wheel is skipped only when torch does not
    carry it either."""
    have = {ver for ver, lib in wheel_libs if lib}
    plan: list[tuple[str, str | None]] = [] if torch_nccl in have else [(f"torch {torch_nccl}", None)]
    return plan + [(ver, lib) for ver, lib in wheel_libs if lib or ver != torch_nccl]


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
    ranks = gpu_common.launch([sys.executable, str(HERE / "gpu_drill_worker.py"), "overhead", str(args.iters)], envs,
                              [log_dir / f"{tag}-r{r}.out" for r in range(NRANKS)])
    gpu_common.wait(ranks, time.monotonic() + args.job_timeout_s)
    return gpu_common.results(ranks)


def _overhead_row(label: str, runs: dict[str, list[dict]], ring_dir: Path) -> dict:
    pairs = len(runs["plugin"])
    ok = [i for i in range(pairs) if len(runs["baseline"][i]) == NRANKS and len(runs["plugin"][i]) == NRANKS]
    versions_seen = {v["nccl"] for job in runs["plugin"] + runs["baseline"] for v in job.values()}
    row: dict[str, Any] = {"nccl": label, "nccl_version": ",".join(sorted(versions_seen)) or "?",
                           **ring_facts(ring_dir), "pairs_run": pairs, "pairs_ok": len(ok), "sizes": {}}
    for mib in (1, 16):
        key = f"{mib}MiB"
        if not ok:
            continue
        # per job: the slowest rank's median (a collective ends when its last rank does)
        b = [max(v["medians_s"][key] for v in runs["baseline"][i].values()) for i in ok]
        p = [max(v["medians_s"][key] for v in runs["plugin"][i].values()) for i in ok]
        diff = [100.0 * (y - x) / x for x, y in zip(b, p)]
        row["sizes"][key] = {
            "baseline_ms": round(1e3 * statistics.median(b), 3), "plugin_ms": round(1e3 * statistics.median(p), 3),
            "baseline_range_ms": [round(1e3 * min(b), 3), round(1e3 * max(b), 3)],
            "plugin_range_ms": [round(1e3 * min(p), 3), round(1e3 * max(p), 3)],
            "overhead_pct_median": round(statistics.median(diff), 2),
            "overhead_pct_range": [round(min(diff), 2), round(max(diff), 2)], "pairs": len(diff)}
    return row


def run_overhead(args, plugin: str, work: Path, deadline: float, log: Log, save) -> list[dict]:
    """Per NCCL: baseline and plugin jobs alternated (B P B P ...), up to --pairs pairs while the budget lasts."""
    import torch

    rows: list[dict] = []
    cuda_major = (torch.version.cuda or "12").split(".")[0]
    torch_nccl = gpu_common.nccl_version()
    versions = [v for v in args.nccl_versions.split(",") if v]
    libs = overhead_plan(torch_nccl, nccl_libraries(Path(args.wheels), versions, cuda_major, work))
    for label, lib in libs:
        if lib == "":
            rows.append({"nccl": label, "skipped": f"no nvidia-nccl wheel for {label} in {args.wheels}", "sizes": {}})
            save(rows)
            continue
        slug = label.replace(" ", "-")  # "torch 2.28.9" names a folder too
        log_dir = work / "overhead" / slug
        log_dir.mkdir(parents=True)
        ring_dir = Path(tempfile.mkdtemp(prefix=f"mycroft-drill-overhead-{slug}-"))
        runs: dict[str, list[dict]] = {"baseline": [], "plugin": []}
        for pair in range(args.pairs):
            if time.monotonic() + 2 * OVERHEAD_JOB_S > deadline:
                break
            for tag in ("baseline", "plugin"):
                runs[tag].append(_overhead_job(args, plugin if tag == "plugin" else None, lib or "", log_dir,
                                               ring_dir, f"{tag}{pair}"))
            rows_now = rows + [_overhead_row(label, runs, ring_dir)]
            save(rows_now)
        row = _overhead_row(label, runs, ring_dir)
        if row["pairs_run"] < args.pairs:
            row["short"] = f"{row['pairs_run']} of {args.pairs} pairs: out of time"
        shutil.rmtree(ring_dir, ignore_errors=True)
        rows.append(row)
        save(rows)
        log(f"  overhead {label}: {json.dumps(row['sizes'])}")
    return rows


def overhead_lines(overhead: list[dict], pairs: int) -> list[str]:
    out = ["overhead (slowest rank's median per job; median and range over the pairs)"]
    for r in overhead:
        if "skipped" in r:
            out.append(f"  NCCL {r['nccl']}: skipped, {r['skipped']}")
            continue
        for size, s in r["sizes"].items():
            out.append(f"  NCCL {r['nccl_version']} ({r['nccl']}, ABI {r['abi']}) {size}: baseline {s['baseline_ms']} ms "
                       f"{s['baseline_range_ms']}, plugin {s['plugin_ms']} ms {s['plugin_range_ms']}, overhead "
                       f"{s['overhead_pct_median']}% [{s['overhead_pct_range'][0]}, {s['overhead_pct_range'][1]}] over "
                       f"{s['pairs']} pairs" + (f" ({r['short']})" if r.get("short") else ""))
        if not r["sizes"]:
            out.append(f"  NCCL {r['nccl']}: no result ({r['pairs_ok']}/{pairs} pairs finished)")
    return out


# ------------------------------------------------------------------------------------------------
# evidence, plan, setup
# ------------------------------------------------------------------------------------------------
LOG_CAP = 2 << 20  # bytes kept of one log (its end) in the evidence archive; files back are capped at 16 MiB
RECORDING = "otlp.rec"  # the processor's --record of one job
#: A recording is replayable only whole: kept whole up to this size (a 4-rank job's 30 s are ~1-3 MB), in an
#: archive of its own, so that recordings over the 16 MiB a call returns never cost the logs.
RECORDING_CAP = 24 << 20


def pack_evidence(work: Path, out: Path) -> None:
    """Every log of every job into out/evidence.tar.gz, every processor recording into out/recordings.tar.gz
    (a device call returns 8 files, two folders deep)."""
    files = [p for p in sorted(work.rglob("*")) if p.is_file() and not p.name.startswith("libnccl")]  # an
    # extracted NCCL library is no evidence
    for name, keep in (("evidence.tar.gz", lambda p: p.name != RECORDING),
                       ("recordings.tar.gz", lambda p: p.name == RECORDING and p.stat().st_size <= RECORDING_CAP)):
        tmp = out / (name + ".part")
        with tarfile.open(tmp, "w:gz") as tar:
            for p in filter(keep, files):
                data = p.read_bytes()
                data = data if p.name == RECORDING else data[-LOG_CAP:]
                info = tarfile.TarInfo(str(p.relative_to(work)))
                info.size, info.mtime = len(data), int(p.stat().st_mtime)
                tar.addfile(info, io.BytesIO(data))
        tmp.replace(out / name)


def plan_steps(faults: list[Fault], args) -> list[setup.Step]:
    rows = [setup.Step(f"row {f.name}", f.injected + (f" -> {f.category}, rank {f.culprit}" if f.category else
                                                     " -> no verdict"), f.bound_s(), f.typical_s()) for f in faults]
    overhead = None if args.skip_overhead else setup.Step(
        "overhead", f"torch's NCCL: {args.pairs} baseline/plugin pairs of 4-rank jobs (1 and 16 MiB all-reduces), "
        "while the budget lasts", float("inf"), 2 * args.pairs * OVERHEAD_JOB_S)
    return setup.plan(rows, overhead, setup=not args.no_setup)


def run_setup(out: Path, log: Log) -> str:
    with open(out / "setup.log", "a") as fh:
        t0 = time.monotonic()
        why = setup.install(fh)
        log(f"install: {why or 'ok'} ({time.monotonic() - t0:.0f} s)")
        if why:
            return why
        t0 = time.monotonic()
        why = setup.build(fh)
        log(f"build: {why or 'ok'} ({time.monotonic() - t0:.0f} s)")
        return why


# ------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=gpu_common.default_out("gpu_drill"))
    ap.add_argument("--dry-run", action="store_true", help="no GPU: the same faults and scoring on the simulator")
    ap.add_argument("--plan", action="store_true", help="print the steps and their time budget, run nothing")
    ap.add_argument("--only", nargs="+", metavar="FAULT", choices=[f.name for f in FAULTS])
    ap.add_argument("--plugin", default=None, help="the plugin .so (default: mycroft-otel plugin-path)")
    ap.add_argument("--nccl-lib", default="", help="a libnccl.so.2 every fault job preloads in place of torch's")
    ap.add_argument("--wheels", default=os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")),
                                                     "mycroft-otel", "wheels"),
                    help="directory of nvidia-nccl-cu12/-cu13 wheels whose libnccl.so.2 the overhead part preloads")
    ap.add_argument("--pairs", type=int, default=10, help="baseline/plugin job pairs per NCCL (>= 10)")
    ap.add_argument("--iters", type=int, default=10, help="timed all-reduces per size and communicator")
    ap.add_argument("--nccl-versions", default=",".join(NCCL_VERSIONS), help="NCCL wheels to measure besides torch's")
    ap.add_argument("--job-timeout-s", type=float, default=30.0, help="bound of one 4-rank overhead job")
    ap.add_argument("--skip-faults", action="store_true", help="only the overhead part")
    ap.add_argument("--skip-overhead", action="store_true")
    ap.add_argument("--budget-s", type=float, default=setup.TOTAL_S, help="wall time the whole drill plans for")
    ap.add_argument("--no-setup", action="store_true", help="skip the install and build steps (already done)")
    args = ap.parse_args(argv)
    if args.pairs < 10:
        ap.error("--pairs must be at least 10 (medians and spread need them)")
    faults = [] if args.skip_faults else [f for f in FAULTS if not args.only or f.name in args.only]
    if args.plan:
        print(setup.format_plan(plan_steps(faults, args), args.budget_s))
        return 0
    t_start = time.monotonic()
    deadline = t_start + args.budget_s - 5.0  # packing the evidence at the end

    def log(msg: str) -> None:
        print(f"[gpu_drill {time.monotonic() - t_start:5.0f}s] {msg}", file=sys.stderr, flush=True)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.dry_run:
        missing = gpu_common.cuda_missing("gpu_drill")
        if missing:
            print(missing, file=sys.stderr)
            return 2
        if not args.no_setup:  # a bare machine: install and build, then run again with what is now there
            print(setup.format_plan(plan_steps(faults, args), args.budget_s), flush=True)
            why = run_setup(out, log)
            if why:
                print(f"gpu_drill: setup failed: {why}", file=sys.stderr)
                return 3
            left = args.budget_s - (time.monotonic() - t_start)
            os.execv(sys.executable, [sys.executable, __file__, *argv, "--no-setup", "--out", str(out),
                                      "--budget-s", f"{left:.0f}"])
    plugin = gpu_common.plugin_or_default(args.plugin)
    work = Path(tempfile.mkdtemp(prefix="mycroft-drill-work-"))
    from mycroft_otel.evaluate.sink import Sink

    doc: dict[str, Any] = {"kind": "mycroft-otel gpu_drill", "dry_run": args.dry_run, "topology": TOPOLOGY,
                           "stall_ms": STALL_MS, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                           "torch_nccl": "" if args.dry_run else gpu_common.nccl_version(), "nccl_lib": args.nccl_lib,
                           "keep_peers_alive": KEEP_PEERS_ALIVE, "faults": [asdict(f) for f in faults],
                           "rows": [], "skipped": [], "overhead": [], "all_right": False}

    def save(overhead_rows: list[dict] | None = None) -> None:  # after every job: a drill cut short keeps its results
        if overhead_rows is not None:
            doc["overhead"] = overhead_rows
        doc["wall_s"] = round(time.monotonic() - t_start, 1)
        (out / "drill.json").write_text(json.dumps(doc, indent=1, default=str))
        (out / "drill.txt").write_text(fault_table(doc["rows"]) + "\n" + "\n".join(
            overhead_lines(doc["overhead"], args.pairs) if doc["overhead"] else []) + "\n")
        if not args.dry_run:
            pack_evidence(work, out)

    print("dry run on the simulator (" + TOPOLOGY + ")" if args.dry_run else "real NCCL, one GPU, 4 ranks as 4 hosts",
          flush=True)
    print("  ".join(HEAD), flush=True)
    sink = Sink()
    sink.start()
    try:
        for f in faults:
            if args.dry_run and f.sim is None:
                doc["skipped"].append({"fault": f.name, "why": "no simulator counterpart: " + f.injected})
                log(f"fault {f.name}: skipped in the dry run (no simulator counterpart)")
                continue
            if not args.dry_run and time.monotonic() + f.bound_s() > deadline:
                doc["skipped"].append({"fault": f.name, "why": "out of time"})
                log(f"fault {f.name}: skipped, out of time")
                save()
                continue
            log(f"fault {f.name} ({'simulator' if args.dry_run else 'real NCCL'})")
            o, extra = run_sim_fault(f, sink, log) if args.dry_run else run_gpu_fault(f, sink, work, plugin,
                                                                                     args.nccl_lib, log)
            row = score(f, o)
            row.update(extra)
            doc["rows"].append(row)
            save()
            print("  ".join(table_line(row)), flush=True)  # each row as it is scored: a timeout keeps them
    finally:
        sink.stop()
    overhead = [] if (args.dry_run or args.skip_overhead) else run_overhead(args, plugin, work, deadline, log, save)
    print()
    print(fault_table(doc["rows"]))
    for s in doc["skipped"]:
        print(f"  {s['fault']}: skipped, {s['why']}")
    if overhead:
        print("\n" + "\n".join(overhead_lines(overhead, args.pairs)))
    elif args.dry_run:
        print("\noverhead: needs a GPU (not measured in --dry-run)")
    right = all(r["right"] for r in doc["rows"]) and not any(s["why"] == "out of time" for s in doc["skipped"])
    doc["all_right"] = right
    save(overhead)
    shutil.rmtree(work, ignore_errors=True)
    print(f"\n{'all verdicts right' if right else 'NOT all verdicts right'}; results in {out}")
    return 0 if right else 1


if __name__ == "__main__":
    sys.exit(main())
