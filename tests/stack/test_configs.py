"""Every shipped operations config is checked by the real tool that will load it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from mycroft_otel.evaluate.routing import BY_JOB

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "collector_config"
ALERTS = REPO / "dashboards" / "alerts"

pytestmark = pytest.mark.stack


def run(argv, env=None, timeout=120):
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd=REPO)  # fmt: skip
    assert proc.returncode == 0, f"{' '.join(map(str, argv))} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout + proc.stderr


@pytest.mark.parametrize("name", ["gateway.yaml", "agent.yaml"])
def test_collector_config_validates(otelcol_bin, name):
    run([otelcol_bin, "validate", "--config", CONF / name])


def test_gateway_validates_with_test_environment(otelcol_bin):
    """The env overrides the stack runner uses (list of processors, loopback ports) still validate."""
    env = {
        "MYCROFT_PROCESSORS": "[127.0.0.1:41001, 127.0.0.1:41002, 127.0.0.1:41003]",
        "MYCROFT_TRACES_BACKEND": "127.0.0.1:41004",
        "MYCROFT_GATEWAY_OTLP_GRPC": "127.0.0.1:41005",
        "MYCROFT_GATEWAY_TELEMETRY_PORT": "41006",
    }
    run([otelcol_bin, "validate", "--config", CONF / "gateway.yaml"], env=env)


def test_collector_validate_rejects_a_broken_config(otelcol_bin, tmp_path):
    """`validate` is a real check: a pipeline naming an unknown exporter fails."""
    cfg = yaml.safe_load((CONF / "gateway.yaml").read_text())
    cfg["service"]["pipelines"]["traces/rootcause"]["exporters"] = ["otlp_grpc/nowhere"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(cfg))
    proc = subprocess.run([str(otelcol_bin), "validate", "--config", str(bad)], capture_output=True, text=True)
    assert proc.returncode != 0


def test_jaeger_config_validates(jaeger_bin):
    run([jaeger_bin, "validate", "--config", CONF / "jaeger.yaml"])


def test_gateway_has_no_feedback_loop():
    """Root-cause spans (from processors) must reach the trace store only, never the load balancer,
    and the agents' pipeline must feed both the processors and the trace store."""
    cfg = yaml.safe_load((CONF / "gateway.yaml").read_text())
    pipes = cfg["service"]["pipelines"]
    lb = [e for e in cfg["exporters"] if e.split("/")[0] in ("load_balancing", "loadbalancing")]
    assert len(lb) == 1
    by_receiver = {}
    for name, p in pipes.items():
        for r in p["receivers"]:
            by_receiver.setdefault(r, set()).update(p["exporters"])
    assert lb[0] in by_receiver["otlp"]
    assert "otlp_grpc/traces_backend" in by_receiver["otlp"]
    # root-cause spans go to the trace store and to the span counter (a connector into a metrics
    # pipeline), never into the load balancer
    assert by_receiver["otlp/rootcause"] == {"otlp_grpc/traces_backend", "spanmetrics/rootcause"}
    # a job's spans stay together (the routing the virtual harness measures: evaluate/routing.BY_JOB)
    assert cfg["exporters"][lb[0]]["routing_key"] == BY_JOB.key.value
    assert tuple(cfg["exporters"][lb[0]]["routing_attributes"]) == BY_JOB.attributes
    assert by_receiver["spanmetrics/rootcause"] == {"prometheus"}
    assert "spanmetrics/rootcause" in cfg["connectors"]
    traces_only = {e for n, p in pipes.items() if n.startswith("traces/") for e in p["exporters"]}
    assert lb[0] not in {e for n, p in pipes.items() if "otlp/rootcause" in p["receivers"] for e in p["exporters"]}
    assert "spanmetrics/rootcause" in traces_only


def test_gateway_serves_agent_metrics_and_root_cause_counts_to_prometheus():
    cfg = yaml.safe_load((CONF / "gateway.yaml").read_text())
    pipes = cfg["service"]["pipelines"]
    assert pipes["metrics/agents"]["receivers"] == ["otlp"] and pipes["metrics/agents"]["exporters"] == ["prometheus"]
    dims = {d["name"] for d in cfg["connectors"]["spanmetrics/rootcause"]["dimensions"]}
    from mycroft_otel import semconv as sc
    assert {sc.RCA_KIND, sc.RCA_CATEGORY, sc.RCA_CULPRIT_HOSTS} <= dims
    # a series per verdict is what a trace id or free text as a label makes: the trace id is an exemplar
    assert not dims & {sc.RCA_EVIDENCE, sc.RCA_TRACE_ID}
    assert cfg["connectors"]["spanmetrics/rootcause"]["exemplars"]["enabled"] is True
    assert cfg["exporters"]["prometheus"]["enable_open_metrics"] is True  # exemplars are OpenMetrics-only
    prom = yaml.safe_load((CONF / "prometheus.yml").read_text())
    assert "otelcol-gateway-metrics" in {j["job_name"] for j in prom["scrape_configs"]}


