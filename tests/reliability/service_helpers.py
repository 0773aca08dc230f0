"""Helpers for the processor / secrets / gateway reliability tests: certificates, a receiver, hostile clients."""

from __future__ import annotations

import http.client
import os
import re
import socket
import ssl
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator, TypeVar

import trustme

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "processor"))  # synth: OTLP traces in the agent's span schema

from processor_support import free_port  # noqa: E402
from synth import Ring  # noqa: E402

TRACES = "/v1/traces"


@dataclass
class Certs:
    """A throwaway CA and a server certificate for localhost / 127.0.0.1, as PEM files."""

    ca: str
    cert: str
    key: str

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=self.ca)


def make_certs(tmp_path) -> Certs:
    ca = trustme.CA()
    server = ca.issue_cert("localhost", "127.0.0.1")
    paths = Certs(str(tmp_path / "ca.pem"), str(tmp_path / "cert.pem"), str(tmp_path / "key.pem"))
    ca.cert_pem.write_to_path(paths.ca)
    server.cert_chain_pems[0].write_to_path(paths.cert)
    server.private_key_pem.write_to_path(paths.key)
    return paths


def hung_payload(seq: int = 1, n: int = 8) -> bytes:
    """One collective where rank 3's GPU stalls: a payload that must give a verdict."""
    ring = Ring(n, seq=seq, comm=0x6A00 + seq, global_base=100 * seq)
    ring.gpu_stall(3)
    return ring.request().SerializeToString()


def post(port: int, body: bytes, headers: dict | None = None, tls: ssl.SSLContext | None = None,
         host: str = "127.0.0.1", timeout_s: float = 30.0) -> tuple[int, bytes]:
    """One OTLP/HTTP POST on a fresh connection; (status, body)."""
    if tls is not None:
        c = http.client.HTTPSConnection(host, port, timeout=timeout_s, context=tls)
    else:
        c = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        h = {"Content-Type": "application/x-protobuf"}
        h.update(headers or {})
        c.request("POST", TRACES, body=body, headers=h)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


_D = TypeVar("_D", bound="_Dripping")


@dataclass
class _Dripping:
    """Connections that a thread feeds a byte a second until stop(): clients slow enough to pin a server's
    workers. A subclass opens them (_open, each with its first bytes sent) and says what one drip sends (_drip)."""

    port: int
    socks: list[socket.socket] = field(default_factory=list, kw_only=True)
    _stop: threading.Event = field(default_factory=threading.Event, kw_only=True)
    _thread: threading.Thread | None = field(default=None, kw_only=True)

    def start(self: _D) -> _D:
        for s in self._open():
            s.setblocking(False)  # the drip thread checks each socket for an answer, it never waits on one
            self.socks.append(s)
        self._thread = threading.Thread(target=self._drip, daemon=True)
        self._thread.start()
        return self

    def _open(self) -> Iterator[socket.socket]:
        raise NotImplementedError

    def _drip(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        for s in self.socks:
            s.close()


@dataclass
class Drippers(_Dripping):
    """Clients that send one byte per second, a slowloris: half still in a header's value, half in a declared
    body."""

    n: int
    closed_by_server: int = 0

    def _open(self) -> Iterator[socket.socket]:
        for i in range(self.n):
            s = socket.create_connection(("127.0.0.1", self.port))
            if i % 2:  # complete headers, a body it never finishes
                s.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
                          b"Content-Length: 100000\r\n\r\n")
            else:  # valid headers so far, one of them never ending
                s.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nX-Padding: ")
            yield s

    def _drip(self) -> None:
        live = list(self.socks)
        while live and not self._stop.wait(1.0):
            for s in list(live):
                try:
                    if s.recv(4096) == b"":
                        raise ConnectionResetError
                    live.remove(s)  # answered: the server refused it
                    self.closed_by_server += 1
                    continue
                except BlockingIOError:
                    pass
                except OSError:
                    live.remove(s)
                    self.closed_by_server += 1
                    continue
                try:
                    s.send(b"a")
                except OSError:
                    live.remove(s)
                    self.closed_by_server += 1


