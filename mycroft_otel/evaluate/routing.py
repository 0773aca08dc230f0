"""The gateway's ``load_balancing`` exporter, for the virtual-time harness: which processor gets which spans.

The gateway (collector_config/gateway.yaml) routes the agents' spans to N processors with the Collector's
contrib ``loadbalancingexporter`` (v0.161.0, the version builder.yaml pins). To measure what N processors
conclude on virtual time, the harness must split the agents' requests exactly as that exporter does:

1. a request is split into one batch per trace id (``batchpersignal.SplitTraces``), each batch keeping
   its resource and scope;
2. each batch gets a routing key: the 16 trace-id bytes for ``routing_key: traceID``; for
   ``routing_key: attributes``, per resource, ``name=value|`` for each routing attribute, looked up in the
   resource, then the scope, then the batch's first span (``name=|`` when none has it);
3. the key's CRC-32 (IEEE) modulo 131,071 is a position on a ring on which every endpoint holds 200
   positions (CRC-32 of the endpoint followed by the point's index, little-endian uint32; a taken position
   moves up to 10 places on), and the batch goes to the endpoint at or after the key's position.

Only the placement must match, not the bytes on the wire: the batches of one endpoint are merged into
one request per processor, as the exporter merges them before it sends.
"""

from __future__ import annotations

import enum
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from mycroft_otel import semconv as sc

MAX_POSITIONS = 131_071  # positions on the exporter's ring
WEIGHT = 200             # positions per endpoint
PROBE_LIMIT = 10         # places a colliding position may move on before the point is dropped


class RoutingKey(enum.Enum):
    TRACE_ID = "traceID"
    ATTRIBUTES = "attributes"


@dataclass(frozen=True)
class Routing:
    """One ``load_balancing`` exporter's ``routing_key`` (and ``routing_attributes``)."""

    key: RoutingKey
    attributes: tuple[str, ...] = ()
    # the agents' MYCROFT_SHARD_RANKS that go with it: the harness sets it on its agent (0: jobs unsharded)
    shard_ranks: int = 0

    def key_for(self, values: dict[str, str]) -> bytes:
        """The routing key of ``routing_key: attributes`` for these attribute values (a missing one: ``name=|``)."""
        return "".join(f"{n}={values[n]}|" if n in values else f"{n}=|" for n in self.attributes).encode()


#: What the shipped gateway configs route on: a job's spans stay together (its communicators' evidence
#: is read together: the slowdown test's per-communicator history, cross-communicator naming); with agents
#: that shard jobs (MYCROFT_SHARD_RANKS), a shard's spans do. Unsharded agents set no shard: ``shard=|``.
BY_JOB = Routing(RoutingKey.ATTRIBUTES, (sc.JOB_ID, sc.JOB_SHARD))
#: The exporter's default: one collective per processor (what the gateway routed on before BY_JOB).
BY_TRACE = Routing(RoutingKey.TRACE_ID)


def by_shard(ranks: int) -> Routing:
    """The shipped routing behind agents that shard jobs into blocks of ``ranks`` global ranks."""
    return Routing(BY_JOB.key, BY_JOB.attributes, ranks)


def _crc(*parts: bytes) -> int:
    c = 0
    for p in parts:
        c = zlib.crc32(p, c)
    return c


class HashRing:
    """The exporter's consistent-hash ring over ``endpoints`` (``consistent_hashing.go``)."""

    def __init__(self, endpoints: Sequence[str]) -> None:
        if not endpoints:
            raise ValueError("a hash ring needs at least one endpoint")
        cands = sorted(((h % MAX_POSITIONS, h, e) for e in endpoints
                        for h in (_crc(e.encode(), i.to_bytes(4, "little")) for i in range(WEIGHT))))
        taken: set[int] = set()
        items = []
        for pos, _h, e in cands:
            probed = 0
            while pos in taken and probed < PROBE_LIMIT:
                pos, probed = (pos + 1) % MAX_POSITIONS, probed + 1
            if probed >= PROBE_LIMIT:
                continue
            taken.add(pos)
            items.append((pos, e))
        items.sort()
        self._items = items

    def endpoint_for(self, key: bytes) -> str:
        pos = zlib.crc32(key) % MAX_POSITIONS
        n = len(self._items)
        return _bsearch(pos, self._items[:n // 2], self._items[n // 2:])


def _bsearch(pos: int, left: list, right: list) -> str:
    """The exporter's bisection, kept as it is written (its wrap-around returns the first item of the
    slice at hand, which at the top level is the ring's first position)."""
    while True:
        if left[-1][0] == pos:
            return left[-1][1]
        if right[0][0] == pos:
            return right[0][1]
        if pos > right[-1][0]:
            return left[0][1]
        part = right if pos > left[-1][0] else left
        if len(part) == 1:
            return part[0][1]
        left, right = part[:len(part) // 2], part[len(part) // 2:]


def _as_string(v: AnyValue) -> str:
    """pcommon.Value.AsString for the scalar kinds the agents set."""
    kind = v.WhichOneof("value")
    if kind == "string_value":
        return v.string_value
    if kind == "bool_value":
        return "true" if v.bool_value else "false"
    if kind == "int_value":
        return str(v.int_value)
    if kind == "double_value":
        return repr(v.double_value)
    return ""


def _lookup(attrs: Iterable[KeyValue], name: str) -> AnyValue | None:
    return next((kv.value for kv in attrs if kv.key == name), None)


def _attribute_key(resource, scope, first_span, routing: Routing) -> bytes:
    found = {}
    for name in routing.attributes:
        v = (_lookup(resource.attributes, name) or _lookup(scope.attributes, name)
             or _lookup(first_span.attributes, name))
        if v is not None:
            found[name] = _as_string(v)
    return routing.key_for(found)


def split(request: ExportTraceServiceRequest, routing: Routing,
          ring: HashRing) -> dict[str, ExportTraceServiceRequest]:
    """``request``'s spans per endpoint, placed as the exporter places them."""
    out: dict[str, ExportTraceServiceRequest] = {}
    for rs in request.resource_spans:
        for ss in rs.scope_spans:
            by_trace: dict[bytes, list] = {}
            for span in ss.spans:
                by_trace.setdefault(span.trace_id, []).append(span)
            for trace_id, spans in by_trace.items():
                key = (trace_id if routing.key is RoutingKey.TRACE_ID
                       else _attribute_key(rs.resource, ss.scope, spans[0], routing))
                dst = out.setdefault(ring.endpoint_for(key), ExportTraceServiceRequest())
                out_rs = dst.resource_spans.add(resource=rs.resource, schema_url=rs.schema_url)
                out_rs.scope_spans.add(scope=ss.scope, schema_url=ss.schema_url).spans.extend(spans)
    return out
