"""A routing probe standing in for `mycroft-otel processor` in the stack smoke test (run as a script).

It is not a model of the processor: it only proves the wiring around it.
- OTLP/gRPC TraceService on --grpc-port: appends one JSON line per received span to --out
  (trace_id, span_id, name, sink index), so the test sees which processor got which trace;
- for each new trace it has seen, sends ONE span named `mycroft.root_cause` in that trace to
  OTEL_EXPORTER_OTLP_ENDPOINT (the gateway's root-cause receiver), like the processor does;
  the test then checks it reaches the trace store and never comes back to a sink (no loop);
- /metrics on --metrics-port (Prometheus text): spans received, and the verdicts it sent as
  mycroft_root_causes_total{kind,category,comm} and an open incident (mycroft_incidents_open and _confidence), so the
  real Prometheus can fire the real alert.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.resource.v1 import resource_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

ROOT_CAUSE = "mycroft.root_cause"


class Sink(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, index: int, out_path: str, upstream: str | None) -> None:
        self.index = index
        self.out_path = out_path
        self.lock = threading.Lock()
        self.received = 0
        self.verdicts = 0
        self.seen_traces: set[bytes] = set()
        self.upstream = None
        if upstream:
            target = upstream.split("://", 1)[-1]
            self.upstream = trace_service_pb2_grpc.TraceServiceStub(grpc.insecure_channel(target))

    def Export(self, request, context):  # noqa: N802 (gRPC method name)
        new_traces: list[tuple[bytes, bytes]] = []
        lines = []
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                for sp in ss.spans:
                    lines.append(
                        json.dumps(
                            {"sink": self.index, "trace_id": sp.trace_id.hex(), "span_id": sp.span_id.hex(),
                             "name": sp.name}  # fmt: skip
                        )
                    )
                    if sp.name != ROOT_CAUSE and sp.trace_id not in self.seen_traces:
                        self.seen_traces.add(sp.trace_id)
                        new_traces.append((sp.trace_id, sp.span_id))
        with self.lock:
            self.received += len(lines)
            with open(self.out_path, "a") as f:
                f.write("".join(line + "\n" for line in lines))
        for trace_id, span_id in new_traces:
            self._send_verdict(trace_id, span_id)
        return trace_service_pb2.ExportTraceServiceResponse()

    def _send_verdict(self, trace_id: bytes, culprit_span: bytes) -> None:
        if self.upstream is None:
            return
        now = time.time_ns()
        span = trace_pb2.Span(
            trace_id=trace_id,
            span_id=hashlib.sha256(trace_id + b"root_cause").digest()[:8],
            name=ROOT_CAUSE,
            kind=trace_pb2.Span.SPAN_KIND_INTERNAL,
            start_time_unix_nano=now,
            end_time_unix_nano=now,
            attributes=[common_pb2.KeyValue(key="mycroft.rca.category",
                                            value=common_pb2.AnyValue(string_value="routing_probe"))],  # fmt: skip
            links=[trace_pb2.Span.Link(trace_id=trace_id, span_id=culprit_span)],
        )
        req = trace_service_pb2.ExportTraceServiceRequest(
            resource_spans=[
                trace_pb2.ResourceSpans(
                    resource=resource_pb2.Resource(
                        attributes=[common_pb2.KeyValue(key="service.name",
                                                        value=common_pb2.AnyValue(string_value="mycroft-processor"))]  # fmt: skip
                    ),
                    scope_spans=[trace_pb2.ScopeSpans(spans=[span])],
                )
            ]
        )
        self.upstream.Export(req, timeout=10)
        with self.lock:
            self.verdicts += 1


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bind", default="127.0.0.1")
    ap.add_argument("--grpc-port", type=int, required=True)
    ap.add_argument("--metrics-port", type=int, required=True)
    ap.add_argument("--index", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    sink = Sink(args.index, args.out, os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(sink, server)
    server.add_insecure_port(f"{args.bind}:{args.grpc_port}")
    server.start()

    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            text = f"mycroft_sink_spans_received_total {sink.received}\n"
            if sink.verdicts:
                text += f'mycroft_root_causes_total{{kind="hang",category="routing_probe",comm="smoke"}} {sink.verdicts}\n'
                page = 'job_id="smoke",kind="hang",category="routing_probe",culprit_ranks="0",culprit_hosts="probe"'
                text += f"mycroft_incidents_open{{{page}}} 1\nmycroft_incident_confidence{{{page}}} 0.9\n"
            body = text.encode()
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    http = ThreadingHTTPServer((args.bind, args.metrics_port), Metrics)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    http.shutdown()
    server.stop(2).wait()


if __name__ == "__main__":
    main()
