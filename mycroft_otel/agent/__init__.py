"""The node agent: shared-memory rings → OpenTelemetry spans over OTLP (issue 4).

Modules, in data-path order: ``discovery`` (rings appear, disappear, and are removed once exported) →
``provenance`` (whom a ring speaks for: its file's owner) → ``source``
(one ring: header, cursor, process) → ``sampling`` (anomaly rule, consistent
sampling, summaries) → ``spans`` (records → span bytes per docs/span-schema.md,
with ``otlp``, the protobuf writer) → ``exporter`` (bounded queue, OTLP per
OTEL_*) → ``state`` (cursors for restarts); ``agent`` is the poll loop tying them
together (``budget``: each ring's and each owner's fair share of a poll), ``health``
its own metrics, ``plugin_counters`` the plugin's drop counters summed per node, ``metrics`` the
collective metrics over every completed op and ``meter`` the MeterProvider that exports them, ``cli``
the ``mycroft-otel agent`` verb and ``instrumentor`` the in-process mode.
"""

from mycroft_otel.agent.agent import Agent
from mycroft_otel.agent.settings import AgentSettings

__all__ = ["Agent", "AgentSettings"]
