"""Helpers of the end-to-end tests: one simulated job through the real agent into a running LocalStack.

    job = Job(stack, "nic64", topology="nodes=8,gpus=8,tp=8,dp=8", fault="nic_down:rank=19,at=2", seed=7)
    with job:                                  # agent subprocess up, then the simulator (real time)
        verdict = job.wait_for_verdict(60)     # found through the trace store's search API
    job.truth, job.agent_counters              # the simulator's ground truth, the agent's own counters

Every job has its own ring directory, job id and seed (so its own communicator hashes), so many jobs can
share one stack and be told apart by the communicator hash of the verdict.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from mycroft_otel import ids, semconv
from mycroft_otel.evaluate.harness import culprit_matches
from mycroft_otel.evaluate.sink import Verdict
from mycroft_otel.stack import LocalStack
from mycroft_otel.stack.runner import free_ports, http_ok
from mycroft_otel.stack.traces import StoredSpan

REPO = Path(__file__).resolve().parents[2]
PY = [sys.executable, "-m", "mycroft_otel"]


def wait_until(pred, timeout_s: float, what: str, poll_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}; last: {last!r}")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MYCROFT_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def prom_counters(text: str) -> dict[str, float]:
    """Unlabelled samples of a Prometheus text page."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*) ([0-9.eE+-]+|NaN)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 (loopback)
        return resp.read().decode()


@dataclass
class Job:
    """A simulated job (``mycroft-otel sim --realtime``) read by a real ``mycroft-otel agent``."""

    stack: LocalStack
    name: str
    topology: str
    fault: str
    seed: int
    duration_s: float = 30.0
    slow_steps: bool = True
    sim_args: list[str] = field(default_factory=list)
    agent_env: dict[str, str] = field(default_factory=dict)
    truth: dict | None = None
    sim_result: dict | None = None
    agent_counters: dict[str, float] = field(default_factory=dict)
    id: str = ""  # the job id (default e2e-<name>); a restarted job reuses its predecessor's

    def __post_init__(self) -> None:
        self.dir = Path(self.stack.run_dir) / "jobs" / self.name
        self.ring_dir = self.dir / "rings"
        self.ring_dir.mkdir(parents=True, mode=0o700)
        self.metrics_port = free_ports(1)[0]
        self._agent: subprocess.Popen | None = None
        self._sim: subprocess.Popen | None = None

    @property
    def job_id(self) -> str:
        return self.id or f"e2e-{self.name}"

    # -- lifecycle ------------------------------------------------------------------------
    def __enter__(self) -> "Job":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        env = clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=self.stack.agent_otlp_grpc, OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
                        OTEL_SERVICE_NAME="mycroft-agent", MYCROFT_RING_DIR=str(self.ring_dir),
                        **self.agent_env)  # fmt: skip
        self._agent = subprocess.Popen(
            PY + ["agent", "--ring-dir", str(self.ring_dir), "--metrics-port", str(self.metrics_port)],
            env=env, stdout=open(self.dir / "agent.log", "wb"), stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        wait_until(lambda: self._agent.poll() is not None or http_ok(self.metrics_url), 30, "agent /metrics")
        assert self._agent.poll() is None, f"agent exited: {self.log('agent')}"
        argv = PY + ["sim", "--topology", self.topology, "--seed", str(self.seed), "--realtime",
                     "--duration", str(self.duration_s), "--ring-dir", str(self.ring_dir), "--job-id", self.job_id,
                     "--no-progress", *self.sim_args]  # fmt: skip
        if self.slow_steps:
            argv.append("--slow-steps")
        if self.fault and self.fault != "healthy":
            argv += ["--fault", self.fault]
        self._sim_out = open(self.dir / "sim.json", "wb")
        self._sim = subprocess.Popen(argv, env=clean_env(MYCROFT_RING_DIR=str(self.ring_dir)), stdout=self._sim_out,
                                     stderr=open(self.dir / "sim.log", "wb"), stdin=subprocess.DEVNULL,
                                     start_new_session=True)  # fmt: skip

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def log(self, what: str) -> str:
        try:
            return (self.dir / f"{what}.log").read_text(errors="replace")[-3000:]
        except OSError:
            return "(no log)"

    def wait_sim(self, timeout_s: float) -> dict:
        """Wait for the simulator to finish; its JSON (truth in ``faults``)."""
        assert self._sim is not None
        rc = self._sim.wait(timeout=timeout_s)
        self._sim_out.close()
        assert rc == 0, f"sim exited {rc}: {self.log('sim')}"
        return self._read_truth()

    def _read_truth(self) -> dict:
        self.sim_result = json.loads((self.dir / "sim.json").read_text())
        faults = self.sim_result["faults"]
        self.truth = faults[0] if faults else {"fault": "healthy"}
        return self.sim_result

    def read_agent_counters(self) -> dict[str, float]:
        self.agent_counters = {k[len("mycroft_agent_"):]: v for k, v in prom_counters(scrape(self.metrics_url)).items()
                               if k.startswith("mycroft_agent_")}  # fmt: skip
        return self.agent_counters

    def stop(self) -> None:
        """Stop the simulator (a hung job is kept alive until its duration) and then the agent (it flushes on
        SIGTERM). The agent's counters are read just before it stops."""
        if self._sim is not None and self._sim.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._sim.pid, signal.SIGKILL)
            self._sim.wait(timeout=10)
        if self._agent is not None and self._agent.poll() is None:
            with contextlib.suppress(Exception):
                self.read_agent_counters()
            self._agent.send_signal(signal.SIGTERM)
            try:
                self._agent.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._agent.kill()
                self._agent.wait(timeout=5)


