"""The harness's copy of the gateway's load_balancing exporter places spans where the exporter does."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from mycroft_otel.evaluate.routing import BY_JOB, BY_TRACE, HashRing, by_shard, split

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "processor"))
from synth import JOB, Ring  # noqa: E402

GOLDEN = Path(__file__).parent / "testdata" / "lb_ring" / "placements.json"  # from the exporter's own Go code


def _endpoints(n: int) -> list[str]:
    return [f"processor-{i}:4317" for i in range(n)]


def test_ring_places_keys_as_the_exporter_v0_161_0_does():
    golden = json.loads(GOLDEN.read_text())
    for n in (1, 2, 3, 4, 8):
        ring = HashRing(_endpoints(n))
        jobs = "".join(ring.endpoint_for(f"mycroft.job.id=job-{k}|".encode())[len("processor-"):-len(":4317")]
                       for k in range(1000))
        traces = "".join(ring.endpoint_for(((k * 0x9E3779B97F4A7C15) % (1 << 64)).to_bytes(16, "big"))
                         [len("processor-"):-len(":4317")] for k in range(1000))
        assert jobs == golden[f"jobs/{n}"], n
        assert traces == golden[f"traces/{n}"], n
    assert len(set(golden["jobs/8"])) == 8  # the golden file spreads jobs over every processor


def _two_jobs_request() -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    for job in ("job-a", "job-b"):
        for seq in range(40):
            req.MergeFrom(Ring(8, seq=seq, comm=0x5100 + seq % 3, job=job).request())
    return req


def _jobs_and_traces(req: ExportTraceServiceRequest) -> tuple[set[str], set[bytes]]:
    jobs = {kv.value.string_value for rs in req.resource_spans for kv in rs.resource.attributes
            if kv.key == "mycroft.job.id"}
    traces = {s.trace_id for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans}
    return jobs, traces


def test_by_job_keeps_each_jobs_spans_on_one_processor_and_by_trace_spreads_them():
    req = _two_jobs_request()
    n_spans = sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)
    ring = HashRing(_endpoints(8))
    by_job = split(req, BY_JOB, ring)
    seen = [_jobs_and_traces(r)[0] for r in by_job.values()]
    assert all(len(j) == 1 for j in seen) and sorted(j for s in seen for j in s) == ["job-a", "job-b"]
    by_trace = split(req, BY_TRACE, ring)
    assert len(by_trace) > 2
    for parts in (by_job, by_trace):
        assert sum(len(ss.spans) for r in parts.values() for rs in r.resource_spans
                   for ss in rs.scope_spans) == n_spans
    # by trace: every collective's spans (all its ranks) still on one processor
    owners: dict[bytes, set[str]] = {}
    for ep, r in by_trace.items():
        for t in _jobs_and_traces(r)[1]:
            owners.setdefault(t, set()).add(ep)
    assert all(len(o) == 1 for o in owners.values())


def test_a_jobs_key_is_what_split_routes_its_spans_on():
    ring = HashRing(_endpoints(8))
    for job in ("job-a", "job-b"):
        req = Ring(8, seq=1, comm=0x5100, job=job).request()
        (endpoint,) = split(req, BY_JOB, ring)
        assert endpoint == ring.endpoint_for(BY_JOB.key_for({"mycroft.job.id": job}))
    assert BY_JOB.key_for({}) == b"mycroft.job.id=|mycroft.job.shard=|"


def test_a_sharded_jobs_blocks_of_ranks_route_apart_and_each_stays_together():
    """Agents that shard jobs (MYCROFT_SHARD_RANKS) set mycroft.job.shard on each rank's resource: the shipped
    routing then places each (job, shard) on one processor, as the exporter composes the key."""
    ring = HashRing(_endpoints(8))
    req = ExportTraceServiceRequest()
    for seq in range(20):
        req.MergeFrom(Ring(32, seq=seq, comm=0x5200).request())
    for rs in req.resource_spans:
        g = next(kv.value.int_value for s in rs.scope_spans[0].spans[:1] for kv in s.attributes
                 if kv.key == "mycroft.global_rank")
        rs.resource.attributes.add(key="mycroft.job.shard").value.int_value = g // 8
    owners: dict[int, set[str]] = {}
    for endpoint, part in split(req, by_shard(8), ring).items():
        for rs in part.resource_spans:
            shard = next(kv.value.int_value for kv in rs.resource.attributes if kv.key == "mycroft.job.shard")
            owners.setdefault(shard, set()).add(endpoint)
    assert sorted(owners) == [0, 1, 2, 3] and all(len(o) == 1 for o in owners.values())
    for shard, (endpoint,) in owners.items():
        assert endpoint == ring.endpoint_for(f"mycroft.job.id={JOB}|mycroft.job.shard={shard}|".encode())
