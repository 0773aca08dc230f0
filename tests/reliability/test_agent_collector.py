"""A hostile collector: one that answers an export with a 1 GiB body, then trickles its replies a byte at a
time. The agent's exports end by their deadline and are counted as failures, its memory stays bounded, and
SIGTERM still ends it within 5 s.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest

pytest.importorskip("mycroft_otel._native")

from agent_process import AgentProcess  # noqa: E402
from agent_shm import FakeRing  # noqa: E402

HUGE = 1 << 30


class HostileCollector:
    """OTLP/HTTP in appearance: the first request gets ``200`` and a 1 GiB body, every later one a reply
    trickled at a byte every 0.2 s."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        self.requests = 0
        self.huge_sent = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                c, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _read_request(self, c: socket.socket, buf: bytes) -> bytes | None:
        while b"\r\n\r\n" not in buf:
            d = c.recv(65536)
            if not d:
                return None
            buf += d
        head, rest = buf.split(b"\r\n\r\n", 1)
        length = next(int(l.split(b":")[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length"))
        while len(rest) < length:
            d = c.recv(65536)
            if not d:
                return None
            rest += d
        return rest[length:]

    def _serve(self, c: socket.socket) -> None:
        buf = b""
        try:
            while not self.stop.is_set():
                buf = self._read_request(c, buf)
                if buf is None:
                    return
                self.requests += 1
                if self.requests == 1:
                    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\n"
                              b"Content-Length: %d\r\n\r\n" % HUGE)
                    chunk = b"\0" * (1 << 20)
                    while self.huge_sent < HUGE and not self.stop.is_set():
                        c.sendall(chunk)
                        self.huge_sent += len(chunk)
                    return
                for b in b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n":
                    if self.stop.wait(0.2):
                        return
                    c.sendall(bytes([b]))
                return  # (one byte short of never: the deadline ends it long before)
        except OSError:
            return
        finally:
            c.close()

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


def test_agent_exits_on_sigterm_within_5_s_while_its_collector_trickles(tmp_path):
    ring_dir = tmp_path / "rings"
    ring_dir.mkdir(mode=0o700)
    ring = FakeRing(ring_dir / "r0.mycroft", rank=0, nranks=1, ring_capacity=1024)
    collector = HostileCollector()
    agent = AgentProcess(ring_dir, tmp_path / "state", env={
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{collector.port}",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "2", "MYCROFT_SAMPLE_RATIO": "1", "MYCROFT_IDLE_AFTER_MS": "600000"}).start()
    stop = threading.Event()

    def feed() -> None:
        while not stop.wait(0.2):
            ring.op_done()

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    rss_kb = 0
    try:
        deadline = time.monotonic() + 60
        m: dict = {}
        while time.monotonic() < deadline:
            rss_kb = max(rss_kb, agent.status("VmRSS"))
            try:
                m = agent.metrics()
            except OSError:
                pass
            if m.get("spans_exported", 0) >= 1 and m.get("export_errors", 0) >= 2:
                break
            time.sleep(0.1)
        assert m.get("spans_exported", 0) >= 1, (m, agent.log()[-2000:])  # the 1 GiB reply: read 64 KiB, accepted
        assert m.get("export_errors", 0) >= 2 and m.get("dropped_export_failed", 0) >= 1, m  # trickles: counted
        assert collector.huge_sent < HUGE  # the agent hung up instead of reading the gigabyte
        assert rss_kb < 400_000, f"{rss_kb} kB"  # (was 1.11 GB)
        time.sleep(0.5)  # an export is trickling now
        took = agent.terminate(timeout_s=30)
        assert took < 5.0, f"SIGTERM took {took:.1f} s"
        print(f"\nSIGTERM to exit {took:.2f} s (rc {agent.proc.returncode}); max RSS {rss_kb / 1024:.0f} MiB; "
              f"collector sent {collector.huge_sent >> 20} MiB of its 1024 MiB body; export errors "
              f"{m['export_errors']:.0f}, requests {collector.requests}")
    finally:
        stop.set()
        feeder.join(5)
        agent.stop()
        collector.close()
        ring.close()
