"""Eval's own OTLP/gRPC trace receiver: it keeps the root-cause spans the processor exports.

It is the measuring instrument of ``mycroft-otel eval`` (the far end of the pipeline), not a
stand-in for a product component: it decodes ExportTraceServiceRequest protobufs off the
wire and timestamps each ``mycroft.root_cause`` span when it arrives.
"""

from __future__ import annotations

import threading
import time
from concurrent import futures
from dataclasses import dataclass, field

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from mycroft_otel import semconv


def any_value(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [any_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind) if kind else None


@dataclass
class Verdict:
    received_ns: int
    trace_id: str
    span_id: str
    attrs: dict = field(default_factory=dict)

    @property
    def category(self) -> str:
        return str(self.attrs.get(semconv.RCA_CATEGORY, ""))

    @property
    def kind(self) -> str:
        return str(self.attrs.get(semconv.RCA_KIND, ""))

    def short(self) -> str:
        g = self.attrs.get(semconv.RCA_CULPRIT_GLOBAL_RANKS)
        r = self.attrs.get(semconv.RCA_CULPRIT_RANKS)
        who = f"g{list(g)}" if g else f"r{list(r or [])}"
        ch = self.attrs.get(semconv.RCA_CULPRIT_CHANNEL)
        return f"{self.category}@{who}" + (f" ch{ch}" if ch is not None else "")


class _Servicer(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, sink: "Sink"):
        self.sink = sink

    def Export(self, request, context):  # noqa: N802 - gRPC method name
        now = time.time_ns()
        got = []
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                for sp in ss.spans:
                    self.sink.spans_seen += 1
                    if sp.name == semconv.ROOT_CAUSE_SPAN:
                        got.append(Verdict(now, sp.trace_id.hex(), sp.span_id.hex(),
                                           {kv.key: any_value(kv.value) for kv in sp.attributes}))
        with self.sink.lock:
            self.sink.verdicts.extend(got)
        return trace_service_pb2.ExportTraceServiceResponse()


class Sink:
    """start() -> port; verdicts accumulate until take()."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.verdicts: list[Verdict] = []
        self.spans_seen = 0
        self.server: grpc.Server | None = None
        self.port = 0

    def start(self, port: int = 0) -> int:
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_Servicer(self), self.server)
        self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        self.server.start()
        return self.port

    def take(self) -> list[Verdict]:
        with self.lock:
            out, self.verdicts = self.verdicts, []
        return out

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(grace=0.5)
            self.server = None
