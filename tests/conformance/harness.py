"""Runs one conformance scenario: real processor and agent subprocesses, rank processes driving the plugin.

    rank processes (rankproc.py, ctypes -> plugin) -> rings -> `mycroft-otel agent` --OTLP/gRPC-->
    `mycroft-otel processor` --OTLP/gRPC--> RootCauseSink (grpcio, in the test process)

Knobs used (documented here because they shorten the run, not the logic): MYCROFT_STALL_MS=3000 (the default),
MYCROFT_POLL_MS=100, MYCROFT_INFLIGHT_AFTER_MS=1000, MYCROFT_SNAPSHOT_MS=1000 (defaults),
MYCROFT_IDLE_AFTER_MS=2000 (default), MYCROFT_SAMPLE_RATIO=0.01 (default). Nothing else is changed.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field

import grpc
import numpy as np
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
STALL_MS = 3000


def _val(v):
    w = v.WhichOneof("value")
    if w == "array_value":
        return [_val(x) for x in v.array_value.values]
    return None if w is None else getattr(v, w)


class RootCauseSink(trace_service_pb2_grpc.TraceServiceServicer):
    """Keeps every `mycroft.root_cause` span the processor exports, with the time it arrived."""

    def __init__(self) -> None:
        self.verdicts: list[dict] = []
        self.lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def Export(self, request, context):  # noqa: N802
        now = time.time_ns()
        with self.lock:
            for rs in request.resource_spans:
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        if s.name == "mycroft.root_cause":
                            a = {kv.key: _val(kv.value) for kv in s.attributes}
                            a["_recv_ns"] = now
                            a["_trace_id"] = s.trace_id.hex()
                            self.verdicts.append(a)
        return trace_service_pb2.ExportTraceServiceResponse()

    def for_comms(self, hashes: set[str]) -> list[dict]:
        with self.lock:
            return [v for v in self.verdicts if v.get("mycroft.comm.hash") in hashes]

    def close(self) -> None:
        self.server.stop(0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class Scenario:
    name: str
    fault: dict = field(default_factory=dict)  # kind, rank, at_iter, channel, factor, ...
    expect: dict | None = None                  # category, ranks, channel, peer; None = no verdict
    kind: str = "hang"                          # hang | slowdown | healthy
    nranks: int = 8
    nodes: list = field(default_factory=lambda: [[0, 1, 2, 3], [4, 5, 6, 7]])
    procs: list = field(default_factory=lambda: [[0, 1], [2, 3], [4, 5], [6], [7]])
    nch: int = 4
    pp_nch: int = 2
    version: int = 7
    iters: int = 80
    async_depth: int = 3
    step_numbering: str = "relative"
    gpu_step_us: int = 50
    net_step_us: int = 50
    max_wait_s: float = 25.0       # after onset (hangs: only to measure how late; the bound is asserted)
    seed: int = 1
    pp_every: int = 3              # a Send/Recv group on the "pp" communicator every N iterations (0: none)
    peerwait_once: bool = False    # diagnosis only: NOT what NCCL does (it re-records SendPeerWait per retry)
    # "": the default job above. (tp, dp): a training job of tp x dp ranks, one per process (RANK and LOCAL_RANK
    # set, as torchrun does), tp per host: a TP group per host and a DP ring per local rank across the hosts,
    # an all-reduce on each per step, TP then DP on one stream per GPU (tpdp_job)
    layout: tuple = ()
    proxy_tick_us: int = 300       # a rank's proxy thread's pause between passes while its ops are active


def tpdp_job(sc: Scenario) -> tuple[int, list, list, list]:
    """(nranks, nodes, procs, comms) of a TP x DP job: rank = host * tp + local rank. Every hop, inside a host
    too, runs over a transport with ProxySteps (the conformance harness has one transport); the NVLink hops of a
    real TP group, kernel-only, are the simulator's (sim/engine.py)."""
    tp, dp = sc.layout
    nodes = [list(range(h * tp, (h + 1) * tp)) for h in range(dp)]
    comms = [{"name": "tp", "hash": secrets.token_hex(8), "nch": sc.nch, "members": rs} for rs in nodes]
    comms += [{"name": "dp", "hash": secrets.token_hex(8), "nch": sc.nch, "members": list(range(lr, tp * dp, tp))}
              for lr in range(tp)]
    return tp * dp, nodes, [[r] for r in range(tp * dp)], comms


#: Result.starved looks this far before the onset: the evidence of the first verdict can have gathered there.
EVIDENCE_BEFORE_S = 4.0


