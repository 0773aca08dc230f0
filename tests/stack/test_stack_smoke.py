"""End to end through the real binaries: SDK → gateway → (routing by job id) → processors, → trace store;
root-cause spans → gateway's root-cause receiver → trace store only; Prometheus scrapes and loads rules.

The processors are tests/stack/otlp_sink.py (a routing probe, see its docstring), so this runs
before and independently of `mycroft-otel processor`.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from mycroft_otel.evaluate.routing import BY_JOB, HashRing
from mycroft_otel.semconv import JOB_ID, JOB_SHARD
from mycroft_otel.stack import LocalStack, ProcessorPorts

pytestmark = [pytest.mark.stack, pytest.mark.slow]

SINK = Path(__file__).with_name("otlp_sink.py")
SERVICE = "mycroft-stack-smoke"
N_TRACES = 12


def wait_until(pred, timeout_s: float, what: str, poll_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}; last: {last!r}")


@pytest.fixture(scope="module")
def stack(stack_bin_dir, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("stack")
    sink_out = run_dir / "sink.jsonl"

    def sink_command(pp: ProcessorPorts):
        return [sys.executable, str(SINK), "--bind", pp.bind, "--grpc-port", str(pp.grpc),
                "--metrics-port", str(pp.metrics), "--index", str(pp.index), "--out", str(sink_out)]  # fmt: skip

    st = LocalStack(processors=2, processor_command=sink_command, run_dir=run_dir, bin_dir=stack_bin_dir,
                    trace_store="auto", ready_timeout_s=90)  # fmt: skip
    with st:
        st.sink_out = sink_out  # type: ignore[attr-defined]
        yield st


def sink_records(stack) -> list[dict]:
    path: Path = stack.sink_out
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _jobs_on_both(stack) -> dict[tuple[str, int | None], int]:
    """(job id, shard) and the processor the gateway's ring gives each (evaluate/routing.py, the exporter's own
    placement): the first ids until both processors have N_TRACES // 4 jobs or more. Every other job is a shard
    of a sharded job (its spans carry the int mycroft.job.shard), the others are whole (no shard)."""
    ring = HashRing([pp.otlp_grpc for pp in stack.processor_ports])
    index = {pp.otlp_grpc: pp.index for pp in stack.processor_ports}
    jobs: dict[tuple[str, int | None], int] = {}
    for k in range(1000):
        job, shard = f"smoke-{k // 2}", (None if k % 2 == 0 else k % 7)
        key = {JOB_ID: job} if shard is None else {JOB_ID: job, JOB_SHARD: str(shard)}
        jobs[(job, shard)] = index[ring.endpoint_for(BY_JOB.key_for(key))]
        if len(jobs) >= N_TRACES // 2 and min(list(jobs.values()).count(i) for i in (0, 1)) >= N_TRACES // 4:
            return jobs
    raise AssertionError(f"no job ids spread over both processors: {jobs}")


@pytest.fixture(scope="module")
def sent(stack):
    """Send N_TRACES traces of 3 spans (a parent and two 'rank' children) through the gateway, two per job or
    shard, spread over both processors by the gateway's routing key. {trace id: (span names, the expected
    processor)}"""
    traces: dict[str, tuple[list[str], int]] = {}
    for (job, shard), owner in _jobs_on_both(stack).items():
        res = {"service.name": SERVICE, JOB_ID: job} | ({} if shard is None else {JOB_SHARD: shard})
        provider = TracerProvider(resource=Resource.create(res))
        provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=stack.agent_otlp_grpc,
                                                                         insecure=True)))
        tracer = provider.get_tracer("tests.stack")
        for i in range(2):
            with tracer.start_as_current_span("ncclAllReduce", attributes={"mycroft.coll.seq": i}) as root:
                tid = format(root.get_span_context().trace_id, "032x")
                names = ["ncclAllReduce"]
                for rank in range(2):
                    with tracer.start_as_current_span(f"rank{rank}", attributes={"mycroft.rank": rank}):
                        names.append(f"rank{rank}")
            traces[tid] = (names, owner)
        provider.shutdown()
    return traces


def test_every_trace_reaches_exactly_one_processor(stack, sent):
    def complete():
        recs = [r for r in sink_records(stack) if r["name"] != "mycroft.root_cause"]
        got = {}
        for r in recs:
            got.setdefault(r["trace_id"], []).append(r)
        return got if all(len(got.get(t, [])) == len(n) for t, (n, _) in sent.items()) else None

    got = wait_until(complete, 30, "all spans at the processors")
    for tid, recs in got.items():
        # every span of the trace, and of its job, at the processor the exporter's ring gives the job
        assert {r["sink"] for r in recs} == {sent[tid][1]}, f"trace {tid}: {[r['sink'] for r in recs]}"
    assert {recs[0]["sink"] for recs in got.values()} == {0, 1}


def test_root_cause_spans_never_loop_back(stack, sent):
    test_every_trace_reaches_exactly_one_processor(stack, sent)
    time.sleep(2)  # give a looping config time to show itself
    assert not [r for r in sink_records(stack) if r["name"] == "mycroft.root_cause"]


def test_trace_found_in_trace_store_with_its_root_cause(stack, sent):
    store = stack.traces
    found = wait_until(lambda: set(sent) <= set(store.search(SERVICE, lookback_s=600)) or None, 60,
                       f"search of service {SERVICE} in {store.kind}")  # fmt: skip
    assert found
    tid = next(iter(sent))
    spans = store.wait_for(
        tid, lambda sp: {"ncclAllReduce", "rank0", "rank1", "mycroft.root_cause"} <= {s.name for s in sp}, 60
    )
    rca = next(s for s in spans if s.name == "mycroft.root_cause")
    assert rca.trace_id == tid
    assert rca.service_name == "mycroft-processor"
    assert rca.attributes["mycroft.rca.category"] == "routing_probe"
    assert rca.links and rca.links[0][0] == tid
    ranks = {s.attributes.get("mycroft.rank") for s in spans if s.name.startswith("rank")}
    assert ranks == {0, 1}
    # the root-cause span is searchable by name too (what Grafana and the alert annotation do)
    assert tid in store.search("mycroft-processor", span_name="mycroft.root_cause", lookback_s=600)


def test_prometheus_scrapes_processors_and_loads_rules(stack, sent):
    test_every_trace_reaches_exactly_one_processor(stack, sent)

    def scraped():
        res = stack.prometheus_query('sum(mycroft_sink_spans_received_total{job="mycroft-processor"})')
        return res and float(res[0]["value"][1]) >= 3 * N_TRACES

    wait_until(scraped, 40, "processor metrics in Prometheus")

    def all_up():  # each target has its own scrape offset within the 5 s interval
        up = stack.prometheus_query('up{job=~"mycroft-processor|otelcol-gateway|tempo"}')
        return len(up) == 4 and all(r["value"][1] == "1" for r in up) and up

    wait_until(all_up, 30, "processors, gateway and trace store up in Prometheus")
    import urllib.request

    with urllib.request.urlopen(f"{stack.prometheus_url}/api/v1/rules", timeout=5) as resp:
        rules = json.load(resp)["data"]["groups"]
    names = {r["name"] for g in rules for r in g["rules"]}
    assert {"MycroftRootCause", "MycroftProcessorDown"} <= names


def test_root_cause_alert_fires_in_prometheus(stack, sent):
    """The probe shows an open incident for its verdicts (mycroft_incidents_open); the shipped rule must fire."""
    import urllib.request

    def firing():
        with urllib.request.urlopen(f"{stack.prometheus_url}/api/v1/alerts", timeout=5) as resp:
            alerts = json.load(resp)["data"]["alerts"]
        return [a for a in alerts if a["labels"].get("alertname") == "MycroftRootCause" and a["state"] == "firing"]

    alerts = wait_until(firing, 40, "MycroftRootCause firing")
    labels = alerts[0]["labels"]
    assert (labels["kind"], labels["category"], labels["job_id"], labels["severity"]) == (
        "hang", "routing_probe", "smoke", "critical")  # fmt: skip
    assert "routing_probe" in alerts[0]["annotations"]["summary"]


def test_stack_logs_and_endpoints_written(stack):
    eps = json.loads((Path(stack.run_dir) / "endpoints.json").read_text())
    assert eps["agent_otlp_grpc"] == stack.agent_otlp_grpc
    assert len(eps["processors"]) == 2
    for name in ("otelcol-gateway", stack.store_kind, "prometheus", "processor-0", "processor-1"):
        assert (Path(stack.run_dir) / "logs" / f"{name}.log").exists()
