"""Collective metrics (mycroft_otel/agent/metrics.py): every completion aggregated, bounded, exported by the SDK."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (AggregationTemporality, MetricExporter, MetricExportResult,
                                              PeriodicExportingMetricReader)
from opentelemetry.sdk.resources import Resource

from mycroft_otel.agent import meter
from mycroft_otel.agent import metrics as am
from mycroft_otel.config import ConfigError
from agent_helpers import make_agent
from agent_shm import FakeRing

BROADCAST, ALLGATHER = 0, 2


class Capture(MetricExporter):
    """Keeps what the SDK's reader hands over (the test's view of an export)."""

    def __init__(self):
        super().__init__(preferred_temporality={}, preferred_aggregation={})
        self.batches = []

    def export(self, metrics_data, timeout_millis: float = 10_000, **kwargs):
        self.batches.append(metrics_data)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        pass


def _collected(ring_dir) -> dict:
    """The collective metrics of one poll of ``ring_dir``'s rings, through a real MeterProvider."""
    cm = am.CollectiveMetrics()
    provider, cap = _pipeline(cm)
    try:
        _poll(ring_dir, cm)
        provider.force_flush()
        return _metrics(cap)
    finally:
        provider.shutdown()


def _pipeline(cm: am.CollectiveMetrics):
    cap = Capture()
    resource = Resource.create({"service.name": "agent-test"})
    reader = PeriodicExportingMetricReader(meter.MergingExporter(cap, cm, resource), export_interval_millis=3_600_000)
    provider = MeterProvider(resource=resource, metric_readers=[reader])
    cm.register(provider)
    return provider, cap


def _poll(tmp_path, cm: am.CollectiveMetrics) -> None:
    """One poll of an agent over the rings in tmp_path that feeds cm; no span is sampled (metrics count all)."""
    agent = make_agent(tmp_path, sample_ratio=0.0)
    agent.metrics = cm
    try:
        agent.poll_once()
    finally:
        agent.close()


def _metrics(cap: Capture) -> dict:
    provider_out = {}
    for rm in cap.batches[-1].resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                provider_out[m.name] = m
    return provider_out


def test_every_completion_is_counted_not_only_sampled(tmp_path, otel_env):
    rings = [FakeRing(tmp_path / f"r{r}", rank=r, nranks=4, ring_capacity=256) for r in range(2)]
    for ring in rings:
        for _ in range(50):
            ring.op_done(dur_ns=1_000_000, count=1 << 18)   # 1 MiB all-reduce, 1 ms
        ring.op_done(dur_ns=3_000_000_000, func=BROADCAST, count=1 << 10)  # 4 KiB broadcast, 3 s
    live = rings[0].make_op()
    rings[0].begin(live)
    got = _collected(tmp_path)
    dur = got[am.DURATION]
    assert dur.unit == "s" and dur.data.aggregation_temporality == AggregationTemporality.CUMULATIVE
    points = {(p.attributes[am.ATTR_FUNC], p.attributes[am.ATTR_SIZE]): p for p in dur.data.data_points}
    assert set(points) == {("AllReduce", "1MiB"), ("Broadcast", "4KiB")}
    ar = points[("AllReduce", "1MiB")]
    assert ar.count == 100 and ar.attributes[am.ATTR_COMM] == "5f3a9c0e12ab44d1"  # both ranks, none sampled
    bounds = list(ar.explicit_bounds)
    # start_ns is 1 µs after the API call: 0.999 ms, the (0.5 ms, 1 ms] bucket
    assert ar.bucket_counts[bounds.index(1e-3)] == 100 and sum(ar.bucket_counts) == 100
    assert ar.sum == pytest.approx(100 * 0.999e-3)
    assert points[("Broadcast", "4KiB")].bucket_counts[bounds.index(5.0)] == 2
    bw = {(p.attributes[am.ATTR_FUNC]): p for p in got[am.BUS_BANDWIDTH].data.data_points}
    assert got[am.BUS_BANDWIDTH].unit == "By/s"
    # NCCL's busBw of an all-reduce on 4 ranks: bytes × 2(n-1)/n / time
    assert bw["AllReduce"].sum / bw["AllReduce"].count == pytest.approx((1 << 20) * 1.5 / 0.999e-3)
    assert bw["Broadcast"].sum / bw["Broadcast"].count == pytest.approx(4096 / (3.0 - 1e-6))
    waits = {(p.attributes[am.ATTR_PEER], p.attributes[am.ATTR_DIRECTION]): p.value
             for p in got[am.NETWORK_WAIT].data.data_points}
    # rank 0 sends to 1 and receives from 3, rank 1 sends to 2 and receives from 0 (2 channels each);
    # FakeRing's flows wait 2 µs × (flow index + 1) on the network
    assert waits[(1, "send")] == pytest.approx(51 * (2000 + 4000) / 1e9)
    assert waits[(3, "recv")] == pytest.approx(51 * (6000 + 8000) / 1e9)
    assert set(waits) == {(1, "send"), (3, "recv"), (2, "send"), (0, "recv")}
    assert got[am.NETWORK_WAIT].data.is_monotonic
    seqs = {p.attributes[am.ATTR_RANK]: p.value for p in got[am.LAST_SEQUENCE].data.data_points}
    assert seqs == {0: 50, 1: 50}
    inflight = {p.attributes[am.ATTR_RANK]: p.value for p in got[am.IN_FLIGHT].data.data_points}
    assert inflight == {0: 1, 1: 0}


