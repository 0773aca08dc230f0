"""Root-cause spans over OTLP, configured by the standard OTEL_* variables.

Each verdict becomes one ``mycroft.root_cause`` span in the trace of the
collective it explains, with the deterministic span id chosen by the pipeline,
``culprit`` links to the culprit's spans and ``evidence`` links to the spans the
verdict used. Spans go through the SDK's BatchSpanProcessor (bounded queue,
drops counted by the SDK) to the OTLP exporter that OTEL_TRACES_EXPORTER
(``otlp`` default, ``console``, ``none``) and OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL
(``grpc`` default, ``http/protobuf``) select; endpoint, headers, certificates,
compression and timeout are read by the SDK exporter itself.
"""

from __future__ import annotations

import os

from opentelemetry import trace as api
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from mycroft_otel import semconv as sc
from mycroft_otel.config import ConfigError

SCOPE = InstrumentationScope("mycroft_otel.processor", "0.1.0")


def _resource() -> Resource:
    res = Resource.create({})
    if not os.environ.get("OTEL_SERVICE_NAME") and "service.name=" not in os.environ.get(
            "OTEL_RESOURCE_ATTRIBUTES", ""):
        res = res.merge(Resource({sc.SERVICE_NAME: "mycroft-otel-processor"}))
    return res


def span_exporter_from_env() -> SpanExporter | None:
    """The SpanExporter that OTEL_TRACES_EXPORTER / OTEL_EXPORTER_OTLP_*PROTOCOL ask for (None: disabled)."""
    kind = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
    if kind == "none":
        return None
    if kind == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter
        return ConsoleSpanExporter()
    if kind != "otlp":
        raise ConfigError(f"OTEL_TRACES_EXPORTER={kind!r} must be one of otlp, console, none")
    proto = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
             or "grpc").strip()
    if proto == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        return OTLPSpanExporter()
    if proto == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HTTPExporter
        return HTTPExporter()
    raise ConfigError(f"OTEL_EXPORTER_OTLP_PROTOCOL={proto!r} must be grpc or http/protobuf")


def _ctx(trace_id: bytes, span_id: bytes) -> api.SpanContext:
    return api.SpanContext(int.from_bytes(trace_id, "big"), int.from_bytes(span_id, "big"), is_remote=False,
                           trace_flags=api.TraceFlags(api.TraceFlags.SAMPLED))


def root_cause_span(verdict, resource: Resource | None = None) -> ReadableSpan:
    f = verdict.finding
    links = [api.Link(_ctx(verdict.trace_id, s), {sc.LINK_ROLE: sc.LINK_CULPRIT}) for s in f.culprit_spans]
    links += [api.Link(_ctx(verdict.trace_id, s), {sc.LINK_ROLE: sc.LINK_EVIDENCE}) for s in f.evidence_spans
              if s not in f.culprit_spans]
    start = min(f.onset_ns, verdict.detected_ns) if f.onset_ns > 0 else verdict.detected_ns
    return ReadableSpan(
        name=sc.ROOT_CAUSE_SPAN, context=_ctx(verdict.trace_id, verdict.span_id), parent=None,
        resource=resource or _resource(), attributes=verdict.attributes(), links=links,
        kind=api.SpanKind.INTERNAL, instrumentation_scope=SCOPE,
        status=api.Status(api.StatusCode.ERROR, f"{f.kind}: {f.category}"),
        start_time=start, end_time=verdict.detected_ns,
    )


class RootCauseExporter:
    """Verdict -> root-cause span -> BatchSpanProcessor -> SpanExporter. Idempotent shutdown."""

    def __init__(self, span_exporter: SpanExporter | None = None, schedule_delay_ms: float = 100.0):
        self.span_exporter = span_exporter if span_exporter is not None else span_exporter_from_env()
        self.resource = _resource()
        self._bsp = (BatchSpanProcessor(self.span_exporter, schedule_delay_millis=schedule_delay_ms)
                     if self.span_exporter is not None else None)
        self.exported = 0

    def export(self, verdict) -> None:
        if self._bsp is None:
            return
        self._bsp.on_end(root_cause_span(verdict, self.resource))
        self.exported += 1

    def force_flush(self, timeout_ms: int = 5000) -> bool:
        return self._bsp.force_flush(timeout_ms) if self._bsp is not None else True

    def shutdown(self) -> None:
        if self._bsp is not None:
            bsp, self._bsp = self._bsp, None
            bsp.force_flush(2000)
            bsp.shutdown()
