"""The plugin's drop and bad-handle counters (shm header) as node-wide agent metrics (agent/plugin_counters.py)."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry, generate_latest

from mycroft_otel.agent import plugin_counters as pc
from agent_events import Rows, ring_allreduce
from agent_helpers import make_agent

_native = pytest.importorskip("mycroft_otel._native")


def _header(live_full: int = 0, **kinds: int) -> dict:
    return {"dropped_live_full": live_full, "dropped_flows": 0, "dropped_bad_descr": 0,
            "bad_handle_by_kind": {k: kinds.get(k, 0) for k in pc.CALLBACK_KINDS}}


def test_callback_kinds_are_the_plugins():
    assert pc.CALLBACK_KINDS == tuple(_native.BAD_HANDLE_KINDS)


def test_totals_only_go_up_and_outlive_their_ring():
    c = pc.PluginCounters()
    c.observe("a", _header(5, op_end=2))
    c.observe("a", _header(7, op_end=2))
    c.forget("a")  # the ring is gone: what it counted stays
    c.observe("b", _header(2))
    c.observe("b", _header(1, op_end=1 << 70))  # a rewritten header goes down (adds nothing) or absurdly up
    t = c.totals()
    assert t[pc.UNTRACKED_OPERATIONS] == 9
    assert t[pc.BAD_HANDLES]["op_end"] == (1 << 63) - 1  # clamped: an OTLP int64 point must stay encodable
    c.observe("b", _header(3))
    assert c.totals()[pc.UNTRACKED_OPERATIONS] == 11  # counted again from what the header last showed (1)


def test_real_plugin_drops_reach_otel_and_prometheus(tmp_path, otel_env):
    """One live slot, a collective left in flight: the next one is untracked and its proxy events are late handles."""
    from mycroft_otel.agent.source import default_reader_factory
    from mycroft_otel.native import Driver, plugin_path

    try:
        d = Driver(str(plugin_path()))
    except FileNotFoundError:
        pytest.skip("plugin not built")
    ring_dir = tmp_path / "rings"
    ring_dir.mkdir()
    ctx = d.init("tp", 0x99, 1, 2, 0, env={"MYCROFT_RING_DIR": str(ring_dir), "MYCROFT_LIVE_SLOTS": "1",
                                          "MYCROFT_JOB_ID": "j"})
    q = Rows()
    ring_allreduce(q, ctx, 0, 2, 0, stall_send_channel0_at=1)
    ring_allreduce(q, ctx, 0, 2, 1)
    d.replay(q.array())
    agent = make_agent(ring_dir, reader_factory=default_reader_factory, state_dir=str(tmp_path / "state"))
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    agent.plugin.register(provider)
    try:
        agent.poll_once()
        header = next(iter(agent.ctxs.values())).src.header
    finally:
        agent.close()
    assert header["dropped_live_full"] == 1 and header["bad_handle_by_kind"]["proxy_step_start"] > 0
    got = {m.name: m for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics
           for m in sm.metrics}
    untracked = got[pc.UNTRACKED_OPERATIONS]
    assert untracked.unit == "{operation}" and untracked.data.is_monotonic
    assert [p.value for p in untracked.data.data_points] == [1]
    bad = {p.attributes[pc.ATTR_CALLBACK]: p.value for p in got[pc.BAD_HANDLES].data.data_points}
    assert bad == header["bad_handle_by_kind"] and got[pc.BAD_HANDLES].unit == "{callback}"
    registry = CollectorRegistry()
    registry.register(agent.plugin)
    text = generate_latest(registry).decode()
    assert "mycroft_plugin_untracked_operations_total 1.0" in text
    n = header["bad_handle_by_kind"]["proxy_step_start"]
    assert f'mycroft_plugin_bad_handles_total{{mycroft_plugin_callback="proxy_step_start"}} {float(n)}' in text
    provider.shutdown()
