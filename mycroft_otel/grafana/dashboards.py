"""The Grafana dashboards, as code (grafana-foundation-sdk), written to dashboards/*.json.

    python -m mycroft_otel.grafana.dashboards            # regenerate dashboards/*.json
    python -m mycroft_otel.grafana.dashboards --check    # exit 1 if a committed file differs

Four dashboards: ``mycroft-overview`` (root causes, their spans in Tempo and in Jaeger,
detection latency, processor health), ``mycroft-collective`` (one collective's trace, Tempo),
``mycroft-jaeger`` (the root causes and their drill-down for a Jaeger trace store) and
``mycroft-collective-health`` (the agents' collective metrics: duration quantiles, bus
bandwidth, per-peer network wait, in flight, the laggiest ranks). The SDK is the build for
Grafana 11.6 (schemaVersion 41); Grafana 11.x and 12.x import it (12 migrates the schema on
load). Datasource uids are those of collector_config/grafana-datasources.yaml.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.parse
from pathlib import Path
from typing import Any, Sequence

try:
    from grafana_foundation_sdk.builders import dashboard as db
    from grafana_foundation_sdk.builders import prometheus, tempo
    from grafana_foundation_sdk.cog import variants
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models import dashboard as dm
    from grafana_foundation_sdk.models.tempo import SearchTableType
except ModuleNotFoundError as exc:  # an optional extra: say which, where a person ran the command
    if __name__ != "__main__":
        raise
    sys.exit(f"python -m mycroft_otel.grafana.dashboards needs the dashboards extra ({exc.name} is missing): "
             "pip install 'mycroft-otel[dashboards]'")

from mycroft_otel import semconv as sc

REPO = Path(__file__).resolve().parents[2]


def default_out_dir() -> Path | None:
    """The checkout's dashboards/: this file's own (an in-place checkout), else the working directory's; None
    where neither is a checkout (an installed package has no dashboards/ beside it)."""
    for root in (REPO, Path.cwd()):
        if (root / "dashboards").is_dir() and (root / "collector_config").is_dir():
            return root / "dashboards"
    return None


PROM = dm.DataSourceRef(type_val="prometheus", uid="mycroft-prometheus")
TEMPO = dm.DataSourceRef(type_val="tempo", uid="mycroft-tempo")
JAEGER = dm.DataSourceRef(type_val="jaeger", uid="mycroft-jaeger")

PROCESSOR_SERVICE = "mycroft-processor"

# --- the collective metrics' Prometheus names (mycroft_otel/agent/metrics.py through the gateway's
# prometheus exporter: dots become underscores, the unit and _total are appended)
DURATION = "mycroft_collective_duration_seconds"
BUSBW = "mycroft_collective_bus_bandwidth_bytes_per_second"
NET_WAIT = "mycroft_network_wait_time_seconds_total"
IN_FLIGHT = "mycroft_collective_in_flight"
LAST_SEQ = "mycroft_collective_last_sequence"
COMM_L, FUNC_L, RANK_L, HOST_L = "mycroft_comm_hash", "mycroft_coll_func", "mycroft_rank", "host_name"
PEER_L, DIR_L, SIZE_L = "mycroft_flow_peer", "mycroft_flow_direction", "mycroft_coll_size_bucket"


class JaegerQuery(variants.Dataquery):
    """A Jaeger datasource search (the SDK has no Jaeger query type): service, operation, tags (logfmt, which
    Grafana turns into the JSON ``tags`` parameter of Jaeger's GET /api/traces). Grafana's answer is one row per
    trace (traceID, traceName, startTime, duration): no span tags."""

    def __init__(self, ref_id: str, service: str, operation: str, tags: str = "", limit: int = 50):
        self.ref_id, self.service, self.operation, self.tags, self.limit = ref_id, service, operation, tags, limit

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"refId": self.ref_id, "datasource": JAEGER.to_json(), "queryType": "search",
                               "service": self.service, "operation": self.operation, "limit": self.limit}
        if self.tags:
            out["tags"] = self.tags
        return out


class JaegerTraceQuery(variants.Dataquery):
    """A Jaeger datasource trace-ID query (no queryType): GET /api/traces/<id>, one row per span with its
    serviceName, operationName and ``tags`` (a JSON array of {key, type, value})."""

    def __init__(self, ref_id: str, trace_id: str):
        self.ref_id, self.trace_id = ref_id, trace_id

    def to_json(self) -> dict[str, Any]:
        return {"refId": self.ref_id, "datasource": JAEGER.to_json(), "query": self.trace_id}


class _Built:
    """Adapts a ready query object to the builder interface the panel builders take."""

    def __init__(self, obj: Any):
        self.obj = obj

    def build(self) -> Any:
        return self.obj


# --- small constructors ---------------------------------------------------------------------------

def prom(ref: str, expr: str, legend: str = "__auto", instant: bool = False, table: bool = False
         ) -> prometheus.Dataquery:
    q = (prometheus.Dataquery().ref_id(ref).datasource(PROM).expr(expr).legend_format(legend))
    q = q.instant() if instant else q.range()
    return q.format("table" if table else "time_series")


def traceql(ref: str, query: str, limit: int = 20, spss: int | None = None, spans: bool = True
            ) -> tempo.TempoQuery:
    q = tempo.TempoQuery().ref_id(ref).datasource(TEMPO).query_type("traceql").query(query).limit(limit)
    if spans:
        q = q.table_type(SearchTableType.SPANS)
    if spss is not None:
        q = q.spss(spss)
    return q


def thresholds(*steps: tuple[str, float | None]) -> dm.ThresholdsConfig:
    return dm.ThresholdsConfig(mode=dm.ThresholdsMode.ABSOLUTE,
                               steps=[dm.Threshold(color=c, value=v) for c, v in steps])


def panel(kind: str, pid: int, title: str, desc: str, grid: tuple[int, int, int, int], targets: Sequence[Any],
          ds: dm.DataSourceRef = PROM, unit: str | None = None, custom: dict | None = None,
          options: dict | None = None, thr: dm.ThresholdsConfig | None = None, minimum: float | None = None,
          mappings: list | None = None, overrides: list | None = None, transformations: list | None = None
          ) -> db.Panel:
    x, y, w, h = grid
    p = (db.Panel().type(kind).id(pid).title(title).description(desc).datasource(ds)
         .grid_pos(dm.GridPos(x=x, y=y, w=w, h=h)).targets(list(targets)))
    defaults = dm.FieldConfig(unit=unit, custom=custom, thresholds=thr, min_val=minimum, mappings=mappings)
    p = p.field_config(dm.FieldConfigSource(defaults=defaults, overrides=overrides or []))
    if options:
        p = p.options(options)
    if transformations:
        p = p.transformations(transformations)
    return p


def row(pid: int, title: str, y: int) -> db.Row:
    return db.Row(title).id(pid).collapsed(False).grid_pos(dm.GridPos(x=0, y=y, w=24, h=1))


def series(kind: str = "line", fill: int = 10, stack: str = "none") -> dict:
    return {"drawStyle": kind, "fillOpacity": fill, "stacking": {"mode": stack}}


BARS = series("bars", 60, "normal")


def query_var(name: str, label: str, metric: str, label_name: str, multi: bool = True) -> db.QueryVariable:
    q = f"label_values({metric}, {label_name})"
    return (db.QueryVariable(name).label(label).datasource(PROM).query({"query": q, "refId": f"{name}-var"})
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).multi(multi).include_all(True)
            .all_value(".*").current(dm.VariableOption(text="All", value="$__all"))
            .sort(dm.VariableSort.ALPHABETICAL_ASC))


def base(uid: str, title: str, desc: str, refresh: str | None) -> db.Dashboard:
    d = (db.Dashboard(title).uid(uid).description(desc).tags(["mycroft", "nccl"]).timezone("")
         .editable().tooltip(dm.DashboardCursorSync.CROSSHAIR).time("now-6h", "now").version(1)
         .link(db.DashboardLink("mycroft").type(dm.DashboardLinkType.DASHBOARDS).tags(["mycroft"])
               .as_dropdown(False).include_vars(False).keep_time(True)))
    return d.refresh(refresh) if refresh else d


def verdicts(by: str, window: str, sel: str) -> str:
    """New verdicts in ``window``: increase() misses a series' first verdict (born at 1), so the
    `unless offset` arm counts series born in the window (the alert rule's form)."""
    m = f"mycroft_root_causes_total{{{sel}}}"
    grouping = f" by ({by})" if by else ""
    return f"sum{grouping} ((increase({m}[{window}]) > 0) or (({m} unless {m} offset {window}) * 1))"


RCA_SELECT = ("select(" + ", ".join(f"span.{k}" for k in (
    sc.RCA_KIND, sc.RCA_CATEGORY, sc.RCA_CULPRIT_RANKS, sc.RCA_CULPRIT_GLOBAL_RANKS, sc.RCA_CULPRIT_HOSTS,
    sc.RCA_CULPRIT_CHANNEL, sc.RCA_CONFIDENCE, sc.RCA_EVIDENCE, sc.COMM_HASH, sc.COLL_FUNC, sc.COLL_SEQ)) + ")")
COLLECTIVE_LINK = "/d/mycroft-collective/mycroft-collective?var-trace_id=${__value.raw}&${__url_time_range}"


def _field_links(fields: Sequence[str], links: list[dict]) -> list[dm.DashboardFieldConfigSourceOverrides]:
    return [dm.DashboardFieldConfigSourceOverrides(matcher=dm.MatcherConfig(id_val="byName", options=f),
                                                   properties=[dm.DynamicConfigValue(id_val="links", value=links)])
            for f in fields]


def _trace_links(*fields: str) -> list[dm.DashboardFieldConfigSourceOverrides]:
    return _field_links(fields, [{"title": "Open in mycroft collective", "url": COLLECTIVE_LINK}])


# --- Jaeger: what Grafana's Jaeger datasource returns (field names of its data frames) and the links out of it
JAEGER_TRACE_FIELDS = ("traceID", "Trace ID")  # the search frame's trace id (name, display name)
JAEGER_DASHBOARD_LINK = "/d/mycroft-jaeger/mycroft-root-causes-jaeger?var-trace_id=${__value.raw}&${__url_time_range}"
JAEGER_SELF_LINK = JAEGER_DASHBOARD_LINK + "&${service:queryparam}&${tags:queryparam}&${jaeger_ui:queryparam}"
# Grafana 10.2+ Explore state (schemaVersion 1, one pane): the Jaeger datasource's trace-ID query
_EXPLORE_PANE = json.dumps({"jaeger": {"datasource": JAEGER.uid, "queries": [
    {"refId": "A", "datasource": {"type": "jaeger", "uid": JAEGER.uid}, "query": "${__value.raw}"}],
    "range": {"from": "${__from}", "to": "${__to}"}}}, separators=(",", ":"), sort_keys=True)
JAEGER_EXPLORE_LINK = "/explore?schemaVersion=1&panes=" + urllib.parse.quote(_EXPLORE_PANE, safe="${}")
JAEGER_UI_LINK = "${jaeger_ui}/trace/${__value.raw}"
#: the root-cause span's tags shown as columns of the verdict table (Jaeger key -> column)
JAEGER_VERDICT_COLUMNS = {sc.RCA_KIND: "kind", sc.RCA_CATEGORY: "category",
                          sc.RCA_CULPRIT_GLOBAL_RANKS: "culprit global ranks", sc.RCA_CULPRIT_HOSTS: "culprit hosts",
                          sc.RCA_CULPRIT_RANKS: "culprit ranks (communicator)",
                          sc.RCA_CULPRIT_CHANNEL: "channel", sc.RCA_CULPRIT_PEER: "peer",
                          sc.RCA_CONFIDENCE: "confidence", sc.RCA_EVIDENCE: "evidence", sc.COMM_HASH: "communicator",
                          sc.COLL_FUNC: "function", sc.COLL_SEQ: "sequence"}


def _transform(kind: str, options: dict) -> dm.DataTransformerConfig:
    return dm.DataTransformerConfig(id_val=kind, options=options)


def jaeger_tag_columns() -> list[dm.DataTransformerConfig]:
    """A trace-ID answer (one row per span, ``tags`` an array of {key, type, value} that Jaeger sorts by key)
    to one row per verdict with a column per tag, keyed by the tag's name, never its position (optional tags
    such as the culprit's hosts move the others): keep the root-cause span, spread its tags into fields,
    transpose them into rows, split each into key/type/value, then make the keys the columns."""
    return [
        _transform("filterByValue", {"type": "include", "match": "any", "filters": [
            {"fieldName": "operationName", "config": {"id": "equal", "options": {"value": sc.ROOT_CAUSE_SPAN}}}]}),
        _transform("extractFields", {"source": "tags", "format": "json", "replace": True}),
        _transform("transpose", {}),
        _transform("extractFields", {"source": "Value", "format": "json", "replace": True}),
        _transform("rowsToFields", {"mappings": [{"fieldName": "key", "handlerKey": "field.name"},
                                                 {"fieldName": "value", "handlerKey": "field.value"}]}),
        _transform("organize", {"includeByName": {k: True for k in JAEGER_VERDICT_COLUMNS},
                                "indexByName": {k: i for i, k in enumerate(JAEGER_VERDICT_COLUMNS)},
                                "renameByName": dict(JAEGER_VERDICT_COLUMNS)}),
    ]


# --- the dashboards -------------------------------------------------------------------------------

def overview() -> db.Dashboard:
    sel = 'kind=~"$kind", category=~"$category", comm=~"$comm"'
    stat_opts = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                 "colorMode": "background", "graphMode": "none"}
    right = {"legend": {"displayMode": "table", "placement": "right"}}
    d = base("mycroft-overview", "mycroft overview",
             "NCCL collective root causes found by mycroft-otel, and the health of its processors.", "30s")
    for v in (query_var("kind", "kind", "mycroft_root_causes_total", "kind"),
              query_var("category", "category", "mycroft_root_causes_total", "category"),
              query_var("comm", "communicator", "mycroft_root_causes_total", "comm")):
        d = d.with_variable(v)
    lat = 'mycroft_processor_detection_latency_seconds_bucket{kind=~"$kind"}'
    panels = [
        row(1, "Root causes", 0),
        panel("stat", 2, "Root causes in range",
              "Verdicts (mycroft.root_cause spans, one per incident) in the dashboard's time range.", (0, 1, 4, 6),
              [prom("A", verdicts("", "$__range", sel), instant=True)], unit="short",
              thr=thresholds(("green", None), ("red", 1)), options=stat_opts),
        panel("timeseries", 3, "Root causes by category",
              "New verdicts per interval, by category (rank_absent, gpu_stalled, slow_nic, ...).", (4, 1, 10, 6),
              [prom("A", verdicts("category", "$__rate_interval", sel), "{{category}}")], unit="short", custom=BARS,
              options=right),
        panel("timeseries", 4, "Root causes by communicator",
              "New verdicts per interval, by communicator hash (mycroft.comm.hash).", (14, 1, 10, 6),
              [prom("A", verdicts("comm", "$__rate_interval", sel), "{{comm}}")], unit="short", custom=BARS,
              options=right),
        panel("table", 5, "Root causes by communicator and category (range)",
              "One row per (communicator, kind, category) with verdicts in the range.", (0, 7, 24, 6),
              [prom("A", verdicts("comm, kind, category", "$__range", sel), instant=True, table=True)],
              transformations=[dm.DataTransformerConfig(id_val="organize", options={
                  "excludeByName": {"Time": True}, "renameByName": {"Value": "verdicts"}})]),
        row(6, "Root-cause spans", 13),
        panel("table", 7, "Root-cause spans (Tempo)",
              "TraceQL search for the processor's verdicts; the trace id opens the collective drill-down.",
              (0, 14, 24, 9), [traceql("A", f'{{ name = "{sc.ROOT_CAUSE_SPAN}" && span.{sc.RCA_CATEGORY} =~ '
                                            f'"${{category:regex}}" && span.{sc.RCA_KIND} =~ "${{kind:regex}}" }} '
                                            f'| {RCA_SELECT}', limit=50, spss=1)],
              ds=TEMPO, overrides=_trace_links("Trace ID", "traceIdHidden")),
        panel("table", 18, "Root-cause traces (Jaeger)",
              "The same verdicts from a Jaeger datasource (the trace store the project tests against): a search "
              f"for {sc.ROOT_CAUSE_SPAN} spans of service {PROCESSOR_SERVICE}; the trace id opens the drill-down.",
              (0, 23, 24, 8), [_Built(JaegerQuery("A", PROCESSOR_SERVICE, sc.ROOT_CAUSE_SPAN))], ds=JAEGER,
              overrides=_field_links(JAEGER_TRACE_FIELDS, [{"title": "Open in mycroft root causes (Jaeger)",
                                                            "url": JAEGER_DASHBOARD_LINK}])),
        row(8, "Detection latency", 31),
        panel("bargauge", 9, "Detection latency in range (p50 / p90 / p99)",
              "From the estimated fault onset to the verdict, over the dashboard's range (Mycroft's anchor: 90% "
              "of anomalies within 15 s).", (0, 32, 8, 7),
              [prom(r, f"histogram_quantile({q}, sum by (le) (increase({lat}[$__range])))", f"p{int(q * 100)}",
                    instant=True) for r, q in (("A", 0.5), ("B", 0.9), ("C", 0.99))],
              unit="s", minimum=0, thr=thresholds(("green", None), ("orange", 15), ("red", 30)),
              options={"orientation": "horizontal", "displayMode": "gradient",
                       "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}}),
        panel("timeseries", 10, "Detection latency by kind (p50, p90; 30 min window)",
              "Verdicts are rare, so the window is long; gaps mean no verdict in 30 min.", (8, 32, 8, 7),
              [prom(r, f"histogram_quantile({q}, sum by (le, kind) (increase({lat}[30m])))",
                    f"{{{{kind}}}} p{int(q * 100)}") for r, q in (("A", 0.5), ("B", 0.9))],
              unit="s", custom=series()),
        panel("timeseries", 11, "Analysis time per trace (p50, p99)",
              "Processor CPU time to analyse one trace (link walk + classification).", (16, 32, 8, 7),
              [prom(r, f"histogram_quantile({q}, sum by (le, kind) "
                       f"(rate(mycroft_processor_analysis_seconds_bucket[$__rate_interval])))",
                    f"{{{{kind}}}} p{int(q * 100)}") for r, q in (("A", 0.5), ("B", 0.99))],
              unit="s", custom=series()),
        row(12, "Processor health", 39),
        panel("stat", 13, "Processors up", "A processor down analyses nothing for its share of the trace-ID ring.",
              (0, 40, 4, 7), [prom("A", 'up{job="mycroft-processor"}', "{{instance}}", instant=True)],
              thr=thresholds(("red", None), ("green", 1)),
              mappings=[dm.ValueMap(options={"0": dm.ValueMappingResult(text="down", color="red"),
                                             "1": dm.ValueMappingResult(text="up", color="green")})],
              options=stat_opts),
        panel("timeseries", 14, "Spans received / s", "Spans the processors took in.", (4, 40, 7, 7),
              [prom("A", "sum by (instance) (rate(mycroft_processor_spans_received_total[$__rate_interval]))",
                    "{{instance}}")], unit="ops", custom=series()),
        panel("timeseries", 15, "Spans dropped and requests rejected / s",
              "Anything above zero is evidence the processor never analysed.", (11, 40, 7, 7),
              [prom("A", "sum by (reason) (rate(mycroft_processor_spans_dropped_total[$__rate_interval]))",
                    "dropped: {{reason}}"),
               prom("B", "sum by (protocol, reason) (rate(mycroft_processor_requests_rejected_total"
                         "[$__rate_interval]))", "rejected {{protocol}}: {{reason}}"),
               prom("C", "sum(rate(mycroft_processor_spans_unknown_shape_total[$__rate_interval]))",
                    "unknown shape (ignored)")], unit="ops", custom=series()),
        panel("timeseries", 16, "Traces in memory", "Evictions by size mean the processor is short of memory for "
              "the traffic.", (18, 40, 6, 7),
              [prom("A", "sum by (instance) (mycroft_processor_traces_in_memory)", "{{instance}}"),
               prom("B", "sum by (reason) (delta(mycroft_processor_traces_evicted[$__rate_interval]))",
                    "evicted per interval: {{reason}}")], unit="short", custom=series()),
        panel("timeseries", 17, "Hung traces attributed to another incident / s",
              "Collectives stuck because of an incident already explained elsewhere.", (0, 47, 24, 5),
              [prom("A", "sum(rate(mycroft_processor_propagated_hangs_total[$__rate_interval]))", "propagated")],
              unit="ops", custom=series()),
    ]
    for p in panels:
        d = d.with_row(p) if isinstance(p, db.Row) else d.with_panel(p)
    return d


def _scoped(key: str) -> str:
    """A TraceQL attribute: span-scoped, or unscoped (span or resource) for those a rank's resource carries."""
    return f".{key}" if key in sc.RESOURCE_SPAN_ATTRS else f"span.{key}"


def collective() -> db.Dashboard:
    d = base("mycroft-collective", "mycroft collective", "Drill-down into one collective instance (one trace): "
             "verdict, every rank's evidence, the trace view.", None)
    d = d.with_variable(db.TextBoxVariable("trace_id").label("trace id").description(
        "32 hex digits: a collective's trace id (from the overview or a mycroft.root_cause span)"))
    d = d.with_variable(query_var("comm", "communicator", "mycroft_root_causes_total", "comm", multi=False))
    # a rank's spans carry their communicator and rank on their resource (sc.RESOURCE_SPAN_ATTRS): unscoped
    evidence = ("select(" + ", ".join(_scoped(k) for k in (
        sc.RANK, sc.GLOBAL_RANK, sc.HOST_NAME, sc.OP_STATE, sc.ANOMALY, sc.SNAPSHOT_SEQ, sc.STATUS_KIND,
        sc.STATUS_LAST_STATE, sc.PROCESS_STOPPED, sc.COLL_FUNC, sc.COLL_SEQ)) + ")")
    comm = 'comm=~"$comm"'
    for p in (
        panel("table", 1, "Root cause of this collective",
              "The processor's verdict span in this trace (empty: no verdict for this collective).", (0, 0, 24, 5),
              [traceql("A", f'{{ trace:id = "${{trace_id}}" && name = "{sc.ROOT_CAUSE_SPAN}" }} | {RCA_SELECT}',
                       spss=10)], ds=TEMPO),
        panel("table", 2, "Every rank's evidence",
              "One row per span: completed op spans, in-flight snapshots, not_entered / process_exited status. A "
              "rank with no row is silent (its op span id is still linked by its peers).", (0, 5, 24, 10),
              [traceql("A", f'{{ trace:id = "${{trace_id}}" && {_scoped(sc.RANK)} >= 0 }} | {evidence}', spss=4096)],
              ds=TEMPO),
        panel("traces", 3, "Trace", "All ranks of the collective in one trace; links are the data dependencies "
              "(recv_from / send_to) and the verdict's culprit/evidence.", (0, 15, 24, 14),
              [traceql("A", "${trace_id}", spans=False)], ds=TEMPO),
        panel("timeseries", 4, "Root causes on this communicator",
              "Verdicts over time for the communicator chosen above (Prometheus).", (0, 29, 24, 7),
              [prom("A", verdicts("category", "$__rate_interval", comm), "{{category}}")], unit="short",
              custom=BARS),
    ):
        d = d.with_panel(p)
    return d


def jaeger_root_causes() -> db.Dashboard:
    """The overview's root-cause spans and the collective drill-down, for a Jaeger trace store (Grafana's Jaeger
    datasource: search, then trace by id; no TraceQL)."""
    d = base("mycroft-jaeger", "mycroft root causes (Jaeger)",
             f"The processors' {sc.ROOT_CAUSE_SPAN} spans in Jaeger: the list (a Jaeger search), the verdict of "
             "the chosen trace with its culprit, and that collective's trace (every rank, one trace).", "30s")
    d = d.with_variable(db.TextBoxVariable("service").label("processor service").default_value(PROCESSOR_SERVICE)
                        .description("service.name of the processors (their OTEL_SERVICE_NAME)"))
    d = d.with_variable(db.TextBoxVariable("tags").label("tags").default_value("").description(
        f"Jaeger tag filter, logfmt, exact values: {sc.RCA_CATEGORY}=gpu_stalled {sc.RCA_KIND}=hang "
        f"{sc.COMM_HASH}=<16 hex digits>"))
    d = d.with_variable(db.TextBoxVariable("trace_id").label("trace id").default_value("").description(
        "32 hex digits: the collective's trace (a row's link below fills it)"))
    d = d.with_variable(db.TextBoxVariable("jaeger_ui").label("Jaeger UI").default_value("http://localhost:16686")
                        .description("base URL of Jaeger's own UI, for the 'Open in Jaeger UI' links"))
    links = [{"title": "Show this collective below", "url": JAEGER_SELF_LINK},
             {"title": "Open in Explore (Jaeger)", "url": JAEGER_EXPLORE_LINK, "targetBlank": True},
             {"title": "Open in Jaeger UI", "url": JAEGER_UI_LINK, "targetBlank": True}]
    for p in (
        panel("table", 1, "Root-cause traces (Jaeger search)",
              f"Jaeger search: service $service, operation {sc.ROOT_CAUSE_SPAN}, tags $tags. One row per "
              "collective with a verdict (Grafana's search answer holds no span tags: the verdict's columns are "
              "in the table below). The trace id shows that collective below, in Explore or in Jaeger's UI.",
              (0, 0, 24, 9), [_Built(JaegerQuery("A", "${service}", sc.ROOT_CAUSE_SPAN, tags="${tags}"))],
              ds=JAEGER, overrides=_field_links(JAEGER_TRACE_FIELDS, links)),
        panel("table", 2, "Verdict of the chosen collective",
              f"The {sc.ROOT_CAUSE_SPAN} span of trace $trace_id, its tags as columns (empty: choose a row "
              "above, or this collective has no verdict).", (0, 9, 24, 5),
              [_Built(JaegerTraceQuery("A", "${trace_id}"))], ds=JAEGER, transformations=jaeger_tag_columns()),
        panel("traces", 3, "Trace", "Every rank's evidence of the collective in one trace (nccl.* op spans, "
              "mycroft.inflight snapshots, mycroft.status spans) and the verdict; span references are the "
              "data dependencies (recv_from / send_to) and the verdict's culprit/evidence.", (0, 14, 24, 16),
              [_Built(JaegerTraceQuery("A", "${trace_id}"))], ds=JAEGER),
    ):
        d = d.with_panel(p)
    return d


def collective_health() -> db.Dashboard:
    """Built on the agents' collective metrics (every completed op, not only the exported spans)."""
    d = base("mycroft-collective-health", "mycroft collective health",
             "Collective performance from every rank's completed operations (the agents' OpenTelemetry metrics): "
             "duration quantiles, bus bandwidth, network wait per peer, operations in flight, lagging ranks.", "30s")
    d = d.with_variable(query_var("comm", "communicator", f"{DURATION}_count", COMM_L))
    d = d.with_variable(query_var("func", "function", f"{DURATION}_count", FUNC_L))
    f = f'{COMM_L}=~"$comm", {FUNC_L}=~"$func"'
    c = f'{COMM_L}=~"$comm"'
    by = f"{COMM_L}, {FUNC_L}"
    legend = f"{{{{{COMM_L}}}}} {{{{{FUNC_L}}}}}"

    def quantile(metric: str, q: float, group: str) -> str:
        return f"histogram_quantile({q}, sum by (le, {group}) (rate({metric}_bucket{{{f}}}[$__rate_interval])))"

    for p in (
        row(1, "Duration", 0),
        panel("timeseries", 2, "Duration p50", "Median time of a completed operation (NCCL's start to its end), by "
              "communicator and function, all ranks and sizes.", (0, 1, 12, 8),
              [prom("A", quantile(DURATION, 0.5, by), legend)], unit="s", custom=series()),
        panel("timeseries", 3, "Duration p99", "Tail time: one slow rank or flow shows here first.", (12, 1, 12, 8),
              [prom("A", quantile(DURATION, 0.99, by), legend)], unit="s", custom=series()),
        panel("timeseries", 4, "Duration p50 by message size",
              "Median time per size bucket (powers of 4 bytes; the label is the bucket's upper bound).",
              (0, 9, 12, 8), [prom("A", quantile(DURATION, 0.5, f"{FUNC_L}, {SIZE_L}"),
                                   f"{{{{{FUNC_L}}}}} {{{{{SIZE_L}}}}}")], unit="s", custom=series()),
        panel("timeseries", 5, "Operations completed / s", "Completed operations per second, all ranks.",
              (12, 9, 12, 8), [prom("A", f"sum by ({by}) (rate({DURATION}_count{{{f}}}[$__rate_interval]))",
                                    legend)], unit="ops", custom=series()),
        row(6, "Bandwidth and network", 17),
        panel("timeseries", 7, "Bus bandwidth p50 per communicator",
              "NCCL's busBw (algorithm bandwidth × 2(n-1)/n for AllReduce, (n-1)/n for AllGather and "
              "ReduceScatter, 1 for Broadcast and Reduce), comparable with the hardware's link speed.",
              (0, 18, 12, 8), [prom("A", quantile(BUSBW, 0.5, by), legend)], unit="Bps", custom=series()),
        panel("timeseries", 8, "Network wait per peer",
              "Seconds per second that flows to or from a peer rank waited on the network (several flows in "
              "parallel can add up to more than 1).", (12, 18, 12, 8),
              [prom("A", f"topk(20, sum by ({COMM_L}, {PEER_L}, {DIR_L}) (rate({NET_WAIT}{{{c}}}"
                         f"[$__rate_interval])))", f"{{{{{COMM_L}}}}} peer {{{{{PEER_L}}}}} {{{{{DIR_L}}}}}")],
              unit="short", custom=series()),
        row(9, "Progress", 26),
        panel("timeseries", 10, "Operations in flight", "Operations started and not completed, per communicator: "
              "a flat non-zero line is a hang.", (0, 27, 12, 8),
              [prom("A", f"sum by ({COMM_L}) ({IN_FLIGHT}{{{c}}})", f"{{{{{COMM_L}}}}}")], unit="short",
              custom=series()),
        panel("table", 11, "Laggiest ranks",
              "Collectives each rank is behind the communicator's most advanced rank (last completed sequence "
              "number): a rank that lags is late or stuck.", (12, 27, 12, 8),
              [prom("A", f"topk(10, max by ({COMM_L}) ({LAST_SEQ}{{{c}}}) - on ({COMM_L}) group_right "
                         f"{LAST_SEQ}{{{c}}})", instant=True, table=True)],
              transformations=[dm.DataTransformerConfig(id_val="organize", options={
                  "excludeByName": {"Time": True, "__name__": True}, "renameByName": {"Value": "collectives behind"}})]),
    ):
        d = d.with_row(p) if isinstance(p, db.Row) else d.with_panel(p)
    return d


DASHBOARDS = {"mycroft-overview.json": overview, "mycroft-collective.json": collective,
              "mycroft-jaeger.json": jaeger_root_causes, "mycroft-collective-health.json": collective_health}


def render(build: Any) -> str:
    """The JSON text of one dashboard (stable: sorted keys, two-space indent, trailing newline)."""
    return json.dumps(build().build(), cls=JSONEncoder, sort_keys=True, indent=2) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mycroft_otel.grafana.dashboards", description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None,
                    help="the dashboards/ directory (default: the checkout's, this one's or the working directory's)")
    ap.add_argument("--check", action="store_true", help="compare with the files instead of writing them")
    args = ap.parse_args(argv)
    args.out = args.out or default_out_dir()
    if args.out is None:
        print("no checkout's dashboards/ here: run from the repository's root or pass --out DIR", file=sys.stderr)
        return 2
    stale = []
    for name, build in DASHBOARDS.items():
        text, path = render(build), args.out / name
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"out of date (run python -m mycroft_otel.grafana.dashboards): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
