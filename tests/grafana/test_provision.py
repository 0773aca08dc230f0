"""`mycroft-otel grafana provision` without a Grafana: payloads, dry run, and the errors it can meet here."""

from __future__ import annotations

import json

import pytest

from mycroft_otel import cli
from mycroft_otel.grafana import payloads
from mycroft_otel.stack.runner import free_ports


def test_payloads_are_well_formed():
    p = payloads.build(urls={"prometheus": "http://prom.example:9090"})
    uids = {d["uid"] for d in p.datasources}
    assert uids == {"mycroft-prometheus", "mycroft-tempo", "mycroft-jaeger"}
    prom = [d for d in p.datasources if d["type"] == "prometheus"][0]
    assert prom["url"] == "http://prom.example:9090" and prom["access"] == "proxy"
    assert p.folder == {"uid": "mycroft-otel", "title": "mycroft-otel"}
    assert {d["dashboard"]["uid"] for d in p.dashboards} == {"mycroft-overview", "mycroft-collective",
                                                             "mycroft-jaeger", "mycroft-collective-health"}
    for d in p.dashboards:
        assert d["overwrite"] is True and d["folderUid"] == "mycroft-otel" and d["dashboard"]["id"] is None
    assert "MycroftRootCause" in {r["title"] for r in p.rules}
    for g in p.rule_groups:
        assert g["folderUid"] == "mycroft-otel" and isinstance(g["interval"], int) and g["interval"] > 0
        for r in g["rules"]:
            assert set(r) >= {"uid", "orgID", "folderUID", "ruleGroup", "title", "condition", "data", "noDataState",
                              "execErrState", "for", "labels", "annotations"}
            assert r["ruleGroup"] == g["title"] and r["folderUID"] == "mycroft-otel"
            assert r["noDataState"] in ("NoData", "Alerting", "OK") and r["execErrState"] in ("Error", "Alerting", "OK")
            assert r["condition"] in {q["refId"] for q in r["data"]}
            for q in r["data"]:
                assert q["datasourceUid"] in uids | {payloads.EXPR_UID}
                assert q["model"]["refId"] == q["refId"] and set(q["relativeTimeRange"]) == {"from", "to"}
    json.dumps(p.__dict__)  # plain JSON all the way down


def test_dry_run_writes_request_bodies(tmp_path):
    assert cli.main(["grafana", "provision", "--dry-run", str(tmp_path)]) == 0
    names = sorted(f.name for f in tmp_path.iterdir())
    assert "dashboard-mycroft-overview.json" in names and "rule-group-mycroft-root-cause.json" in names
    assert "datasource-mycroft-tempo.json" in names and "folder.json" in names
    body = json.loads((tmp_path / "rule-group-mycroft-root-cause.json").read_text())
    assert body["rules"][0]["title"] == "MycroftRootCause"


def test_bad_dashboard_file_is_named_before_any_connection(tmp_path, capsys):
    (tmp_path / "bad.json").write_text('{\n  "uid": "x",\n  oops\n}')
    port, = free_ports(1)
    rc = cli.main(["grafana", "provision", "--url", f"http://127.0.0.1:{port}", "--dashboards", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2
    assert "bad.json: invalid JSON at line 3" in err
    assert "cannot reach" not in err


def test_bad_alert_rule_file_is_named(tmp_path, capsys):
    f = tmp_path / "rules.yaml"
    f.write_text("groups:\n  - name: g\n    rules:\n      - uid: a\n        title: A\n        condition: Z\n"
                 "        data:\n          - {refId: A, datasourceUid: mycroft-prometheus, model: {expr: up}}\n")
    rc = cli.main(["grafana", "provision", "--dry-run", str(tmp_path / "out"), "--alert-rules", str(f)])
    assert rc == 2
    assert "condition 'Z' is none of the refIds ['A']" in capsys.readouterr().err


def test_missing_url(capsys, monkeypatch):
    monkeypatch.delenv("GRAFANA_URL", raising=False)
    assert cli.main(["grafana", "provision"]) == 2
    assert "--url is required" in capsys.readouterr().err


def test_unreachable_grafana(capsys):
    pytest.importorskip("grafana_client")
    port, = free_ports(1)  # nothing listens there
    rc = cli.main(["grafana", "provision", "--url", f"http://127.0.0.1:{port}", "--token", "t", "--timeout", "3"])
    err = capsys.readouterr().err
    assert rc == 2
    assert f"cannot reach Grafana at http://127.0.0.1:{port}" in err and "Connection refused" in err


def test_http_errors_are_explained():
    """grafana-client's exceptions (as it raises them for 401/403/400/500) -> one actionable line."""
    pytest.importorskip("grafana_client")
    from grafana_client import client as gc

    from mycroft_otel.grafana.push import explain

    url = "http://g:3000"
    e = explain(gc.GrafanaUnauthorizedError({"message": "invalid API key"}), url, "reading")
    assert e.fatal and "refused the credentials (401" in str(e) and "--token" in str(e)
    e = explain(gc.GrafanaClientError(403, {"message": "permissions"}, "Client Error 403"), url, "creating x")
    assert e.fatal and "403 Forbidden" in str(e) and "Admin" in str(e)
    e = explain(gc.GrafanaBadInputError({"message": "Dashboard title cannot be empty"}), url, "saving dashboard y")
    assert not e.fatal and "rejected saving dashboard y (400 Bad Request): Dashboard title cannot be empty" in str(e)
    e = explain(gc.GrafanaServerError(500, {"message": "db locked"}, "Server Error 500"), url, "saving")
    assert not e.fatal and "500 server error" in str(e)
