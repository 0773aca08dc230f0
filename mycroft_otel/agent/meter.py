"""The agent's MeterProvider: OTEL_METRICS_* checked once, the node as the resource, and the exporter
wrapper that hands the bulk-aggregated collective histograms (:mod:`.metrics`) to the SDK's exporter.

The node agent (cli.py) and the in-process mode (instrumentor.py) build their provider here, the same way.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from mycroft_otel import semconv as sc
from mycroft_otel.agent.metrics import SCOPE_NAME, CollectiveMetrics
from mycroft_otel.config import ConfigError

EXPORTERS = ("otlp", "console", "none")
_PROTOCOLS = ("grpc", "http/protobuf")


def _exporter_base() -> type:
    from opentelemetry.sdk.metrics.export import MetricExporter

    return MetricExporter


class MergingExporter(_exporter_base()):  # type: ignore[misc]
    """A ``MetricExporter`` that adds the collective histograms to each export of the SDK's reader.

    Wraps the real exporter (OTLP, console); the PeriodicExportingMetricReader drives it, so the
    export interval, timeout and shutdown are the SDK's.
    """

    def __init__(self, inner: Any, metrics: CollectiveMetrics, resource: Any):
        super().__init__(preferred_temporality=getattr(inner, "_preferred_temporality", None),
                         preferred_aggregation=getattr(inner, "_preferred_aggregation", None))
        self.inner = inner
        self.metrics = metrics
        self.resource = resource

    def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> Any:
        from opentelemetry.sdk.metrics.export import MetricsData, ResourceMetrics, ScopeMetrics
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        import mycroft_otel

        hist = self.metrics.histograms()
        if hist:
            scope = ScopeMetrics(InstrumentationScope(SCOPE_NAME, mycroft_otel.__version__), hist, "")
            rms = list(metrics_data.resource_metrics) if metrics_data is not None else []
            if rms:
                first = rms[0]
                rms[0] = ResourceMetrics(first.resource, [*first.scope_metrics, scope], first.schema_url)
            else:
                rms = [ResourceMetrics(self.resource, [scope], "")]
            metrics_data = MetricsData(rms)
        return self.inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)


@dataclass(frozen=True)
class MetricsConfig:
    """What OTEL_METRICS_EXPORTER and friends ask for, checked once."""
    exporter: str = "otlp"
    protocol: str = "grpc"
    interval_ms: int = 60_000

    @property
    def enabled(self) -> bool:
        return self.exporter != "none"


def metrics_config(env: Mapping[str, str] | None = None) -> MetricsConfig:
    """Validate OTEL_METRICS_EXPORTER, OTEL_EXPORTER_OTLP_METRICS_PROTOCOL, OTEL_METRIC_EXPORT_INTERVAL.

    The default is ``otlp``, the OpenTelemetry specification's: the shipped node collector
    (collector_config/agent.yaml) and gateway both carry a metrics pipeline. ``prometheus`` (a
    pull exporter in the SDK) is refused by name: the agent's own /metrics (--metrics-port) is
    the pull endpoint, and the collective metrics reach Prometheus through the gateway.
    """
    env = os.environ if env is None else env

    def get(name: str) -> str | None:
        v = env.get(name)
        return v.strip() if v is not None and v.strip() else None

    names = [x.strip().lower() for x in (get("OTEL_METRICS_EXPORTER") or "otlp").split(",") if x.strip()]
    bad = [x for x in names if x not in EXPORTERS]
    if bad or not names:
        raise ConfigError(f"OTEL_METRICS_EXPORTER={get('OTEL_METRICS_EXPORTER')!r} must be one of "
                          f"{', '.join(EXPORTERS)}")
    exporter = "otlp" if "otlp" in names else "console" if "console" in names else "none"
    var = "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL" if get("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL") else \
        "OTEL_EXPORTER_OTLP_PROTOCOL"
    protocol = get(var) or "grpc"
    if protocol not in _PROTOCOLS:
        raise ConfigError(f"{var}={protocol!r} must be one of {', '.join(_PROTOCOLS)} (http/json is not supported)")
    raw = get("OTEL_METRIC_EXPORT_INTERVAL")
    interval = 60_000
    if raw is not None:
        try:
            interval = int(raw)
        except ValueError:
            raise ConfigError(f"OTEL_METRIC_EXPORT_INTERVAL={raw!r} is not an integer (milliseconds)") from None
        if not 100 <= interval <= 86_400_000:
            raise ConfigError(f"OTEL_METRIC_EXPORT_INTERVAL={raw!r} is out of range [100, 86400000] ms")
    return MetricsConfig(exporter, protocol, interval)


def metrics_resource(resource_attrs: Sequence[tuple[str, Any]] = ()) -> Any:
    """The agent's metrics resource: the node (service.instance.id, host.name) beside ``resource_attrs``."""
    from opentelemetry.sdk.resources import OTELResourceDetector, Resource

    attrs = dict(resource_attrs)
    given = OTELResourceDetector().detect().attributes  # OTEL_RESOURCE_ATTRIBUTES wins over what we detect
    if "service.instance.id" not in given:
        # Prometheus' `instance` label: without it two nodes' series of one communicator collide
        attrs["service.instance.id"] = socket.gethostname()
    if sc.HOST_NAME not in given:
        attrs[sc.HOST_NAME] = socket.gethostname()  # the node (target_info's host_name in Prometheus)
    return Resource.create(attrs)


def meter_provider(cfg: MetricsConfig, metrics: CollectiveMetrics, resource_attrs: Sequence[tuple[str, Any]] = (),
                   exporter: Any = None) -> Any:
    """An SDK MeterProvider whose periodic reader exports, per OTEL_*, the SDK's instruments and ``metrics``
    (``exporter``: a MetricExporter to use instead of the one OTEL_METRICS_EXPORTER names)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader

    resource = metrics_resource(resource_attrs)
    if exporter is not None:
        inner = exporter
    elif cfg.exporter == "console":
        inner = ConsoleMetricExporter()
    elif cfg.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        inner = OTLPMetricExporter()
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        inner = OTLPMetricExporter()
    reader = PeriodicExportingMetricReader(MergingExporter(inner, metrics, resource),
                                           export_interval_millis=cfg.interval_ms)
    provider = MeterProvider(resource=resource, metric_readers=[reader])
    metrics.register(provider)
    return provider