@dataclass
class Result:
    scenario: Scenario
    verdicts: list
    onset_ns: int | None
    first_ns: int | None
    logs: dict
    wall_s: float
    comm_hashes: set
    slowdown: float | None = None  # slowdown scenarios: the all-reduces' time with the fault over without
    members: dict = field(default_factory=dict)  # comm hash -> its world ranks, where they are not 0..n-1
    pace: list = field(default_factory=list)  # per rank process: {"ranks", "gaps": [(wall ns, ms), ...]}

    def world(self, v: dict, rank) -> int | None:
        """A rank of verdict ``v``'s communicator as the world rank the scenario's faults and expectations use."""
        m = self.members.get(v.get("mycroft.comm.hash"))
        return rank if m is None or rank is None or not 0 <= rank < len(m) else m[rank]

    def culprit(self, v: dict) -> tuple[list, int | None]:
        """The verdict's culprit ranks and peer, as world ranks."""
        return ([self.world(v, r) for r in v.get("mycroft.rca.culprit.ranks") or []],
                self.world(v, v.get("mycroft.rca.culprit.peer")))

    @property
    def first(self) -> dict | None:
        return self.verdicts[0] if self.verdicts else None

    def latency_s(self) -> float | None:
        if self.first is None or self.onset_ns is None:
            return None
        return (self.first["_recv_ns"] - self.onset_ns) / 1e9

    def _others_gaps(self) -> list[tuple[list, list]]:
        """(ranks, gaps) of the rank processes other than the culprit's, within the time the first verdict's
        evidence can have come from: from EVIDENCE_BEFORE_S before the onset (before the end of a healthy run)
        to the first verdict (to the end when there was none)."""
        culprit = (self.scenario.fault or {}).get("rank")
        others = [p for p in self.pace if culprit not in p["ranks"]]
        end = self.first["_recv_ns"] if self.first else max((g[0] for p in others for g in p["gaps"]), default=0)
        start = (self.onset_ns or end) - EVIDENCE_BEFORE_S * 1e9
        return [(p["ranks"], [ms for t, ms in p["gaps"] if start <= t <= end]) for p in others]

    def starved(self) -> str:
        """How long the host kept rank processes other than the culprit's off the CPU while the first verdict's
        evidence gathered (_others_gaps): the sum and the longest of their proxy threads' gaps (text for the
        report). An emulated GPU and proxy are threads of their rank's process, so a process the host starves
        reads as a slow GPU, proxy or receiver of its own: a second fault beside the injected one."""
        per = sorted(((sum(g), max(g, default=0.0), ranks) for ranks, g in self._others_gaps()), key=lambda x: -x[1])
        if not per:
            return "pace: -"
        return (f"others off CPU {sum(x[0] for x in per):.0f} ms (longest {per[0][1]:.0f} ms, ranks {per[0][2]})")

    def short(self) -> str:
        return "; ".join(f"{v.get('mycroft.rca.category')} ranks={self.culprit(v)[0]} "
                         f"ch={v.get('mycroft.rca.culprit.channel')} peer={self.culprit(v)[1]} "
                         f"seq={v.get('mycroft.coll.seq')}" for v in self.verdicts[:4]) or "no verdict"


def _start(argv, env, log) -> subprocess.Popen:
    return subprocess.Popen(argv, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT, cwd=REPO,
                            start_new_session=True)


def _stop(p: subprocess.Popen) -> None:
    if p.poll() is not None:
        return
    try:
        os.killpg(p.pid, signal.SIGCONT)
    except OSError:
        pass
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=5)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(timeout=5)


