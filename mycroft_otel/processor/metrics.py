"""Prometheus ``/metrics`` of the processor (its own registry, so tests can run several).

Label values are bounded: reasons and protocols are this package's constants, and the
communicator label of ``mycroft_root_causes`` keeps its first :data:`MAX_COMM_LABELS`
values, after which verdicts count under ``comm="other"`` (communicator hashes come
from the network: a sender must not be able to grow the scrape without bound).

The open incidents (open_incidents.py) are three gauges per job with an incident open, removed when it
closes, so their series count is the open incidents' (at most open_incidents.MAX_OPEN): the page's labels
(kind, category, culprit global ranks and hosts) on ``mycroft_incidents_open`` (1) and
``mycroft_incident_confidence`` (the verdict's confidence: with several processors, each may name its own
verdict of the job, and the alert pages the likeliest), and ``mycroft_incident_info`` adds the trace id,
its link in the trace UI, its category's section of the runbook, the communicator and the evidence
sentence. The trace id is kept out of the first two so that the alert's identity is the incident's
culprit, not one of its traces: two processors naming the same culprit make one alert.

The same server answers ``/runbook``: docs/runbook.md as HTML (runbook.py), what the page's ``runbook_url``
links to unless MYCROFT_RUNBOOK_URL points elsewhere.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent import futures
from pathlib import Path

import tornado.httpserver
import tornado.netutil
import tornado.web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from mycroft_otel import paths
from mycroft_otel.processor import runbook
from mycroft_otel.processor.outcome import Outcome
from mycroft_otel.processor.state import DROP_REASONS

_LATENCY_BUCKETS = (0.5, 1, 2, 3, 3.5, 4, 4.5, 5, 6, 8, 10, 15, 20, 30, 60, 120)
MAX_COMM_LABELS = 512
METRICS_REQUEST_TIMEOUT_S = 10.0
METRICS_MAX_CONNECTIONS = 256
OTHER_COMM = "other"
_PAGE_LABELS = ["job_id", "kind", "category", "culprit_ranks", "culprit_hosts"]  # an open incident's page
_ANALYSIS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.root_causes = Counter("mycroft_root_causes", "Root causes emitted (one per incident).",
                                   ["kind", "category", "comm"], registry=r)
        self.detection = Histogram("mycroft_processor_detection_latency_seconds",
                                   "From the estimated fault onset to the verdict.", ["kind"],
                                   buckets=_LATENCY_BUCKETS, registry=r)
        self.analysis = Histogram("mycroft_processor_analysis_seconds", "Time to analyse one trace.", ["kind"],
                                  buckets=_ANALYSIS_BUCKETS, registry=r)
        self.received = Counter("mycroft_processor_spans_received", "Spans received over OTLP.", registry=r)
        self.unknown = Counter("mycroft_processor_spans_unknown_shape",
                               "Spans ignored because they do not have the mycroft span shape.", registry=r)
        self.dropped = Counter("mycroft_processor_spans_dropped",
                               "Spans received and then let go before analysis: traces evicted for the byte "
                               "budget (evicted_bytes) or the trace count (evicted_count), spans of a trace "
                               "over the budget alone (over_budget) or past the rank cap (rank_cap). Refused "
                               "requests are counted by mycroft_processor_requests_rejected.",
                               ["reason"], registry=r)
        for reason in DROP_REASONS:  # every series exists from the start: rate() and the panel read 0, not "no data"
            self.dropped.labels(reason)
        self.decisions = Counter("mycroft_processor_decisions",
                                 "What the slowdown analysis decided about each completed collective it judged: a "
                                 "verdict (named, straggler, mismatch) or the reason for its silence (outcome.py).",
                                 ["outcome"], registry=r)
        for outcome in Outcome:
            self.decisions.labels(outcome.value)
        self.rejected = Counter("mycroft_processor_requests_rejected", "OTLP requests answered with an error.",
                                ["protocol", "reason"], registry=r)
        self.evicted = Gauge("mycroft_processor_traces_evicted", "Traces evicted from memory (cumulative).",
                             ["reason"], registry=r)
        self.traces = Gauge("mycroft_processor_traces_in_memory", "Traces held in memory.", registry=r)
        self.trace_bytes = Gauge("mycroft_processor_trace_bytes",
                                 "Accounted bytes of the spans held (budget: MYCROFT_MAX_TRACE_BYTES).", registry=r)
        self.propagated_total = Counter("mycroft_processor_propagated_hangs",
                                        "Hung traces attributed to another trace's incident.", registry=r)
        self.incidents_open = Gauge("mycroft_incidents_open",
                                    "1 while the job's incident is open (the page): its most severe verdict's "
                                    "kind and category, culprit global ranks (else 'comm <ranks>') and hosts.",
                                    _PAGE_LABELS, registry=r)
        self.incident_confidence = Gauge("mycroft_incident_confidence",
                                         "The confidence (0..1) of the verdict the job's open incident shows.",
                                         _PAGE_LABELS, registry=r)
        self.incident_info = Gauge("mycroft_incident_info",
                                   "1 while the job's incident is open: the trace of the verdict the page shows, "
                                   "its link in the trace UI (MYCROFT_TRACE_UI_URL), its category's section of the "
                                   "runbook (MYCROFT_RUNBOOK_URL), communicator and evidence.",
                                   _PAGE_LABELS + ["trace_id", "trace_url", "runbook_url", "comm", "evidence"],
                                   registry=r)
        self._server = None
        self._comms: set[str] = set()
        self._shown: dict[str, tuple[tuple, tuple]] = {}  # job -> label values of its page and info series

    def decided(self, outcome: Outcome) -> None:
        self.decisions.labels(outcome.value).inc()

    def spans_received(self, n: int, unknown: int) -> None:
        self.received.inc(n)
        if unknown:
            self.unknown.inc(unknown)

    def request_rejected(self, protocol: str, reason: str) -> None:
        self.rejected.labels(protocol, reason).inc()

    def spans_dropped(self, reason: str, n: int) -> None:
        self.dropped.labels(reason).inc(n)

    def traces_in_memory(self, n: int, evicted_ttl: int, evicted_size: int, evicted_bytes: int = 0,
                         held_bytes: int = 0) -> None:
        self.traces.set(n)
        self.evicted.labels("ttl").set(evicted_ttl)
        self.evicted.labels("size").set(evicted_size)
        self.evicted.labels("bytes").set(evicted_bytes)
        self.trace_bytes.set(held_bytes)

    def _comm_label(self, comm: str) -> str:
        if comm in self._comms:
            return comm
        if len(self._comms) < MAX_COMM_LABELS:
            self._comms.add(comm)
            return comm
        return OTHER_COMM

    def propagated(self) -> None:
        self.propagated_total.inc()

    def verdict(self, v) -> None:
        self.root_causes.labels(v.kind, v.category, self._comm_label(v.comm)).inc()
        onset = v.finding.onset_ns
        if onset > 0:
            self.detection.labels(v.kind).observe(max(0.0, (v.detected_ns - onset) / 1e9))
        self.analysis.labels(v.kind).observe(v.analysis_s)

    def incident_shown(self, inc, face, links) -> None:
        self.incident_closed(inc.job)
        page = (inc.job, face.kind, face.category, face.culprit_label(), ",".join(face.hosts))
        info = page + (face.trace_id.hex(), links.trace_url, links.runbook_url, face.comm, face.evidence)
        self.incidents_open.labels(*page).set(1)
        self.incident_confidence.labels(*page).set(face.confidence)
        self.incident_info.labels(*info).set(1)
        self._shown[inc.job] = (page, info)

    def incident_closed(self, job: str) -> None:
        shown = self._shown.pop(job, None)
        if shown is not None:
            self.incidents_open.remove(*shown[0])
            self.incident_confidence.remove(*shown[0])
            self.incident_info.remove(*shown[1])

    def serve(self, port: int, addr: str = "127.0.0.1", runbook_path: Path | None = None) -> int:
        """Serve /metrics (and /) and /runbook (``runbook_path``, default paths.runbook_path()); returns the
        bound port (0 picks a free one). Raises OSError when it cannot bind."""
        runbook_path = runbook_path or paths.runbook_path()
        loop = asyncio.new_event_loop()
        started: futures.Future = futures.Future()

        async def start():
            socks = tornado.netutil.bind_sockets(port, addr, reuse_port=False)
            app = tornado.web.Application([(r"/(?:metrics)?", _Scrape, {"registry": self.registry}),
                                           (r"/runbook", _Runbook, {"path": runbook_path})])
            server = _CappedServer(app, idle_connection_timeout=METRICS_REQUEST_TIMEOUT_S,
                                   body_timeout=METRICS_REQUEST_TIMEOUT_S, max_body_size=64 << 10,
                                   max_header_size=64 << 10)
            server.add_sockets(socks)
            return server, socks[0].getsockname()[1]

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                started.set_result(loop.run_until_complete(start()))
            except BaseException as exc:  # noqa: BLE001 - handed to serve()'s caller
                started.set_exception(exc)
                loop.close()
                return
            loop.run_forever()
            loop.close()

        thread = threading.Thread(target=run, name="processor-metrics", daemon=True)
        thread.start()
        server, bound = started.result(30)
        self._server = (loop, server, thread)
        return bound

    def text(self) -> str:
        return generate_latest(self.registry).decode()

    def shutdown(self) -> None:
        if self._server is not None:
            loop, server, thread = self._server
            loop.call_soon_threadsafe(server.stop)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(5)
            self._server = None


class _Scrape(tornado.web.RequestHandler):
    def initialize(self, registry: CollectorRegistry) -> None:  # type: ignore[override]
        self.registry = registry

    def get(self) -> None:
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.write(generate_latest(self.registry))

    def log_exception(self, *args) -> None:  # a broken scraper is not our error
        pass


class _Runbook(tornado.web.RequestHandler):
    """The runbook, read at each request (a page is rare; an edited file shows at once)."""

    def initialize(self, path: Path) -> None:  # type: ignore[override]
        self.path = path

    def get(self) -> None:
        try:
            text = self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            self.set_status(404)
            self.set_header("Content-Type", "text/plain; charset=utf-8")
            self.write(f"no runbook here: {self.path} cannot be read "
                       f"({exc.strerror if isinstance(exc, OSError) else exc}). It is mycroft-otel's "
                       "docs/runbook.md, which the package installs there; or set MYCROFT_RUNBOOK_URL to "
                       "another copy.\n")
            return
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.write(runbook.render(text))


class _CappedServer(tornado.httpserver.HTTPServer):
    """At most METRICS_MAX_CONNECTIONS open connections; more are closed at accept."""

    def handle_stream(self, stream, address) -> None:
        if len(self._connections) >= METRICS_MAX_CONNECTIONS:
            stream.close()
            return
        super().handle_stream(stream, address)
