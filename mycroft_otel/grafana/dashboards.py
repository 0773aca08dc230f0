"""The Grafana dashboards, as code (grafana-foundation-sdk), written to dashboards/*.json.

    python -m mycroft_otel.grafana.dashboards            # regenerate dashboards/*.json
    python -m mycroft_otel.grafana.dashboards --check    # exit 1 if a committed file differs

Three dashboards: ``mycroft-overview`` (root causes, their spans in Tempo and in Jaeger,
detection latency, processor health), ``mycroft-collective`` (one collective's trace) and
``mycroft-collective-health`` (the agents' collective metrics: duration quantiles, bus
bandwidth, per-peer network wait, in flight, the laggiest ranks). The SDK is the build for
Grafana 11.6 (schemaVersion 41); Grafana 11.x and 12.x import it (12 migrates the schema on
load). Datasource uids are those of collector_config/grafana-datasources.yaml.
"""

from __future__ import annotations

import argparse
import json
import sys
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
    """A Jaeger datasource search (the SDK has no Jaeger query type): service, operation, tags."""

    def __init__(self, ref_id: str, service: str, operation: str, tags: str = "", limit: int = 50):
        self.ref_id, self.service, self.operation, self.tags, self.limit = ref_id, service, operation, tags, limit

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"refId": self.ref_id, "datasource": JAEGER.to_json(), "queryType": "search",
                               "service": self.service, "operation": self.operation, "limit": self.limit}
        if self.tags:
            out["tags"] = self.tags
        return out


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


def _trace_links(*fields: str) -> list[dm.DashboardFieldConfigSourceOverrides]:
    link = [{"title": "Open in mycroft collective", "url": COLLECTIVE_LINK}]
    return [dm.DashboardFieldConfigSourceOverrides(matcher=dm.MatcherConfig(id_val="byName", options=f),
                                                   properties=[dm.DynamicConfigValue(id_val="links", value=link)])
            for f in fields]


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
              overrides=_trace_links("traceID", "Trace ID")),
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


def collective() -> db.Dashboard:
    d = base("mycroft-collective", "mycroft collective", "Drill-down into one collective instance (one trace): "
             "verdict, every rank's evidence, the trace view.", None)
    d = d.with_variable(db.TextBoxVariable("trace_id").label("trace id").description(
        "32 hex digits: a collective's trace id (from the overview or a mycroft.root_cause span)"))
    d = d.with_variable(query_var("comm", "communicator", "mycroft_root_causes_total", "comm", multi=False))
    evidence = ("select(" + ", ".join(f"span.{k}" for k in (
        sc.RANK, sc.GLOBAL_RANK, sc.HOST, sc.OP_STATE, sc.ANOMALY, sc.SNAPSHOT_SEQ, sc.STATUS_KIND,
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
              [traceql("A", f'{{ trace:id = "${{trace_id}}" && span.{sc.RANK} >= 0 }} | {evidence}', spss=4096)],
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
              "mycroft-collective-health.json": collective_health}


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
