"""The analysis processor: OTLP spans in, root-cause spans and metrics out.

Named like an OpenTelemetry Collector component, following one collective's
spans through the modules:

- ``receiver``  OTLP/gRPC TraceService and OTLP/HTTP ``POST /v1/traces`` -> decoded requests
- ``spans``     OTLP protobuf spans -> light :class:`~mycroft_otel.processor.spans.SpanRef`
                (key attributes at ingest, the rest decoded lazily when analysed)
- ``state``     per-trace state (one trace = one collective), bounded by TTL and size
- ``detect``    hangs (no progress for MYCROFT_STALL_MS) and slowdowns (online baselines)
- ``rca``       the walk over span links to the root cause, classification, confidence
- ``pipeline``  the :class:`Processor` that ties them together on a timer, incidents, dedupe
- ``exporter``  ``mycroft.root_cause`` spans over OTLP (OTEL_*)
- ``metrics``   Prometheus ``/metrics``
- ``cli``       ``mycroft-otel processor``

The processor works from spans alone: it imports only ``semconv``, ``ids`` and
``config`` from the rest of the package.
"""

from mycroft_otel.processor.pipeline import Processor, Verdict

__all__ = ["Processor", "Verdict"]