def _h2_frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


def _hpack_literal(name: bytes, value: bytes) -> bytes:  # literal header field, never indexed, no Huffman
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


@dataclass
class GrpcDrippers(_Dripping):
    """HTTP/2 connections whose gRPC Export calls announce a 100 kB message and then send it a byte a second
    (raw frames: a real gRPC client would not let us drip)."""

    connections: int
    streams: int

    def _open(self) -> Iterator[socket.socket]:
        headers = b"".join(_hpack_literal(k, v) for k, v in (
            (b":method", b"POST"), (b":scheme", b"http"),
            (b":path", b"/opentelemetry.proto.collector.trace.v1.TraceService/Export"),
            (b":authority", f"127.0.0.1:{self.port}".encode()), (b"content-type", b"application/grpc"),
            (b"te", b"trailers")))
        for _ in range(self.connections):
            s = socket.create_connection(("127.0.0.1", self.port))
            s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _h2_frame(4, 0, 0))  # preface, empty SETTINGS
            for i in range(self.streams):
                sid = 2 * i + 1
                s.sendall(_h2_frame(1, 4, sid, headers)  # HEADERS, END_HEADERS
                          + _h2_frame(0, 0, sid, b"\x00" + (100_000).to_bytes(4, "big")))  # gRPC message prefix
            yield s

    def _drip(self) -> None:
        while not self._stop.wait(1.0):
            for s in self.socks:
                try:
                    while s.recv(65536):  # (the server's frames: settings, pings, trailers)
                        pass
                except OSError:
                    pass
                for i in range(self.streams):
                    try:
                        s.send(_h2_frame(0, 0, 2 * i + 1, b"x"))
                    except OSError:
                        pass


@dataclass
class ProcessorProcess:
    """``mycroft-otel processor`` as its own process, as an operator runs it: the attacks go through its real
    sockets, and its memory and CPU are read from /proc."""

    proc: subprocess.Popen
    grpc_port: int
    http_port: int
    metrics_port: int
    log_path: str

    def _proc_file(self, name: str) -> str:
        with open(f"/proc/{self.proc.pid}/{name}") as f:
            return f.read()

    def rss_bytes(self) -> int:
        return int(re.search(r"VmRSS:\s+(\d+) kB", self._proc_file("status")).group(1)) * 1024

    def peak_rss_bytes(self) -> int:
        return int(re.search(r"VmHWM:\s+(\d+) kB", self._proc_file("status")).group(1)) * 1024

    def cpu_s(self) -> float:
        """User + system CPU seconds so far (all threads)."""
        fields = self._proc_file("stat").rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def metrics(self) -> str:
        import urllib.request

        return urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=30).read().decode()

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self) -> str:
        """Stop it (SIGTERM, then SIGKILL); its log."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.log()


def start_processor(tmp_path, *args: str, env: dict | None = None) -> ProcessorProcess:
    """A processor on free loopback ports, verdicts not exported (OTEL_TRACES_EXPORTER=none), MYCROFT_* from
    ``env`` only; returns once it has printed its banner (it listens then)."""
    ports = [free_port() for _ in range(3)]
    e = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MYCROFT_"))}
    e.update(PYTHONPATH=ROOT, OTEL_TRACES_EXPORTER="none", **(env or {}))
    log_path = str(tmp_path / f"processor-{ports[0]}.log")
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "mycroft_otel", "processor", "--grpc-port", str(ports[0]),
                                 "--http-port", str(ports[1]), "--metrics-port", str(ports[2]), *args],
                                env=e, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    p = ProcessorProcess(proc, *ports, log_path)
    end = time.monotonic() + 60
    while "mycroft-otel processor: OTLP" not in p.log():
        if proc.poll() is not None or time.monotonic() > end:
            raise RuntimeError(f"the processor did not start (exit {proc.poll()}):\n{p.stop()[-3000:]}")
        time.sleep(0.1)
    return p
