#!/usr/bin/env python3
"""Real-NCCL check of the mycroft-otel profiler plugin on one GPU (issue 2, item 7).

Runs 4 ranks on ONE GPU as 4 "hosts" (distinct NCCL_HOSTID, NCCL_NET=Socket over lo,
NCCL_MULTI_RANK_GPU_ENABLE=1 for NCCL >= 2.30) so the ranks talk through the network transport and
NCCL's proxy thread produces real ProxyOp/ProxyStep events. Each rank runs torch.distributed
all_reduce, all_gather, reduce_scatter and ring send/recv, twice: without the plugin (baseline) and
with NCCL_PROFILER_PLUGIN pointing at ours. Then it reads the shared memory the plugin wrote and
prints which profiler ABI NCCL picked, records and progress counters per rank, and the timing
comparison; it writes a JSON capture (gpu_check.json) for the simulator's golden comparison.

    scripts/gpu_check.sh [--out DIR] [--iters N] [--sizes-mib 1,16] [--timeout-s 120]
    scripts/gpu_check.sh --dry-run     # no CUDA: the plugin driven through the ABI driver instead

Exit status 0 when every rank loaded the plugin and recorded collectives with chunk-level progress.
Budget: < 5 minutes (two runs of 4 ranks, each bounded by --timeout-s).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_common, also when this file is loaded by path

import gpu_common  # noqa: E402  (the four-hosts job: rank_env, launching and reading the ranks)
from gpu_common import NRANKS, ROOT  # noqa: E402

OPS = ("all_reduce", "all_gather", "reduce_scatter", "sendrecv")


# ------------------------------------------------------------------------------------------------
# worker: one rank (runs in its own process)
# ------------------------------------------------------------------------------------------------
def worker(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist

    rank, world, dev = gpu_common.join_job()
    results: dict[str, dict[str, float]] = {}
    nxt, prv = (rank + 1) % world, (rank - 1) % world

    def run(op: str, n: int):
        x = torch.ones(n, dtype=torch.float32, device=dev)
        if op == "all_reduce":
            return lambda: dist.all_reduce(x)
        if op == "all_gather":
            out = torch.empty(n * world, dtype=torch.float32, device=dev)
            return lambda: dist.all_gather_into_tensor(out, x)
        if op == "reduce_scatter":
            big = torch.ones(n * world, dtype=torch.float32, device=dev)
            return lambda: dist.reduce_scatter_tensor(x, big)
        r = torch.empty_like(x)

        def sendrecv():
            reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, x, nxt), dist.P2POp(dist.irecv, r, prv)])
            for q in reqs:
                q.wait()
        return sendrecv

    for mib in args.sizes_mib:
        n = int(mib * (1 << 20)) // 4
        for op in OPS:
            times = gpu_common.time_calls(run(op, n), args.iters)
            results[f"{op}/{mib}MiB"] = {"median_s": statistics.median(times), "min_s": min(times)}
    dist.barrier()
    gpu_common.report({"rank": rank, "results": results, "nccl": gpu_common.nccl_version() or "?",
                       "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)})
    dist.destroy_process_group()
    return 0


# ------------------------------------------------------------------------------------------------
# orchestration
# ------------------------------------------------------------------------------------------------
def run_ranks(args: argparse.Namespace, plugin: str | None, ring_dir: Path, log_dir: Path, tag: str) -> dict:
    """One 4-rank job of worker(), bounded to --timeout-s; which ranks failed and what each reported."""
    port = gpu_common.free_port()
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--iters", str(args.iters),
           "--sizes-mib", ",".join(map(str, args.sizes_mib))]
    t0 = time.monotonic()
    envs = [gpu_common.rank_env(r, port, plugin, ring_dir, log_dir, tag) for r in range(NRANKS)]
    ranks = gpu_common.launch(cmd, envs, [log_dir / f"{tag}-r{r}.out" for r in range(NRANKS)])
    failed = gpu_common.wait(ranks, t0 + args.timeout_s)
    return {"tag": tag, "wall_s": time.monotonic() - t0, "failed": failed, "ranks": gpu_common.results(ranks)}


# ------------------------------------------------------------------------------------------------
# reading what the plugin recorded
# ------------------------------------------------------------------------------------------------
def summarize_rings(ring_dir: Path, max_records: int) -> list[dict]:
    from mycroft_otel import native

    out = []
    for path in native.ring_files(ring_dir):
        try:
            reader = native.open_ring(path)
        except ValueError as exc:
            out.append({"file": path.name, "error": str(exc)})
            continue
        h = native.read_header(reader)
        records, cursor, lost = [], 0, 0
        for recs, cursor, n_lost in native.drain(reader, 0, skip_unpublished=True):
            lost += n_lost
            records.extend(recs)
        live = reader.live()
        by_func: dict[str, int] = {}
        flows_total = {"n_steps": 0, "posted": 0, "ready": 0, "transmitted": 0, "done": 0, "bytes": 0}
        captured = []
        for rec in records:
            op = rec["op"]
            kind = native.op_kind_name(op["kind"])
            name = native.func_name(op["func"]) if kind == "coll" else kind
            by_func[name] = by_func.get(name, 0) + 1
            flows = rec["flows"][: int(op["n_flows"])]
            for k in flows_total:
                flows_total[k] += int(flows[k].sum())
            if len(captured) < max_records:
                captured.append({
                    "kind": kind, "func": native.func_name(op["func"]), "seq": int(op["seq"]),
                    "nccl_seq": int(op["nccl_seq"]), "count": int(op["count"]), "bytes": int(op["bytes"]),
                    "datatype": native.datatype_name(op["datatype"]), "algo": native.algo_name(op["algo"]),
                    "proto": native.proto_name(op["proto"]), "n_channels": int(op["n_channels"]),
                    "peer": int(op["root_or_peer"]), "flags": int(op["flags"]),
                    "duration_ns": int(op["end_ns"] - op["start_ns"]) if op["end_ns"] else None,
                    "launch_ns": int(op["launch_ns"] - op["start_ns"]) if op["launch_ns"] else None,
                    "kernel_ch": [int(op["kernel_ch_started"]), int(op["kernel_ch_stopped"])],
                    "proxy_ops": [int(op["proxy_ops_started"]), int(op["proxy_ops_stopped"])],
                    "flows": [{"channel": int(f["channel"]), "dir": native.dir_name(f["dir"]), "peer": int(f["peer"]),
                               "n_proxy_ops": int(f["n_proxy_ops"]), "n_steps": int(f["n_steps"]),
                               "posted": int(f["posted"]), "ready": int(f["ready"]),
                               "transmitted": int(f["transmitted"]), "done": int(f["done"]),
                               "chunk_size": int(f["chunk_size"]), "bytes": int(f["bytes"]),
                               "gpu_wait_ns": int(f["gpu_wait_ns"]), "net_wait_ns": int(f["net_wait_ns"]),
                               "gpu_busy_ns": int(f["gpu_busy_ns"]), "net_busy_ns": int(f["net_busy_ns"]),
                               "peer_busy_ns": int(f["peer_busy_ns"])}
                              for f in flows],
                })
        out.append({
            "file": path.name, "abi_version": h.abi_version, "rank": h.rank, "nranks": h.nranks, "nnodes": h.nnodes,
            "global_rank": h.global_rank, "host": h.host, "pid": h.pid, "comm_hash": h.comm_hash_hex,
            "comm_name": h.comm_name, "activation_mask": h.activation_mask, "ops_started": h.ops_started,
            "ops_completed": h.ops_completed, "records": len(records), "overwritten": lost, "in_flight": len(live),
            "dropped": {k: getattr(h, k) for k in ("dropped_live_full", "dropped_bad_handle", "dropped_bad_descr",
                                                    "dropped_flows", "pxn_foreign_ops")},
            # which callbacks the bad handles came in, and the late KernelCh stops the plugin kept
            "bad_handle_by_kind": {k: v for k, v in h.bad_handle_by_kind.items() if v},
            "late_kernel_stops": h.late_kernel_stops, "nccl_version": h.nccl_version,
            "by_func": by_func, "flow_totals": flows_total, "captured": captured,
        })
    return out


def nccl_log_facts(log_dir: Path) -> list[str]:
    """NCCL's own lines about the profiler plugin and its version (NCCL_DEBUG=INFO logs of the plugin run)."""
    keys = ("NCCL version", "PROFILER/Plugin", "profiler plugin", "Profiler", "mycroft-otel")
    seen: list[str] = []
    for f in sorted(log_dir.glob("nccl-plugin-r*.log")):
        for line in f.read_text(errors="replace").splitlines():
            if any(k in line for k in keys):
                text = line.split("NCCL INFO", 1)[-1].strip()
                if text not in seen:
                    seen.append(text)
    return seen[:40]


