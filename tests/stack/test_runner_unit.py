"""LocalStack pieces that need no binaries: ports, binary lookup errors, the Prometheus config it derives."""

from __future__ import annotations

import pytest
import yaml

from mycroft_otel.cli import command
from mycroft_otel.stack import LocalStack, ProcessorPorts, StackError, default_processor_command
from mycroft_otel.stack.runner import free_ports
from mycroft_otel.stack.traces import spans_from_otlp_json


def test_free_ports_are_distinct():
    ports = free_ports(40)
    assert len(set(ports)) == 40


def test_missing_binaries_name_the_build_script(tmp_path):
    stack = LocalStack(processors=1, bin_dir=tmp_path / "empty", run_dir=tmp_path / "run", trace_store="jaeger")
    with pytest.raises(StackError, match="build_stack.sh"):
        stack.start()


def test_default_processor_command_uses_the_product_cli():
    argv = default_processor_command(ProcessorPorts(0, 1001, 1002, 1003))
    base = command()   # the product CLI, run with this very package (never `-m`, see cli.command)
    assert argv[:len(base) + 1] == base + ["processor"]
    assert argv[argv.index("--grpc-port") + 1] == "1001"
    assert argv[argv.index("--metrics-port") + 1] == "1003"


def test_prometheus_config_gets_loopback_targets_and_absolute_rules(tmp_path):
    stack = LocalStack(processors=2, run_dir=tmp_path, agent_metrics_targets=["127.0.0.1:9999"])
    stack.store_kind = "jaeger"
    names = ["gw_telemetry", "gw_prometheus", "store_http", "store_telemetry", "store_spanmetrics", "prom"]
    stack.ports = dict(zip(names, free_ports(len(names))))
    stack.processor_ports = [ProcessorPorts(i, 1, 2, 7000 + i) for i in range(2)]
    cfg = yaml.safe_load(stack._prometheus_config().read_text())
    jobs = {j["job_name"]: j["static_configs"][0]["targets"] for j in cfg["scrape_configs"]}
    assert jobs["mycroft-processor"] == ["127.0.0.1:7000", "127.0.0.1:7001"]
    assert jobs["mycroft-agent"] == ["127.0.0.1:9999"]
    assert jobs["traces-spanmetrics"] == [f"127.0.0.1:{stack.ports['store_spanmetrics']}"]
    assert jobs["otelcol-gateway-metrics"] == [f"127.0.0.1:{stack.ports['gw_prometheus']}"]
    assert "alerting" not in cfg  # no Alertmanager asked for
    assert all(r.startswith("/") and r.endswith("-rules.yaml") for r in cfg["rule_files"])


def test_alertmanager_config_points_every_webhook_at_the_callers_url(tmp_path):
    stack = LocalStack(processors=1, run_dir=tmp_path, alert_webhook_url="http://127.0.0.1:1234/hook")
    stack.store_kind = "jaeger"
    names = ["gw_telemetry", "gw_prometheus", "store_http", "store_telemetry", "store_spanmetrics", "prom",
             "alertmanager"]
    stack.ports = dict(zip(names, free_ports(len(names))))
    cfg = yaml.safe_load(stack._alertmanager_config().read_text())
    hooks = [h["url"] for r in cfg["receivers"] for h in r.get("webhook_configs", [])]
    assert hooks and set(hooks) == {"http://127.0.0.1:1234/hook"}
    prom = yaml.safe_load(stack._prometheus_config().read_text())
    assert prom["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == [
        f"127.0.0.1:{stack.ports['alertmanager']}"]


def test_otlp_json_flattening_accepts_hex_and_base64_ids():
    tid = "0af7651916cd43dd8448eb211c80319c"
    doc = {"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "svc"}}]},
        "scopeSpans": [{"spans": [
            {"traceId": tid, "spanId": "b7ad6b7169203331", "name": "a",
             "attributes": [{"key": "mycroft.rca.culprit.ranks",
                             "value": {"arrayValue": {"values": [{"intValue": "3"}]}}}]},
            {"traceId": "CvdlGRbNQ92ESOshHIAxnA==", "spanId": "t61rcWkgMzE=", "name": "b",
             "links": [{"traceId": tid, "spanId": "b7ad6b7169203331"}]},
        ]}],
    }]}  # fmt: skip
    a, b = spans_from_otlp_json(doc)
    assert a.trace_id == b.trace_id == tid
    assert b.span_id == "b7ad6b7169203331"
    assert a.attributes["mycroft.rca.culprit.ranks"] == [3]
    assert a.service_name == "svc"
    assert b.links == ((tid, "b7ad6b7169203331"),)