def test_cardinality_caps_go_to_one_overflow_series(tmp_path, otel_env):
    rings = [FakeRing(tmp_path / f"r{c}", rank=0, nranks=2, comm_hash=0x1000 + c) for c in range(3)]
    for ring in rings:
        ring.op_done(count=1 << 10)
        ring.op_done(count=1 << 20, func=BROADCAST)  # a second series on each communicator
    cm = am.CollectiveMetrics(max_comms=2, max_ranks=2, max_peers=1)
    _poll(tmp_path, cm)
    dur = cm.histograms()[0]
    attrs = [dict(p.attributes) for p in dur.data.data_points]
    assert len(attrs) == 5
    assert {am.ATTR_OVERFLOW: True} in attrs
    assert len({a[am.ATTR_COMM] for a in attrs if am.ATTR_COMM in a}) == 2
    assert len(cm._last_seq) == 2  # the gauges stop at their cap
    over = [p for p in dur.data.data_points if am.ATTR_OVERFLOW in p.attributes]
    assert len(over) == 1 and over[0].count == 2  # one overflow series, whatever it holds


def test_allgather_busbw_is_per_rank_bytes_times_n_minus_1(tmp_path, otel_env):
    ring = FakeRing(tmp_path / "r0", rank=0, nranks=8)
    ring.op_done(func=ALLGATHER, dur_ns=2_000_000, count=1 << 20)
    cm = am.CollectiveMetrics()
    _poll(tmp_path, cm)
    bw = cm.histograms()[1].data.data_points[0]
    # the record's bytes are one rank's send buffer: busBw = (n-1) × that / time (nccl-tests' (n-1)/n of the total)
    assert bw.sum == pytest.approx(7 * (4 << 20) / (2e-3 - 1e-6))


def test_completions_are_folded_in_by_the_time_they_are_read(tmp_path, otel_env, monkeypatch):
    """A poll's few records wait as op records (no histogram work per poll); reading the histograms folds them in,
    and so does a communicator holding FOLD_RECORDS of them."""
    ring = FakeRing(tmp_path / "r0", rank=0, nranks=4)
    for _ in range(3):
        ring.op_done()
    cm = am.CollectiveMetrics()
    _poll(tmp_path, cm)
    c = next(iter(cm._comms.values()))
    assert c.pending == 3 and not c.duration
    assert [p.count for p in cm.histograms()[0].data.data_points] == [3] and c.pending == 0

    for _ in range(3):
        ring.op_done()
    monkeypatch.setattr(am, "FOLD_RECORDS", 2)
    _poll(tmp_path, cm)
    assert c.pending == 0 and sum(int(h.counts.sum()) for h in c.duration.values()) == 6


