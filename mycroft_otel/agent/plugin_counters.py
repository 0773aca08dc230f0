"""The plugin's own loss counters, read from each ring's shared-memory header, as node-wide agent metrics.

The plugin never blocks NCCL: what it cannot record it drops and counts in the ring's header
(``ShmHeader`` in native/include/mycroft/shm_layout.h). Those counts are per ring (one process,
communicator and rank) and vanish with the ring file; here they are summed per node into counters
that only go up: each poll adds what a ring's header gained since the last one, and a ring that
goes away keeps what it contributed. An agent restart starts the counters again (a new start
time), carrying what the rings it finds already hold.

=====================================  ==============  ======================================================
instrument (Prometheus)                unit            header field
=====================================  ==============  ======================================================
``mycroft.plugin.untracked_operations`` ``{operation}`` ``dropped_live_full``: no free live-table slot
(``mycroft_plugin_untracked_operations_total``)         (MYCROFT_LIVE_SLOTS too small for the operations in flight)
``mycroft.plugin.dropped_flows``       ``{flow}``      ``dropped_flows``: flows beyond the per-operation maximum
``mycroft.plugin.bad_descriptors``     ``{event}``     ``dropped_bad_descr``: event descriptors with out-of-range values
``mycroft.plugin.bad_handles``         ``{callback}``  ``bad_handle_by_kind``, attribute ``mycroft.plugin.callback``
                                                       (the callback kind; mostly late events of finished operations)
=====================================  ==============  ======================================================

Headers are hostile input (the training user writes them): a value is clamped to int64, a value
that goes down (a rewritten header) adds nothing, and the totals stop at int64's maximum.
"""

from __future__ import annotations

import threading
from typing import Any, Iterable, Iterator, Mapping

SCOPE_NAME = "mycroft_otel.agent.plugin"

UNTRACKED_OPERATIONS = "mycroft.plugin.untracked_operations"
DROPPED_FLOWS = "mycroft.plugin.dropped_flows"
BAD_DESCRIPTORS = "mycroft.plugin.bad_descriptors"
BAD_HANDLES = "mycroft.plugin.bad_handles"
ATTR_CALLBACK = "mycroft.plugin.callback"

# header field -> (instrument, unit, description)
SCALARS: dict[str, tuple[str, str, str]] = {
    "dropped_live_full": (UNTRACKED_OPERATIONS, "{operation}",
                          "NCCL operations the plugin could not track: no free live-table slot"),
    "dropped_flows": (DROPPED_FLOWS, "{flow}", "flows beyond the plugin's per-operation maximum, not recorded"),
    "dropped_bad_descr": (BAD_DESCRIPTORS, "{event}", "NCCL event descriptors with out-of-range values, ignored"),
}
BAD_HANDLE_UNIT = "{callback}"
BAD_HANDLE_DESCRIPTION = "NCCL callbacks whose handle the plugin could not use (mostly late events), by callback"
# shm_layout.h kBadHandleKindNames, in its order (tests/agent/test_plugin_counters.py holds them equal); spelled
# out so the agent's metrics do not need the native bindings loaded to exist
CALLBACK_KINDS: tuple[str, ...] = (
    "start_after_finalize", "kernel_ch_start", "kernel_ch_stop", "kernel_ch_state", "kernel_phase",
    "proxy_op_start", "proxy_op_end", "proxy_step_start", "proxy_step_end", "op_end", "other")

_INT64_MAX = (1 << 63) - 1
_FIELDS = tuple(SCALARS)
_N = len(_FIELDS) + len(CALLBACK_KINDS)


def _values(header: Mapping[str, Any]) -> list[int]:
    """The header's counters in a fixed order (scalars, then bad handles by kind), each in [0, int64 max]."""
    kinds = header.get("bad_handle_by_kind") or {}
    raw = [header.get(f, 0) for f in _FIELDS] + [kinds.get(k, 0) for k in CALLBACK_KINDS]
    out = []
    for v in raw:
        try:
            out.append(min(max(int(v), 0), _INT64_MAX))
        except (TypeError, ValueError):
            out.append(0)
    return out


class PluginCounters:
    """Node totals of the plugin's drop and bad-handle counters; ``observe`` from the poll loop, read anywhere."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[str, list[int]] = {}  # ring -> the counters its header showed last
        self._total = [0] * _N

    def observe(self, ring: str, header: Mapping[str, Any]) -> None:
        """Add what ``ring``'s header gained since it was last observed."""
        now = _values(header)
        with self._lock:
            last = self._last.get(ring, [0] * _N)
            for i, (a, b) in enumerate(zip(last, now)):
                if b > a:
                    self._total[i] = min(self._total[i] + (b - a), _INT64_MAX)
            self._last[ring] = now

    def forget(self, ring: str) -> None:
        """The ring is gone: stop following it (what it contributed stays in the totals)."""
        with self._lock:
            self._last.pop(ring, None)

    def totals(self) -> dict[str, Any]:
        """{instrument: total} for the scalars, and BAD_HANDLES: {callback kind: total}."""
        with self._lock:
            t = list(self._total)
        out: dict[str, Any] = {SCALARS[f][0]: t[i] for i, f in enumerate(_FIELDS)}
        out[BAD_HANDLES] = dict(zip(CALLBACK_KINDS, t[len(_FIELDS):]))
        return out

    # --- exposition ------------------------------------------------------------------------
    def register(self, meter_provider: Any) -> None:
        """Observable counters on ``meter_provider`` (every kind reported, zeros included: a rate needs them)."""
        from opentelemetry.metrics import Observation

        meter = meter_provider.get_meter(SCOPE_NAME)
        for name, unit, desc in SCALARS.values():
            meter.create_observable_counter(
                name, [(lambda n: (lambda _o: [Observation(self.totals()[n])]))(name)], unit=unit, description=desc)

        def bad(_options: Any) -> Iterable[Observation]:
            return [Observation(v, {ATTR_CALLBACK: k}) for k, v in self.totals()[BAD_HANDLES].items()]

        meter.create_observable_counter(BAD_HANDLES, [bad], unit=BAD_HANDLE_UNIT, description=BAD_HANDLE_DESCRIPTION)

    def collect(self) -> Iterator[Any]:
        """prometheus_client families, named as the OTel → Prometheus rules name the instruments above."""
        from prometheus_client.core import CounterMetricFamily

        t = self.totals()
        for name, _unit, desc in SCALARS.values():
            yield CounterMetricFamily(prometheus_name(name), desc, value=t[name])
        fam = CounterMetricFamily(prometheus_name(BAD_HANDLES), BAD_HANDLE_DESCRIPTION,
                                  labels=[prometheus_name(ATTR_CALLBACK)])
        for kind, v in t[BAD_HANDLES].items():
            fam.add_metric([kind], v)
        yield fam


def prometheus_name(otel_name: str) -> str:
    """Dots to underscores (units in braces add no suffix; prometheus_client appends ``_total`` to counters)."""
    return otel_name.replace(".", "_")
