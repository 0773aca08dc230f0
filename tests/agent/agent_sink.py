"""A real OTLP gRPC receiver for the agent's tests (grpcio + opentelemetry-proto).

The sink decodes every ExportTraceServiceRequest it receives and keeps flattened
spans; tests assert on what went over the wire, never on Python objects inside the
agent. Its behaviour can be switched to fail (a gRPC status code) or to be slow.
"""

from __future__ import annotations

import threading
import time
from concurrent import futures
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from mycroft_otel import semconv as sc



def as_read(own: dict, resource: dict, start: int) -> dict:
    """A span's attributes as docs/span-schema.md tells a reader to take them: with those its resource carries
    for all its spans (sc.with_shared), a flow's times from their offsets after the span's ``start``
    (sc.flow_time), a flow array left out as equal to another (sc.FLOW_SAME_AS) read as that one, NCCL's
    seqNumber left out as the collective number and a [started, stopped] pair left out as the whole."""
    a = dict(sc.with_shared(own, resource))
    for key in sc.FLOW_OFFSETS:
        if key in a:
            a[key] = [sc.flow_time(v, start) for v in a[key]]
    for key, same in sc.FLOW_SAME_AS.items():
        if key not in a and same in a:
            a[key] = a[same]
    if sc.COLL_SEQ in a:
        a.setdefault(sc.NCCL_SEQ, a[sc.COLL_SEQ])
    if sc.OP_STATE in a:
        a.setdefault(sc.PROXY_OPS, [len(a.get(sc.FLOW_CHANNEL, []))] * 2)
        a.setdefault(sc.KERNEL_CHANNELS, [a.get(sc.COLL_NCHANNELS, 0)] * 2)
    return a


def any_value(v: Any) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [any_value(x) for x in v.array_value.values]
    if which is None:
        return None
    return getattr(v, which)


def attrs(kvs) -> dict:
    return {kv.key: any_value(kv.value) for kv in kvs}


class Sink(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans: list[dict] = []
        self.requests = 0
        self.fail_code: grpc.StatusCode | None = None
        self.delay_s = 0.0
        self.metadata: dict = {}
        self.lock = threading.Lock()
        self.cv = threading.Condition(self.lock)

    def Export(self, request, context):  # noqa: N802 (gRPC naming)
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.fail_code is not None:
            context.abort(self.fail_code, "test sink told to fail")
        self.metadata = dict(context.invocation_metadata())
        req = trace_service_pb2.ExportTraceServiceRequest()
        req.ParseFromString(request.SerializeToString())
        out = []
        now = time.time_ns()
        for rs in req.resource_spans:
            res = attrs(rs.resource.attributes)
            # "attrs": a span's attributes as a reader takes them (as_read); "span_attrs": the span's own
            for ss in rs.scope_spans:
                for s in ss.spans:
                    out.append({
                        "trace_id": int.from_bytes(s.trace_id, "big"), "span_id": int.from_bytes(s.span_id, "big"),
                        "name": s.name, "start": s.start_time_unix_nano, "end": s.end_time_unix_nano,
                        "kind": s.kind, "recv_ns": now,
                        "attrs": as_read(attrs(s.attributes), res, s.start_time_unix_nano),
                        "span_attrs": attrs(s.attributes), "resource": res,
                        "scope": ss.scope.name,
                        "events": [(e.name, e.time_unix_nano, attrs(e.attributes)) for e in s.events],
                        "links": [{"trace_id": int.from_bytes(lk.trace_id, "big"),
                                   "span_id": int.from_bytes(lk.span_id, "big"), "attrs": attrs(lk.attributes)}
                                  for lk in s.links]})
        with self.cv:
            self.requests += 1
            self.spans.extend(out)
            self.cv.notify_all()
        return trace_service_pb2.ExportTraceServiceResponse()

    def wait_for(self, pred, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        with self.cv:
            while not pred(self.spans):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cv.wait(left)
        return True

    def named(self, name: str) -> list[dict]:
        with self.lock:
            return [s for s in self.spans if s["name"] == name]

    def clear(self) -> None:
        with self.lock:
            self.spans.clear()


class SinkServer:
    def __init__(self, port: int = 0):
        self.sink = Sink()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self.sink, self.server)
        self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        self.server.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.stop(grace=None).wait(5)