def test_overflow_series_takes_each_communicators_own_rank_count_for_bus_bandwidth(tmp_path, otel_env):
    """Communicators over the cap share one series, but each completion's busBw uses its own communicator's size."""
    FakeRing(tmp_path / "a", rank=0, nranks=4, comm_hash=0x1).op_done(func=ALLGATHER, dur_ns=2_000_000, count=1 << 20)
    FakeRing(tmp_path / "b", rank=0, nranks=2, comm_hash=0x2).op_done(func=ALLGATHER, dur_ns=2_000_000, count=1 << 20)
    FakeRing(tmp_path / "c", rank=0, nranks=8, comm_hash=0x3).op_done(func=ALLGATHER, dur_ns=2_000_000, count=1 << 20)
    cm = am.CollectiveMetrics(max_comms=1)
    _poll(tmp_path, cm)
    over = [p for p in cm.histograms()[1].data.data_points if am.ATTR_OVERFLOW in p.attributes]
    kept = [p for p in cm.histograms()[1].data.data_points if am.ATTR_OVERFLOW not in p.attributes]
    assert len(over) == 1 and over[0].count == 2 and len(kept) == 1
    n_kept = {0x1: 4, 0x2: 2, 0x3: 8}[int(kept[0].attributes[am.ATTR_COMM], 16)]
    per_rank_step = (4 << 20) / (2e-3 - 1e-6)  # (n - 1) x this each (test_allgather_busbw_...)
    assert over[0].sum == pytest.approx((4 - 1 + 2 - 1 + 8 - 1 - (n_kept - 1)) * per_rank_step)


def test_every_series_names_its_job_and_communicator_kind(tmp_path, otel_env):
    """Job id and where the communicator's ranks are (NCCL's node count) on every collective series."""
    FakeRing(tmp_path / "tp", rank=0, nranks=8, comm_hash=0x11, job_id="job-7", nnodes=1).op_done()
    FakeRing(tmp_path / "dp", rank=0, nranks=4, comm_hash=0x22, job_id="job-7", nnodes=4).op_done()
    FakeRing(tmp_path / "unk", rank=0, nranks=2, comm_hash=0x33, job_id="job-7", nnodes=0).op_done()
    got = _collected(tmp_path)
    kinds = {"0000000000000011": "intra_node", "0000000000000022": "inter_node", "0000000000000033": None}
    for name in (am.DURATION, am.BUS_BANDWIDTH, am.NETWORK_WAIT, am.IN_FLIGHT, am.LAST_SEQUENCE):
        points = got[name].data.data_points
        assert {p.attributes[am.ATTR_COMM] for p in points} == set(kinds), name
        for p in points:
            assert p.attributes[am.ATTR_JOB] == "job-7", name
            assert p.attributes.get(am.ATTR_KIND) == kinds[p.attributes[am.ATTR_COMM]], name


def test_the_node_is_the_metrics_resource(monkeypatch):
    import socket

    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    attrs = meter.metrics_resource([("service.name", "a")]).attributes
    assert attrs["host.name"] == socket.gethostname() == attrs["service.instance.id"]
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "host.name=n7")
    assert meter.metrics_resource().attributes["host.name"] == "n7"  # the operator's word wins


def test_comm_kind_from_node_count():
    assert [am.comm_kind(n) for n in (-1, 0, 1, 2, 64)] == [None, None, "intra_node", "inter_node", "inter_node"]


def test_size_buckets():
    assert am.size_bucket(0) == "1KiB" and am.size_bucket(1024) == "1KiB" and am.size_bucket(1025) == "4KiB"
    assert am.size_bucket(1 << 20) == "1MiB" and am.size_bucket(4 << 30) == "4GiB"
    assert am.size_bucket((4 << 30) + 1) == "inf"


