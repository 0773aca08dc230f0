"""Schema, ids and links of completed spans, decoded from OTLP at a real receiver."""

from __future__ import annotations

import numpy as np
import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from mycroft_otel import ids
from mycroft_otel import semconv as sc
from mycroft_otel.agent import otlp
from agent_helpers import make_agent
from agent_shm import KIND_RECV, KIND_SEND, RECV, SEND, FakeReader, FakeRing

JOB, COMM = "job-1", 0x5F3A9C0E12AB44D1


def test_every_rank_once_links_resolve(tmp_path, otel_env):
    n = 8
    rings = [FakeRing(tmp_path / f"r{r}", rank=r, nranks=n, host=f"node-{r // 4}") for r in range(n)]
    for seq in range(5):
        for ring in rings:
            ring.op_done(dur_ns=2_000_000)
    agent = make_agent(tmp_path, sample_ratio=1.0)
    agent.poll_once()
    assert agent.queue.flush(10)
    spans = otel_env.sink.named("nccl.AllReduce")
    assert len(spans) == 5 * n
    by_trace: dict[int, list[dict]] = {}
    for s in spans:
        by_trace.setdefault(s["trace_id"], []).append(s)
    assert len(by_trace) == 5
    emitted = {(s["trace_id"], s["span_id"]) for s in spans}
    for seq in range(5):
        trace = ids.coll_trace_id(JOB, COMM, seq)
        group = by_trace[trace]
        assert sorted(s["attrs"][sc.RANK] for s in group) == list(range(n))
        for s in group:
            a = s["attrs"]
            r = a[sc.RANK]
            assert s["span_id"] == ids.span_id(trace, r, sc.ROLE_OP)
            assert a[sc.COLL_SEQ] == seq and a[sc.COLL_FUNC] == "AllReduce" and a[sc.OP_KIND] == "coll"
            assert a[sc.OP_STATE] == "completed"
            assert a[sc.COMM_HASH] == ids.comm_hash_hex(COMM) and a[sc.COMM_NRANKS] == n
            assert a[sc.GLOBAL_RANK] == r and a[sc.HOST_NAME] == f"node-{r // 4}"
            assert a[sc.COLL_BYTES] == 4 << 20 and a[sc.COLL_DATATYPE] == "ncclFloat32"
            assert a[sc.COLL_ALGO] == "Ring" and a[sc.COLL_PROTO] == "Simple"
            assert a[sc.FLOW_DIRECTION] == ["send", "send", "recv", "recv"]
            assert a[sc.FLOW_PEER] == [(r + 1) % n] * 2 + [(r - 1) % n] * 2
            assert a[sc.FLOW_DONE] == [8, 8, 8, 8] and sc.FLOW_DONE not in s["span_attrs"]  # left out: = steps
            assert all(len(a[k]) == 4 for k in a if k.startswith("mycroft.flow."))
            # a flow's times travel as offsets after the span's start, and read back inside the span
            assert all(0 <= t < s["end"] - s["start"] for t in s["span_attrs"][sc.FLOW_START])
            assert all(s["start"] <= t <= s["end"] for k in (sc.FLOW_START, sc.FLOW_END) for t in a[k])
            # what other attributes already say is left out: NCCL's seqNumber equal to the collective number,
            # the [started, stopped] pairs that are the whole (a ProxyOp per flow, a kernel per channel), the
            # step a completed flow waited on last
            assert not {sc.NCCL_SEQ, sc.PROXY_OPS, sc.KERNEL_CHANNELS, sc.FLOW_WAIT_STEP} & set(s["span_attrs"])
            assert a[sc.NCCL_SEQ] == seq and a[sc.PROXY_OPS] == [4, 4] and a[sc.KERNEL_CHANNELS] == [2, 2]
            # realtime ns, consistent with the span's own times
            assert s["start"] <= a[sc.TIME_ENQUEUE] <= s["end"]
            # the API call is the span's start and the end its end: neither is repeated as an attribute
            assert not {sc.TIME_API, sc.TIME_END, sc.TIME_LAST_PROGRESS} & set(a)
            assert abs(s["end"] - __import__("time").time_ns()) < 60e9
            assert a[sc.BUS_BW] > 0
            res = s["resource"]
            # what a rank's spans share travels on their resource only
            assert not set(s["span_attrs"]) & set(sc.RESOURCE_SPAN_ATTRS) and res[sc.RANK] == r
            assert res[sc.SERVICE_NAME] == "agent-test" and res[sc.JOB_ID] == JOB and res[sc.HW_TYPE] == "gpu"
            assert res["deployment.environment"] == "test" and res[sc.PROCESS_PID] > 0
            # one link per neighbour and direction, whatever the channels: the ring's next rank, fed, and its
            # previous one, waited on
            roles = {lk["attrs"][sc.LINK_ROLE]: lk["attrs"][sc.LINK_PEER] for lk in s["links"]}
            assert len(s["links"]) == 2 and roles == {sc.LINK_SEND_TO: (r + 1) % n, sc.LINK_RECV_FROM: (r - 1) % n}
            for lk in s["links"]:
                assert lk["trace_id"] == trace
                assert (trace, lk["span_id"]) in emitted  # every link points at a span the peer emitted
                assert lk["span_id"] == ids.span_id(trace, lk["attrs"][sc.LINK_PEER], sc.ROLE_OP)
                assert set(lk["attrs"]) == {sc.LINK_ROLE, sc.LINK_PEER}
    agent.close()
    for ring in rings:
        ring.close()


