"""In-process mode: an OpenTelemetry instrumentor that traces this process's NCCL collectives.

``opentelemetry-instrument python train.py`` (entry point ``nccl`` in the
``opentelemetry_instrumentor`` group) or ``mycroft_otel.instrument()`` sets
``NCCL_PROFILER_PLUGIN`` to our plugin unless already set (NCCL reads it when the
first communicator is created, so call this before ``init_process_group``), and
runs the agent's loop on a daemon thread, exporting with the same OTEL_*
configuration. Each in-process agent follows only the rings its own process writes
(so every rank of a torchrun job can call it without duplicates); pass
``all_rings=True`` to follow the whole ring directory instead. A process cannot
report its own death: for ``process_exited`` evidence run the node agent
(``mycroft-otel agent``) as a sidecar.

Metrics are the node agent's: the collective metrics, the agent's health and the
plugin's counters, on a MeterProvider of its own built exactly as ``mycroft-otel
agent`` builds it (OTEL_METRICS_EXPORTER, default otlp; ``none`` turns them off).
Its own because the collective histograms are aggregated in bulk and handed to the
exporter (meter.MergingExporter), which an application's provider cannot be
given. ``meter_provider=`` still receives the health and plugin counters;
``metric_exporter=`` replaces the exporter OTEL_METRICS_EXPORTER names.
"""

from __future__ import annotations

import atexit
import os
import threading
from typing import Any, Collection

try:  # opentelemetry-instrumentation is optional
    from opentelemetry.instrumentation.instrumentor import BaseInstrumentor as _Base
except ImportError:  # pragma: no cover - depends on the environment
    class _Base:  # minimal stand-in with the same lifecycle
        _instance = None
        _is_instrumented_by_opentelemetry = False

        def instrument(self, **kwargs: Any) -> None:
            if not self._is_instrumented_by_opentelemetry:
                self._instrument(**kwargs)
                self._is_instrumented_by_opentelemetry = True

        def uninstrument(self, **kwargs: Any) -> None:
            if self._is_instrumented_by_opentelemetry:
                self._uninstrument(**kwargs)
                self._is_instrumented_by_opentelemetry = False


class NcclInstrumentor(_Base):
    """Sets NCCL_PROFILER_PLUGIN and runs the mycroft-otel agent loop on a thread."""

    _agent = None
    _thread = None
    _stop = None
    _provider = None  # the agent's own MeterProvider (None when OTEL_METRICS_EXPORTER=none)

    def instrumentation_dependencies(self) -> Collection[str]:
        return ()

    def _instrument(self, **kwargs: Any) -> None:
        from opentelemetry import metrics

        from mycroft_otel.agent.agent import Agent
        from mycroft_otel.agent.health import register_otel_metrics
        from mycroft_otel.agent.meter import meter_provider, metrics_config
        from mycroft_otel.agent.metrics import CollectiveMetrics
        from mycroft_otel.agent.settings import AgentSettings
        from mycroft_otel.paths import plugin_path

        if not os.environ.get("NCCL_PROFILER_PLUGIN"):
            try:
                os.environ["NCCL_PROFILER_PLUGIN"] = str(plugin_path())
            except FileNotFoundError:
                pass  # no plugin built: nothing will be recorded, but do not break the application
        settings = kwargs.get("settings") or AgentSettings.from_env(ring_dir=kwargs.get("ring_dir"))
        mcfg = metrics_config()
        collective = CollectiveMetrics() if mcfg.enabled else None
        agent = Agent(settings, transport=kwargs.get("transport"),
                      only_pid=None if kwargs.get("all_rings") else os.getpid(), metrics=collective)
        own = None
        if collective is not None:  # as the node agent (cli.py): collective metrics, health, plugin counters
            own = meter_provider(mcfg, collective, [("service.name", settings.service_name)],
                                 exporter=kwargs.get("metric_exporter"))
        target = kwargs.get("meter_provider") or own or metrics.get_meter_provider()
        register_otel_metrics(agent.health, target)
        agent.plugin.register(target)
        stop = threading.Event()
        thread = threading.Thread(target=agent.run, args=(stop,), name="mycroft-otel-agent", daemon=True)
        thread.start()
        NcclInstrumentor._agent, NcclInstrumentor._thread, NcclInstrumentor._stop = agent, thread, stop
        NcclInstrumentor._provider = own
        atexit.register(self._shutdown)

    def _shutdown(self) -> None:
        agent, thread, stop = NcclInstrumentor._agent, NcclInstrumentor._thread, NcclInstrumentor._stop
        if agent is None:
            return
        stop.set()
        thread.join(timeout=5)
        agent.poll_once()  # the last completions
        agent.close()
        if NcclInstrumentor._provider is not None:
            NcclInstrumentor._provider.shutdown(timeout_millis=1000)  # a last export of what the final poll added
        NcclInstrumentor._agent = NcclInstrumentor._thread = NcclInstrumentor._stop = None
        NcclInstrumentor._provider = None

    def _uninstrument(self, **kwargs: Any) -> None:
        self._shutdown()

    @property
    def agent(self):
        return NcclInstrumentor._agent


def instrument(**kwargs: Any) -> NcclInstrumentor:
    """Trace this process's NCCL collectives (see the module docstring)."""
    inst = NcclInstrumentor()
    inst.instrument(**kwargs)
    return inst
