"""The real plugin, driven through NCCL's ABI by _native.Driver, read by the agent, decoded at an OTLP receiver."""

from __future__ import annotations

import pytest

_native = pytest.importorskip("mycroft_otel._native")

from mycroft_otel import ids  # noqa: E402
from mycroft_otel import semconv as sc  # noqa: E402
from mycroft_otel.native import Driver, plugin_path  # noqa: E402
from mycroft_otel.agent.source import default_reader_factory  # noqa: E402
from agent_events import Rows, ring_allreduce  # noqa: E402
from agent_helpers import make_agent  # noqa: E402

JOB = "e2e-job"


def _job(tmp_path, nranks: int, gpus: int, colls: int, comm_hash: int, stall_rank: int | None = None):
    try:
        path = plugin_path()
    except FileNotFoundError:
        pytest.skip("plugin not built")
    d = Driver(path)
    ring_dir = tmp_path / "rings"
    ring_dir.mkdir()
    ctxs = [d.init("dp", comm_hash, nranks // gpus, nranks, r,
                   env={"RANK": str(r), "LOCAL_RANK": str(r % gpus), "NCCL_HOSTID": f"node-{r // gpus}",
                        "MYCROFT_RING_DIR": str(ring_dir), "MYCROFT_JOB_ID": JOB})
            for r in range(nranks)]
    q = Rows()
    for seq in range(colls):
        for r in range(nranks):
            ring_allreduce(q, ctxs[r], r, nranks, seq)
    if stall_rank is not None:
        for r in range(nranks):
            ring_allreduce(q, ctxs[r], r, nranks, colls, stall_send_channel0_at=1 if r == stall_rank else None)
    stats = d.replay(q.array())
    return d, ctxs, ring_dir, stats


def test_64_ranks_every_span_once_and_links_resolve(tmp_path, otel_env):
    n, colls, comm = 64, 3, 0x1234ABCD5678EF01
    d, ctxs, ring_dir, stats = _job(tmp_path, n, 8, colls, comm)
    agent = make_agent(ring_dir, reader_factory=default_reader_factory, sample_ratio=1.0,
                       state_dir=str(tmp_path / "state"))
    agent.poll_once()
    assert agent.queue.flush(20)
    spans = otel_env.sink.named("nccl.AllReduce")
    assert len(spans) == n * colls, (len(spans), stats, agent.health.snapshot())
    emitted = {(s["trace_id"], s["span_id"]) for s in spans}
    for seq in range(colls):
        trace = ids.coll_trace_id(JOB, comm, seq)
        group = [s for s in spans if s["trace_id"] == trace]
        assert sorted(s["attrs"][sc.RANK] for s in group) == list(range(n))  # each rank exactly once
        for s in group:
            a, r = s["attrs"], s["attrs"][sc.RANK]
            assert s["span_id"] == ids.span_id(trace, r, sc.ROLE_OP)
            assert a[sc.COLL_SEQ] == seq and a[sc.COMM_NRANKS] == n and a[sc.GLOBAL_RANK] == r
            assert a[sc.LOCAL_RANK] == r % 8
            assert s["resource"][sc.JOB_ID] == JOB and s["resource"][sc.NCCL_PROFILER_ABI] == d.version
            assert a[sc.FLOW_DONE] == [4] * 4 and sorted(a[sc.FLOW_DIRECTION]) == ["recv", "recv", "send", "send"]
            assert s["start"] <= a[sc.TIME_ENQUEUE] <= s["end"] and sc.TIME_END not in a  # (the end is the span's)
            assert len(s["links"]) == 2  # the ring's two neighbours, over both channels
            for lk in s["links"]:
                assert (lk["trace_id"], lk["span_id"]) in emitted
                peer = lk["attrs"][sc.LINK_PEER]
                want = (r + 1) % n if lk["attrs"][sc.LINK_ROLE] == sc.LINK_SEND_TO else (r - 1) % n
                assert peer == want
    agent.close()
    for c in ctxs:
        d.finalize(c)


def test_stalled_rank_inflight_from_real_plugin(tmp_path, otel_env):
    n, comm = 8, 0x0BADC0FFEE
    d, ctxs, ring_dir, _ = _job(tmp_path, n, 8, 2, comm, stall_rank=5)
    agent = make_agent(ring_dir, reader_factory=default_reader_factory, sample_ratio=0.0, inflight_after_ms=1,
                       snapshot_ms=10)
    agent.poll_once()
    assert agent.queue.flush(10)
    snaps = otel_env.sink.named(sc.INFLIGHT_SPAN)
    trace = ids.coll_trace_id(JOB, comm, 2)
    assert [s["attrs"][sc.RANK] for s in snaps] == [5]
    a = snaps[0]["attrs"]
    assert snaps[0]["trace_id"] == trace and a[sc.OP_STATE] == "in_flight"
    i = [k for k, (c, dr) in enumerate(zip(a[sc.FLOW_CHANNEL], a[sc.FLOW_DIRECTION])) if c == 0 and dr == "send"][0]
    assert a[sc.FLOW_WAIT_STATE][i] == "SendWait" and a[sc.FLOW_DONE][i] == 1
    agent.close()
    for c in ctxs:
        d.finalize(c)
