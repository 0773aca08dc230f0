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
from typing import Any

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

    def snapshot(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def prometheus_text(self) -> str:
        lines = []
        for name in self.COUNTERS:
            m = f"mycroft_agent_{name}_total"
            lines += [f"# TYPE {m} counter", f"{m} {getattr(self, name)}"]
        for name in self.GAUGES:
            m = f"mycroft_agent_{name}"
            lines += [f"# TYPE {m} gauge", f"{m} {getattr(self, name)}"]
        return "\n".join(lines) + "\n"


class MetricsServer:
    """Prometheus text on http://bind:port/metrics (prometheus_client's registry and server)."""

    def __init__(self, health: Health, port: int, bind: str = "0.0.0.0"):
        from prometheus_client import CollectorRegistry, start_http_server
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        class _Collector:
            def collect(self_inner):  # noqa: N805
                for name in Health.COUNTERS:
                    yield CounterMetricFamily(f"mycroft_agent_{name}", name.replace("_", " "),
                                              value=getattr(health, name))
                for name in Health.GAUGES:
                    yield GaugeMetricFamily(f"mycroft_agent_{name}", name.replace("_", " "),
                                            value=getattr(health, name))

        self.registry = CollectorRegistry()
        self.registry.register(_Collector())
        self.server, self.thread = start_http_server(port, addr=bind, registry=self.registry)
        self.port = self.server.server_port

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def register_otel_metrics(health: Health, meter_provider: Any = None) -> None:
    """Observable instruments on the given (or global) MeterProvider, reading the counters."""
    from opentelemetry import metrics
    from opentelemetry.metrics import Observation

    meter = (meter_provider or metrics.get_meter_provider()).get_meter("mycroft_otel.agent")
    for name in Health.COUNTERS:
        meter.create_observable_counter(f"mycroft.agent.{name}", callbacks=[
            (lambda n: (lambda options: [Observation(getattr(health, n))]))(name)])
    for name in Health.GAUGES:
        meter.create_observable_gauge(f"mycroft.agent.{name}", callbacks=[
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