def print_report(rings: list[dict], timing: dict | None) -> None:
    abis = sorted({r.get("abi_version") for r in rings if "abi_version" in r})
    print(f"\nprofiler ABI NCCL picked: {', '.join(f'ncclProfiler_v{a}' for a in abis) or 'none (plugin not loaded)'}")
    print(f"{'file':44} {'grank':>5} {'rank':>4} {'abi':>3} {'records':>7} {'lost':>5} {'live':>4} "
          f"{'steps':>8} {'posted':>8} {'done':>8} {'MiB':>9}  by func")
    for r in rings:
        if "error" in r:
            print(f"{r['file']:44} ERROR {r['error']}")
            continue
        t = r["flow_totals"]
        print(f"{r['file'][-44:]:44} {r['global_rank']:>5} {r['rank']:>4} {r['abi_version']:>3} {r['records']:>7} "
              f"{r['overwritten']:>5} {r['in_flight']:>4} {t['n_steps']:>8} {t['posted']:>8} {t['done']:>8} "
              f"{t['bytes'] / 2**20:>9.1f}  {r['by_func']}")
    if timing:
        print(f"\n{'op/size':24} {'baseline ms':>12} {'plugin ms':>10} {'overhead':>9}")
        for key, row in timing.items():
            print(f"{key:24} {row['baseline_ms']:>12.3f} {row['plugin_ms']:>10.3f} {row['overhead_pct']:>8.1f}%")


