"""Processor processes end to end: root-cause spans over OTLP, restart mid-hang, scale-out by trace id."""

from __future__ import annotations

import time
import urllib.request

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

from mycroft_otel import ids
from mycroft_otel import semconv as sc
from mycroft_otel.processor import Processor
from mycroft_otel.processor.exporter import RootCauseExporter
from synth import Ring, any_value


def _attrs(span) -> dict:
    return {kv.key: any_value(kv.value) for kv in span.attributes}


def _root_causes(spans) -> list:
    return [s for s in spans if s.name == sc.ROOT_CAUSE_SPAN]


def test_root_cause_span_over_otlp(sink):
    exp = RootCauseExporter(OTLPSpanExporter(endpoint=f"127.0.0.1:{sink.port}", insecure=True))
    proc = Processor(env={}, exporter=exp)
    ring = Ring(8, nch=2)
    ring.net_delivery_stall(4, 1)
    proc.ingest_request(ring.request())
    (v,) = proc.tick()
    exp.force_flush()
    (span,) = _root_causes(sink.wait(1))
    assert span.trace_id == ring.tid.to_bytes(16, "big")
    assert span.span_id == ids.span_id(ring.tid, -1, sc.ROLE_ROOT_CAUSE, 0).to_bytes(8, "big")
    a = _attrs(span)
    assert a[sc.RCA_KIND] == "hang" and a[sc.RCA_CATEGORY] == "net_delivery_stalled"
    assert a[sc.RCA_CULPRIT_RANKS] == [4] and a[sc.RCA_CULPRIT_GLOBAL_RANKS] == [4]
    assert a[sc.RCA_CULPRIT_CHANNEL] == 1 and a[sc.RCA_CULPRIT_PEER] == 5
    assert a[sc.RCA_CULPRIT_HOSTS] == ["node-4"]
    assert 0 < a[sc.RCA_CONFIDENCE] <= 1 and a[sc.RCA_EVIDENCE]
    assert a[sc.COMM_HASH] == "5f3a9c0e12ab44d1" and a[sc.COLL_SEQ] == 17 and a[sc.COLL_FUNC] == "AllReduce"
    assert 0 < a[sc.RCA_ONSET] <= a[sc.RCA_DETECTED]
    assert a[sc.RCA_TRACE_ID] == format(ring.tid, "032x")  # for span-derived metrics (spanmetrics labels)
    roles = {}
    for link in span.links:
        roles.setdefault(_attrs(link)[sc.LINK_ROLE], []).append(link.span_id)
    assert ids.span_id(ring.tid, 4, sc.ROLE_OP).to_bytes(8, "big") in roles[sc.LINK_CULPRIT]
    assert roles[sc.LINK_EVIDENCE]
    proc.shutdown()


def _wait_root_causes(sink, n: int, timeout: float) -> list:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        rc = _root_causes(sink.wait(0, 0.1))
        if len(rc) >= n:
            return rc
        time.sleep(0.1)
    return _root_causes(sink.spans)


def test_processor_restarted_mid_hang_still_gives_the_verdict(spawn, sink):
    a = spawn()  # started (listening) before the clock of the hang starts: its start-up is not part of it
    now = time.time_ns()
    ring = Ring(8, t0=now - 2_000_000_000)
    ring.hang_all(when=now - 1_500_000_000, snap_time=now)  # stalled 1.5 s ago: not yet a hang
    ring.gpu_stall(2)
    for rv in ring.ranks.values():
        rv.last_progress = now - 1_500_000_000
        for f in rv.flows:
            f.last = f.since = now - 1_500_000_000
    a.send(ring.request())
    time.sleep(0.5)
    a.stop()  # restarted before the stall threshold
    assert _root_causes(sink.spans) == []
    b = spawn()
    for rv in ring.ranks.values():  # the agent keeps re-sending snapshots
        rv.snapshot += 1
        rv.end = time.time_ns()
    t_send = time.time_ns()
    b.send(ring.request())
    (span,) = _wait_root_causes(sink, 1, 8.0)
    a_ = _attrs(span)
    assert (a_[sc.RCA_CATEGORY], a_[sc.RCA_CULPRIT_RANKS]) == ("gpu_stalled", [2])
    assert a_[sc.RCA_DETECTED] - (now - 1_500_000_000) >= 3_000_000_000  # not before the stall threshold
    assert a_[sc.RCA_DETECTED] - t_send <= 1_000_000_000  # but at once: the state came back with the snapshot
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{b.metrics_port}/metrics", timeout=5).read().decode()
    assert 'mycroft_root_causes_total{category="gpu_stalled"' in metrics
    assert "mycroft_processor_traces_in_memory 1.0" in metrics


