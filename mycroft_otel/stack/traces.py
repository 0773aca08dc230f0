"""Read traces back from the trace store (Tempo's HTTP API with TraceQL, or Jaeger v2's /api/v3) as plain spans."""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable

from mycroft_otel import semconv as sc


@dataclass(frozen=True)
class StoredSpan:
    """One span as the trace store returns it (OTLP JSON flattened)."""

    trace_id: str  # 32 lowercase hex digits
    span_id: str  # 16 lowercase hex digits
    name: str
    service_name: str | None
    attributes: dict[str, Any] = field(default_factory=dict)  # with its resource's shared ones (sc.with_shared)
    links: tuple[tuple[str, str], ...] = ()  # (trace_id, span_id)
    link_attributes: tuple[dict[str, Any], ...] = ()  # one dict per link, same order


def _hex_id(value: str, nbytes: int) -> str:
    """OTLP JSON ids are hex (OTLP/JSON spec) or base64 (plain protojson); normalise to hex."""
    if not value:
        return ""
    v = value.strip()
    if len(v) == 2 * nbytes and all(c in "0123456789abcdefABCDEF" for c in v):
        return v.lower()
    return base64.b64decode(v + "=" * (-len(v) % 4)).hex()


def _any_value(v: dict[str, Any]) -> Any:
    if "stringValue" in v:
        return v["stringValue"]
    if "intValue" in v:
        return int(v["intValue"])
    if "doubleValue" in v:
        return float(v["doubleValue"])
    if "boolValue" in v:
        return bool(v["boolValue"])
    if "arrayValue" in v:
        return [_any_value(x) for x in v["arrayValue"].get("values", [])]
    if "kvlistValue" in v:
        return {kv["key"]: _any_value(kv.get("value", {})) for kv in v["kvlistValue"].get("values", [])}
    if "bytesValue" in v:
        return v["bytesValue"]
    return None


