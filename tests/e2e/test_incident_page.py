"""One page per incident, on the real stack: gateway, `mycroft-otel processor`, Jaeger, Prometheus with the
shipped rules, Alertmanager with the shipped routes, and a webhook served here.

A job hangs (a NIC stops sending on global rank 2). The processor names it and opens the job's incident;
Prometheus' MycroftRootCause reads it and Alertmanager posts exactly one notification, which names the
global culprit and its host and links the trace in Jaeger and the runbook (the processor's own /runbook,
fetched here: the page's category is a section of it). The job stays hung for 15
minutes of the incidents' clock (the processor runs it 20x real time, fast_clock_processor.py; the quiet
window is 5 of those minutes): the page stays up, nothing resolves. Then the job restarts under the same
job id and its culprit process runs collectives again: the processor closes the incident and Alertmanager
posts the resolution, while the old hung job is still sending its snapshots (so it is the recovery that
ended the page, not the job's silence). Alertmanager's timings are seconds here, minutes in the shipped file.
"""

from __future__ import annotations

import re
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from e2e_helpers import Job, Webhook, verdicts_in_store, wait_until
from mycroft_otel.stack import LocalStack, ProcessorPorts

STALL_MS = 3000
SPEED = 20.0            # the incidents' clock against real time
QUIET_S = 300           # MYCROFT_INCIDENT_QUIET_S, on the incidents' clock: 15 s real
HANG_MINUTES = 15
FAST = Path(__file__).with_name("fast_clock_processor.py")
TOPOLOGY = "nodes=4,gpus=2,tp=2,dp=4"


def _fast_processor(pp: ProcessorPorts) -> list[str]:
    return [sys.executable, str(FAST), str(SPEED), "processor", "--bind", pp.bind, "--grpc-port", str(pp.grpc),
            "--http-port", str(pp.http), "--metrics-port", str(pp.metrics)]


@pytest.fixture(scope="module")
def stack(e2e_bin_dir, alertmanager_bin, tmp_path_factory, webhook):
    st = LocalStack(processors=1, processor_command=_fast_processor, trace_store="jaeger",
                    run_dir=tmp_path_factory.mktemp("e2e-page"), bin_dir=e2e_bin_dir,
                    processor_env={"MYCROFT_STALL_MS": str(STALL_MS), "MYCROFT_INCIDENT_QUIET_S": str(QUIET_S)},
                    alert_webhook_url=webhook.url, ready_timeout_s=120,
                    alert_timing={"group_wait": "1s", "group_interval": "2s", "repeat_interval": "1h"})
    with st:
        yield st


def _posts(webhook: Webhook, job_id: str, status: str) -> list[dict]:
    """The notifications about the job's group with this status."""
    return [n for n in list(webhook.notifications)
            if n.get("groupLabels", {}).get("job_id") == job_id and n.get("status") == status]


def _firing_alerts(stack: LocalStack, job_id: str) -> list[dict]:
    import json
    with urllib.request.urlopen(f"{stack.prometheus_url}/api/v1/alerts", timeout=5) as resp:  # noqa: S310
        alerts = json.load(resp)["data"]["alerts"]
    return [a for a in alerts if a["labels"].get("alertname") == "MycroftRootCause"
            and a["labels"].get("job_id") == job_id and a["state"] == "firing"]


def test_one_page_per_hang_up_while_hung_resolved_on_recovery(stack, webhook):
    hung = Job(stack, "page", topology=TOPOLOGY, fault="nic_down:rank=2,at=2", seed=11, duration_s=600)
    restart = Job(stack, "page-restart", topology=TOPOLOGY, fault="healthy", seed=12, duration_s=600,
                  id=hung.job_id, agent_env={"MYCROFT_SUMMARY_MS": "1000"})
    with hung:
        # -- the page: one notification, useful from the first
        post, = wait_until(lambda: _posts(webhook, hung.job_id, "firing"), 180, f"a page for job {hung.job_id}")
        paged = time.monotonic()
        alert, = post["alerts"]
        labels, ann = alert["labels"], alert["annotations"]
        assert (labels["kind"], labels["category"], labels["severity"]) == ("hang", "net_send_stalled", "critical")
        assert labels["culprit_ranks"] == "2"  # global rank 2 (rank 1 of its DP communicator)
        assert labels["culprit_hosts"] == "sim-node001", labels
        assert "global rank 2 on sim-node001" in ann["summary"] and hung.job_id in ann["summary"]
        runbook, _, section = ann["runbook_url"].partition("#")
        assert runbook == f"http://{stack.processor_ports[0].bind}:{stack.processor_ports[0].metrics}/runbook", ann
        assert section == labels["category"]
        with urllib.request.urlopen(runbook, timeout=10) as resp:  # noqa: S310
            assert resp.headers["Content-Type"].startswith("text/html")
            page = resp.read().decode()
        assert re.search(rf'<h[1-6] id="{section}">', page), page[:2000]
        assert ann["description"], ann
        (tid, rca), = wait_until(lambda: verdicts_in_store(stack, "net_send_stalled"), 60, "the verdict in Jaeger")
        assert ann["trace_id"] == tid
        assert ann["trace_url"] == f"{stack.trace_store_url}/trace/{tid}"

        # -- still hung for 15 minutes of the incidents' clock: the page stays, nothing more is posted
        hold_s = HANG_MINUTES * 60 / SPEED + 2
        while time.monotonic() - paged < hold_s:
            assert not _posts(webhook, hung.job_id, "resolved"), "resolved while the job is still hung"
            time.sleep(1)
        assert _firing_alerts(stack, hung.job_id), "MycroftRootCause no longer firing after 15 minutes of hang"
        assert len(_posts(webhook, hung.job_id, "firing")) == 1, _posts(webhook, hung.job_id, "firing")

        # -- the job restarts under the same id; its culprit runs again: resolved (the old one still sends)
        with restart:
            wait_until(lambda: _posts(webhook, hung.job_id, "resolved"), 180, "the resolution of the page")
    assert len(_posts(webhook, hung.job_id, "firing")) == 1, [n["alerts"] for n in webhook.notifications]
    log = (Path(stack.run_dir) / "logs" / "processor-0.log").read_text(errors="replace")
    assert "is over" in log and "no span of the job" not in log, log[-3000:]
