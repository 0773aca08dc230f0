"""The committed dashboards are the generator's output, and their TraceQL parses with Grafana's grammar."""

from __future__ import annotations

import subprocess
import sys

from grafana_helpers import DASHBOARDS, REPO, parse_traceql, traceql_queries

from mycroft_otel.grafana import dashboards as gen


def test_regenerating_gives_the_same_bytes(tmp_path):
    out = subprocess.run([sys.executable, "-m", "mycroft_otel.grafana.dashboards", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in DASHBOARDS), \
        "every dashboards/*.json comes from the generator"
    for p in DASHBOARDS:
        assert (tmp_path / p.name).read_bytes() == p.read_bytes(), \
            f"{p.name} differs from the generator's output: run python -m mycroft_otel.grafana.dashboards"


def test_check_mode_names_a_stale_file(tmp_path):
    gen.main(["--out", str(tmp_path)])
    (tmp_path / "mycroft-overview.json").write_text("{}")
    assert gen.main(["--out", str(tmp_path), "--check"]) == 1
    gen.main(["--out", str(tmp_path)])
    assert gen.main(["--out", str(tmp_path), "--check"]) == 0


def test_schema_version_is_grafana_11_6(dashboards):
    # Grafana 11.6 writes schemaVersion 41; Grafana 12 imports it and migrates on load
    assert {d["schemaVersion"] for d in dashboards.values()} == {41}


def test_every_traceql_query_parses_with_grafanas_grammar(dashboards):
    queries = traceql_queries(dashboards)
    assert len(queries) >= 4
    # the trace view's query is a bare trace id (a lookup, not a TraceQL expression)
    exprs = [(w, q) for w, q in queries if q.startswith("{")]
    assert len(exprs) >= 3
    errors = parse_traceql([q for _, q in exprs])
    bad = [(w, q, e) for (w, q), e in zip(exprs, errors) if e is not None]
    assert not bad, bad


def test_the_grammar_check_can_fail():
    """The parser rejects what Grafana's editor would mark as an error (the check is not vacuous)."""
    errors = parse_traceql(['{ name = "mycroft.root_cause" && }', '{ span.mycroft.rank >= 0 } | nosuchfn(x)',
                            '{ span.mycroft.rank >= 0 } | select(span.mycroft.rank)'])
    assert errors[0] is not None and errors[1] is not None and errors[2] is None


def test_jaeger_root_cause_table(dashboards):
    over = dashboards["mycroft-overview.json"]
    jaeger = [p for p in over["panels"] if p.get("datasource", {}).get("type") == "jaeger"]
    assert len(jaeger) == 1
    t = jaeger[0]["targets"][0]
    assert (t["service"], t["operation"]) == ("mycroft-processor", "mycroft.root_cause")


def test_jaeger_dashboard_is_jaeger_only_and_searches_the_processors_spans(dashboards):
    """The Jaeger variant: no Tempo query anywhere; the search is service $service (default: the processors'
    OTEL_SERVICE_NAME of the stack and docker-compose) and operation mycroft.root_cause; the verdict and trace
    panels query the trace id that the search table's link fills."""
    import yaml

    from mycroft_otel import semconv

    d = dashboards["mycroft-jaeger.json"]
    targets = [t for p in d["panels"] for t in p["targets"]]
    assert {p["datasource"]["type"] for p in d["panels"]} == {"jaeger"}
    assert {t["datasource"]["uid"] for t in targets} == {"mycroft-jaeger"}
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert set(variables) == {"service", "tags", "trace_id", "jaeger_ui"}
    compose = yaml.safe_load((REPO / "collector_config" / "docker-compose.yaml").read_text())
    processor_services = {s["environment"]["OTEL_SERVICE_NAME"] for name, s in compose["services"].items()
                          if name.startswith("mycroft-processor")}
    assert processor_services == {variables["service"]["query"]} == {gen.PROCESSOR_SERVICE}
    runner = (REPO / "mycroft_otel" / "stack" / "runner.py").read_text()
    assert f'"OTEL_SERVICE_NAME": "{gen.PROCESSOR_SERVICE}"' in runner, "the local stack's processors"
    (search,) = [t for t in targets if t.get("queryType") == "search"]
    assert (search["service"], search["operation"], search["tags"]) == ("${service}", semconv.ROOT_CAUSE_SPAN,
                                                                        "${tags}")
    assert [t["query"] for t in targets if "queryType" not in t] == ["${trace_id}", "${trace_id}"]
    assert [p["type"] for p in d["panels"]] == ["table", "table", "traces"]
    links = {ln["title"]: ln["url"] for o in d["panels"][0]["fieldConfig"]["overrides"] for p in o["properties"]
             for ln in p["value"]}
    assert links["Show this collective below"].startswith("/d/mycroft-jaeger/")
    assert "var-trace_id=${__value.raw}" in links["Show this collective below"]
    assert links["Open in Jaeger UI"] == "${jaeger_ui}/trace/${__value.raw}"
    assert "mycroft-jaeger" in links["Open in Explore (Jaeger)"]
    # the columns are tags of the root-cause span (semconv keys), picked by name after the reshaping
    verdict = d["panels"][1]
    assert [t["id"] for t in verdict["transformations"]] == [
        "filterByValue", "extractFields", "transpose", "extractFields", "rowsToFields", "organize"]
    keys = {v for k, v in vars(semconv).items() if isinstance(v, str) and k.isupper()}
    columns = verdict["transformations"][-1]["options"]["renameByName"]
    assert set(columns) <= keys and {semconv.RCA_CATEGORY, semconv.RCA_CULPRIT_GLOBAL_RANKS,
                                     semconv.RCA_CULPRIT_HOSTS} <= set(columns)


def test_overviews_jaeger_table_opens_the_jaeger_drill_down(dashboards):
    """The collective dashboard is TraceQL (Tempo); a Jaeger row's link goes to the Jaeger variant."""
    over = dashboards["mycroft-overview.json"]
    (table,) = [p for p in over["panels"] if p.get("datasource", {}).get("type") == "jaeger"]
    urls = [ln["url"] for o in table["fieldConfig"]["overrides"] for p in o["properties"] for ln in p["value"]]
    assert urls and all(u.startswith("/d/mycroft-jaeger/") and "var-trace_id=${__value.raw}" in u for u in urls)


def test_alert_annotations_traceql_parses_with_grafanas_grammar():
    """The `traceql` annotation of each alert (what the on-call pastes into Grafana), templates filled in."""
    import re

    import yaml
    from grafana_helpers import GRAFANA_RULES, PROM_RULES

    queries = []
    for path, groups_key in ((PROM_RULES, "rules"), (GRAFANA_RULES, "rules")):
        for g in yaml.safe_load(path.read_text())["groups"]:
            for r in g[groups_key]:
                q = r.get("annotations", {}).get("traceql")
                if q:
                    queries.append(re.sub(r"\{\{[^}]*\}\}", "x0123456789abcdef", q))
    assert len(queries) >= 2  # the root-cause alert, in the Prometheus rules and in their Grafana twin
    assert parse_traceql(queries) == [None] * len(queries), queries
