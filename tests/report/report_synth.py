"""Synthetic recorded runs in OTLP/JSON (the Collector file exporter's shape), built from the span schema."""

from __future__ import annotations

import json

from mycroft_otel import ids
from mycroft_otel import semconv as sc

JOB = "report-job"
COMM = 0x5F3A9C0E12AB44D1
T0 = 1_764_475_200_000_000_000


def av(v) -> dict:
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}  # 64-bit ints are strings in OTLP/JSON
    if isinstance(v, float):
        return {"doubleValue": v}
    if isinstance(v, str):
        return {"stringValue": v}
    return {"arrayValue": {"values": [av(x) for x in v]}}


def kvs(d: dict) -> list:
    return [{"key": k, "value": av(v)} for k, v in d.items()]


def span(tid: int, sid: int, name: str, start: int, end: int, attrs: dict, links=()) -> dict:
    return {"traceId": f"{tid:032x}", "spanId": f"{sid:016x}", "name": name, "kind": 1,
            "startTimeUnixNano": str(start), "endTimeUnixNano": str(end), "attributes": kvs(attrs),
            "links": [{"traceId": f"{tid:032x}", "spanId": f"{s:016x}", "attributes": kvs(a)} for s, a in links]}


def request(spans: list[dict], service: str = "mycroft-otel-agent") -> dict:
    return {"resourceSpans": [{"resource": {"attributes": kvs({sc.SERVICE_NAME: service})},
                               "scopeSpans": [{"scope": {"name": "test"}, "spans": spans}]}]}


def ring_hang(n: int = 8, culprit: int = 3, seq: int = 17, silent: int | None = None) -> tuple[int, list[dict]]:
    """A ring AllReduce hung by rank ``culprit``'s GPU; every other rank waits for data from upstream."""
    tid = ids.coll_trace_id(JOB, COMM, seq)
    out = []
    for r in range(n):
        if r == silent:
            continue
        flows = {"ch": [], "dir": [], "peer": [], "steps": [], "posted": [], "ready": [], "tx": [], "done": [],
                 "wait": []}
        links = [(ids.span_id(tid, r, sc.ROLE_OP), {sc.LINK_ROLE: sc.LINK_SNAPSHOT_OF})]
        for c in range(2):
            for d, peer in (("send", (r + 1) % n), ("recv", (r - 1) % n)):
                if r == culprit:
                    ready, tx, done = (3, 3, 3) if d == "send" else (4, 4, 3)
                    wait = "SendGpuWait" if d == "send" else "RecvGpuWait"
                else:
                    ready, tx, done = 3, 3, 3
                    wait = "SendGpuWait" if d == "send" else "RecvWait"
                for k, v in zip(flows, (c, d, peer, 16, 8, ready, tx, done, wait)):
                    flows[k].append(v)
                if c == 0:  # one link per peer and direction
                    links.append((ids.span_id(tid, peer, sc.ROLE_OP),
                                  {sc.LINK_ROLE: sc.LINK_SEND_TO if d == "send" else sc.LINK_RECV_FROM,
                                   sc.LINK_PEER: peer}))
        for k in range(3):
            a = {sc.COMM_HASH: ids.comm_hash_hex(COMM), sc.COMM_NRANKS: n, sc.RANK: r, sc.GLOBAL_RANK: r,
                 sc.HOST_NAME: f"node-{r // 4}", sc.OP_KIND: "coll", sc.OP_STATE: "in_flight", sc.COLL_SEQ: seq,
                 sc.COLL_FUNC: "AllReduce", sc.SNAPSHOT_SEQ: k, sc.ANOMALY: "stalled",
                 sc.FLOW_CHANNEL: flows["ch"], sc.FLOW_DIRECTION: flows["dir"], sc.FLOW_PEER: flows["peer"],
                 sc.FLOW_STEPS: flows["steps"], sc.FLOW_POSTED: flows["posted"], sc.FLOW_READY: flows["ready"],
                 sc.FLOW_TRANSMITTED: flows["tx"], sc.FLOW_DONE: flows["done"], sc.FLOW_WAIT_STATE: flows["wait"]}
            out.append(span(tid, ids.span_id(tid, r, sc.ROLE_INFLIGHT, k), sc.INFLIGHT_SPAN, T0 + r * 1000,
                            T0 + (1 + k) * 1_000_000_000, a, links))
    return tid, out