def test_alertmanager_config(tmp_path):
    amtool = shutil.which("amtool")
    if amtool is None:
        pytest.skip("amtool not installed (Debian's prometheus-alertmanager; scripts/install_alertmanager.sh)")
    out = run([amtool, "check-config", CONF / "alertmanager.yml"])
    assert "SUCCESS" in out


def test_prometheus_config(promtool_bin):
    out = run([promtool_bin, "check", "config", CONF / "prometheus.yml"])
    assert "SUCCESS" in out
    # the rule glob of prometheus.yml really picks up our rules (and not the unit-test file)
    assert "mycroft-rules.yaml" in out and "test.yaml" not in out


def test_alert_rules_check(promtool_bin):
    run([promtool_bin, "check", "rules", ALERTS / "mycroft-rules.yaml"])


def test_alert_rules_unit_tests(promtool_bin):
    out = run([promtool_bin, "test", "rules", ALERTS / "mycroft-rules.test.yaml"])
    assert "SUCCESS" in out


_PAGE = "job_id, kind, category, culprit_ranks, culprit_hosts"


@pytest.mark.parametrize("naive", [
    # the old "a verdict in the last 10 minutes" alert: resolves while the job is still hung
    f"max by ({_PAGE}) (max_over_time(mycroft_incidents_open[10m])) > 0",
    # per processor: two processors naming one culprit page twice
    "mycroft_incidents_open > 0",
    # every open incident of a job: two processors naming two culprits page twice
    f"max by ({_PAGE}) (mycroft_incidents_open) > 0",
])
def test_alert_rule_tests_can_fail(promtool_bin, tmp_path, naive):
    """Guard against vacuous rule tests: a windowed, per-processor or per-culprit expression fails them."""
    rules = yaml.safe_load((ALERTS / "mycroft-rules.yaml").read_text())
    alert = next(r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "MycroftRootCause")
    alert["expr"] = naive
    (tmp_path / "mycroft-rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
    (tmp_path / "mycroft-rules.test.yaml").write_text((ALERTS / "mycroft-rules.test.yaml").read_text())
    proc = subprocess.run([str(promtool_bin), "test", "rules", "mycroft-rules.test.yaml"],
                          capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    assert proc.returncode != 0, proc.stdout


def test_root_cause_alert_is_one_per_job_incident():
    rules = yaml.safe_load((ALERTS / "mycroft-rules.yaml").read_text())
    alerts = [r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "MycroftRootCause"]
    assert len(alerts) == 1  # one source: a second one would page twice
    alert, = alerts
    assert f"max by ({_PAGE}) (mycroft_incidents_open)" in alert["expr"] and "topk by (job_id)" in alert["expr"]
    assert "trace_id" not in alert["expr"] and "[" not in alert["expr"]  # no trace in the identity, no window
    assert {"summary", "description", "trace_url", "runbook_url"} <= set(alert["annotations"])
    am = yaml.safe_load((CONF / "alertmanager.yml").read_text())
    nccl = next(r for r in am["route"]["routes"] if 'component = "nccl"' in r["matchers"])
    assert nccl["group_by"] == ["job_id"]


def test_both_gateways_route_by_job():
    """gateway.yaml and gateway-secure.yaml balance the processors on the same key (a cluster switching to the
    secure one must not start splitting its jobs)."""
    for name in ("gateway.yaml", "gateway-secure.yaml"):
        exporters = yaml.safe_load((CONF / name).read_text())["exporters"]
        (lb,) = [v for k, v in exporters.items() if k.split("/")[0] == "load_balancing"]
        assert (lb["routing_key"], tuple(lb["routing_attributes"])) == (BY_JOB.key.value, BY_JOB.attributes), name


def test_the_page_links_come_from_the_incidents_info_series():
    """trace_url and runbook_url are the info series' labels, read alike: the processors know the links (their
    MYCROFT_TRACE_UI_URL, MYCROFT_RUNBOOK_URL), the rule invents none."""
    rules = yaml.safe_load((ALERTS / "mycroft-rules.yaml").read_text())
    alert = next(r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "MycroftRootCause")
    ann = alert["annotations"]
    for link in ("trace_url", "runbook_url"):
        assert ann[link] == ann["trace_id"].replace('label "trace_id"', f'label "{link}"'), link
        assert "http" not in ann[link]
    grafana = yaml.safe_load((REPO / "dashboards" / "grafana-alert-rules.yaml").read_text())
    rule = next(r for g in grafana["groups"] for r in g["rules"] if r.get("title") == "MycroftRootCause")
    for link in ("trace_url", "runbook_url"):
        assert rule["annotations"][link].startswith(f"label {link} of mycroft_incident_info{{"), link
