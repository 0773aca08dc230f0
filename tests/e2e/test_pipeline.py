"""The whole pipeline against the real binaries, one stack for the module:

    mycroft-otel sim --realtime (real plugin, shared memory) → mycroft-otel agent (OTLP/gRPC, OTEL_* → gateway)
    → otelcol-mycroft gateway (collector_config/gateway.yaml) → load_balancing by trace id → 2 × mycroft-otel processor
    → root-cause spans → gateway's root-cause receiver → trace store (Jaeger v2 here, Tempo where installed)
    Prometheus scrapes the processors and evaluates dashboards/alerts/mycroft-rules.yaml.

1. one short 8-rank scenario per category of the fault catalogue, through the same stack (own ring dir, seed,
   hence communicator hashes, and job id each);
2. a 64-rank job (8 nodes × 8 GPUs, tp=8 dp=8) whose rank 19 loses its NIC: the verdict is found through the
   store's search API, its trace holds every rank of the communicator with intact links, the culprit is the
   injected one, Prometheus counts it and MycroftRootCause fires for the job.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request

import pytest

from e2e_helpers import Job, all_verdicts_since, check_trace_links, is_right, verdicts_in_store, wait_until
from mycroft_otel import ids, semconv
from mycroft_otel.evaluate.scenarios import builtin
from mycroft_otel.stack import LocalStack

pytestmark = [pytest.mark.stack, pytest.mark.slow]

STALL_MS = 3000


@pytest.fixture(scope="module")
def stack(e2e_bin_dir, tmp_path_factory):
    st = LocalStack(processors=int(os.environ.get("MYCROFT_E2E_PROCESSORS", "2")), run_dir=tmp_path_factory.mktemp("e2e-stack"), bin_dir=e2e_bin_dir,
                    processor_env={"MYCROFT_STALL_MS": str(STALL_MS)}, ready_timeout_s=120)  # fmt: skip
    with st:
        yield st


# -- 1. one scenario per category (first: see _ORDER) ------------------------------------------------------------------

# eval's catalogue (8 ranks, nodes=4,gpus=2,tp=2,dp=4), one fault per category (sigstop and congestion
# duplicate rank_absent and slow_nic; nic_down is the 64-rank job above, repeated here at eval's size).
#
# Culprits rotate over the 8 global ranks, and process_exited (which blames its whole host) runs last: the
# processor treats a hang naming the same (host, global rank) as a live incident of the last 120 s as that
# incident, and a slowdown naming the same global rank likewise, whatever the job (its incident identity
# carries no job id or pid), so scenarios that reuse a culprit back to back would see their verdict deduped.
#
# Slowdowns run first: chosen when a processor kept one per-step history for all jobs, which a hang elsewhere
# inflated; that history is per job now (`pipeline._job_history`), and the order is kept.
_ORDER = [("late_rank", 5), ("slow_flow", 7), ("slow_nic", 0), ("slow_gpu", 6), ("slow_proxy", 1),
          ("process_exited", 6), ("rank_absent", 3), ("gpu_stalled", 1), ("nic_down", 2), ("flow_stall", 4),
          ("coll_mismatch", 5)]  # fmt: skip
# (process_exited blames its whole host, sim-node003, for 120 s: no later hang scenario uses that host.)
_BY_NAME = {sc.name: sc for sc in builtin(STALL_MS)}
CATALOGUE = []
for _name, _rank in _ORDER:
    _sc = _BY_NAME[_name]
    _kind, _, _params = _sc.fault.partition(":")
    _params = ",".join([f"rank={_rank}"] + [p for p in _params.split(",") if p and not p.startswith("rank=")])
    CATALOGUE.append(type(_sc)(_sc.name, f"{_kind}:{_params}", _sc.topology, _sc.seed, _sc.duration_s, _sc.env))
# Known misses, each an xfail that may pass:
# - slow_proxy: through the stack the first attempt named nothing in 1 of 1 runs this stop (the retry named it;
#   `mycroft-otel eval --only slow_proxy` named it in 4 of 4): its proxy sleeps in every other collective only
#   (p=0.5), and its credit wait reaches the processor only in the collectives the agents export.
KNOWN_MISSES = {"slow_proxy": "through the stack an attempt may end with no verdict for it"}


def _param(sc):
    marks = [pytest.mark.xfail(reason=KNOWN_MISSES[sc.name], strict=False)] if sc.name in KNOWN_MISSES else []
    return pytest.param(sc, id=sc.name, marks=marks)


def _run_scenario(stack, scenario, seed: int, attempt: int):
    """(trace id, root-cause span) of a right verdict for one catalogue job, or (None, failure text)."""
    job = Job(stack, f"cat-{scenario.name}-{attempt}", topology=scenario.topology, fault=scenario.fault, seed=seed,
              duration_s=scenario.duration_s)  # fmt: skip
    with job:
        started_ns = time.time_ns()
        job.wait_sim(scenario.duration_s + 120)
        truth = job.truth
        category = truth["category"]

        def right():
            mine = [(t, sp) for t, sp in verdicts_in_store(stack, category, lookback_s=600)
                    if sp.attributes.get(semconv.RCA_DETECTED, 0) >= started_ns]  # fmt: skip
            return [x for x in mine if is_right(x[1], truth)] or None

        try:
            return wait_until(right, 20, f"a right {category} verdict in {stack.store_kind}")[0]
        except AssertionError:
            got = all_verdicts_since(stack, started_ns)
            short = {k: truth[k] for k in ("category", "culprit_global_ranks", "comm_hash", "onset_ns")}
            return None, (f"{scenario.name} (seed {seed}): no right verdict; truth {short}; verdicts of the job: "
                          f"{got}; sim lag {job.sim_result['stats'].get('max_late_ns', 0) / 1e6:.0f} ms")


@pytest.mark.parametrize("scenario", [_param(sc) for sc in CATALOGUE])
def test_catalogue_scenario_through_the_stack(stack, scenario):
    """A right verdict (category and culprit) found through the store's search; its trace holds the evidence.

    A real-time job on a shared 2-core box is noisy: one retry with another seed (the first failure is
    printed, so a flaky category shows in the test log)."""
    seed = 100 + CATALOGUE.index(scenario)  # own communicator hashes per scenario
    tid, rca = _run_scenario(stack, scenario, seed, 0)
    if tid is None:
        print(f"first attempt: {rca}")
        tid, rca = _run_scenario(stack, scenario, seed + 50, 1)
    assert tid is not None, rca
    spans = stack.traces.get_trace(tid)
    assert any(s.name != semconv.ROOT_CAUSE_SPAN for s in spans), "the verdict's trace holds the evidence"
    # an absent, dead or mismatched rank may have no span in the trace: its peers still link to its op span id
    assert not check_trace_links(spans, tid, require_peers=False)


# -- 2. the 64-rank NIC-down job ---------------------------------------------------------------

NIC_DOWN = dict(topology="nodes=8,gpus=8,tp=8,dp=8", fault="nic_down:rank=19,at=2", seed=7,
                duration_s=2 + STALL_MS / 1000 + 5)  # fmt: skip


@pytest.fixture(scope="module")
def nic_down(stack):
    """Runs the job; returns (job, trace id, root-cause span) of the verdict found through search."""
    job = Job(stack, "nic64", **NIC_DOWN)
    with job:
        job.wait_sim(180)
        truth = job.truth
        assert truth["category"] == "net_send_stalled" and truth["culprit_global_ranks"] == [19]
        found = wait_until(lambda: verdicts_in_store(stack, "net_send_stalled", truth["comm_hash"]), 60,
                           f"a net_send_stalled verdict on comm {truth['comm_hash']} in {stack.store_kind}")  # fmt: skip
        job.read_agent_counters()
    return job, found


def test_nic_down_verdict_found_by_search_names_the_injected_nic(nic_down):
    job, found = nic_down
    truth = job.truth
    assert len(found) == 1, f"one incident, one verdict: {[sp.attributes for _, sp in found]}"
    tid, rca = found[0]
    a = rca.attributes
    assert is_right(rca, truth), a
    assert a[semconv.RCA_KIND] == "hang"
    assert list(a[semconv.RCA_CULPRIT_GLOBAL_RANKS]) == [19]
    assert list(a[semconv.RCA_CULPRIT_RANKS]) == truth["culprit_ranks"]
    assert list(a[semconv.RCA_CULPRIT_HOSTS]) == truth["culprit_hosts"]
    assert a[semconv.COMM_HASH] == truth["comm_hash"]
    # the verdict sits in the trace of the collective it explains (one trace per collective instance)
    assert tid == format(ids.coll_trace_id(job.job_id, int(truth["comm_hash"], 16), truth["coll_seq"]), "032x")
    assert rca.service_name == "mycroft-processor"
    # detected after the onset, within the stall threshold plus a few seconds on this loaded box
    assert 0 <= a[semconv.RCA_DETECTED] - truth["onset_ns"] < (STALL_MS / 1000 + 15) * 1e9


def test_nic_down_trace_holds_every_rank_with_links_intact(stack, nic_down):
    job, found = nic_down
    tid, rca = found[0]
    truth = job.truth
    spans = stack.traces.get_trace(tid)
    evidence = [s for s in spans if s.name != semconv.ROOT_CAUSE_SPAN]
    assert {s.attributes.get(semconv.COMM_HASH) for s in evidence} == {truth["comm_hash"]}
    nranks = evidence[0].attributes[semconv.COMM_NRANKS]
    assert nranks == 8
    assert {s.attributes[semconv.RANK] for s in evidence} == set(range(nranks)), "a rank's evidence is missing"
    in_flight = {s.attributes[semconv.RANK] for s in evidence if s.name == semconv.INFLIGHT_SPAN}
    assert in_flight == set(range(nranks)), "every rank is stuck in the hung all-reduce"
    assert not check_trace_links(spans, tid)
    flow_links = sum(1 for s in evidence for la in s.link_attributes
                     if la.get(semconv.LINK_ROLE) in (semconv.LINK_RECV_FROM, semconv.LINK_SEND_TO))  # fmt: skip
    assert flow_links >= 2 * nranks, "ring flows: every rank links to its predecessor and successor"
    culprit_op = format(ids.span_id(int(tid, 16), truth["culprit_ranks"][0], semconv.ROLE_OP), "016x")
    assert culprit_op in {sid for _, sid in rca.links}, "the verdict links to the culprit's span"


def test_nic_down_agent_exported_without_loss(nic_down):
    job, _ = nic_down
    c = job.agent_counters
    assert c["spans_exported_total"] > 0
    assert c["dropped_export_queue_total"] == c["dropped_export_failed_total"] == c["dropped_ring_total"] == 0
    assert c["export_errors_total"] == 0


def _alerts(stack) -> list[dict]:
    with urllib.request.urlopen(f"{stack.prometheus_url}/api/v1/alerts", timeout=5) as resp:  # noqa: S310
        return json.load(resp)["data"]["alerts"]


def test_nic_down_counted_in_prometheus_and_alert_fires(stack, nic_down):
    job, _ = nic_down
    comm = job.truth["comm_hash"]
    sel = f'mycroft_root_causes_total{{kind="hang",category="net_send_stalled",comm="{comm}"}}'
    res = wait_until(lambda: stack.prometheus_query(sel), 30, sel)
    assert sum(float(r["value"][1]) for r in res) == 1
    assert res[0]["metric"]["job"] == "mycroft-processor"

    def firing():  # one alert for the job: with two processors each may name its own verdict, the likeliest pages
        alerts = [a for a in _alerts(stack) if a["labels"].get("alertname") == "MycroftRootCause"
                  and a["labels"].get("job_id") == job.job_id and a["state"] == "firing"]  # fmt: skip
        return alerts if len(alerts) == 1 and alerts[0]["labels"]["category"] == "net_send_stalled" else None

    alerts = wait_until(firing, 40, f"one MycroftRootCause firing for job {job.job_id}")
    labels = alerts[0]["labels"]
    assert (labels["kind"], labels["category"], labels["severity"]) == ("hang", "net_send_stalled", "critical")
    assert labels["culprit_ranks"] == ",".join(map(str, job.truth["culprit_global_ranks"]))
