"""Start the real stack on loopback: gateway collector, trace store, Prometheus and N processors.

    with LocalStack(processors=2) as stack:
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = stack.agent_otlp_grpc
        ...                                   # run agents / a simulated job
        stack.traces.wait_for(trace_id)       # read it back from the trace store
        stack.prometheus_query("mycroft_root_causes_total")

Wiring (the same files that production uses, with free loopback ports from the environment):

    agents ─► otelcol-mycroft (collector_config/gateway.yaml) ─► load_balancing ─► processor×N
                      │    ▲ root-cause receiver ◄── OTEL_EXPORTER_OTLP_ENDPOINT ───────┘
                      └────┴─► trace store: Tempo (tempo.yaml) when a `tempo` binary is found,
                               else Jaeger v2 (jaeger.yaml)
    Prometheus (prometheus.yml, rules from dashboards/alerts) scrapes processors, gateway (its own
    metrics and its Prometheus exporter: agents' metrics, root-cause span counts), store; with
    ``alert_webhook_url`` it sends alerts to Alertmanager (alertmanager.yml), which posts them there.
    With Jaeger, the processors' pages link to its UI (MYCROFT_TRACE_UI_URL); always to the processor's own
    /runbook on loopback (MYCROFT_RUNBOOK_URL's default where --bind names an address).

Binaries come from $MYCROFT_BIN_DIR (default ${XDG_CACHE_HOME:-~/.cache}/mycroft-otel/bin, what
scripts/build_stack.sh fills), then PATH. Each process logs to <run_dir>/logs/<name>.log; a
process that dies or a health endpoint that stays down raises StackError with its log tail.
The processor command is injectable (``processor_command``) so the stack can run with any OTLP
sink in place of ``mycroft-otel processor``.

``python -m mycroft_otel.stack --processors 2`` runs the stack until Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import yaml

from mycroft_otel.cli import command
from mycroft_otel.stack.traces import TraceStoreClient

LOOPBACK = "127.0.0.1"


class StackError(RuntimeError):
    """The stack could not start (missing binary, process exit, health timeout)."""


@dataclass(frozen=True)
class ProcessorPorts:
    """Ports of one analysis processor; ``index`` is its position in the trace-ID ring."""

    index: int
    grpc: int
    http: int
    metrics: int
    bind: str = LOOPBACK

    @property
    def otlp_grpc(self) -> str:
        return f"{self.bind}:{self.grpc}"


ProcessorCommand = Callable[[ProcessorPorts], Sequence[str]]


def default_processor_command(ports: ProcessorPorts) -> list[str]:
    """``mycroft-otel processor`` on the given ports (the product's analysis processor)."""
    return command(  # the package this process runs, never one the working directory shadows
        "processor",
        "--bind", ports.bind,
        "--grpc-port", str(ports.grpc),
        "--http-port", str(ports.http),
        "--metrics-port", str(ports.metrics),
    )  # fmt: skip


def default_bin_dir() -> Path:
    env = os.environ.get("MYCROFT_BIN_DIR")
    if env:
        return Path(env)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "mycroft-otel" / "bin"


def default_config_dir() -> Path:
    """collector_config/ of this checkout (override with MYCROFT_CONFIG_DIR)."""
    env = os.environ.get("MYCROFT_CONFIG_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "collector_config"


def find_binary(name: str, bin_dir: Path | None = None) -> Path | None:
    candidate = (bin_dir or default_bin_dir()) / name
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return candidate
    found = shutil.which(name)
    return Path(found) if found else None


def free_ports(n: int, host: str = LOOPBACK) -> list[int]:
    """n distinct free TCP ports (held open together while choosing, so no duplicates)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def http_ok(url: str, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (loopback)
            return 200 <= resp.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def tcp_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


@dataclass
class _Proc:
    name: str
    popen: subprocess.Popen
    log_path: Path
    ready: Callable[[], bool]

    def log_tail(self, n: int = 40) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-n:])


@dataclass
class LocalStack:
    """The stack as a context manager. All fields are optional."""

    processors: int = 2
    processor_command: ProcessorCommand = default_processor_command
    processor_env: dict[str, str] = field(default_factory=dict)
    #: readiness of one processor; default: its /metrics answers and its OTLP gRPC port accepts
    processor_ready: Callable[[ProcessorPorts], bool] | None = None
    run_dir: Path | None = None
    bin_dir: Path | None = None
    config_dir: Path | None = None
    #: "auto" (Tempo if a tempo binary is found, else Jaeger), "tempo" or "jaeger"
    trace_store: str = "auto"
    with_prometheus: bool = True
    #: extra Prometheus scrape targets for the mycroft-agent job ("127.0.0.1:9465", ...)
    agent_metrics_targets: Sequence[str] = ()
    #: start Alertmanager (collector_config/alertmanager.yml) with its webhook receiver pointed here
    #: (a URL), and Prometheus sending its alerts to it; None: no Alertmanager
    alert_webhook_url: str | None = None
    #: replaces group_wait / group_interval / repeat_interval of every Alertmanager route (tests: seconds
    #: instead of the shipped minutes), e.g. {"group_interval": "2s"}
    alert_timing: dict[str, str] = field(default_factory=dict)
    ready_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        self.bin_dir = Path(self.bin_dir) if self.bin_dir else default_bin_dir()
        self.config_dir = Path(self.config_dir) if self.config_dir else default_config_dir()
        self.run_dir = Path(self.run_dir or tempfile.mkdtemp(prefix="mycroft-stack-"))
        self._procs: list[_Proc] = []
        self.processor_ports: list[ProcessorPorts] = []
        self.ports: dict[str, int] = {}
        self.store_kind: str = ""

    # -- public endpoints -----------------------------------------------------------------
    @property
    def agent_otlp_grpc(self) -> str:
        """Where agents send spans (OTEL_EXPORTER_OTLP_ENDPOINT, gRPC)."""
        return f"http://{LOOPBACK}:{self.ports['gw_otlp_grpc']}"

    @property
    def agent_otlp_http(self) -> str:
        return f"http://{LOOPBACK}:{self.ports['gw_otlp_http']}"

    @property
    def rootcause_otlp_grpc(self) -> str:
        """Where processors send root-cause spans (gateway pipeline to the trace store only)."""
        return f"http://{LOOPBACK}:{self.ports['gw_rca_grpc']}"

    @property
    def trace_store_url(self) -> str:
        """HTTP API of the trace store (Tempo: search/TraceQL; Jaeger: /api/v3)."""
        return f"http://{LOOPBACK}:{self.ports['store_http']}"

    @property
    def trace_store_otlp_grpc(self) -> str:
        return f"http://{LOOPBACK}:{self.ports['store_otlp_grpc']}"

    @property
    def alertmanager_url(self) -> str:
        return f"http://{LOOPBACK}:{self.ports['alertmanager']}"

    @property
    def gateway_metrics_url(self) -> str:
        """The gateway's Prometheus exporter (agents' metrics, root-cause span counts)."""
        return f"http://{LOOPBACK}:{self.ports['gw_prometheus']}/metrics"

    @property
    def prometheus_url(self) -> str:
        return f"http://{LOOPBACK}:{self.ports['prom']}"

    @property
    def traces(self) -> TraceStoreClient:
        return TraceStoreClient(self.store_kind, self.trace_store_url)

    def endpoints(self) -> dict[str, object]:
        out: dict[str, object] = {
            "agent_otlp_grpc": self.agent_otlp_grpc,
            "agent_otlp_http": self.agent_otlp_http,
            "rootcause_otlp_grpc": self.rootcause_otlp_grpc,
            "trace_store": self.store_kind,
            "trace_store_url": self.trace_store_url,
            "processors": [p.__dict__ for p in self.processor_ports],
            "run_dir": str(self.run_dir),
        }
        if self.with_prometheus:
            out["prometheus_url"] = self.prometheus_url
        return out

    def prometheus_query(self, promql: str) -> list[dict]:
        """Instant query; the ``result`` list of Prometheus' answer."""
        url = f"{self.prometheus_url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
        with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 (loopback)
            doc = json.load(resp)
        if doc.get("status") != "success":
            raise StackError(f"prometheus query {promql!r} failed: {doc}")
        return doc["data"]["result"]

    def prometheus_exemplars(self, promql: str, window_s: float = 3600.0) -> list[dict]:
        """Exemplars of the series ``promql`` selects over the last ``window_s`` (/api/v1/query_exemplars)."""
        now = time.time()
        q = urllib.parse.urlencode({"query": promql, "start": now - window_s, "end": now})
        with urllib.request.urlopen(f"{self.prometheus_url}/api/v1/query_exemplars?{q}", timeout=5) as resp:  # noqa: S310
            doc = json.load(resp)
        if doc.get("status") != "success":
            raise StackError(f"prometheus exemplar query {promql!r} failed: {doc}")
        return doc["data"] or []

    # -- lifecycle ------------------------------------------------------------------------
    def __enter__(self) -> "LocalStack":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        binaries = self._resolve_binaries()
        names = ["gw_otlp_grpc", "gw_otlp_http", "gw_rca_grpc", "gw_rca_http", "gw_health", "gw_telemetry",
                 "store_http", "store_grpc", "store_otlp_grpc", "store_otlp_http", "store_health",
                 "store_spanmetrics", "store_telemetry", "store_memberlist", "prom", "gw_prometheus",
                 "alertmanager", "alertmanager_cluster"]  # fmt: skip
        ports = free_ports(len(names) + 3 * self.processors)
        self.ports = dict(zip(names, ports))
        rest = ports[len(names) :]
        self.processor_ports = [
            ProcessorPorts(i, rest[3 * i], rest[3 * i + 1], rest[3 * i + 2]) for i in range(self.processors)
        ]
        try:
            self._start_trace_store(binaries)
            if self.alert_webhook_url:
                self._start_alertmanager(binaries["alertmanager"])
            if self.with_prometheus:
                self._start_prometheus(binaries["prometheus"])
            for pp in self.processor_ports:
                self._start_processor(pp)
            self._start_gateway(binaries["otelcol-mycroft"])
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        (self.run_dir / "endpoints.json").write_text(json.dumps(self.endpoints(), indent=2))

    def stop(self) -> None:
        """Stop in reverse start order (gateway first, so nothing new flows in). Idempotent."""
        for proc in reversed(self._procs):
            _terminate(proc.popen)
        self._procs.clear()

    def kill_processor(self, index: int) -> None:
        """SIGKILL processor ``index`` (a crash: nothing flushed, nothing closed)."""
        proc = self._proc(f"processor-{index}")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.popen.pid, signal.SIGKILL)
        proc.popen.wait(timeout=10)

    def restart_processor(self, index: int) -> None:
        """Start processor ``index`` again on its ports, as its supervisor would after a crash (its log goes on
        in the same file), and wait until it is ready."""
        old = self._proc(f"processor-{index}")
        if old.popen.poll() is None:
            raise StackError(f"processor-{index} is still running (kill_processor first)")
        self._procs.remove(old)
        self._start_processor(self.processor_ports[index])
        self._wait_ready()

    # -- internals ------------------------------------------------------------------------
    def _proc(self, name: str) -> _Proc:
        found = [p for p in self._procs if p.name == name]
        if not found:
            raise StackError(f"no {name} in this stack ({', '.join(p.name for p in self._procs)})")
        return found[0]

    def _resolve_binaries(self) -> dict[str, Path]:
        needed = ["otelcol-mycroft"] + (["prometheus"] if self.with_prometheus else [])
        if self.alert_webhook_url:
            needed.append("alertmanager")
        kind = self.trace_store
        if kind == "auto":
            kind = "tempo" if find_binary("tempo", self.bin_dir) else "jaeger"
        if kind not in ("tempo", "jaeger"):
            raise StackError(f"trace_store must be auto, tempo or jaeger, not {self.trace_store!r}")
        self.store_kind = kind
        needed.append(kind)
        # Debian installs Alertmanager as prometheus-alertmanager
        found = {n: find_binary(n, self.bin_dir) or (find_binary("prometheus-alertmanager", self.bin_dir)
                                                     if n == "alertmanager" else None) for n in needed}
        missing = [n for n, p in found.items() if p is None]
        if missing:
            raise StackError(
                f"missing binaries {missing} (looked in {self.bin_dir} and PATH); "
                "build them with scripts/build_stack.sh"
            )
        return {n: p for n, p in found.items() if p is not None}

    def _spawn(self, name: str, argv: Sequence[str], env: dict[str, str], ready: Callable[[], bool]) -> None:
        log_path = self.run_dir / "logs" / f"{name}.log"
        log = open(log_path, "ab")  # noqa: SIM115 (the child keeps its own descriptor; ours closes below)
        full_env = {**os.environ, **env}
        with open(self.run_dir / "logs" / "commands.txt", "a") as f:
            f.write(f"{name}: {' '.join(map(str, argv))}\n")
        try:
            popen = subprocess.Popen(
                [str(a) for a in argv],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=full_env,
                cwd=self.run_dir,
                start_new_session=True,
            )
        except OSError as exc:
            raise StackError(f"cannot start {name}: {exc}") from exc
        finally:
            log.close()
        self._procs.append(_Proc(name, popen, log_path, ready))

    def _start_trace_store(self, binaries: dict[str, Path]) -> None:
        p = self.ports
        if self.store_kind == "tempo":
            data = self.run_dir / "tempo"
            data.mkdir(exist_ok=True)
            env = {
                "MYCROFT_TEMPO_LISTEN": LOOPBACK,
                "MYCROFT_TEMPO_HTTP_PORT": str(p["store_http"]),
                "MYCROFT_TEMPO_GRPC_PORT": str(p["store_grpc"]),
                "MYCROFT_TEMPO_OTLP_GRPC": str(p["store_otlp_grpc"]),
                "MYCROFT_TEMPO_OTLP_HTTP": str(p["store_otlp_http"]),
                "MYCROFT_TEMPO_MEMBERLIST_PORT": str(p["store_memberlist"]),
                "MYCROFT_TEMPO_DATA": str(data),
                "MYCROFT_PROMETHEUS_URL": f"http://{LOOPBACK}:{p['prom']}",
            }
            argv = [binaries["tempo"], "-target=all", f"-config.file={self.config_dir / 'tempo.yaml'}",
                    "-config.expand-env=true"]  # fmt: skip
            ready_url = f"http://{LOOPBACK}:{p['store_http']}/ready"
        else:
            env = {
                "MYCROFT_TRACES_LISTEN_HOST": LOOPBACK,
                "MYCROFT_TRACES_OTLP_GRPC_PORT": str(p["store_otlp_grpc"]),
                "MYCROFT_TRACES_OTLP_HTTP_PORT": str(p["store_otlp_http"]),
                "MYCROFT_TRACES_QUERY_HTTP_PORT": str(p["store_http"]),
                "MYCROFT_TRACES_QUERY_GRPC_PORT": str(p["store_grpc"]),
                "MYCROFT_TRACES_HEALTH_PORT": str(p["store_health"]),
                "MYCROFT_TRACES_SPANMETRICS_PORT": str(p["store_spanmetrics"]),
                "MYCROFT_TRACES_TELEMETRY_PORT": str(p["store_telemetry"]),
            }
            argv = [binaries["jaeger"], "--config", str(self.config_dir / "jaeger.yaml")]
            ready_url = f"http://{LOOPBACK}:{p['store_health']}/status"
        self._spawn(self.store_kind, argv, env, lambda: http_ok(ready_url))

    def _prometheus_config(self) -> Path:
        """collector_config/prometheus.yml with loopback targets and absolute rule paths."""
        src = self.config_dir / "prometheus.yml"
        cfg = yaml.safe_load(src.read_text())
        p = self.ports
        store_targets = (
            [f"{LOOPBACK}:{p['store_http']}"]
            if self.store_kind == "tempo"
            else [f"{LOOPBACK}:{p['store_telemetry']}"]
        )
        targets = {
            "mycroft-processor": [f"{LOOPBACK}:{pp.metrics}" for pp in self.processor_ports],
            "mycroft-agent": list(self.agent_metrics_targets),
            "otelcol-gateway": [f"{LOOPBACK}:{p['gw_telemetry']}"],
            "otelcol-gateway-metrics": [f"{LOOPBACK}:{p['gw_prometheus']}"],
            "tempo": store_targets,
        }
        jobs = cfg.get("scrape_configs", [])
        for job in jobs:
            if job["job_name"] in targets:
                job["static_configs"] = [{"targets": targets[job["job_name"]]}]
        if self.store_kind == "jaeger":  # Jaeger exposes span metrics for scraping (Tempo remote-writes)
            jobs.append({"job_name": "traces-spanmetrics",
                         "static_configs": [{"targets": [f"{LOOPBACK}:{p['store_spanmetrics']}"]}]})  # fmt: skip
        cfg["scrape_configs"] = jobs
        if self.alert_webhook_url:
            cfg["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [f"{LOOPBACK}:{p['alertmanager']}"]}]}]}
        else:
            cfg.pop("alerting", None)
        cfg["rule_files"] = [str((src.parent / r).resolve()) for r in cfg.get("rule_files", [])]
        out = self.run_dir / "prometheus.yml"
        out.write_text(yaml.safe_dump(cfg, sort_keys=False))
        return out

    def _start_prometheus(self, binary: Path) -> None:
        cfg = self._prometheus_config()
        argv = [
            binary,
            f"--config.file={cfg}",
            f"--storage.tsdb.path={self.run_dir / 'prometheus-data'}",
            f"--web.listen-address={LOOPBACK}:{self.ports['prom']}",
            "--web.enable-remote-write-receiver",
            "--web.enable-lifecycle",
            "--enable-feature=exemplar-storage",  # trace ids of the duration histograms (/api/v1/query_exemplars)
        ]
        url = f"http://{LOOPBACK}:{self.ports['prom']}/-/ready"
        self._spawn("prometheus", argv, {}, lambda: http_ok(url))

    def _alertmanager_config(self) -> Path:
        """collector_config/alertmanager.yml with every webhook receiver pointed at alert_webhook_url."""
        cfg = yaml.safe_load((self.config_dir / "alertmanager.yml").read_text())
        for rcv in cfg.get("receivers", []):
            for hook in rcv.get("webhook_configs", []):
                hook["url"] = self.alert_webhook_url
        routes = [cfg.get("route", {})]
        while routes:
            route = routes.pop()
            route.update({k: v for k, v in self.alert_timing.items() if k in route})
            routes += route.get("routes", [])
        out = self.run_dir / "alertmanager.yml"
        out.write_text(yaml.safe_dump(cfg, sort_keys=False))
        return out

    def _start_alertmanager(self, binary: Path) -> None:
        p = self.ports
        argv = [
            binary,
            f"--config.file={self._alertmanager_config()}",
            f"--storage.path={self.run_dir / 'alertmanager-data'}",
            f"--web.listen-address={LOOPBACK}:{p['alertmanager']}",
            f"--cluster.listen-address={LOOPBACK}:{p['alertmanager_cluster']}",
        ]
        url = f"http://{LOOPBACK}:{p['alertmanager']}/-/ready"
        self._spawn("alertmanager", argv, {}, lambda: http_ok(url))

    def _start_processor(self, pp: ProcessorPorts) -> None:
        # the child imports the same mycroft_otel as we do, installed or not (its cwd is the run dir)
        pkg_root = str(Path(__file__).resolve().parents[2])
        pythonpath = os.pathsep.join(filter(None, [pkg_root, os.environ.get("PYTHONPATH")]))
        env = {
            "PYTHONPATH": pythonpath,
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.rootcause_otlp_grpc,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "OTEL_SERVICE_NAME": "mycroft-processor",
            "OTEL_RESOURCE_ATTRIBUTES": f"service.instance.id=processor-{pp.index}",
            # the pages link to the trace in the stack's own trace UI (Jaeger's /trace/<id>)
            **({"MYCROFT_TRACE_UI_URL": self.trace_store_url} if self.store_kind == "jaeger" else {}),
            **self.processor_env,
        }
        check = self.processor_ready or _default_processor_ready
        self._spawn(f"processor-{pp.index}", self.processor_command(pp), env, lambda: check(pp))

    def _start_gateway(self, binary: Path) -> None:
        p = self.ports
        hosts = ", ".join(pp.otlp_grpc for pp in self.processor_ports)
        env = {
            "MYCROFT_GATEWAY_OTLP_GRPC": f"{LOOPBACK}:{p['gw_otlp_grpc']}",
            "MYCROFT_GATEWAY_OTLP_HTTP": f"{LOOPBACK}:{p['gw_otlp_http']}",
            "MYCROFT_GATEWAY_RCA_GRPC": f"{LOOPBACK}:{p['gw_rca_grpc']}",
            "MYCROFT_GATEWAY_RCA_HTTP": f"{LOOPBACK}:{p['gw_rca_http']}",
            "MYCROFT_GATEWAY_HEALTH": f"{LOOPBACK}:{p['gw_health']}",
            "MYCROFT_GATEWAY_TELEMETRY_HOST": LOOPBACK,
            "MYCROFT_GATEWAY_TELEMETRY_PORT": str(p["gw_telemetry"]),
            "MYCROFT_GATEWAY_PROMETHEUS": f"{LOOPBACK}:{p['gw_prometheus']}",
            "MYCROFT_PROCESSORS": f"[{hosts}]",
            "MYCROFT_TRACES_BACKEND": f"{LOOPBACK}:{p['store_otlp_grpc']}",
            "MYCROFT_GATEWAY_QUEUE_DIR": str(self.run_dir / "gateway-queue"),
        }
        argv = [binary, "--config", str(self.config_dir / "gateway.yaml")]
        url = f"http://{LOOPBACK}:{p['gw_health']}/"
        self._spawn("otelcol-gateway", argv, env, lambda: http_ok(url))

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        pending = list(self._procs)
        while pending:
            for proc in list(pending):
                rc = proc.popen.poll()
                if rc is not None:
                    raise StackError(f"{proc.name} exited with {rc} during start; log {proc.log_path}:\n{proc.log_tail()}")
                if proc.ready():
                    pending.remove(proc)
            if not pending:
                return
            if time.monotonic() > deadline:
                details = "\n\n".join(f"--- {p.name} ({p.log_path}):\n{p.log_tail(20)}" for p in pending)
                raise StackError(f"not ready after {self.ready_timeout_s:.0f}s: {[p.name for p in pending]}\n{details}")
            time.sleep(0.2)


def _default_processor_ready(pp: ProcessorPorts) -> bool:
    return tcp_open(pp.bind, pp.grpc) and http_ok(f"http://{pp.bind}:{pp.metrics}/metrics")


def _terminate(popen: subprocess.Popen, grace_s: float = 10.0) -> None:
    if popen.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(popen.pid, signal.SIGTERM)
    try:
        popen.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, signal.SIGKILL)
        popen.wait(timeout=5)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mycroft_otel.stack", description=__doc__.split("\n")[0])
    ap.add_argument("--processors", type=int, default=2)
    ap.add_argument("--run-dir", type=Path)
    ap.add_argument("--trace-store", choices=["auto", "tempo", "jaeger"], default="auto")
    args = ap.parse_args(argv)
    with LocalStack(processors=args.processors, run_dir=args.run_dir, trace_store=args.trace_store) as stack:
        print(json.dumps(stack.endpoints(), indent=2), flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while all(p.popen.poll() is None for p in stack._procs):
                time.sleep(1)
        for p in stack._procs:
            if p.popen.poll() is not None:
                print(f"{p.name} exited ({p.popen.returncode}); log {p.log_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