def test_p2p_send_and_recv_share_a_trace(tmp_path, otel_env):
    a = FakeRing(tmp_path / "a", rank=0, nranks=2)
    b = FakeRing(tmp_path / "b", rank=1, nranks=2)
    for _ in range(3):
        a.op_done(kind=KIND_SEND, func=SEND, peer=1)
        b.op_done(kind=KIND_RECV, func=RECV, peer=0)
    agent = make_agent(tmp_path, sample_ratio=1.0)
    agent.poll_once()
    assert agent.queue.flush(10)
    sends, recvs = otel_env.sink.named("nccl.Send"), otel_env.sink.named("nccl.Recv")
    assert len(sends) == len(recvs) == 3
    for n in range(3):
        trace = ids.p2p_trace_id(JOB, COMM, 0, 1, n)
        s = [x for x in sends if x["trace_id"] == trace]
        r = [x for x in recvs if x["trace_id"] == trace]
        assert len(s) == len(r) == 1
        assert s[0]["attrs"][sc.P2P_SRC] == 0 and s[0]["attrs"][sc.P2P_DST] == 1
        assert s[0]["links"][0]["span_id"] == r[0]["span_id"] == ids.span_id(trace, 1, sc.ROLE_OP)
        assert r[0]["links"][0]["span_id"] == s[0]["span_id"]
        assert r[0]["links"][0]["attrs"][sc.LINK_ROLE] == sc.LINK_RECV_FROM
    agent.close()


@pytest.mark.parametrize("detail", ["op", "chunk"])
def test_fast_path_equals_generic(tmp_path, otel_env, detail):
    ring = FakeRing(tmp_path / "r0", rank=3, nranks=8)
    recs = [ring.make_op(start_ns=10_000_000_000 + i, end_ns=10_002_000_000 + 7 * i, n_channels=1 + i % 4)
            for i in range(6)]
    recs.append(ring.make_op(kind=KIND_SEND, func=SEND, peer=5, start_ns=20_000_000_000, end_ns=20_000_100_000))
    recs.append(ring.make_op(func=0, peer=2, start_ns=20_000_000_000, end_ns=20_000_100_000))  # Broadcast root 2
    for r in recs:
        ring.complete(r)
    agent = make_agent(tmp_path, detail=detail)
    agent.poll_once()
    ctx = next(iter(agent.ctxs.values()))
    reader = FakeReader(str(tmp_path / "r0"))
    got, _, _ = reader.read(0, 100)
    b = ctx.builder
    traces = b.trace_ids(got["op"])
    anomalies = [None, ("slow", 123, None), ("late", 5, 77), None, None, None, None, None]
    steps = [0, 3, -1, 1, 2, 0, -1, 5]  # places in the training step (StepPattern), -1 where none is known
    fast = b.op_spans(got, traces, anomalies, steps)
    for i in range(len(got)):
        an = anomalies[i] or (None, None, None)
        ref = b.op_span_generic(got[i], *an, step_index=steps[i])
        assert fast[i] == ref, i
        span = Span()
        span.ParseFromString(fast[i])  # valid protobuf
        place = [a.value.int_value for a in span.attributes if a.key == sc.COLL_STEP_INDEX]
        assert place == ([steps[i]] if steps[i] >= 0 else []), i
    agent.close()