def root_cause(tid: int, category: str, ranks: list[int], seq: int = 17, channel: int | None = None,
               onset: int = T0 + 200_000_000, detected: int = T0 + 3_200_000_000) -> dict:
    a = {sc.RCA_KIND: sc.CATEGORIES.get(category, "hang"), sc.RCA_CATEGORY: category, sc.RCA_CULPRIT_RANKS: ranks,
         sc.RCA_CULPRIT_GLOBAL_RANKS: ranks, sc.RCA_CULPRIT_HOSTS: [f"node-{r // 4}" for r in ranks],
         sc.RCA_CONFIDENCE: 0.9, sc.RCA_EVIDENCE: f"rank {ranks[0]} received data its GPU never consumed",
         sc.RCA_ONSET: onset, sc.RCA_DETECTED: detected, sc.COMM_HASH: ids.comm_hash_hex(COMM), sc.COLL_SEQ: seq,
         sc.COLL_FUNC: "AllReduce"}
    if channel is not None:
        a[sc.RCA_CULPRIT_CHANNEL] = channel
    links = [(ids.span_id(tid, r, sc.ROLE_OP), {sc.LINK_ROLE: sc.LINK_CULPRIT}) for r in ranks]
    return span(tid, ids.span_id(tid, 0, sc.ROLE_ROOT_CAUSE, 0), sc.ROOT_CAUSE_SPAN, onset, detected, a, links)


def completed(n: int = 4, seq: int = 40, late: int = 2) -> tuple[int, list[dict]]:
    """A completed AllReduce where rank ``late`` arrived 50 ms late."""
    tid = ids.coll_trace_id(JOB, COMM, seq)
    out = []
    base = T0 + 10_000_000_000
    for r in range(n):
        start = base + (50_000_000 if r == late else r * 10_000)
        end = base + 60_000_000
        a = {sc.COMM_HASH: ids.comm_hash_hex(COMM), sc.COMM_NRANKS: n, sc.RANK: r, sc.HOST_NAME: "node-0",
             sc.OP_KIND: "coll", sc.OP_STATE: "completed", sc.COLL_SEQ: seq, sc.COLL_FUNC: "AllReduce",
             sc.TIME_API: start, sc.TIME_END: end}
        if r == late:
            a[sc.ANOMALY] = "late"
        out.append(span(tid, ids.span_id(tid, r, sc.ROLE_OP), "nccl.AllReduce", start, end, a))
    return tid, out


def write_run(path, *requests: dict) -> None:
    with open(path, "w") as f:
        for r in requests:
            f.write(json.dumps(r) + "\n")


def exit_status(tid: int, rank: int, seq: int, start: int, end: int, in_flight: bool) -> dict:
    """The agent's ``process_exited`` status of ``rank`` (in the collective, or idle after ``seq - 1``)."""
    a = {sc.COMM_HASH: ids.comm_hash_hex(COMM), sc.COMM_NRANKS: 8, sc.RANK: rank, sc.GLOBAL_RANK: rank,
         sc.HOST_NAME: f"node-{rank // 4}", sc.COLL_SEQ: seq, sc.STATUS_KIND: sc.STATUS_PROCESS_EXITED,
         sc.STATUS_LAST_SEQ: seq - 1,
         sc.STATUS_LAST_STATE: f"process exited in AllReduce seq {seq}" if in_flight
         else f"process exited after collective {seq - 1}"}
    return span(tid, ids.span_id(tid, rank, sc.ROLE_STATUS, 1), sc.STATUS_SPAN, start, end, a)