@pytest.mark.parametrize("env,match", [
    ({"OTEL_METRICS_EXPORTER": "prometheus"}, "OTEL_METRICS_EXPORTER='prometheus' must be one of otlp, console, none"),
    ({"OTEL_METRICS_EXPORTER": "otlp", "OTEL_METRIC_EXPORT_INTERVAL": "5s"}, "OTEL_METRIC_EXPORT_INTERVAL='5s'"),
    ({"OTEL_METRICS_EXPORTER": "otlp", "OTEL_METRIC_EXPORT_INTERVAL": "10"}, "out of range"),
    ({"OTEL_METRICS_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/json"},
     "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL='http/json'"),
])
def test_bad_settings_are_named(env, match):
    with pytest.raises(ConfigError, match=match):
        meter.metrics_config(env)


def test_settings():
    # the OpenTelemetry specification's default exporter is otlp; none turns metrics off
    assert meter.metrics_config({}).exporter == "otlp" and meter.metrics_config({}).enabled
    assert meter.MetricsConfig().exporter == "otlp"
    assert not meter.metrics_config({"OTEL_METRICS_EXPORTER": "none"}).enabled
    assert meter.metrics_config({"OTEL_METRICS_EXPORTER": "console"}).exporter == "console"
    cfg = meter.metrics_config({"OTEL_METRICS_EXPORTER": "otlp", "OTEL_METRIC_EXPORT_INTERVAL": "1000",
                             "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"})
    assert (cfg.exporter, cfg.protocol, cfg.interval_ms) == ("otlp", "http/protobuf", 1000)


