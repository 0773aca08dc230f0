"""Volume control: slow and late anomalies, consistent sampling, summaries; HTTP export; instrumentor."""

from __future__ import annotations

import http.server
import threading
import time

import numpy as np
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from mycroft_otel import ids
from mycroft_otel import semconv as sc
from mycroft_otel.agent.sampling import Baselines, FlowRule, sample_bound, sampled
from mycroft_otel.native import FLOW_DTYPE
from agent_helpers import make_agent
from agent_shm import KIND_RECV, KIND_SEND, RECV, SEND, FakeReader, FakeRing

JOB, COMM = "job-1", 0x5F3A9C0E12AB44D1
MS = 1_000_000


def test_baselines_slow_and_late():
    b = Baselines(factor=2.0, warmup=4, min_excess_ns=MS)
    t = 0
    for _ in range(6):  # steady: 10 ms gap, 5 ms op
        t += 10 * MS
        assert b.classify(4, 1 << 20, t, t + 5 * MS) is None
        t += 5 * MS
    t += 10 * MS
    an = b.classify(4, 1 << 20, t, t + 15 * MS)  # slow: 15 ms >= 2 x 5 ms
    assert an[0] == sc.ANOMALY_SLOW and abs(an[1] - 5 * MS) < MS
    t += 15 * MS + 40 * MS  # late: 40 ms gap >= 2 x 10 ms, own op short
    an = b.classify(4, 1 << 20, t, t + 1 * MS)
    assert an[0] == sc.ANOMALY_LATE and an[2] == 40 * MS
    # sub-millisecond jitter is never anomalous (absolute floor)
    b2 = Baselines(factor=2.0, warmup=2, min_excess_ns=MS)
    for i in range(10):
        assert b2.classify(4, 8, i * 1000, i * 1000 + (10 if i % 2 else 100)) is None