# -- verdicts in the trace store ---------------------------------------------------------------

def verdicts_in_store(stack: LocalStack, category: str, comm_hash: str | None = None,
                      lookback_s: float = 1800) -> list[tuple[str, StoredSpan]]:
    """(trace id, root-cause span) of ``category`` found through the store's search API, optionally only those
    about communicator ``comm_hash``."""
    store = stack.traces
    out = []
    for tid in store.find_root_causes(category, lookback_s=lookback_s):
        for sp in store.get_trace(tid):
            if sp.name != semconv.ROOT_CAUSE_SPAN or sp.attributes.get(semconv.RCA_CATEGORY) != category:
                continue
            if comm_hash is None or sp.attributes.get(semconv.COMM_HASH) == comm_hash:
                out.append((tid, sp))
    return out


def all_verdicts_since(stack: LocalStack, since_ns: int) -> list[dict]:
    """Every root-cause span detected since ``since_ns`` (any category; for failure messages)."""
    store = stack.traces
    out = []
    for tid in store.search("mycroft-processor", span_name=semconv.ROOT_CAUSE_SPAN, lookback_s=1800):
        for sp in store.get_trace(tid):
            if sp.name == semconv.ROOT_CAUSE_SPAN and sp.attributes.get(semconv.RCA_DETECTED, 0) >= since_ns:
                a = sp.attributes
                out.append({k.rsplit(".", 1)[-1]: a.get(k) for k in (
                    semconv.RCA_CATEGORY, semconv.RCA_CULPRIT_GLOBAL_RANKS, semconv.COMM_HASH,
                    semconv.RCA_CONFIDENCE, semconv.RCA_EVIDENCE)})
    return out


def is_right(span: StoredSpan, truth: dict) -> bool:
    """The verdict names a true culprit (as eval scores it: global rank, else comm rank, else host)."""
    v = Verdict(received_ns=0, trace_id=span.trace_id, span_id=span.span_id, attrs=span.attributes)
    return culprit_matches(v, truth) and span.attributes.get(semconv.RCA_CATEGORY) == truth.get("category")


def check_trace_links(spans: list[StoredSpan], trace_id: str, require_peers: bool = True) -> list[str]:
    """Problems with the links of a collective's trace (empty list: all intact).

    Every flow link (recv_from / send_to) of a rank's evidence points, in this trace, at
    ``span_id(trace, peer, "op")`` of the peer it names, and that peer has evidence in the trace;
    ``snapshot_of`` points at the rank's own op span id. ``require_peers=False`` for slowdown traces, where
    only the anomalous ranks (and sampled collectives) export a span and a link may point at a span never sent.
    """
    problems = []
    tid_int = int(trace_id, 16)
    ranks = {s.attributes.get(semconv.RANK) for s in spans if s.name != semconv.ROOT_CAUSE_SPAN}
    for s in spans:
        rank = s.attributes.get(semconv.RANK)
        for (ltid, lsid), lattrs in zip(s.links, s.link_attributes or [{}] * len(s.links)):
            if ltid and ltid != trace_id:
                problems.append(f"{s.name} rank {rank}: link to another trace {ltid}")
            role = lattrs.get(semconv.LINK_ROLE)
            if role in (semconv.LINK_RECV_FROM, semconv.LINK_SEND_TO):
                peer = lattrs.get(semconv.LINK_PEER)
                if lsid != format(ids.span_id(tid_int, int(peer), semconv.ROLE_OP), "016x"):
                    problems.append(f"{s.name} rank {rank}: {role} link to {lsid} is not op(peer {peer})")
                if require_peers and peer not in ranks:
                    problems.append(f"{s.name} rank {rank}: {role} peer {peer} has no span in the trace")
            elif role == semconv.LINK_SNAPSHOT_OF and s.name != semconv.ROOT_CAUSE_SPAN:
                if lsid != format(ids.span_id(tid_int, int(rank), semconv.ROLE_OP), "016x"):
                    problems.append(f"{s.name} rank {rank}: snapshot_of link {lsid} is not its own op span")
    return problems


# -- Alertmanager's webhook -----------------------------------------------------------------------

class Webhook:
    """Alertmanager's webhook receiver: keeps every notification (the JSON body of each POST)."""

    def __init__(self) -> None:
        self.notifications: list[dict] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server naming)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                owner.notifications.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}/alerts"

    def alerts(self) -> list[dict]:
        return [a for n in list(self.notifications) for a in n.get("alerts", [])]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
