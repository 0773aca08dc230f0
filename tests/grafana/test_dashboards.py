"""Dashboards and alert rules, checked without a Grafana: shape, datasources, PromQL, metric names."""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.parse
import urllib.request
from types import SimpleNamespace

import pytest
import yaml

from grafana_helpers import GRAFANA_RULES, PROM_RULES, binary, panels, prom_exprs, substitute


def test_dashboards_exist(dashboards):
    assert {"mycroft-overview.json", "mycroft-collective.json", "mycroft-jaeger.json",
            "mycroft-collective-health.json"} <= set(dashboards)
    assert len({d["uid"] for d in dashboards.values()}) == len(dashboards)


def test_every_panel_and_target_uses_a_provisioned_datasource(dashboards, datasource_uids):
    for name, d in dashboards.items():
        ids = [p["id"] for p in panels(d)]
        assert len(ids) == len(set(ids)), f"{name}: duplicate panel ids"
        for p in panels(d):
            where = f"{name} panel {p['id']} {p['title']!r}"
            g = p["gridPos"]
            assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, where
            if p["type"] == "row":
                continue
            ds = p["datasource"]
            assert ds["uid"] in datasource_uids, f"{where}: datasource {ds} not in grafana-datasources.yaml"
            assert ds["type"] == datasource_uids[ds["uid"]], where
            assert p["targets"], f"{where}: no query"
            for t in p["targets"]:
                tds = t.get("datasource", ds)
                assert tds["uid"] in datasource_uids and tds["type"] == datasource_uids[tds["uid"]], where
                if tds["type"] == "prometheus":
                    assert t.get("expr"), where
                elif tds["type"] == "jaeger":  # Jaeger's search (service and operation) or a trace id
                    assert (t.get("queryType") == "search" and t.get("service") and t.get("operation")) or \
                        ("queryType" not in t and t.get("query")), where
                else:
                    assert t.get("query") and t.get("queryType") == "traceql", where
        for v in d["templating"]["list"]:
            if v["type"] == "query":
                assert v["datasource"]["uid"] in datasource_uids, f"{name} variable {v['name']}"


def test_traceql_queries_name_schema_attributes(dashboards):
    """Every span.mycroft.* attribute a TraceQL query selects is a key of the span schema."""
    from mycroft_otel import semconv
    keys = {v for k, v in vars(semconv).items() if isinstance(v, str) and k.isupper()}
    for name, d in dashboards.items():
        for p in panels(d):
            for t in p.get("targets", []):
                for attr in re.findall(r"span\.([a-z_.]+)", t.get("query", "")):
                    assert attr in keys, f"{name} panel {p['title']!r}: {attr} is not in semconv"


def test_collective_links(dashboards):
    over = json.dumps(dashboards["mycroft-overview.json"])
    assert "/d/mycroft-collective/" in over and "var-trace_id=" in over
    coll = dashboards["mycroft-collective.json"]
    assert "trace_id" in {v["name"] for v in coll["templating"]["list"]}