def test_agent_cli_names_a_bad_metrics_variable(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MYCROFT_"))}
    env.update(OTEL_METRICS_EXPORTER="otlp", OTEL_METRIC_EXPORT_INTERVAL="soon", PYTHONPATH=str(repo))
    out = subprocess.run([sys.executable, "-m", "mycroft_otel", "agent", "--once", "--ring-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert out.returncode == 2 and "OTEL_METRIC_EXPORT_INTERVAL='soon'" in out.stderr, out.stderr


def test_hostile_records_stay_bounded(tmp_path, otel_env):
    """A ring is hostile input: absurd peers, sizes, times and function codes neither blow up nor go unbounded."""
    ring = FakeRing(tmp_path / "r0", rank=0, nranks=4, ring_capacity=256)
    for i in range(100):
        rec = ring.make_op(start_ns=1000, end_ns=2000 + i, func=200 + (i % 50), count=(1 << 61) + i)
        rec["flows"][0]["peer"] = (1 << 31) - 1 - i  # int32 peers near the top
        ring.complete(rec)
    bad = ring.make_op(start_ns=5000, end_ns=10)  # ends before it starts: not a duration
    ring.complete(bad)
    many = ring.make_op(start_ns=1000, end_ns=3000, func=250, count=1 << 61)
    many["op"]["n_flows"] = 255  # more flows than the record has slots (64)
    ring.complete(many)
    cm = am.CollectiveMetrics(max_peers=8)
    _poll(tmp_path, cm)
    dur = cm.histograms()[0]
    assert sum(p.count for p in dur.data.data_points) == 101
    assert len(dur.data.data_points) == 1  # 50 unknown function codes: one series, not 50 with one label set
    assert {p.attributes[am.ATTR_FUNC] for p in dur.data.data_points} == {"Unknown"}
    assert {p.attributes[am.ATTR_SIZE] for p in dur.data.data_points} == {"inf"}
    waits = cm._comms["5f3a9c0e12ab44d1"].net_wait_ns
    assert len(waits) <= 2 * 8 + 1 and (-1, -1) in waits  # capped, the rest in the overflow series


def test_instrument_exports_the_agents_collective_metrics(tmp_path, otel_env, monkeypatch):
    """instrument() (in-process) exports what `mycroft-otel agent` does: collective, health and plugin metrics."""
    import time

    import mycroft_otel.agent.agent as agent_mod
    from agent_shm import FakeReader
    from mycroft_otel.agent import plugin_counters as pc
    from mycroft_otel.agent.instrumentor import NcclInstrumentor
    from mycroft_otel.agent.settings import AgentSettings

    monkeypatch.setenv("NCCL_PROFILER_PLUGIN", "/nonexistent")  # keep the process's own setting untouched
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "3600000")  # only the shutdown's export
    monkeypatch.setattr(agent_mod, "default_reader_factory", FakeReader)
    ring = FakeRing(tmp_path / "r0", rank=0, nranks=2, job_id="job-9")
    env = dict(__import__("os").environ, MYCROFT_RING_DIR=str(tmp_path), MYCROFT_POLL_MS="20",
               MYCROFT_STATE_DIR=str(tmp_path.parent / (tmp_path.name + ".state")))
    cap = Capture()
    inst = NcclInstrumentor()
    inst.instrument(settings=AgentSettings.from_env(env), metric_exporter=cap)
    try:
        for _ in range(3):
            ring.op_done()
        deadline = time.monotonic() + 10
        while inst.agent.health.records_read < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        inst.uninstrument()
    got = _metrics(cap)
    dur = got[am.DURATION].data.data_points
    assert sum(p.count for p in dur) == 3 and {p.attributes[am.ATTR_JOB] for p in dur} == {"job-9"}
    assert am.LAST_SEQUENCE in got and am.NETWORK_WAIT in got
    assert got["mycroft.agent.records_read"].data.data_points[0].value == 3
    assert pc.UNTRACKED_OPERATIONS in got and pc.BAD_HANDLES in got


def test_duration_exemplars_link_exported_spans_not_labels(tmp_path, otel_env):
    """Exported operations are the duration histogram's exemplars (trace id + op span id); unexported are not."""
    ring = FakeRing(tmp_path / "r0", rank=0, nranks=2)
    for _ in range(3):
        ring.op_done(dur_ns=1_000_000, count=1 << 18)
    ring.op_done(dur_ns=3_000_000_000, func=BROADCAST, count=1 << 10)
    cm = am.CollectiveMetrics()
    agent = make_agent(tmp_path, sample_ratio=1.0)
    agent.metrics = cm
    try:
        agent.poll_once()
        assert agent.queue.flush(10)
    finally:
        agent.close()
    spans = {(s["trace_id"], s["span_id"]) for s in otel_env.sink.spans if s["name"].startswith("nccl.")}
    points = {p.attributes[am.ATTR_FUNC]: p for p in cm.histograms()[0].data.data_points}
    ar, bc = points["AllReduce"], points["Broadcast"]
    assert len(ar.exemplars) == 1 and len(bc.exemplars) == 1  # one per bucket: the latest there
    for p in (ar, bc):
        ex = p.exemplars[0]
        assert (ex.trace_id, ex.span_id) in spans and not ex.filtered_attributes
        assert ex.time_unix_nano > 1_600_000_000 * 10 ** 9  # wall-clock time, not the ring's monotonic clock
        assert not {k for k in p.attributes if "trace" in k}
    assert bc.exemplars[0].value == pytest.approx(3.0 - 1e-6)
    assert cm.histograms()[1].data.data_points[0].exemplars == []  # bandwidth: none (duration carries them)


def test_unexported_operations_are_no_exemplars(tmp_path, otel_env):
    ring = FakeRing(tmp_path / "r0", rank=0, nranks=2)
    for _ in range(3):
        ring.op_done()
    cm = am.CollectiveMetrics()
    agent = make_agent(tmp_path, sample_ratio=0.0)
    agent.metrics = cm
    try:
        agent.poll_once()
        kept = agent.health.spans_built
    finally:
        agent.close()
    points = cm.histograms()[0].data.data_points
    assert sum(p.count for p in points) == 3
    assert kept == 0 and sum(len(p.exemplars) for p in points) == 0, kept