def test_fast_path_equals_generic_with_v7_tag_and_phases(tmp_path, otel_env):
    """v7's user tag (also one with the top bit set) and per-channel KernelPhase times, both paths, same bytes."""
    from mycroft_otel.agent.spans import FLAG_KERNEL_PHASES

    ring = FakeRing(tmp_path / "r0", rank=1, nranks=4, abi_version=7)
    recs = []
    for i in range(4):
        r = ring.make_op(start_ns=10_000_000_000 + i, end_ns=10_002_000_000 + i, n_channels=2)
        r["op"]["user_tag"] = [0, 7, 2**63 + 5, 42][i]
        if i >= 2:
            r["op"]["kch_valid"] = 0b101
            r["op"]["flags"] |= FLAG_KERNEL_PHASES
            k = r["kch"]
            for ch in (0, 2):
                k["start_ns"][ch], k["end_ns"][ch] = 1000, 2000 + ch
                k["phase_start_ns"][ch] = [1000, 1700, 1950]
                k["phase_end_ns"][ch] = [1700, 1950, 0 if ch else 2000]  # one phase without its end
        recs.append(r)
    for r in recs:
        ring.complete(r)
    agent = make_agent(tmp_path)
    agent.poll_once()
    ctx = next(iter(agent.ctxs.values()))
    got, _, _ = FakeReader(str(tmp_path / "r0")).read(0, 100)
    b = ctx.builder
    fast = b.op_spans(got, b.trace_ids(got["op"]), [None] * len(got))
    for i in range(len(got)):
        assert fast[i] == b.op_span_generic(got[i]), i
    attrs = [dict(b.op_attributes(got[i]["op"], got[i]["flows"], sc.OP_STATE_COMPLETED, b.start_end(got[i]["op"])[1],
                                  kch=got[i]["kch"])) for i in range(len(got))]
    assert sc.COLL_USER_TAG not in attrs[0] and attrs[1][sc.COLL_USER_TAG] == 7
    assert attrs[2][sc.COLL_USER_TAG] == 5 - 2**63  # the 64 bits, as OTLP's signed int
    assert sc.KERNEL_CH_CHANNEL not in attrs[1]
    assert attrs[3][sc.KERNEL_CH_CHANNEL] == [0, 2]
    assert attrs[3][sc.KERNEL_INITIAL_SYNC] == [700, 700] and attrs[3][sc.KERNEL_FINAL_SYNC] == [50, -1]
    agent.close()


def test_int_columns_roundtrip():
    vals = np.array([0, 1, 127, 128, 16383, 16384, 2**35, 2**63 - 1, -1, -2**63], dtype=np.int64)
    blob, ends = otlp.int_attr_column("k", vals.view(np.uint64))
    parts = otlp.split(blob, ends, np.ones(len(vals), dtype=np.int64))
    for v, p in zip(vals.tolist(), parts):
        s = Span()
        s.ParseFromString(p)
        assert s.attributes[0].value.int_value == v
        assert p == otlp.ld(9, otlp.key_value("k", v))


@pytest.mark.parametrize("shard_ranks", [0, 3])
def test_a_sharding_agent_puts_each_rank_in_its_block_of_global_ranks(tmp_path, otel_env, shard_ranks):
    """MYCROFT_SHARD_RANKS=N: each rank's resource carries mycroft.job.shard = its global rank // N, which the
    gateway routes on (docs/algorithm.md §7); unset, no shard: the job stays whole."""
    n = 8
    rings = [FakeRing(tmp_path / f"r{r}", rank=r, nranks=n) for r in range(n)]
    for ring in rings:
        ring.op_done(dur_ns=2_000_000)
    agent = make_agent(tmp_path, sample_ratio=1.0, shard_ranks=shard_ranks)
    agent.poll_once()
    assert agent.queue.flush(10)
    spans = otel_env.sink.named("nccl.AllReduce")
    assert len(spans) == n
    for s in spans:
        res = s["resource"]
        if shard_ranks:
            assert res[sc.JOB_SHARD] == res[sc.GLOBAL_RANK] // shard_ranks
        else:
            assert sc.JOB_SHARD not in res
