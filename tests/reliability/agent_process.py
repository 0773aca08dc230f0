"""The real agent program (``python -m mycroft_otel agent``) as a subprocess, and what a test reads off it from
outside: its /metrics, CPU time, threads, resident memory and log lines."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class AgentProcess:
    """``mycroft-otel agent --ring-dir D --metrics-port P`` exporting per the OTEL_* in ``env``."""

    ring_dir: Path
    state_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    metrics_port: int = field(default_factory=free_port)
    log_level: str = "INFO"
    proc: subprocess.Popen | None = None

    def start(self) -> "AgentProcess":
        env = {k: v for k, v in os.environ.items() if not k.startswith("MYCROFT_")}
        env.update(PYTHONPATH=str(ROOT), MYCROFT_STATE_DIR=str(self.state_dir))
        env.update(self.env)
        self.log_path = self.log_path or self.state_dir.parent / f"{self.state_dir.name}.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mycroft_otel", "agent", "--ring-dir", str(self.ring_dir),
             "--metrics-port", str(self.metrics_port), "--log-level", self.log_level],
            env=env, stdout=self._log, stderr=subprocess.STDOUT)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def metrics(self, timeout_s: float = 5.0) -> dict[str, float]:
        """The agent's counters and gauges by name (``mycroft_agent_<name>[_total]`` without the affixes)."""
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=timeout_s).read()
        out = {}
        for line in text.decode().splitlines():
            m = re.match(r"mycroft_agent_(\w+?)(?:_total)? ([0-9.e+-]+)$", line)
            if m:
                out[m.group(1)] = float(m.group(2))
        return out

    def wait_metric(self, name: str, pred, timeout_s: float = 60.0) -> dict[str, float]:
        deadline = time.monotonic() + timeout_s
        m: dict[str, float] = {}
        while time.monotonic() < deadline:
            assert self.proc is not None and self.proc.poll() is None, self.log()
            try:
                m = self.metrics()
                if pred(m.get(name, 0.0)):
                    return m
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"{name} never satisfied the condition: last {m.get(name)}\n{self.log()[-3000:]}")

    def cpu_s(self) -> float:
        """User + system CPU seconds the agent has used so far."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def status(self, key: str) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
        raise KeyError(key)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def terminate(self, timeout_s: float = 30.0) -> float:
        """SIGTERM; seconds until the process was gone."""
        assert self.proc is not None
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout_s)
        return time.monotonic() - t0

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        if getattr(self, "_log", None):
            self._log.close()


def fill_live_table(ring, *, age_s: float = 30.0) -> None:
    """Every live slot of a FakeRing holds an op in flight that has made no progress for ``age_s``: a ring
    of stalled slots, written column by column (FakeRing.begin is per slot)."""
    rec = ring.make_op(start_ns=time.monotonic_ns() - int(age_s * 1e9), done=2)
    n = len(ring.live)
    live = ring.live
    live["op"] = np.broadcast_to(rec["op"], (n,))
    live["flows"] = np.broadcast_to(rec["flows"], (n,) + rec["flows"].shape)
    live["op"]["op_id"] = np.arange(1000, 1000 + n)
    live["op"]["seq"] = np.arange(n)
    live["generation"] = 2
    live["state"] = 1


def spawn_as(uid: int, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    """``argv`` running as ``uid``, started without fork handlers.

    ``Popen(user=...)`` must fork (the uid change cannot run in a vfork child), and a fork runs gRPC's atfork
    handlers: in a test process whose OTLP sink has started gRPC's event engine, the child restarts its poller, then
    ``close_fds`` closes that poller's epoll descriptor and the child can die before its exec (grpc/grpc#43055). Popen
    reads an empty error pipe as success and hands back the pid of a process that never ran. ``setpriv`` changes the
    uid after a plain spawn instead, and the checks below turn any such loss into a clear failure here.
    """
    p = subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *argv], env=env)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the uid flips when setpriv has run; the command is running from then on
        assert p.poll() is None, f"{argv} as uid {uid} exited at once with {p.returncode}"
        try:
            if os.stat(f"/proc/{p.pid}").st_uid == uid:
                return p
        except FileNotFoundError:
            pass
        time.sleep(0.01)
    p.kill()
    raise AssertionError(f"{argv} never ran as uid {uid}")
