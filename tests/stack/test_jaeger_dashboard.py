"""The Jaeger dashboard's queries (dashboards/mycroft-jaeger.json) against the real Jaeger v2 of the local stack.

A verdict span made by the processor's own exporter (``root_cause_span``) and one rank's op span of the same
collective go to Jaeger over OTLP/HTTP; then the HTTP calls Grafana's Jaeger datasource makes for the
dashboard's panels are made with the dashboard's own service, operation and tags: the search
(GET /api/traces?service&operation&tags, the tags logfmt turned into JSON as Grafana does) finds the trace,
a filter on another category does not; the trace-ID query (GET /api/traces/<id>, also the trace view and the
Explore link) holds the ``mycroft.root_cause`` span with every tag the verdict table makes a column of, and
the trace of the collective; Jaeger's UI answers the "Open in Jaeger UI" link's path. No Grafana runs: what
Grafana does with these answers (its data frames, the transformations) is read from its documentation and
source, not observed.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.parse
import urllib.request

import pytest
from opentelemetry import trace as api
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult

from mycroft_otel import ids
from mycroft_otel import semconv as sc
from mycroft_otel.grafana import dashboards as gen
from mycroft_otel.processor.exporter import root_cause_span
from mycroft_otel.processor.incidents import Verdict
from mycroft_otel.processor.views import Finding
from mycroft_otel.stack.runner import LOOPBACK, free_ports, http_ok

pytestmark = [pytest.mark.stack]

DASHBOARD = gen.REPO / "dashboards" / "mycroft-jaeger.json"
AGENT_SERVICE = "mycroft-otel-agent"


def _get(url: str):
    with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 (loopback)
        return resp.status, resp.read()


def _logfmt(text: str) -> dict[str, str]:
    """Grafana's Jaeger datasource: tags in logfmt -> the JSON object of /api/traces?tags= (plain key=value)."""
    return dict(tok.split("=", 1) for tok in text.split())


@pytest.fixture(scope="module")
def jaeger(jaeger_bin, tmp_path_factory):
    names = ("OTLP_GRPC", "OTLP_HTTP", "QUERY_HTTP", "QUERY_GRPC", "HEALTH", "SPANMETRICS", "TELEMETRY")
    ports = dict(zip(names, free_ports(len(names))))
    # always_off: Jaeger's query service traces its own requests to localhost:4317 otherwise, and its stop
    # waits 10 s on that export
    env = dict(os.environ, MYCROFT_TRACES_LISTEN_HOST=LOOPBACK, OTEL_TRACES_SAMPLER="always_off",
               **{f"MYCROFT_TRACES_{k}_PORT": str(v) for k, v in ports.items()})
    log = tmp_path_factory.mktemp("jaeger") / "jaeger.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([str(jaeger_bin), "--config", str(gen.REPO / "collector_config" / "jaeger.yaml")],
                                env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while not http_ok(f"http://{LOOPBACK}:{ports['HEALTH']}/status"):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        yield {"query": f"http://{LOOPBACK}:{ports['QUERY_HTTP']}",
               "otlp": f"http://{LOOPBACK}:{ports['OTLP_HTTP']}/v1/traces"}
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@pytest.fixture(scope="module")
def board() -> dict:
    return json.loads(DASHBOARD.read_text())


@pytest.fixture(scope="module")
def sent(jaeger, board):
    """One hang verdict (net_send_stalled on global rank 11, host node-b) and rank 2's op span, one trace."""
    tid = ids.coll_trace_id("job-jaeger", 0xab, 42)
    now = time.time_ns()
    finding = Finding("hang", "net_send_stalled", [3], 0.9, "rank 3 holds data it never sends", now - 10**9,
                      channel=1, peer=4, global_ranks=[11], hosts=["node-b"])
    verdict = Verdict(tid.to_bytes(16, "big"), ids.span_id(tid, -1, "root_cause").to_bytes(8, "big"),
                      "00000000000000ab", 42, "AllReduce", finding, now, 0.01)
    service = next(v for v in board["templating"]["list"] if v["name"] == "service")["query"]
    rca = root_cause_span(verdict, Resource({sc.SERVICE_NAME: service}))
    ctx = api.SpanContext(tid, ids.span_id(tid, 2, "op"), is_remote=False,
                          trace_flags=api.TraceFlags(api.TraceFlags.SAMPLED))
    op = ReadableSpan(name=sc.op_span_name("AllReduce"), context=ctx,
                      resource=Resource({sc.SERVICE_NAME: AGENT_SERVICE, sc.HOST_NAME: "node-a", sc.RANK: 2,
                                         sc.COMM_HASH: "00000000000000ab"}),  # as the agent: RESOURCE_SPAN_ATTRS
                      attributes={sc.COLL_SEQ: 42},
                      start_time=now - 2 * 10**9, end_time=now - 10**9)
    exporter = OTLPSpanExporter(endpoint=jaeger["otlp"])
    try:
        assert exporter.export([rca, op]) == SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()  # its keep-alive connection would hold Jaeger's graceful stop
    return {"trace_id": f"{tid:032x}", "service": service, "verdict": verdict}


def _search(jaeger, target: dict, tags: str, lookback_s: float = 3600) -> list[str]:
    """What the search panel's query asks Jaeger (Grafana: GET /api/traces, lookback=custom, start/end in µs)."""
    now = time.time()
    params = {"service": target["service"], "operation": target["operation"], "limit": target["limit"],
              "start": int((now - lookback_s) * 1e6), "end": int((now + 1) * 1e6), "lookback": "custom"}
    if tags:
        params["tags"] = json.dumps(_logfmt(tags))
    _, body = _get(f"{jaeger['query']}/api/traces?{urllib.parse.urlencode(params)}")
    return [t["traceID"] for t in json.loads(body)["data"] or []]


