"""The real OpenTelemetry stack on loopback (gateway collector, trace store, Prometheus, processors) for tests and demos."""

from mycroft_otel.stack.runner import LocalStack, ProcessorPorts, StackError, default_processor_command

__all__ = ["LocalStack", "ProcessorPorts", "StackError", "default_processor_command"]