def run(sc: Scenario, sink: RootCauseSink, keep: bool = False) -> Result:
    t_start = time.monotonic()
    work = tempfile.mkdtemp(prefix=f"mycroft-conf-{sc.name}-")
    ring_dir = os.path.join(work, "rings")
    os.makedirs(ring_dir, mode=0o700)
    out_dir = os.path.join(work, "out")
    os.makedirs(out_dir)
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MYCROFT_", "NCCL_"))}
    base_env.update(PYTHONUNBUFFERED="1", MYCROFT_STALL_MS=str(STALL_MS), PYTHONPATH=REPO)
    py = [sys.executable, "-m", "mycroft_otel"]
    gport = free_port()
    proc_env = dict(base_env, OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{sink.port}",
                    OTEL_EXPORTER_OTLP_PROTOCOL="grpc", OTEL_SERVICE_NAME="conformance-processor")
    rec = ["--record", os.path.join(work, "otlp.rec")] if keep else []
    processor = _start(py + ["processor", "--grpc-port", str(gport), "--http-port", "-1", "--metrics-port", "-1"] + rec,
                       proc_env, os.path.join(work, "processor.log"))
    deadline = time.monotonic() + 20
    while processor.poll() is None and not port_open(gport) and time.monotonic() < deadline:
        time.sleep(0.1)
    agent_env = dict(base_env, OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{gport}",
                     OTEL_EXPORTER_OTLP_PROTOCOL="grpc", OTEL_SERVICE_NAME="conformance-agent")
    agent = _start(py + ["agent", "--ring-dir", ring_dir, "--state-dir", os.path.join(work, "state")], agent_env,
                   os.path.join(work, "agent.log"))

    if sc.layout:
        nranks, nodes, procs, comms = tpdp_job(sc)
    else:
        nranks, nodes, procs = sc.nranks, sc.nodes, sc.procs
        comms = [{"name": None, "hash": secrets.token_hex(8), "nch": sc.nch},
                 {"name": "pp", "hash": secrets.token_hex(8), "nch": sc.pp_nch}]
    hashes = {c["hash"] for c in comms}
    net_file = os.path.join(work, "net.bin")
    maxch = max(c["nch"] for c in comms)
    np.zeros((len(comms), maxch, nranks, 12), dtype=np.int64).tofile(net_file)
    cfg = {"version": sc.version, "nranks": nranks, "nodes": nodes, "procs": procs, "comms": comms,
           "net_file": net_file, "out_dir": out_dir, "fault": sc.fault, "iters": sc.iters,
           "async_depth": sc.async_depth, "step_numbering": sc.step_numbering, "gpu_step_us": sc.gpu_step_us,
           "net_step_us": sc.net_step_us, "chunk": 1 << 19, "seed": sc.seed, "t0": 0,
           "peerwait_once": sc.peerwait_once, "pp_every": sc.pp_every, "layout": bool(sc.layout),
           "proxy_tick_us": sc.proxy_tick_us}
    node_of = {r: i for i, rs in enumerate(nodes) for r in rs}
    per_node = len(nodes[0])
    ranks = []
    for i, rs in enumerate(procs):
        env = dict(base_env, MYCROFT_RING_DIR=ring_dir, MYCROFT_JOB_ID=f"conf-{sc.name}",
                   NCCL_HOSTID=f"node{node_of[rs[0]]}", LOCAL_RANK=str(rs[0] % per_node))
        if len(rs) == 1:
            env["RANK"] = str(rs[0])  # one rank per process: the launcher's global rank
        ranks.append((i, env))
    cfg["t0"] = time.time() + 1.5 + 0.3 * len(procs)
    cfg_path = os.path.join(work, "job.json")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    rprocs = [_start([sys.executable, os.path.join(HERE, "rankproc.py"), cfg_path, str(i)], env,
                     os.path.join(work, f"rank{i}.log")) for i, env in ranks]

    onset_path = os.path.join(out_dir, "onset.json")
    onset_ns = None
    end_at = None
    while True:
        time.sleep(0.1)
        if onset_ns is None and os.path.exists(onset_path):
            onset_ns = json.load(open(onset_path))["onset_ns"]
            end_at = time.monotonic() + sc.max_wait_s
        finished = all(os.path.exists(os.path.join(out_dir, f"done.{i}")) for i, _ in ranks)
        if sc.kind == "hang" and onset_ns is not None and sink.for_comms(hashes):
            # keep a little longer: a second, different verdict would be reported too
            time.sleep(1.0)
            break
        if end_at is not None and time.monotonic() > end_at:
            break
        if finished and (onset_ns is None or sc.kind != "hang"):
            time.sleep(6.0 if sc.kind != "hang" else 0)  # let the agent and processor drain
            break
        if time.monotonic() - t_start > 120:
            break
    for p in rprocs:
        _stop(p)
    time.sleep(0.5)
    for p in (agent, processor):
        _stop(p)
    logs = {}
    for name in ["processor", "agent"] + [f"rank{i}" for i, _ in ranks]:
        try:
            with open(os.path.join(work, f"{name}.log"), errors="replace") as f:
                logs[name] = f.read()[-3000:]
        except OSError:
            logs[name] = ""
    verdicts = sorted(sink.for_comms(hashes), key=lambda v: v["_recv_ns"])
    slowdown = _slowdown(out_dir, sc, comms) if sc.kind == "slowdown" else None
    pace = []
    for i, _ in ranks:
        try:
            with open(os.path.join(out_dir, f"pace.{i}")) as fh:
                pace.append(json.load(fh))
        except (OSError, ValueError):
            pass  # a killed or stopped rank writes none
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
    else:
        logs["workdir"] = work
    return Result(sc, verdicts, onset_ns, verdicts[0]["_recv_ns"] if verdicts else None, logs,
                  time.monotonic() - t_start, hashes, slowdown, {c["hash"]: c["members"] for c in comms
                                                                 if "members" in c}, pace)