def _attrs(kvs: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {kv["key"]: _any_value(kv.get("value", {})) for kv in kvs or []}


def spans_from_otlp_json(doc: dict[str, Any]) -> list[StoredSpan]:
    """Flatten an OTLP JSON TracesData-like document (resourceSpans or Tempo's 'batches')."""
    out: list[StoredSpan] = []
    resource_spans = doc.get("resourceSpans") or doc.get("batches") or []
    for rs in resource_spans:
        res_attrs = _attrs((rs.get("resource") or {}).get("attributes"))
        service = res_attrs.get("service.name")
        for ss in rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans") or []:
            for sp in ss.get("spans", []):
                out.append(
                    StoredSpan(
                        trace_id=_hex_id(sp.get("traceId", ""), 16),
                        span_id=_hex_id(sp.get("spanId", ""), 8),
                        name=sp.get("name", ""),
                        service_name=service,
                        attributes=sc.with_shared(_attrs(sp.get("attributes")), res_attrs),
                        links=tuple(
                            (_hex_id(lk.get("traceId", ""), 16), _hex_id(lk.get("spanId", ""), 8))
                            for lk in sp.get("links", [])
                        ),
                        link_attributes=tuple(_attrs(lk.get("attributes")) for lk in sp.get("links", [])),
                    )
                )
    return out


def _get_json(url: str, timeout: float = 5.0) -> Any:
    req = urllib.request.Request(url, headers={"Accept": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 (loopback URLs we built)
        body = resp.read().decode()
    # Jaeger's /api/v3 streams one JSON object per chunk; join them if there are several.
    try:
        return json.loads(body)
    except json.JSONDecodeError:
        return [json.loads(line) for line in body.splitlines() if line.strip()]


#: TraceQL for the root-cause spans of one category (Tempo); Grafana's alert annotation uses the same query.
ROOT_CAUSE_TRACEQL = '{{ name = "mycroft.root_cause" && span.mycroft.rca.category = "{category}" }}'


class TraceStoreClient:
    """Query API of the stack's trace store.

    ``kind`` is ``"tempo"`` (Tempo HTTP API: /api/v2/traces/<id>, /api/search?q=<TraceQL>) or
    ``"jaeger"`` (Jaeger v2 query API: /api/v3/traces/<id>, /api/v3/traces?query.*).
    """

    def __init__(self, kind: str, base_url: str) -> None:
        if kind not in ("tempo", "jaeger"):
            raise ValueError(f"unknown trace store kind {kind!r}")
        self.kind = kind
        self.base_url = base_url.rstrip("/")

    # -- single trace ---------------------------------------------------------------------
    def get_trace(self, trace_id: str) -> list[StoredSpan]:
        """All spans of one trace; [] while the store does not have it (yet)."""
        trace_id = trace_id.lower()
        url = (
            f"{self.base_url}/api/v2/traces/{trace_id}"
            if self.kind == "tempo"
            else f"{self.base_url}/api/v3/traces/{trace_id}"
        )
        try:
            doc = _get_json(url)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return []
            raise
        docs = doc if isinstance(doc, list) else [doc]
        spans: list[StoredSpan] = []
        for d in docs:
            if "error" in d and "result" not in d:
                if int(d["error"].get("httpCode", d["error"].get("code", 0))) in (404, 5):
                    return []
                raise RuntimeError(f"trace store error: {d['error']}")
            body = d.get("result", d)
            body = body.get("trace", body)  # Tempo v2: {"trace": {...}}
            spans += spans_from_otlp_json(body)
        return spans

    # -- search ---------------------------------------------------------------------------
    def search(self, service: str, span_name: str | None = None, lookback_s: float = 3600) -> list[str]:
        """Trace ids having a span of ``service`` (and of ``span_name`` if given), newest first.

        Tempo: a TraceQL query; Jaeger: the query API's service/operation filters.
        """
        end = time.time()
        start = end - lookback_s
        if self.kind == "tempo":
            cond = f'resource.service.name = "{service}"'
            if span_name:
                cond += f' && name = "{span_name}"'
            q = urllib.parse.urlencode(
                {"q": "{ " + cond + " }", "start": int(start), "end": int(end) + 1, "limit": 100}
            )
            doc = _get_json(f"{self.base_url}/api/search?{q}")
            return [t["traceID"].rjust(32, "0").lower() for t in doc.get("traces", [])]
        params = {
            "query.service_name": service,
            "query.start_time_min": _rfc3339(start),
            "query.start_time_max": _rfc3339(end + 1),
            "query.num_traces": 100,
        }
        if span_name:
            params["query.operation_name"] = span_name
        try:
            doc = _get_json(f"{self.base_url}/api/v3/traces?{urllib.parse.urlencode(params)}")
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return []
            raise
        ids: list[str] = []
        for d in doc if isinstance(doc, list) else [doc]:
            for sp in spans_from_otlp_json(d.get("result", d)):
                if sp.trace_id not in ids:
                    ids.append(sp.trace_id)
        return ids

    def find_root_causes(self, category: str, lookback_s: float = 3600, limit: int = 100) -> list[str]:
        """Trace ids holding a ``mycroft.root_cause`` span of ``category``, found by the store's search.

        Tempo: the TraceQL query ``ROOT_CAUSE_TRACEQL``. Jaeger: its query API's span-name and tag filters
        (``/api/traces?operation=mycroft.root_cause&tags={"mycroft.rca.category": ...}``; the v3 API has no
        attribute filter), over the services that emitted root-cause spans.
        """
        end = time.time()
        start = end - lookback_s
        if self.kind == "tempo":
            q = urllib.parse.urlencode({"q": ROOT_CAUSE_TRACEQL.format(category=category),
                                        "start": int(start), "end": int(end) + 1, "limit": limit})
            doc = _get_json(f"{self.base_url}/api/search?{q}")
            return [t["traceID"].rjust(32, "0").lower() for t in doc.get("traces", [])]
        ids: list[str] = []
        for service in self._services_with(sc.ROOT_CAUSE_SPAN):
            params = {"service": service, "operation": sc.ROOT_CAUSE_SPAN, "limit": limit,
                      "start": int(start * 1e6), "end": int((end + 1) * 1e6),
                      "tags": json.dumps({"mycroft.rca.category": category})}
            doc = _get_json(f"{self.base_url}/api/traces?{urllib.parse.urlencode(params)}")
            for t in doc.get("data") or []:
                tid = t["traceID"].rjust(32, "0").lower()
                if tid not in ids:
                    ids.append(tid)
        return ids

    def _services_with(self, operation: str) -> list[str]:
        """Jaeger: services having spans named ``operation``."""
        services = _get_json(f"{self.base_url}/api/services").get("data") or []
        out = []
        for svc in services:
            ops = _get_json(f"{self.base_url}/api/services/{urllib.parse.quote(svc, safe='')}/operations")
            if operation in (ops.get("data") or []):
                out.append(svc)
        return out

    def wait_for(
        self,
        trace_id: str,
        predicate: Callable[[list[StoredSpan]], bool] = bool,
        timeout_s: float = 30.0,
        poll_s: float = 0.5,
    ) -> list[StoredSpan]:
        """Poll ``get_trace`` until ``predicate(spans)`` holds; raise TimeoutError with what was seen."""
        deadline = time.monotonic() + timeout_s
        spans: list[StoredSpan] = []
        while time.monotonic() < deadline:
            spans = self.get_trace(trace_id)
            if predicate(spans):
                return spans
            time.sleep(poll_s)
        raise TimeoutError(
            f"trace {trace_id} not as expected after {timeout_s:.0f}s in {self.kind}; "
            f"spans seen: {[s.name for s in spans]}"
        )


def _rfc3339(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int((t % 1) * 1e6):06d}Z"