def compare(base: dict, plug: dict) -> dict:
    """Per op/size: the slowest rank's median (a collective finishes with its slowest rank)."""
    out = {}
    keys = set()
    for res in list(base["ranks"].values()) + list(plug["ranks"].values()):
        keys |= set(res["results"])
    for key in sorted(keys):
        b = [r["results"][key]["median_s"] for r in base["ranks"].values() if key in r["results"]]
        p = [r["results"][key]["median_s"] for r in plug["ranks"].values() if key in r["results"]]
        if b and p:
            out[key] = {"baseline_ms": max(b) * 1e3, "plugin_ms": max(p) * 1e3,
                        "overhead_pct": (max(p) / max(b) - 1) * 100}
    return out


def verdict(rings: list[dict], expect_ranks: int) -> list[str]:
    problems = []
    good = [r for r in rings if "error" not in r]
    if len({r["global_rank"] for r in good}) < expect_ranks:
        problems.append(f"shm files for {len({r['global_rank'] for r in good})} of {expect_ranks} ranks")
    if any(r["abi_version"] not in (4, 5, 6, 7) for r in good):
        problems.append("unexpected ABI version in a header")
    if not any(r["records"] for r in good):
        problems.append("no completed collective recorded")
    if not any(r["flow_totals"]["done"] for r in good):
        problems.append("no chunk-level progress (ProxyStep) recorded: was the network transport used?")
    if any(r["dropped"]["dropped_bad_handle"] or r["dropped"]["dropped_bad_descr"] for r in good):
        problems.append("the plugin dropped callbacks as bad handles/descriptors (see 'dropped')")
    return problems


