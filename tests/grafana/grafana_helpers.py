"""Helpers of the Grafana tests (not conftest.py: other test folders have one too).

No Grafana runs here (AGPL, not installed), so nothing pretends to be one.

What is checked: the dashboards are what mycroft_otel/grafana/dashboards.py generates, dashboard
JSON sanity, TraceQL through Grafana's own grammar (@grafana/lezer-traceql with node), PromQL
through the real promtool and a real Prometheus scraping a real processor /metrics registry,
alert-rule equivalence with dashboards/alerts, the API payloads, and the CLI's errors that need
no Grafana (unreachable URL, bad files).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from mycroft_otel.stack.runner import find_binary

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((REPO / "dashboards").glob("*.json"))
DATASOURCES = REPO / "collector_config" / "grafana-datasources.yaml"
GRAFANA_RULES = REPO / "dashboards" / "grafana-alert-rules.yaml"
PROM_RULES = REPO / "dashboards" / "alerts" / "mycroft-rules.yaml"
TRACEQL_DIR = Path(__file__).resolve().parent / "traceql"  # package.json: @grafana/lezer-traceql


def strict() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def binary(name: str) -> Path:
    path = find_binary(name)
    if path is None:
        msg = f"{name} not found (scripts/install_prometheus.sh installs it)"
        if strict():
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    return path


def load_dashboards() -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in DASHBOARDS}


def load_datasource_uids() -> dict[str, str]:
    doc = yaml.safe_load(DATASOURCES.read_text())
    return {d["uid"]: d["type"] for d in doc["datasources"]}


def panels(d: dict):
    for p in d["panels"]:
        yield p
        yield from p.get("panels", [])


def prom_exprs(dashboards: dict) -> list[tuple[str, str]]:
    """(where, expr) of every Prometheus query in the dashboards."""
    out = []
    for name, d in dashboards.items():
        for p in panels(d):
            for t in p.get("targets", []):
                if t.get("datasource", p.get("datasource", {})).get("type") == "prometheus":
                    out.append((f"{name} panel {p['id']} ({p['title']}) {t['refId']}", t["expr"]))
    return out


def substitute(expr: str) -> str:
    """Grafana's variables -> what Grafana would put there (ranges; 'All' regexes)."""
    for var, val in (("$__rate_interval", "1m"), ("$__range", "5m"), ("$__interval", "15s")):
        expr = expr.replace(var, val)
    for var in ("$kind", "$category", "$comm", "$func"):
        expr = expr.replace(f'=~"{var}"', '=~".*"').replace(f'="{var}"', '=""')
    assert not re.search(r"\$[A-Za-z_{]", expr), expr  # no Grafana variable left ($1 is label_replace's)
    return expr


def traceql_queries(dashboards: dict) -> list[tuple[str, str]]:
    """(where, query) of every TraceQL query, Grafana's variables replaced as Grafana would."""
    out = []
    for name, d in dashboards.items():
        for p in panels(d):
            for t in p.get("targets", []):
                if t.get("queryType") != "traceql":
                    continue
                q = t["query"].replace("${trace_id}", "0123456789abcdef0123456789abcdef")
                q = re.sub(r"\$\{(kind|category|comm):regex\}", ".*", q)
                assert "$" not in q, (name, p["title"], q)
                out.append((f"{name} panel {p['id']} ({p['title']}) {t['refId']}", q))
    return out


def parse_traceql(queries: list[str]) -> list[dict | None]:
    """Grafana's TraceQL grammar on each query: None, or where the first syntax error is."""
    node = shutil.which("node")
    if node is None or not (TRACEQL_DIR / "node_modules" / "@grafana" / "lezer-traceql").is_dir():
        msg = "node or @grafana/lezer-traceql missing (scripts/test.sh runs npm ci in tests/grafana/traceql)"
        if strict():
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    out = subprocess.run([node, str(TRACEQL_DIR / "parse.mjs")], input=json.dumps(queries), capture_output=True,
                         text=True, timeout=60, cwd=TRACEQL_DIR)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)
