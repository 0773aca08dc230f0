"""mycroft-otel: observable NCCL collectives.

Data path, one folder per stage:
  native/ (capture: NCCL profiler plugin -> shared memory)
  mycroft_otel/agent (export: shared memory -> OpenTelemetry spans over OTLP)
  mycroft_otel/processor (analysis: spans -> root-cause spans and metrics)
  dashboards/, collector_config/ (operations)
The simulator (mycroft_otel/sim) drives the real plugin through NCCL's ABI.
"""

__version__ = "0.1.0"


def instrument() -> None:
    """Trace this process's NCCL collectives (in-process agent); see mycroft_otel.agent.instrumentor."""
    from mycroft_otel.agent.instrumentor import instrument as _instrument

    _instrument()
