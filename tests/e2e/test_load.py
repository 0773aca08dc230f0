"""Load: a healthy 1,024-rank simulated job for 2 minutes of real time through the real stack.

benchmarks/stack_load/run.py (``job``) does the work: 1,024 ranks (nodes=128,gpus=8,tp=8,pp=16,dp=8; 3,072 plugin
contexts), ~6.4 s training steps of ~9 collectives per rank (about 1,500 rank-collectives/s for the job; the rate the
run reached is in its result), one agent (default sampling: 1 % of healthy collectives, plus per-context
summaries, plus every anomaly) → gateway → 2 processors → Jaeger. Here we check its accounting:

* spans sent (the agent's own counters) = accepted by the gateway = received by the processors (sum) = accepted
  by the trace store less the verdicts (the only other spans it gets); nothing dropped, refused or failed;
* the gateway routes by job id: the one job's spans all reach one of the 2 processors; the collector's and
  processors' private memory stays bounded.

The benchmark's own job (~3.4 s steps, about 3,000 rank-collectives/s) keeps this machine's 2 cores at their
limit: one agent process reads all 128 nodes' rings (~1.1 cores) beside the simulator, the gateway, 2 processors
and Jaeger, and on a slow day its export queue overflows or the gateway's retries repeat batches. Those are
capacity figures, which the benchmark reports; here the same job runs at half the rate, so the accounting is
checked with headroom.

Whether the detector stays silent on this healthy job is checked on virtual time
(tests/evaluate/test_healthy_at_scale.py), not here: in real time on 2 shared cores the simulator's replay
threads fall seconds behind each other, so the rings break causality (a rank completes an all-reduce before its
peer launched it) and a verdict would measure the machine, not the detector.
"""

from __future__ import annotations

import json
import os

import pytest

pytestmark = [pytest.mark.stack, pytest.mark.slow]

DURATION_S = float(os.environ.get("MYCROFT_LOAD_SECONDS", "120"))


@pytest.fixture(scope="module")
def load(e2e_bin_dir, tmp_path_factory, stack_load):
    res = stack_load.run_job(tmp_path_factory.mktemp("stack-load"), duration_s=DURATION_S, bin_dir=e2e_bin_dir,
                           record=False, log=print, host_s=5.5)  # fmt: skip
    print(json.dumps(res, indent=1))
    return res


def test_load_job_ran_at_scale(load):
    sim = load["sim"]
    assert sim["world"] == 1024 and sim["contexts"] == 3 * 1024
    c = load["counts"]
    # every completion the plugin wrote was read (the agent kept up; rings of 64 records per context)
    assert c["agent_records_read"] >= 0.8 * 1024 * 7 * sim["steps"], c
    assert load["rates"]["rank_ops_per_s"] > 1000


def test_load_spans_sent_equal_spans_received(load):
    c = load["counts"]
    assert c["agent_dropped"] == 0 and c["agent_export_errors"] == 0, c
    assert c["agent_spans_exported"] == c["agent_spans_built"] > 0, c
    assert c["gateway_accepted"] == c["agent_spans_exported"], c
    assert c["gateway_refused"] == 0 and c["gateway_send_failed"] == 0, c
    assert c["gateway_sent_processors"] == c["gateway_accepted"], c
    # OTLP export is at-least-once: a batch the gateway retried after a processor answered too late (timeout
    # 5 s, retry_on_failure) arrives twice -- harmless, span ids are deterministic and verdicts idempotent.
    # Nothing may be lost; a few retried batches may repeat.
    dup = c["processors_received"] - c["agent_spans_exported"]
    assert 0 <= dup <= 0.01 * c["agent_spans_exported"], c
    # the trace store gets every agent span plus the processors' root-cause spans (through the gateway's
    # second receiver), nothing else
    assert c["store_accepted"] == c["agent_spans_exported"] + c["verdicts"], c


def test_load_one_jobs_spans_reach_one_processor(load):
    """The real gateway's load_balancing exporter on ``mycroft.job.id``: every span of the job (its 3,072
    contexts' TP, PP and DP communicators) at one processor, none at the other."""
    each = load["counts"]["processors_received_each"]
    assert len(each) == 2 and sorted(each) == [0, sum(each)] and sum(each) > 0, each


def test_load_collector_and_processor_memory_bounded(load):
    u = load["usage"]
    gw = u["otelcol-gateway"]
    assert gw["rss_max_mib"] < 400, gw  # memory_limiter's hard limit is 1024 MiB
    for name in ("processor-0", "processor-1"):
        p = u[name]
        # processors hold at most MYCROFT_MAX_TRACES traces for MYCROFT_TRACE_TTL_S (120 s); deploy.md: 1.5-2 GiB
        assert p["rss_max_mib"] < 1500, (name, p)
    assert u["agent"]["rss_max_mib"] < 600, u["agent"]
