"""`mycroft-otel drill` as an operator runs it: beside a running agent, against the real stack, until paged.

A real `mycroft-otel agent` watches a ring directory and exports to the gateway of a real stack (gateway,
one processor, Jaeger, Prometheus, Alertmanager whose webhook is served here). `mycroft-otel drill
--ring-dir DIR --alertmanager URL` writes a hung synthetic job there and must exit 0 having seen the
MycroftRootCause alert of its job in Alertmanager; the webhook (the operator's pager) must have
received that notification, naming the simulated culprit host.
"""

from __future__ import annotations

import signal
import subprocess

import pytest

from e2e_helpers import PY, clean_env, wait_until
from mycroft_otel.stack import LocalStack
from mycroft_otel.stack.runner import free_ports, http_ok

STALL_MS = 3000


@pytest.fixture(scope="module")
def stack(e2e_bin_dir, alertmanager_bin, tmp_path_factory, webhook):
    st = LocalStack(processors=1, run_dir=tmp_path_factory.mktemp("e2e-drill"), bin_dir=e2e_bin_dir,
                    processor_env={"MYCROFT_STALL_MS": str(STALL_MS)}, ready_timeout_s=120,
                    alert_webhook_url=webhook.url)  # fmt: skip
    with st:
        yield st


@pytest.mark.slow
@pytest.mark.stack
def test_drill_beside_a_real_agent_pages_through_alertmanager(stack, webhook, tmp_path):
    ring_dir = tmp_path / "rings"
    ring_dir.mkdir(mode=0o700)
    metrics_port = free_ports(1)[0]
    env = clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=stack.agent_otlp_grpc, OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
                    OTEL_SERVICE_NAME="mycroft-agent")  # fmt: skip
    with open(tmp_path / "agent.log", "wb") as log:
        agent = subprocess.Popen(PY + ["agent", "--ring-dir", str(ring_dir), "--metrics-port", str(metrics_port)],
                                 env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        wait_until(lambda: agent.poll() is not None or http_ok(url), 30, "agent /metrics")
        assert agent.poll() is None, (tmp_path / "agent.log").read_text()[-3000:]
        # the drill runs in the operator's shell: no OTEL_* of its own (the agent exports), short job
        drill = subprocess.run(PY + ["drill", "--ring-dir", str(ring_dir), "--duration", str(2 + STALL_MS / 1000 + 7),
                                     "--alertmanager", stack.alertmanager_url, "--wait", "90"],
                               env=clean_env(), capture_output=True, text=True, timeout=300)  # fmt: skip
        assert drill.returncode == 0, drill.stdout + drill.stderr[-3000:]
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(timeout=15)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait(timeout=5)
    out = drill.stdout
    assert "paged     MycroftRootCause net_send_stalled severity=critical" in out, out
    injected = next(line for line in out.splitlines() if line.startswith("injected"))
    host = injected.split(" on ", 1)[1].split(",")[0]
    assert host.startswith("sim-node"), injected
    job = next(line for line in out.splitlines() if line.startswith("expect")).split('job_id="', 1)[1].split('"')[0]

    def delivered() -> list[dict]:
        return [a for a in webhook.alerts() if a["labels"].get("alertname") == "MycroftRootCause"
                and a["labels"].get("job_id") == job and a["status"] == "firing"]  # fmt: skip

    # the job's one page names the culprit's host
    alerts = wait_until(delivered, 60, f"the drill's notification for job {job} at the webhook")
    assert any(host in a["labels"].get("culprit_hosts", "") for a in alerts), alerts