def _panel(board: dict, pid: int) -> dict:
    return next(p for p in board["panels"] if p["id"] == pid)


def test_search_panel_finds_the_verdict_with_the_dashboards_service_operation_and_tags(jaeger, board, sent):
    target = _panel(board, 1)["targets"][0]
    assert (target["queryType"], target["operation"]) == ("search", sc.ROOT_CAUSE_SPAN)
    target = dict(target, service=target["service"].replace("${service}", sent["service"]))
    assert target["tags"] == "${tags}"
    found: list[str] = []
    deadline = time.monotonic() + 20  # Jaeger's batch processor flushes within a second
    while sent["trace_id"] not in found and time.monotonic() < deadline:
        found = _search(jaeger, target, "")
        time.sleep(0.2)
    assert sent["trace_id"] in found, found
    # the tag filter a user types into $tags (logfmt): the right values find it, another category does not
    assert _search(jaeger, target, f"{sc.RCA_CATEGORY}=net_send_stalled {sc.COMM_HASH}=00000000000000ab") == \
        [sent["trace_id"]]
    assert _search(jaeger, target, f"{sc.RCA_CATEGORY}=gpu_stalled") == []
    # numbers and arrays match their text as Jaeger shows it (docs/dashboards.md, "Jaeger")
    assert _search(jaeger, target, f"{sc.COLL_SEQ}=42 {sc.RCA_CULPRIT_GLOBAL_RANKS}=[11]") == [sent["trace_id"]]
    # the agent's service has no root-cause operation: the processors' service is the one to search
    assert _search(jaeger, dict(target, service=AGENT_SERVICE), "") == []
    # the agents' side as docs/dashboards.md tells a Jaeger user to search it: span and resource (process) tags
    rank_op = dict(target, service=AGENT_SERVICE, operation="nccl.AllReduce")
    assert _search(jaeger, rank_op, f"{sc.RANK}=2 {sc.HOST_NAME}=node-a") == [sent["trace_id"]]
    assert _search(jaeger, rank_op, f"{sc.RANK}=5") == []


def test_trace_id_query_holds_the_verdict_tags_the_table_makes_columns_of(jaeger, board, sent):
    """GET /api/traces/<id> (Grafana's trace-ID query; the verdict table and the trace view): the span the
    table's filter keeps, with every tag its columns name, values as the verdict set them."""
    verdict_panel = _panel(board, 2)
    assert verdict_panel["targets"][0]["query"] == "${trace_id}" and "queryType" not in verdict_panel["targets"][0]
    filt = verdict_panel["transformations"][0]["options"]["filters"][0]
    assert (filt["fieldName"], filt["config"]["options"]["value"]) == ("operationName", sc.ROOT_CAUSE_SPAN)
    organize = verdict_panel["transformations"][-1]["options"]
    _, body = _get(f"{jaeger['query']}/api/traces/{sent['trace_id']}")
    (trace,) = json.loads(body)["data"]
    services = {k: p["serviceName"] for k, p in trace["processes"].items()}
    rca = [s for s in trace["spans"] if s["operationName"] == sc.ROOT_CAUSE_SPAN]
    assert len(rca) == 1 and services[rca[0]["processID"]] == sent["service"]
    tags = {t["key"]: t["value"] for t in rca[0]["tags"]}
    expected = sent["verdict"].attributes()
    for key in organize["includeByName"]:
        assert key in tags, f"column {organize['renameByName'][key]!r}: Jaeger has no tag {key}"
        want = expected[key]
        # Jaeger v1 JSON: arrays as their JSON text, int64 as a number
        assert tags[key] == (json.dumps(want) if isinstance(want, list) else want), key
    assert json.loads(tags[sc.RCA_CULPRIT_GLOBAL_RANKS]) == [11] and json.loads(tags[sc.RCA_CULPRIT_HOSTS]) == ["node-b"]
    # the trace of the collective: the agent's op span of rank 2 beside the verdict
    ops = [s for s in trace["spans"] if s["operationName"] == "nccl.AllReduce"]
    assert len(ops) == 1 and services[ops[0]["processID"]] == AGENT_SERVICE


def test_drill_down_links_resolve(jaeger, board, sent):
    """Each link of the search table's trace id, filled with the id Jaeger's search returned."""
    links = {ln["title"]: ln["url"] for o in _panel(board, 1)["fieldConfig"]["overrides"]
             for p in o["properties"] for ln in p["value"]}
    tid = sent["trace_id"]
    ui = links["Open in Jaeger UI"].replace("${jaeger_ui}", jaeger["query"]).replace("${__value.raw}", tid)
    status, body = _get(ui)
    assert status == 200 and b"<html" in body.lower()[:2000], "Jaeger's UI serves /trace/<id>"
    explore = urllib.parse.urlsplit(links["Open in Explore (Jaeger)"])
    panes = json.loads(urllib.parse.parse_qs(explore.query)["panes"][0].replace("${__value.raw}", tid))
    (query,) = panes["jaeger"]["queries"]
    assert query["datasource"]["uid"] == board["panels"][0]["datasource"]["uid"] == "mycroft-jaeger"
    _, body = _get(f"{jaeger['query']}/api/traces/{query['query']}")
    assert json.loads(body)["data"][0]["traceID"] == tid
    here = links["Show this collective below"]
    assert here.startswith(f"/d/{board['uid']}/") and "var-trace_id=${__value.raw}" in here
