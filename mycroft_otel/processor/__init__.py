"""The analysis processor: OTLP spans in, root-cause spans and metrics out.

Named like an OpenTelemetry Collector component, following one collective's
spans through the modules:

- ``receiver``  OTLP/gRPC TraceService and OTLP/HTTP ``POST /v1/traces`` -> decoded requests
- ``spans``     OTLP protobuf spans -> light :class:`~mycroft_otel.processor.spans.SpanRef`
                (key attributes at ingest, the rest decoded lazily when analysed)
- ``state``     per-trace state (one trace = one collective), bounded by TTL and size
- ``settings``  the knobs (MYCROFT_*, read once) and the detector's design constants, one typed object
- ``detect``    hangs (no progress for a learned threshold, MYCROFT_STALL_MS the floor), slowdown candidates
- ``views``     each rank's view of a trace, and the ``Finding`` an analysis concludes
- ``rca``       the walk over span links to the root cause of a hang, classification, confidence
- ``mismatch``  ranks that called different collectives or step counts at one sequence number
- ``propagation`` what other traces say about a hang (its culprit stuck elsewhere, or moved on)
- ``slowdown``  a completed collective's evidence per measure (GPU, flow, NIC, proxy, lateness)
- ``sequential`` the learned null and the CUSUM, with its average run length
- ``detector``  the slowdown detector: what one completed collective decides, over its stages:
  ``memory`` (per-job state), ``candidates`` (the sequential test), ``slower`` (did the communicator
  slow down), ``naming`` (which alarm names the culprit); ``outcome`` names every decision
- ``incidents`` findings -> verdicts, one per incident
- ``open_incidents`` which jobs' incidents still hold (a hang until the job moves again): the page
- ``pipeline``  the :class:`Processor` that ties them together on a timer
- ``published``, ``checkpoint`` (--state-dir) the verdicts published and the learned history, kept across a
                restart; ``allocator`` memory a burst freed,
                given back to the system; ``runbook`` the runbook page /metrics serves beside it
- ``exporter``  ``mycroft.root_cause`` spans over OTLP (OTEL_*)
- ``metrics``   Prometheus ``/metrics``
- ``cli``       ``mycroft-otel processor``

The processor works from spans alone: it imports only ``semconv``, ``ids`` and
``config`` from the rest of the package.
"""

import os

# The processor's numpy work is elementwise, never BLAS; OpenBLAS's idle worker threads would only take
# CPU from ingest (measured: ~5% of a core while decoding). Only when numpy is not loaded yet.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from mycroft_otel.processor.pipeline import Processor, Verdict  # noqa: E402

__all__ = ["Processor", "Verdict"]
