"""The operator's view, end to end, on the real stack (gateway collector, Jaeger v2, Prometheus).

* The agents' collective metrics (OTEL_METRICS_EXPORTER=otlp) travel over OTLP to the gateway, which serves
  them to Prometheus; every query of the collective-health dashboard returns data there, and the histogram
  counts every completed operation the agent read.

The page a verdict raises (Prometheus, Alertmanager, a webhook) is test_incident_page.py's.
"""

from __future__ import annotations

import json

import pytest

from e2e_helpers import Job, verdicts_in_store, wait_until
from mycroft_otel.grafana import dashboards as gen
from mycroft_otel.stack import LocalStack

STALL_MS = 3000


@pytest.fixture(scope="module")
def stack(e2e_bin_dir, tmp_path_factory):
    st = LocalStack(processors=1, run_dir=tmp_path_factory.mktemp("e2e-operator"), bin_dir=e2e_bin_dir,
                    processor_env={"MYCROFT_STALL_MS": str(STALL_MS)}, ready_timeout_s=120)  # fmt: skip
    with st:
        yield st


@pytest.fixture(scope="module")
def hang(stack):
    """An 8-rank job whose NIC stops sending; the agent exports metrics every second."""
    job = Job(stack, "operator", topology="nodes=4,gpus=2,tp=2,dp=4", fault="nic_down:rank=2,at=2", seed=11,
              duration_s=2 + STALL_MS / 1000 + 6,
              agent_env={"OTEL_METRICS_EXPORTER": "otlp", "OTEL_METRIC_EXPORT_INTERVAL": "1000"})  # fmt: skip
    with job:
        job.wait_sim(180)
        truth = job.truth
        found = wait_until(lambda: verdicts_in_store(stack, truth["category"], truth["comm_hash"]), 60,
                           f"a {truth['category']} verdict on comm {truth['comm_hash']}")  # fmt: skip
    return job, found


def _health_queries() -> list[tuple[str, str]]:
    d = json.loads(gen.render(gen.collective_health))
    out = []
    for p in d["panels"]:
        for t in p.get("targets", []):
            e = t["expr"].replace("$__rate_interval", "1m")
            for var in ("$comm", "$func"):
                e = e.replace(f'=~"{var}"', '=~".*"')
            assert "$" not in e, e
            out.append((f"{p['title']} {t['refId']}", e))
    return out


def test_agent_metrics_reach_prometheus_and_collective_health_queries_return_data(stack, hang):
    job, _ = hang
    queries = _health_queries()
    assert len(queries) >= 8

    def empty() -> list[str]:
        return [w for w, e in queries if not stack.prometheus_query(e)]

    wait_until(lambda: not empty() or None, 60, "data for every collective-health query")
    assert not empty(), empty()
    comm = job.truth["comm_hash"]
    # every completed op the agent read is in the histogram (sampled away or not); the job's agent has
    # stopped, and its last export holds its final counts
    records = job.agent_counters["records_read_total"]
    total = 'sum(mycroft_collective_duration_seconds_count{job="mycroft-agent"})'
    wait_until(lambda: stack.prometheus_query(total) and float(stack.prometheus_query(total)[0]["value"][1])
               == records, 30, f"{total} == {records} records read")  # fmt: skip
    # the hung communicator still has its collective in flight on every rank
    hung = stack.prometheus_query(f'mycroft_collective_in_flight{{mycroft_comm_hash="{comm}"}}')
    assert hung and all(float(r["value"][1]) >= 1 for r in hung), hung
    # the lag gauge: one series per rank of the communicator, labelled with its host
    seqs = stack.prometheus_query(f'mycroft_collective_last_sequence{{mycroft_comm_hash="{comm}"}}')
    ranks = [r["metric"]["mycroft_rank"] for r in seqs]
    assert len(ranks) >= 2 and len(set(ranks)) == len(ranks), seqs
    assert all(r["metric"].get("host_name") for r in seqs)
    # every collective series names its job and where its ranks are (4 nodes: inter_node)
    dur = stack.prometheus_query(f'mycroft_collective_duration_seconds_count{{mycroft_comm_hash="{comm}"}}')
    assert dur and all(r["metric"].get("mycroft_job_id") and r["metric"].get("mycroft_comm_kind") for r in dur), dur
    # the exported operations' trace ids are exemplars of the duration histogram, never labels
    assert not [r for r in dur if any("trace" in k for k in r["metric"])]
    ex = wait_until(lambda: stack.prometheus_exemplars('mycroft_collective_duration_seconds_bucket{job="mycroft-agent"}')
                    or None, 30, "exemplars of the duration histogram")  # fmt: skip
    points = [e for series in ex for e in series["exemplars"]]
    assert points and all(len(e["labels"].get("trace_id", "")) == 32 for e in points), ex[:2]