def _slowdown(out_dir: str, sc: Scenario, comms: list) -> float | None:
    """How many times slower the faulty communicator's operations ran: the median launch-to-completion time
    of its all-reduces (a p2p fault: its sends and receives; a layout: the culprit's communicators) of the
    fault's iterations (from the second on; a late rank is late ``n_late`` times) over that of the 16
    iterations before it, all ranks (rankproc.py writes every completed operation to its done file)."""
    at = sc.fault.get("at_iter")
    if at is None:
        return None
    end = at + sc.fault.get("n_late", sc.iters)
    funcs = ("Send", "Recv") if sc.fault.get("kind") == "slow_p2p" else ("AllReduce",)
    culprit, want = sc.fault.get("rank"), sc.fault.get("comm")
    # the culprit's communicators (the one the fault names, if it names one)
    mine = {c["hash"] for c in comms if culprit in c.get("members", [culprit]) and want in (None, c["name"])}
    before, after = [], []
    for name in os.listdir(out_dir):
        if not name.startswith("done."):
            continue
        with open(os.path.join(out_dir, name)) as fh:
            for func, _steps, ms, iteration, comm in json.load(fh):
                if comm not in mine:
                    continue
                if func in funcs and at - 16 <= iteration < at:
                    before.append(ms)
                elif func in funcs and at + 1 <= iteration < end:
                    after.append(ms)
    return float(np.median(after) / np.median(before)) if before and after else None


def _names_culprit(res: Result, v: dict, exp: dict) -> bool:
    ranks = res.culprit(v)[0]
    if "flow" in exp:
        return bool(ranks) and ranks[0] in exp["flow"]
    return bool(ranks) and ranks[0] in exp.get("ranks", ranks[:1])


def check_secondary(res: Result) -> list[str]:
    """Verdicts after the first one: the same incident must not be blamed on anybody else (the contract: one
    verdict per incident; collectives queued behind the faulty one, or other communicators of the same ranks,
    are consequences, not new culprits)."""
    exp = res.scenario.expect
    if exp is None or res.onset_ns is None:
        return []
    after = [v for v in res.verdicts if v["_recv_ns"] >= res.onset_ns]
    wrong = [v for v in after[1:] if not _names_culprit(res, v, exp)]
    if not wrong:
        return []
    return [f"{len(wrong)} later verdict(s) blame someone else: " + "; ".join(
        f"{v.get('mycroft.rca.category')} ranks={res.culprit(v)[0]} "
        f"seq={v.get('mycroft.coll.seq')} comm={v.get('mycroft.comm.hash')}" for v in wrong[:4])]


def check(res: Result) -> list[str]:
    """What is wrong with the first verdict, as sentences (empty = the scenario passes)."""
    sc, exp = res.scenario, res.scenario.expect
    errs = []
    if exp is None:
        if res.verdicts:
            errs.append(f"healthy run produced verdicts: {res.short()}")
        return errs
    if res.onset_ns is None:
        return ["the fault never started (harness problem)"]
    early = [v for v in res.verdicts if v["_recv_ns"] < res.onset_ns]
    if early:
        errs.append(f"{len(early)} verdict(s) before the fault's onset")
    first = next((v for v in res.verdicts if v["_recv_ns"] >= res.onset_ns), None)
    if first is None:
        return errs + [f"no verdict within {sc.max_wait_s:.0f} s of onset"]
    cat = first.get("mycroft.rca.category")
    ranks, peer = res.culprit(first)
    if res.members and ranks and list(first.get("mycroft.rca.culprit.global_ranks") or []) != ranks:
        errs.append(f"global ranks {first.get('mycroft.rca.culprit.global_ranks')} are not the culprit's {ranks}")
    if cat not in ([exp["category"]] if isinstance(exp["category"], str) else exp["category"]):
        errs.append(f"category {cat!r}, expected {exp['category']!r}")
    if "ranks" in exp and (not ranks or ranks[0] not in exp["ranks"]):
        errs.append(f"culprit ranks {ranks}, expected first in {exp['ranks']}")
    if "channel" in exp and first.get("mycroft.rca.culprit.channel") != exp["channel"]:
        errs.append(f"culprit channel {first.get('mycroft.rca.culprit.channel')}, expected {exp['channel']}")
    if "flow" in exp:  # the flow's two ends: culprit rank + peer must be exactly them
        ends = {ranks[0] if ranks else None, peer}
        if ends != set(exp["flow"]):
            errs.append(f"flow ends {sorted(map(str, ends))}, expected {sorted(exp['flow'])}")
    lat = (first["_recv_ns"] - res.onset_ns) / 1e9
    bound = exp.get("latency_s", STALL_MS / 1000 + 3 if sc.kind == "hang" else 15.0)
    if lat > bound:
        errs.append(f"latency {lat:.1f} s > {bound:.1f} s")
    return errs