def test_promql_parses_with_promtool(dashboards, tmp_path):
    """promtool check rules parses every expression (as recording rules) offline."""
    promtool = binary("promtool")
    exprs = prom_exprs(dashboards)
    assert len(exprs) >= 10
    rules = {"groups": [{"name": "dashboards", "rules": [
        {"record": f"mycroft:dashboard_expr_{i}", "expr": substitute(e)} for i, (_w, e) in enumerate(exprs)]}]}
    f = tmp_path / "exprs.yaml"
    f.write_text(yaml.safe_dump(rules))
    out = subprocess.run([str(promtool), "check", "rules", str(f)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def _processor_metrics():
    """A real processor Metrics registry that has seen one verdict."""
    from mycroft_otel.processor.metrics import Metrics
    from mycroft_otel.processor.open_incidents import PageLinks
    m = Metrics()
    v = SimpleNamespace(kind="hang", category="gpu_stalled", comm="5f3a9c0e12ab44d1", detected_ns=4_000_000_000,
                        finding=SimpleNamespace(onset_ns=1_000_000_000), analysis_s=0.002)
    m.verdict(v)
    face = SimpleNamespace(kind="hang", category="gpu_stalled", culprit_label=lambda: "19", hosts=("node-2",),
                           trace_id=bytes(range(16)), comm="5f3a9c0e12ab44d1", evidence="rank 3 GPU stalled",
                           confidence=0.9)
    m.incident_shown(SimpleNamespace(job="train-7"), face,
                     PageLinks("http://jaeger:16686/trace/" + bytes(range(16)).hex(),
                               "http://p0:9464/runbook#gpu_stalled"))
    m.spans_received(10, 1)
    m.request_rejected("http", "malformed")
    m.traces_in_memory(3, 0, 0)
    m.propagated()
    return m


def _agent_metric_names() -> set[str]:
    """The agents' collective metrics as the gateway's Prometheus exporter names them (dots to underscores,
    the unit appended, _total on counters, _bucket/_sum/_count on histograms)."""
    from mycroft_otel.agent import metrics as am
    base = {am.DURATION: "_seconds", am.BUS_BANDWIDTH: "_bytes_per_second"}
    names = {n.replace(".", "_") + s + x for n, s in base.items() for x in ("_bucket", "_sum", "_count")}
    names.add(am.NETWORK_WAIT.replace(".", "_") + "_seconds_total")
    names |= {am.IN_FLIGHT.replace(".", "_"), am.LAST_SEQUENCE.replace(".", "_")}
    return names


def test_metric_names_exist_in_processor_or_agent_metrics(dashboards):
    text = _processor_metrics().text()
    exposed = set(re.findall(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]", text, re.M)) | _agent_metric_names()
    exprs = prom_exprs(dashboards)
    from mycroft_otel.agent import metrics as am
    labels = {a.replace(".", "_") for a in (am.ATTR_COMM, am.ATTR_FUNC, am.ATTR_RANK, am.ATTR_SIZE, am.ATTR_PEER,
                                            am.ATTR_DIRECTION)}
    named = {n for _w, e in exprs for n in re.findall(r"\b(mycroft_[a-z0-9_]+)", e)} - labels
    assert named, "no mycroft metric in the dashboards"
    missing = named - exposed
    assert not missing, f"neither in the processor's /metrics nor the agents' metrics: {sorted(missing)}"


def _wait_json(url: str, timeout: float = 20.0):
    end = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return json.loads(r.read())
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.2)


def test_promql_evaluates_on_real_prometheus(dashboards, tmp_path):
    """A real Prometheus scrapes a real processor registry; promtool evaluates every dashboard and alert query."""
    from mycroft_otel.stack.runner import free_ports
    prom = binary("prometheus")
    m = _processor_metrics()
    mport = m.serve(0)
    pport, = free_ports(1)
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(yaml.safe_dump({"global": {"scrape_interval": "1s"}, "scrape_configs": [
        {"job_name": "mycroft-processor", "static_configs": [{"targets": [f"127.0.0.1:{mport}"]}]}]}))
    proc = subprocess.Popen([str(prom), f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'data'}",
                             f"--web.listen-address=127.0.0.1:{pport}"], stdout=subprocess.DEVNULL,
                            stderr=open(tmp_path / "prometheus.log", "w"))
    base = f"http://127.0.0.1:{pport}/api/v1/query?query="
    try:
        end = time.monotonic() + 60
        while True:  # two scrapes, so increase() has samples to work with
            try:
                r = _wait_json(base + urllib.parse.quote("count_over_time(mycroft_processor_traces_in_memory[1m])"))
                if r["data"]["result"] and float(r["data"]["result"][0]["value"][1]) >= 2:
                    break
            except (OSError, KeyError, IndexError):
                pass
            assert time.monotonic() < end, (tmp_path / "prometheus.log").read_text()[-2000:]
            time.sleep(0.5)
        exprs = prom_exprs(dashboards)
        rules = yaml.safe_load(GRAFANA_RULES.read_text())
        exprs += [(f"alert {r['uid']}", r["data"][0]["model"]["expr"]) for g in rules["groups"] for r in g["rules"]]
        results = {}
        promtool = binary("promtool")
        for where, e in exprs:  # evaluated by promtool against the running Prometheus
            out = subprocess.run([str(promtool), "query", "instant", "-o", "json", f"http://127.0.0.1:{pport}",
                                  substitute(e)], capture_output=True, text=True, timeout=30)
            assert out.returncode == 0, (where, out.stderr)
            results[where] = json.loads(out.stdout)
        # the verdict seen by the registry shows up, first one included (the `unless offset` arm)
        stat = [v for w, v in results.items() if "Root causes in range" in w][0]
        assert stat and float(stat[0]["value"][1]) == 1.0, stat
        alert = results["alert mycroft-root-cause"]
        assert [(s["metric"]["job_id"], s["metric"]["category"], s["metric"]["culprit_ranks"]) for s in alert] \
            == [("train-7", "gpu_stalled", "19")]
    finally:
        proc.terminate()
        proc.wait(10)
        m.shutdown()


def _norm(s: str) -> str:
    return " ".join(str(s).split())


def test_grafana_rules_are_the_prometheus_rules():
    """Same expressions, durations, labels, annotations ($value -> $values.A.Value) as dashboards/alerts."""
    prom = {r["alert"]: r for g in yaml.safe_load(PROM_RULES.read_text())["groups"] for r in g["rules"]}
    graf = {r["title"]: r for g in yaml.safe_load(GRAFANA_RULES.read_text())["groups"] for r in g["rules"]}
    assert "MycroftRootCause" in graf
    assert set(graf) <= set(prom)
    for name, gr in graf.items():
        pr = prom[name]
        q = {d["refId"]: d for d in gr["data"]}
        assert _norm(q["A"]["model"]["expr"]) == _norm(pr["expr"]), name
        assert q["A"]["datasourceUid"] == "mycroft-prometheus" and q["A"]["model"]["instant"] is True
        assert q[gr["condition"]]["datasourceUid"] == "__expr__"
        assert str(gr.get("for", "0s")) == str(pr.get("for", "0s")), name
        assert gr["labels"] == pr.get("labels", {}), name
        ann = {k: v for k, v in gr["annotations"].items() if not k.startswith("__")}
        want = {k: _norm(v.replace("$value", "$values.A.Value")) for k, v in pr.get("annotations", {}).items()}
        assert set(ann) == set(want), name
        for k, v in ann.items():  # Grafana has no query(): those annotations name the series to read
            if "| query" in want[k]:
                assert "mycroft_incident_info" in v and f"label {k}" in v or k == "description", (name, k)
            else:
                assert _norm(v) == want[k], (name, k)


def test_alert_annotations_point_at_real_panels(dashboards):
    by_uid = {d["uid"]: d for d in dashboards.values()}
    for g in yaml.safe_load(GRAFANA_RULES.read_text())["groups"]:
        for r in g["rules"]:
            a = r["annotations"]
            if "__dashboardUid__" in a:
                d = by_uid[a["__dashboardUid__"]]
                assert int(a["__panelId__"]) in {p["id"] for p in panels(d)}, r["title"]


@pytest.mark.parametrize("bad", ["{", "[1, 2]"])
def test_bad_json_is_named(tmp_path, bad):
    from mycroft_otel.grafana.payloads import PayloadError, dashboards
    (tmp_path / "ok.json").write_text('{"uid": "a", "title": "a", "panels": []}')
    (tmp_path / "bad.json").write_text(bad)
    with pytest.raises(PayloadError, match=r"bad\.json: (invalid JSON at line 1|a dashboard is a JSON object)"):
        dashboards(tmp_path)