class _History:
    """A native rule's running baseline, written out as sampling.py documents it: seeded by the median (and median
    absolute deviation) of the first ``seed`` values, then a mean and mean absolute deviation (alpha) and a fast
    mean (alpha 0.3)."""

    def __init__(self, seed: int = 8) -> None:
        self.n, self.value, self.dev, self.fast, self.first, self.seed = 0, 0.0, 0.0, 0.0, [], max(1, seed)

    def add(self, x: float, alpha: float) -> None:
        self.n += 1
        if self.first is not None:
            self.first.append(x)
            v = sorted(self.first)
            self.value = self.fast = v[len(v) // 2]
            self.dev = sorted(abs(y - self.value) for y in v)[len(v) // 2]
            if len(v) >= self.seed:
                self.first = None
            return
        self.dev += alpha * (abs(x - self.value) - self.dev)
        self.value += alpha * (x - self.value)
        self.fast += 0.3 * (x - self.fast)


class _ReferenceBaselines:
    """sampling.Baselines' rule written out (factor, warmup, floor, alpha 0.1, k_dev 4): what the native one must
    answer, op by op."""

    def __init__(self, factor: float, warmup: int, floor: int) -> None:
        self.f, self.w, self.floor, self.dur, self.gap, self.prev_end = factor, warmup, floor, {}, {}, 0

    def _exceeds(self, e: _History, x: float) -> bool:
        return x >= self.f * e.value and x - e.value >= max(self.floor, 4 * e.dev)

    def _shifted(self, e: _History) -> bool:
        return e.fast >= self.f * e.value and e.fast - e.value >= self.floor

    def _update(self, e: _History, x: float) -> None:
        if e.n >= self.w:
            e.add(min(x, 2 * self.f * e.value), 0.1 / 4 if self._shifted(e) else 0.1)
        else:
            e.add(x, 0.1)

    def classify(self, func: int, nbytes: int, arrive: int, end: int):
        key = (func, nbytes.bit_length())
        dur, gap = end - arrive, (arrive - self.prev_end if self.prev_end and arrive > self.prev_end else None)
        self.prev_end = max(self.prev_end, end)
        d = self.dur.setdefault(key, _History(self.w))
        warm, result = d.n >= self.w, None
        if gap is not None:
            g = self.gap.setdefault(key, _History(self.w))
            if g.n >= self.w and self._exceeds(g, gap):
                result = (sc.ANOMALY_LATE, int(g.value), gap)
            self._update(g, gap)
        base, outlier = d.value, warm and self._exceeds(d, dur)
        if dur >= 0:
            self._update(d, dur)
        if result is None and (outlier or (warm and self._shifted(d) and dur >= self.f * d.value)):
            result = (sc.ANOMALY_SLOW, int(base), None)
        return result

    def unusual_idle(self, idle: int) -> bool:
        usual = [e.value + 4 * e.dev for e in self.gap.values() if e.n >= self.w]
        return bool(usual) and idle >= self.f * max(max(usual), self.floor)


def test_baselines_answer_as_their_rule_says_op_by_op():
    """The native rule against its rule written out: warm-up, jitter, slow regimes and their absorption, late
    arrivals, several functions and sizes, idle checks; every answer the same."""
    rng = np.random.default_rng(17)
    for factor, warmup in ((2.0, 4), (3.0, 8), (1.5, 1)):
        got, ref = Baselines(factor, warmup, MS), _ReferenceBaselines(factor, warmup, MS)
        t = 10**12
        for i in range(4000):
            func, nbytes = int(rng.integers(0, 3)), int(rng.choice([8, 1 << 20, 1 << 26]))
            slow = 6 if 1000 <= i < 1600 else 1
            t += int(rng.lognormal(np.log(2 * MS), 0.4) * (25 if rng.random() < 0.02 else 1))
            dur = int(rng.lognormal(np.log(5 * MS), 0.3) * slow)
            if rng.random() < 0.01:
                dur = -int(rng.integers(1, MS))  # a clock read out of order: no duration to learn
            assert got.classify(func, nbytes, t, t + dur) == ref.classify(func, nbytes, t, t + dur), (factor, i)
            idle = int(rng.lognormal(np.log(20 * MS), 1.0))
            assert got.unusual_idle(idle) == ref.unusual_idle(idle), (factor, i)
            t += max(dur, 0)


def test_baselines_take_any_ring_times_and_stay_bounded():
    """A ring file is another process's: times anywhere in uint64, out of order, or 0 answer without raising, and
    ever new sizes keep the tables bounded."""
    b = Baselines(2.0, 2, MS, max_keys=4)
    top = (1 << 64) - 1
    for arrive, end in ((top, 0), (0, top), (top, top), (5, 3), (top - 1, top)):
        an = b.classify(4, 1 << 20, arrive, end)
        assert an is None or an[0] in (sc.ANOMALY_SLOW, sc.ANOMALY_LATE)
    assert isinstance(b.unusual_idle(top), bool)
    for k in range(64):
        b.classify(4, 1 << k, 10**9 * k, 10**9 * k + MS)
    assert b.keys <= 2 * 4


def _gpu_flows(wait_per_step_ns: float) -> np.ndarray:
    """One receive and one send flow of 8 steps; the receive side's GPU waited this long per step."""
    f = np.zeros(2, dtype=FLOW_DTYPE)
    f["n_steps"] = 8
    f["dir"] = [1, 0]
    f["peer"] = [1, 2]
    f["gpu_wait_ns"][0] = f["gpu_busy_ns"][0] = int(8 * wait_per_step_ns)
    f["net_wait_ns"][1] = f["net_busy_ns"][1] = 8 * 10_000
    return f


def test_flow_rule_keeps_a_sustained_slowdown_flagged_then_absorbs_it():
    rng = np.random.default_rng(3)
    rule = FlowRule()
    healthy = [rule.classify(4, 1 << 22, _gpu_flows(rng.lognormal(np.log(15e3), 0.3))) for _ in range(40)]
    assert sum(healthy) <= 2
    # a GPU 25x slower from now on: flagged long enough for the processor to see it recur ...
    slow = [rule.classify(4, 1 << 22, _gpu_flows(375e3 * rng.uniform(0.9, 1.1))) for _ in range(300)]
    assert all(slow[:40]), slow.index(False)
    # ... yet a lasting new regime is not flagged forever
    assert not any(slow[-50:])


def _send_flows(net_per_step_ns: list[float]) -> np.ndarray:
    """A rank's send flows of 8 steps, one per channel to peer 1, with these network waits per step, and a
    healthy receive flow; as the agent reads them: a row of a ring batch's (records x MAX_FLOWS) flows."""
    rows = np.zeros((3, 8), dtype=FLOW_DTYPE)
    n = len(net_per_step_ns) + 1
    f = rows[1, :n]
    f["n_steps"] = 8
    f["dir"] = [0] * (n - 1) + [1]
    f["channel"] = list(range(n - 1)) + [0]
    f["peer"] = [1] * (n - 1) + [3]
    f["net_busy_ns"][:n - 1] = [int(8 * x) for x in net_per_step_ns]
    f["gpu_busy_ns"][n - 1] = 8 * 15_000
    return f


def test_flow_rule_names_what_moved_by_its_own_history_and_siblings():
    rng = np.random.default_rng(5)

    def healthy(k: int = 4) -> list[float]:
        return list(100e3 * rng.uniform(0.95, 1.05, k))

    rule = FlowRule()
    assert not any(rule.classify(4, 1 << 22, _send_flows(healthy())) for _ in range(30))
    # one channel 10x slower than its own history and its siblings: a slow flow
    assert rule.classify(4, 1 << 22, _send_flows([1e6] + healthy(3)))
    # every channel 10x slower: no flow stands out from its siblings, the least-waiting one is the NIC's
    nic = FlowRule()
    for _ in range(30):
        nic.classify(4, 1 << 22, _send_flows(healthy()))
    assert nic.classify(4, 1 << 22, _send_flows([1e6] * 4))
    # a size bucket has its own history: a 10x larger message's first ops are its warm-up, not slow
    assert not any(nic.classify(4, 1 << 26, _send_flows([1e6] * 4)) for _ in range(8))


def test_flow_rule_histories_are_the_baselines_running_means():
    """The native rule keeps its histories as sampling.py documents them (seeded by a median, then alpha, and
    alpha / 16 clipped while above): the same flags as those histories give, op by op, through warm-up, a
    slowdown and its absorption."""
    rng = np.random.default_rng(11)
    rule, gpu, nic = FlowRule(), _History(8), _History(8)

    def check(e: _History, x: float) -> bool:  # FlowRule's test on one history (factor 3, 20 us floor, alpha 0.1)
        if e.n < 8:
            e.add(x, 0.1)
            return False
        hit = x >= 3 * e.value and x - e.value >= max(20_000, 4 * e.dev)
        e.add(min(x, 6 * e.value), 0.1 / 16 if hit else 0.1)
        return hit

    flags = []
    for i in range(600):
        wait = 15e3 * rng.lognormal(0, 0.3) * (25 if 100 <= i < 400 else 1)
        f = _gpu_flows(wait)
        ref_gpu = check(gpu, int(f["gpu_busy_ns"][0]) / 8)
        ref_nic = check(nic, int(f["net_busy_ns"][1]) / 8)
        got = rule.classify(4, 1 << 22, f)
        assert got == (ref_gpu or ref_nic), i
        flags.append(got)
    assert any(flags[100:140]) and not any(flags[500:])


def test_flow_rule_reads_ring_rows_refuses_other_records_and_stays_bounded():
    rule = FlowRule(warmup=2, max_keys=4)
    contiguous = np.ascontiguousarray(_send_flows([100e3, 100e3]))
    assert rule.classify(4, 1 << 20, contiguous) is False
    assert rule.classify(4, 1 << 20, contiguous[:0]) is False  # no flows: nothing learnt
    for peer in range(50):  # a rank whose flows lead to ever new peers (hostile or buggy input)
        f = _send_flows([100e3, 100e3])
        f["peer"][:2] = peer
        rule.classify(4, 1 << 20, f)
    assert rule.keys <= 3 * 4
    with pytest.raises(TypeError, match="FLOW_DTYPE"):
        rule.classify(4, 1 << 20, np.zeros(4, dtype=np.int64))
    with pytest.raises(TypeError, match="FLOW_DTYPE"):
        rule.classify(4, 1 << 20, np.zeros((2, 2), dtype=FLOW_DTYPE))


def test_sampling_is_consistent_across_ranks(tmp_path, otel_env):
    n, colls = 4, 400
    rings = [FakeRing(tmp_path / f"r{r}", rank=r, nranks=n, ring_capacity=512) for r in range(n)]
    for _ in range(colls):
        for ring in rings:
            ring.op_done(dur_ns=2 * MS)
    agent = make_agent(tmp_path, sample_ratio=0.05, summary_ms=100)
    agent.poll_once()
    time.sleep(0.15)
    agent.poll_once()  # closes the summary window
    assert agent.queue.flush(10)
    spans = otel_env.sink.named("nccl.AllReduce")
    bound = sample_bound(0.05)
    healthy = {s["attrs"][sc.COLL_SEQ] for s in spans if sc.ANOMALY not in s["attrs"]}
    want = {q for q in range(colls) if sampled(ids.coll_trace_id(JOB, COMM, q), bound)}
    flagged = {s["attrs"][sc.COLL_SEQ] for s in spans if sc.ANOMALY in s["attrs"]}
    assert want <= healthy and healthy - want <= flagged  # extras: local peers of a flagged collective
    assert 5 <= len(want) <= 40
    for q in want:  # every rank keeps the same collectives
        assert sorted(s["attrs"][sc.RANK] for s in spans if s["attrs"][sc.COLL_SEQ] == q) == list(range(n))
    summaries = otel_env.sink.named(sc.SUMMARY_SPAN)
    assert len(summaries) == n
    for s in summaries:
        a = s["attrs"]
        assert a[sc.SUMMARY_OPS] == colls and a[sc.SUMMARY_SEQ_FIRST] == 0 and a[sc.SUMMARY_SEQ_LAST] == colls - 1
        assert a[sc.SUMMARY_FUNCS] == ["AllReduce"] and a[sc.SUMMARY_FUNC_OPS] == [colls]
        assert a[sc.SUMMARY_EXPORTED] >= len(want) and a[sc.SUMMARY_BYTES] == colls * (4 << 20)
        assert s["start"] == a[sc.SUMMARY_WINDOW_START] < s["end"]
    agent.close()


def test_slow_and_late_are_exported_unsampled(tmp_path, otel_env):
    ring = FakeRing(tmp_path / "r0", rank=0, nranks=2)
    t = time.monotonic_ns() - 450 * MS  # the last op ends just now: the rank is not idle (no status, no recent ops)
    for i in range(20):
        rec = ring.make_op(start_ns=t, end_ns=t + 5 * MS)
        ring.complete(rec)
        t += 5 * MS + 10 * MS
    ring.complete(ring.make_op(start_ns=t, end_ns=t + 30 * MS))  # slow, seq 20
    t += 30 * MS + 100 * MS
    ring.complete(ring.make_op(start_ns=t, end_ns=t + 5 * MS))  # late, seq 21
    agent = make_agent(tmp_path, sample_ratio=0.0)
    agent.poll_once()
    assert agent.queue.flush(10)
    got = {s["attrs"][sc.COLL_SEQ]: s["attrs"] for s in otel_env.sink.named("nccl.AllReduce")}
    assert set(got) == {20, 21}
    assert got[20][sc.ANOMALY] == sc.ANOMALY_SLOW and abs(got[20][sc.BASELINE_NS] - 5 * MS) < MS
    assert got[21][sc.ANOMALY] == sc.ANOMALY_LATE and got[21][sc.GAP_NS] >= 100 * MS
    agent.close()


def test_chunk_detail_adds_flow_events(tmp_path, otel_env):
    ring = FakeRing(tmp_path / "r0", rank=0, nranks=2)
    ring.op_done()
    agent = make_agent(tmp_path, sample_ratio=1.0, detail="chunk")
    agent.poll_once()
    assert agent.queue.flush(10)
    ev = otel_env.sink.named("nccl.AllReduce")[0]["events"]
    names = [e[0] for e in ev]
    assert names.count("mycroft.flow.start") == 4 and names.count("mycroft.flow.end") == 4
    assert all(e[2][sc.FLOW_DONE] == 8 for e in ev)
    agent.close()


class _HttpSink(http.server.BaseHTTPRequestHandler):
    spans: list = []

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        assert self.path == "/v1/traces" and self.headers["Content-Type"] == "application/x-protobuf"
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        for rs in req.resource_spans:
            for ss in rs.scope_spans:
                _HttpSink.spans.extend(s.name for s in ss.spans)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()
        self.wfile.write(b"")

    def log_message(self, *a):
        pass


def test_http_protobuf_export(tmp_path, otel_env, monkeypatch):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _HttpSink)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{srv.server_address[1]}")
        ring = FakeRing(tmp_path / "r0", rank=0, nranks=2)
        for _ in range(5):
            ring.op_done()
        agent = make_agent(tmp_path, sample_ratio=1.0)
        agent.poll_once()
        assert agent.queue.flush(10)
        agent.close()
        assert _HttpSink.spans.count("nccl.AllReduce") == 5
    finally:
        srv.shutdown()


def test_instrumentor_sets_plugin_and_runs(tmp_path, otel_env, monkeypatch):
    from mycroft_otel.agent.instrumentor import NcclInstrumentor
    from mycroft_otel.agent.settings import AgentSettings
    import os

    monkeypatch.delenv("NCCL_PROFILER_PLUGIN", raising=False)
    ring = FakeRing(tmp_path / "r0", rank=0, nranks=2)
    other = FakeRing(tmp_path / "r1", rank=1, nranks=2, pid=1)  # another process's ring: not followed
    other.op_done()
    env = dict(os.environ, MYCROFT_RING_DIR=str(tmp_path), MYCROFT_SAMPLE_RATIO="1", MYCROFT_POLL_MS="20")
    inst = NcclInstrumentor()
    import mycroft_otel.agent.source as source_mod
    monkeypatch.setattr(source_mod, "default_reader_factory", FakeReader)
    import mycroft_otel.agent.agent as agent_mod
    monkeypatch.setattr(agent_mod, "default_reader_factory", FakeReader)
    inst.instrument(settings=AgentSettings.from_env(env))
    try:
        ring.op_done()
        assert otel_env.sink.wait_for(lambda s: any(x["name"] == "nccl.AllReduce" for x in s), timeout=5)
        time.sleep(0.1)
        assert {s["attrs"][sc.RANK] for s in otel_env.sink.named("nccl.AllReduce")} == {0}
        try:
            from mycroft_otel.paths import plugin_path
            assert os.environ["NCCL_PROFILER_PLUGIN"] == str(plugin_path())
        except FileNotFoundError:
            pass
    finally:
        inst.uninstrument()
    assert inst.agent is None


def test_otel_headers_and_gzip_over_grpc(tmp_path, otel_env, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=team-a,authorization=Bearer%20t0k")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
    ring = FakeRing(tmp_path / "r0", rank=0, nranks=2)
    ring.op_done()
    agent = make_agent(tmp_path, sample_ratio=1.0)
    agent.poll_once()
    assert agent.queue.flush(10)
    agent.close()
    assert len(otel_env.sink.named("nccl.AllReduce")) == 1
    md = otel_env.sink.metadata
    assert md["x-tenant"] == "team-a" and md["authorization"] == "Bearer t0k"
    # (gzip itself is negotiated below what a Python servicer sees; the request decoded fine)


def test_health_as_otel_metrics():
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from mycroft_otel.agent.health import Health, register_otel_metrics

    reader = InMemoryMetricReader()
    h = Health(records_read=11, export_errors=2, queue_spans=5, export_lag_s=1.5)
    register_otel_metrics(h, MeterProvider(metric_readers=[reader]))
    data = reader.get_metrics_data()
    metrics = {m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    got = {name: m.data.data_points[0].value for name, m in metrics.items()}
    assert got["mycroft.agent.records_read"] == 11 and got["mycroft.agent.export_errors"] == 2
    assert got["mycroft.agent.queue_spans"] == 5
    # units in the unit field, not in the name
    assert got["mycroft.agent.export_lag"] == 1.5 and metrics["mycroft.agent.export_lag"].unit == "s"
    assert metrics["mycroft.agent.poll_duration"].unit == "s" and metrics["mycroft.agent.records_read"].unit == "{record}"
    assert not [n for n in metrics if n.endswith("_s")]
    assert all(m.unit for m in metrics.values())


def test_health_prometheus_names_follow_the_otel_rules():
    """The agent's own /metrics names are what the gateway's exporter makes of the OTel instruments."""
    from mycroft_otel.agent.health import Health

    text = Health(export_lag_s=0.25, polls=3).prometheus_text()
    assert "mycroft_agent_export_lag_seconds 0.25" in text and "mycroft_agent_poll_duration_seconds 0.0" in text
    assert "mycroft_agent_polls_total 3" in text and "_s " not in text


def test_local_peers_of_an_anomalous_collective_are_exported(tmp_path, otel_env):
    rings = [FakeRing(tmp_path / f"r{r}", rank=r, nranks=3) for r in range(3)]
    t = time.monotonic_ns() - 10_000 * MS
    for q in range(21):
        for r, ring in enumerate(rings):
            dur = 40 * MS if (q == 20 and r == 1) else 5 * MS  # only rank 1's rule will see seq 20 as slow
            ring.complete(ring.make_op(seq=q, start_ns=t, end_ns=t + dur))
        t += 60 * MS
    agent = make_agent(tmp_path, sample_ratio=0.0)
    agent.poll_once()
    assert agent.queue.flush(10)
    got = {(s["attrs"][sc.COLL_SEQ], s["attrs"][sc.RANK]): s["attrs"].get(sc.ANOMALY)
           for s in otel_env.sink.named("nccl.AllReduce")}
    assert got == {(20, 0): None, (20, 1): sc.ANOMALY_SLOW, (20, 2): None}
    agent.close()


def test_the_other_end_of_an_anomalous_transfer_is_exported(tmp_path, otel_env):
    """A slow Send flags itself; the Recv it fed (another local rank, not slow by its own rule) goes out with it,
    in the transfer's trace: one end alone cannot be compared with anything."""
    send = FakeRing(tmp_path / "s", rank=0, nranks=2)
    recv = FakeRing(tmp_path / "r", rank=1, nranks=2)
    t = time.monotonic_ns() - 10_000 * MS
    for n in range(21):
        dur = 40 * MS if n == 20 else 5 * MS
        send.complete(send.make_op(kind=KIND_SEND, func=SEND, peer=1, start_ns=t, end_ns=t + dur))
        recv.complete(recv.make_op(kind=KIND_RECV, func=RECV, peer=0, start_ns=t + dur - 5 * MS, end_ns=t + dur))
        t += 60 * MS
    agent = make_agent(tmp_path, sample_ratio=0.0)
    agent.poll_once()
    assert agent.queue.flush(10)
    trace = ids.p2p_trace_id(JOB, COMM, 0, 1, 20)
    got = {(s["name"], s["attrs"][sc.RANK]): s["attrs"].get(sc.ANOMALY)
           for s in otel_env.sink.spans if s["trace_id"] == trace}
    assert got == {("nccl.Send", 0): sc.ANOMALY_SLOW, ("nccl.Recv", 1): None}
    assert {s["trace_id"] for s in otel_env.sink.spans if s["name"] in ("nccl.Send", "nccl.Recv")} == {trace}
    agent.close()
