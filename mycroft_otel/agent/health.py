"""The agent's own health: counters as OpenTelemetry metrics and Prometheus text.

Counters are plain ints bumped by the poll loop and the export thread (each
counter has one writer thread); readers (the Prometheus scrape, the OTel metric
callbacks) read them at any time.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, fields
from typing import Any, Sequence

log = logging.getLogger("mycroft_otel.agent")


@dataclass
class Health:
    records_read: int = 0          # completion records drained from rings
    spans_built: int = 0           # spans encoded (op, in-flight, status, summary)
    spans_exported: int = 0        # spans the endpoint accepted
    dropped_ring: int = 0          # completions overwritten in a ring before the agent read them
    dropped_export_queue: int = 0  # spans dropped because the export queue was full
    dropped_export_failed: int = 0  # spans in requests that failed after the exporter's retries
    export_errors: int = 0         # failed export requests
    export_requests: int = 0       # export requests sent
    polls: int = 0                 # poll cycles
    sources_opened: int = 0        # ring files opened
    bad_files: int = 0             # files in the ring dir that are not valid rings
    rings_removed: int = 0         # finished rings deleted after their evidence was exported
    rings_skipped: int = 0         # leftovers of jobs finished long before the agent saw them, removed unread
    deferred_live_reads: int = 0   # live-table reads a ring had to wait for (its fair share was spent)
    deferred_snapshots: int = 0    # in-flight snapshots put off to a later poll (its fair share was spent)
    # gauges
    sources: int = 0               # rings currently followed
    queue_spans: int = 0           # spans waiting for export
    ring_backlog: int = 0          # records in rings not yet read (all sources)
    export_lag_s: float = 0.0      # age of the oldest span waiting for export
    poll_duration_s: float = 0.0   # last poll cycle's duration

    COUNTERS = ("records_read", "spans_built", "spans_exported", "dropped_ring", "dropped_export_queue",
                "dropped_export_failed", "export_errors", "export_requests", "polls", "sources_opened", "bad_files",
                "rings_removed", "rings_skipped", "deferred_live_reads", "deferred_snapshots")
    GAUGES = ("sources", "queue_spans", "ring_backlog", "export_lag_s", "poll_duration_s")

    # The unit of each instrument (UCUM; braces are annotations, counted things). The unit is in the
    # instrument's unit field, never its name: a field named *_s is seconds and its metric name drops the
    # suffix (OTel: mycroft.agent.export_lag, unit s; Prometheus, which appends units: *_seconds).
    UNITS = {"records_read": "{record}", "spans_built": "{span}", "spans_exported": "{span}",
             "dropped_ring": "{record}", "dropped_export_queue": "{span}", "dropped_export_failed": "{span}",
             "export_errors": "{request}", "export_requests": "{request}", "polls": "{poll}",
             "sources_opened": "{ring}", "bad_files": "{file}", "rings_removed": "{ring}", "rings_skipped": "{ring}",
             "deferred_live_reads": "{read}", "deferred_snapshots": "{snapshot}", "sources": "{ring}",
             "queue_spans": "{span}", "ring_backlog": "{record}", "export_lag_s": "s", "poll_duration_s": "s"}

    @staticmethod
    def otel_name(name: str) -> str:
        """``mycroft.agent.<name>``, a seconds suffix dropped (the unit says it)."""
        return "mycroft.agent." + (name[:-2] if Health.UNITS[name] == "s" else name)

    @staticmethod
    def prometheus_name(name: str) -> str:
        """The OTel name as the OTel → Prometheus rules write it: ``_`` for ``.``, ``_seconds`` for unit s
        (units in braces add nothing; counters get ``_total`` where they are written)."""
        base = Health.otel_name(name).replace(".", "_")
        return base + "_seconds" if Health.UNITS[name] == "s" else base

    def snapshot(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def prometheus_text(self) -> str:
        lines = []
        for name in self.COUNTERS:
            m = self.prometheus_name(name) + "_total"
            lines += [f"# TYPE {m} counter", f"{m} {getattr(self, name)}"]
        for name in self.GAUGES:
            m = self.prometheus_name(name)
            lines += [f"# TYPE {m} gauge", f"{m} {getattr(self, name)}"]
        return "\n".join(lines) + "\n"


class MetricsServer:
    """Prometheus text on http://bind:port/metrics: one thread, one selector, whatever the clients do.

    prometheus_client's own server starts a thread per connection (3,000 idle connections: 3,010
    threads in the agent). Here a connection costs a socket: at most MAX_CONNECTIONS are open (more are
    closed, oldest first), each must send its request within REQUEST_TIMEOUT_S and is closed after its answer.
    The text is the registry's (prometheus_client.generate_latest), as before.
    """

    MAX_CONNECTIONS = 64
    REQUEST_TIMEOUT_S = 5.0
    MAX_REQUEST_BYTES = 8192

    def __init__(self, health: Health, port: int, bind: str = "0.0.0.0", extra: Sequence[Any] = ()):
        import selectors
        import socket

        from prometheus_client import CollectorRegistry
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        class _Collector:
            def collect(self_inner):  # noqa: N805
                for name in Health.COUNTERS:
                    yield CounterMetricFamily(Health.prometheus_name(name), name.replace("_", " "),
                                              value=getattr(health, name))
                for name in Health.GAUGES:
                    yield GaugeMetricFamily(Health.prometheus_name(name), name.replace("_", " "),
                                            value=getattr(health, name))

        self.registry = CollectorRegistry()
        self.registry.register(_Collector())
        for collector in extra:  # other families served beside the health (the plugin's counters: plugin_counters.py)
            self.registry.register(collector)
        family = socket.AF_INET6 if ":" in bind else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((bind, port))
        self._listener.listen(128)
        self._listener.setblocking(False)
        self.port = self._listener.getsockname()[1]
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, None)
        self._conns: dict[Any, tuple[float, bytearray]] = {}  # socket -> (deadline, request bytes so far)
        self._stop = threading.Event()
        self.refused = 0  # idle connections closed to make room (over MAX_CONNECTIONS)
        self.thread = threading.Thread(target=self._serve, name="mycroft-agent-metrics", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._sel.select(timeout=0.5):
                if key.data is None:
                    self._accept()
                else:
                    self._read(key.fileobj)
            now = time.monotonic()
            for sock in [c for c, (deadline, _) in self._conns.items() if deadline < now]:
                self._drop(sock)

    def _accept(self) -> None:
        import selectors

        for _ in range(64):
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            if len(self._conns) >= self.MAX_CONNECTIONS:
                # full: the connection idle longest goes, not the newcomer (a scraper sends its request at
                # once, so clients holding connections open cannot keep it out)
                self.refused += 1
                self._drop(min(self._conns, key=lambda c: self._conns[c][0]))
            sock.setblocking(False)
            self._conns[sock] = (time.monotonic() + self.REQUEST_TIMEOUT_S, bytearray())
            self._sel.register(sock, selectors.EVENT_READ, True)

    def _read(self, sock: Any) -> None:
        try:
            data = sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(sock)
            return
        buf = self._conns[sock][1]
        buf += data
        if b"\r\n\r\n" not in buf:
            if len(buf) > self.MAX_REQUEST_BYTES:
                self._answer(sock, b"431 Request Header Fields Too Large", b"")
            return
        line = bytes(buf).split(b"\r\n", 1)[0].split()
        if len(line) < 2 or line[0] not in (b"GET", b"HEAD"):
            self._answer(sock, b"405 Method Not Allowed", b"")
        elif line[1].split(b"?", 1)[0] not in (b"/metrics", b"/"):
            self._answer(sock, b"404 Not Found", b"")
        else:
            from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

            body = generate_latest(self.registry)
            self._answer(sock, b"200 OK", b"" if line[0] == b"HEAD" else body, CONTENT_TYPE_LATEST.encode(),
                         len(body))

    def _answer(self, sock: Any, status: bytes, body: bytes, ctype: bytes = b"text/plain",
                length: int | None = None) -> None:
        head = (b"HTTP/1.1 " + status + b"\r\nContent-Type: " + ctype + b"\r\nContent-Length: "
                + str(len(body) if length is None else length).encode() + b"\r\nConnection: close\r\n\r\n")
        try:
            sock.setblocking(True)
            sock.settimeout(1.0)  # a scraper that does not read its answer is dropped, not waited on
            sock.sendall(head + body)
        except OSError:
            pass
        self._drop(sock)

    def _drop(self, sock: Any) -> None:
        self._conns.pop(sock, None)
        try:
            self._sel.unregister(sock)
        except (KeyError, ValueError):
            pass
        sock.close()

    def close(self) -> None:
        self._stop.set()
        self.thread.join(2.0)
        for sock in list(self._conns):
            self._drop(sock)
        self._sel.close()
        self._listener.close()


def register_otel_metrics(health: Health, meter_provider: Any = None) -> None:
    """Observable instruments on the given (or global) MeterProvider, reading the counters."""
    from opentelemetry import metrics
    from opentelemetry.metrics import Observation

    meter = (meter_provider or metrics.get_meter_provider()).get_meter("mycroft_otel.agent")
    for name in Health.COUNTERS:
        meter.create_observable_counter(Health.otel_name(name), unit=Health.UNITS[name], callbacks=[
            (lambda n: (lambda options: [Observation(getattr(health, n))]))(name)])
    for name in Health.GAUGES:
        meter.create_observable_gauge(Health.otel_name(name), unit=Health.UNITS[name], callbacks=[
            (lambda n: (lambda options: [Observation(getattr(health, n))]))(name)])


class RateLimitedLog:
    """Log a repeated problem at most once per interval per key."""

    def __init__(self, interval_s: float = 30.0):
        self.interval = interval_s
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()

    def warning(self, key: str, msg: str, *args: Any) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._last.get(key, -1e9) < self.interval:
                return
            self._last[key] = now
        log.warning(msg, *args)