# ------------------------------------------------------------------------------------------------
# dry run: no CUDA; the plugin driven through the ABI driver, same analysis and capture
# ------------------------------------------------------------------------------------------------
def dry_run_capture(plugin: str, ring_dir: Path) -> None:
    sys.path.insert(0, str(ROOT / "tests" / "native"))
    from events import Seq, p2p, ring_allreduce  # the documented NCCL call sequences

    from mycroft_otel.native import Driver

    d = Driver(plugin)
    q = Seq()
    for rank in range(NRANKS):
        env = {"MYCROFT_RING_DIR": str(ring_dir), "RANK": str(rank), "LOCAL_RANK": str(rank),
               "NCCL_HOSTID": gpu_common.host_id(rank), "MYCROFT_JOB_ID": "gpu-check-dry"}
        ctx = d.init(None, 0x6D7963726F667421, NRANKS, NRANKS, rank, env=env)
        for s in range(8):
            ring_allreduce(q, ctx, rank, NRANKS, s, n_channels=2, steps=2 * (NRANKS - 1))
        p2p(q, ctx, rank, (rank + 1) % NRANKS, send=True)
        p2p(q, ctx, rank, (rank - 1) % NRANKS, send=False)
    d.replay(q.array())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=gpu_common.default_out("gpu_check"),
                    help="output directory (default: $OUT, else runs/gpu_check-<time>)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--sizes-mib", type=lambda s: [float(x) for x in s.split(",")], default=[1.0, 16.0])
    ap.add_argument("--timeout-s", type=float, default=120, help="bound on each 4-rank run")
    ap.add_argument("--max-records", type=int, default=64, help="records per rank kept in the JSON capture")
    ap.add_argument("--plugin", default=None, help="plugin .so (default: mycroft-otel plugin-path)")
    ap.add_argument("--dry-run", action="store_true", help="no CUDA: drive the plugin through the ABI driver")
    ap.add_argument("--skip-baseline", action="store_true", help="only the run with the plugin")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)

    plugin = gpu_common.plugin_or_default(args.plugin)
    out = Path(args.out)
    ring_dir, log_dir = out / "rings", out / "logs"
    if ring_dir.exists():
        shutil.rmtree(ring_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    capture: dict = {"kind": "mycroft-otel gpu_check", "version": 1, "dry_run": args.dry_run, "plugin": plugin,
                     "host": platform.node(), "nranks": NRANKS, "time_ns": time.time_ns(),
                     "settings": {"iters": args.iters, "sizes_mib": args.sizes_mib,
                                  "env": {**gpu_common.FOUR_HOSTS_ENV, "NCCL_HOSTID": gpu_common.host_id("<rank>")}}}
    timing = None
    t0 = time.monotonic()
    if args.dry_run:
        dry_run_capture(plugin, ring_dir)
    else:
        missing = gpu_common.cuda_missing("gpu_check")
        if missing:
            print(missing, file=sys.stderr)
            return 2
        import torch

        capture["torch"] = torch.__version__
        capture["nccl"] = gpu_common.nccl_version()
        capture["gpu"] = torch.cuda.get_device_name(0)
        runs = []
        if not args.skip_baseline:
            print(f"[gpu_check] baseline run (no profiler plugin), NCCL {capture['nccl']}, {capture['gpu']}")
            runs.append(run_ranks(args, None, ring_dir, log_dir, "baseline"))
        print(f"[gpu_check] run with NCCL_PROFILER_PLUGIN={plugin}")
        runs.append(run_ranks(args, plugin, ring_dir, log_dir, "plugin"))
        capture["runs"] = runs
        capture["nccl_log"] = nccl_log_facts(log_dir)
        print("\n".join(["[gpu_check] NCCL says:"] + ["  " + x for x in capture["nccl_log"]]))
        for r in runs:
            if r["failed"]:
                print(f"[gpu_check] {r['tag']} run: ranks failed {r['failed']} (logs in {log_dir})", file=sys.stderr)
        if len(runs) == 2 and runs[0]["ranks"] and runs[1]["ranks"]:
            timing = compare(runs[0], runs[1])
            capture["timing"] = timing
    rings = summarize_rings(ring_dir, args.max_records)
    capture["rings"] = rings
    print_report(rings, timing)
    problems = verdict(rings, NRANKS)
    capture["problems"] = problems
    capture["wall_s"] = time.monotonic() - t0
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(capture, indent=1, default=int))
    print(f"\n[gpu_check] capture: {out / 'gpu_check.json'}  ({capture['wall_s']:.0f}s)")
    if problems:
        print("[gpu_check] FAILED: " + "; ".join(problems), file=sys.stderr)
        return 1
    print("[gpu_check] OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
