"""A processor killed -9 in the middle of a hang, behind the real gateway (issue 29, item 3).

Two `mycroft-otel processor`s, each with its own `--state-dir`, behind the gateway that routes by job id;
Jaeger stores the traces. A job hangs (a NIC stops sending on global rank 2). The processor that owns the job
(found with the gateway's own hash ring, evaluate/routing.py) names it; then it is killed with SIGKILL and
started again on the same ports and state directory, while the job stays hung and its agent keeps sending
the hung collectives' snapshots. Expected: the restarted processor restores the checkpoint it wrote when it
named the hang (processor/checkpoint.py), exactly one right root-cause span in the trace store (the same hang
found again is the same incident, and a verdict published before is not published twice), the job's incident
open at the restarted processor (its page must not resolve while the job is hung), and nothing dropped in
the gateway: the spans sent while the processor was down waited in the exporter's queue for its return.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from e2e_helpers import Job, all_verdicts_since, scrape, verdicts_in_store, wait_until
from mycroft_otel import semconv
from mycroft_otel.semconv import JOB_ID
from mycroft_otel.evaluate.routing import BY_JOB, HashRing
from mycroft_otel.stack import LocalStack, ProcessorPorts
from mycroft_otel.stack.runner import default_processor_command

STALL_MS = 3000
TOPOLOGY = "nodes=4,gpus=2,tp=2,dp=4"


@pytest.fixture(scope="module")
def stack(e2e_bin_dir, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("e2e-restart")

    def with_state(pp: ProcessorPorts) -> list[str]:
        return default_processor_command(pp) + ["--state-dir", str(run_dir / f"state-{pp.index}")]

    st = LocalStack(processors=2, processor_command=with_state, trace_store="jaeger", with_prometheus=False,
                    run_dir=run_dir, bin_dir=e2e_bin_dir,
                    processor_env={"MYCROFT_STALL_MS": str(STALL_MS)}, ready_timeout_s=120)
    with st:
        yield st


def _gateway_counter(stack: LocalStack, name: str, **labels: str) -> float:
    text = scrape(f"http://127.0.0.1:{stack.ports['gw_telemetry']}/metrics")
    total = 0.0
    for line in text.splitlines():
        head, _, value = line.rpartition(" ")
        metric = head.split("{", 1)[0]
        if metric in (name, f"{name}_total") and all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def _owner(stack: LocalStack, job: Job) -> int:
    """The index of the processor the gateway sends the job to (its own hash ring of the job id)."""
    ring = HashRing([pp.otlp_grpc for pp in stack.processor_ports])
    owner = ring.endpoint_for(BY_JOB.key_for({JOB_ID: job.job_id}))
    return next(pp.index for pp in stack.processor_ports if pp.otlp_grpc == owner)


def _verdict_lines(stack: LocalStack) -> list[str]:
    """Each processor's log lines of the verdicts it published (which processor, collective and evidence)."""
    out = []
    for log in sorted((Path(stack.run_dir) / "logs").glob("processor-*.log")):
        out += [f"{log.name}: {line}" for line in log.read_text(errors="replace").splitlines() if "root cause:" in line]
    return out


def test_a_processor_killed_mid_hang_gives_one_verdict_and_loses_nothing(stack):
    job = Job(stack, "restart", topology=TOPOLOGY, fault="nic_down:rank=2,at=2", seed=21, duration_s=300)
    index = _owner(stack, job)
    metrics_url = f"http://127.0.0.1:{stack.processor_ports[index].metrics}/metrics"
    other_url = f"http://127.0.0.1:{stack.processor_ports[1 - index].metrics}/metrics"
    started_ns = time.time_ns()
    with job:
        wait_until(lambda: verdicts_in_store(stack, semconv.CAT_NET_SEND_STALLED), 180, "the hang's verdict")
        assert "mycroft_incidents_open{" in scrape(metrics_url)
        stack.kill_processor(index)
        time.sleep(3.0)  # the agent goes on sending the hung collective's snapshots meanwhile
        stack.restart_processor(index)
        log = Path(stack.run_dir) / "logs" / f"processor-{index}.log"
        wait_until(lambda: "detector history restored" in log.read_text(errors="replace"), 60,
                   "the restarted processor restoring its checkpoint")
        assert re.search(r"detector history restored .* 1 open incidents", log.read_text(errors="replace"))
        wait_until(lambda: "mycroft_incidents_open{" in scrape(metrics_url), 30, "the job's incident open again")
        assert f'job_id="{job.job_id}"' in scrape(metrics_url)
        time.sleep(5.0)  # more snapshots through the restarted processor
        verdicts = verdicts_in_store(stack, semconv.CAT_NET_SEND_STALLED)
        lb = {"exporter": "load_balancing/processors"}
        sent = _gateway_counter(stack, "otelcol_exporter_sent_spans", **lb)
        failed = _gateway_counter(stack, "otelcol_exporter_send_failed_spans", **lb)
        enqueue_failed = _gateway_counter(stack, "otelcol_exporter_enqueue_failed_spans", **lb)
    assert len(verdicts) == 1, [(t, s.attributes) for t, s in verdicts]
    # nor any other verdict: the hung job's other communicators, whose snapshots the agents re-send after the
    # restart, wait on the hang named before it (the checkpoint's process index and incident keys)
    assert len(all_verdicts_since(stack, started_ns)) == 1, (all_verdicts_since(stack, started_ns),
                                                              _verdict_lines(stack))
    (_, span), = verdicts
    assert list(span.attributes[semconv.RCA_CULPRIT_GLOBAL_RANKS]) == [2], span.attributes
    assert sent > 0 and failed == 0 and enqueue_failed == 0, (sent, failed, enqueue_failed)
    assert "mycroft_processor_spans_received_total 0.0" in scrape(other_url)  # the job went to its owner only