def _side(tid: int) -> int:
    return tid.to_bytes(16, "big")[-1] % 2  # what the Collector's load_balancing exporter does by trace id


def _traffic() -> list:
    """Requests of several independent incidents and healthy collectives, each a separate trace.

    Hangs hit one collective each; slowdowns recur (they are named when they do), here in
    16 collectives routed to each of the two processors (a null learned from 8, then 6 of evidence).
    """
    reqs = []
    faults = [("gpu_stall", (3,)), ("net_send_stall", (5, None)), ("net_delivery_stall", (1, 0)),
              ("absent", (6,)), ("mismatch", (2,)), ("late", (4, 400_000_000)), ("slow_flow", (7, 1)),
              ("slow_gpu", (0,))]
    for i, (name, args) in enumerate(faults):
        rings = []
        seq = 10  # past a communicator's warm-up (Settings.warmup_seq)
        want = {0: 16, 1: 16} if name in ("late", "slow_flow", "slow_gpu") else {0: 1, 1: 0}
        while any(want.values()):
            ring = Ring(8, nch=2, comm=0x1000 + i, seq=seq, global_base=100 * i)
            seq += 1
            if want[_side(ring.tid)] == 0:
                continue
            want[_side(ring.tid)] -= 1
            getattr(ring, name)(*args)
            rings.append(ring)
        for ring in rings:
            # the agent sends each rank separately: split per rank so traffic interleaves
            for r in sorted(ring.ranks):
                reqs.append((ring.tid, ring.request([r])))
    for j in range(20):
        ring = Ring(8, nch=2, comm=0x2000, seq=100 + j)
        reqs.append((ring.tid, ring.request()))
    return reqs


def _verdicts(spans) -> set:
    """Incidents: (communicator, category, culprit, channel) -- which trace carries one may differ."""
    out = set()
    for s in _root_causes(spans):
        a = _attrs(s)
        out.add((a[sc.COMM_HASH], a[sc.RCA_CATEGORY], tuple(a[sc.RCA_CULPRIT_RANKS]), a.get(sc.RCA_CULPRIT_CHANNEL)))
    return out


def _wait_incidents(sink, n: int, timeout: float = 30.0) -> set:
    end = time.monotonic() + timeout
    while time.monotonic() < end and len(_verdicts(sink.spans)) < n:
        time.sleep(0.2)
    time.sleep(1.5)  # and nothing more comes
    return _verdicts(sink.spans)


def test_two_processors_split_by_trace_id_give_the_same_verdicts(spawn, sink):
    traffic = _traffic()
    one = spawn()
    for _, req in traffic:
        one.send(req)
    single = _wait_incidents(sink, 8)
    one.stop()
    sink.spans.clear()
    a, b = spawn(), spawn()
    for tid, req in traffic:
        (a if _side(tid) == 0 else b).send(req)
    split = _wait_incidents(sink, 8)
    assert len(single) == 8, single
    assert split == single
    cats = sorted(v[1] for v in single)
    assert cats == sorted(["gpu_stalled", "net_send_stalled", "net_delivery_stalled", "rank_absent",
                           "coll_mismatch", "late_rank", "slow_flow", "slow_gpu"])
