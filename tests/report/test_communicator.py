"""The communicator pictures of a verdict's trace: ring or tree, the wait-state heat map, transfer times."""

from __future__ import annotations

import html as html_mod
import re

from mycroft_otel import ids
from mycroft_otel import semconv as sc
from mycroft_otel.report import render_report

from report_synth import COMM, JOB, T0, av, request, ring_hang, root_cause, span, write_run


def _set(s: dict, key: str, value) -> None:
    s["attributes"] = [kv for kv in s["attributes"] if kv["key"] != key] + [{"key": key, "value": av(value)}]


def _render(tmp_path, spans):
    write_run(tmp_path / "run.jsonl", request(spans))
    html, run, problems = render_report(str(tmp_path / "run.jsonl"))
    assert problems == []
    return html_mod.unescape(html)


def _svg(html: str, cls: str) -> str:
    m = re.search(rf'<svg class="{cls}".*?</svg>', html, re.S)
    assert m, f"no {cls} picture"
    return m.group(0)


def test_ring_with_culprit_and_blocked_flows(tmp_path):
    tid, spans = ring_hang(n=8, culprit=3)
    topo = _svg(_render(tmp_path, spans + [root_cause(tid, "gpu_stalled", [3])]), "topology")
    assert 'as a ring"' in topo
    assert re.findall(r'data-culprit-rank="(\d+)"', topo) == ["3"]
    # every rank reports a send to r+1: eight ring edges; the culprit's unfinished ones are blocked
    edges = re.findall(r'<line class="(flow[^"]*)" data-from="(\d+)" data-to="(\d+)"', topo)
    assert {(int(a), int(b)) for _c, a, b in edges} >= {(r, (r + 1) % 8) for r in range(8)}
    blocked = {(int(a), int(b)) for c, a, b in edges if c == "flow blocked"}
    assert blocked and all(3 in e for e in blocked), blocked
    assert any(c == "flow chain" for c, _a, _b in edges)          # the wait chain towards the culprit


def test_verdict_peer_picks_the_one_blocked_flow(tmp_path):
    tid, spans = ring_hang(n=8, culprit=3)
    rc = root_cause(tid, "net_send_stalled", [3], channel=0)
    _set(rc, sc.RCA_CULPRIT_PEER, 4)
    topo = _svg(_render(tmp_path, spans + [rc]), "topology")
    blocked = re.findall(r'<line class="flow blocked" data-from="(\d+)" data-to="(\d+)"', topo)
    assert {tuple(map(int, e)) for e in blocked} == {(3, 4)}, blocked


def _tree_hang(n: int = 7, culprit: int = 5) -> tuple[int, list[dict]]:
    """A binary-tree broadcast (parent (r-1)//2 sends to r) stalled: ``culprit`` never consumes, so its
    parent's send waits for its credit and the parent's kernel stops consuming too, up to the root; the
    other subtrees wait for data their stuck kernels never produce."""
    tid = ids.coll_trace_id(JOB, COMM, 90)
    path = {culprit}
    while min(path):
        path.add((min(path) - 1) // 2)
    out = []
    for r in range(n):
        flows = []   # (direction, peer, wait state)
        if r:
            flows.append(("recv", (r - 1) // 2, "RecvGpuWait" if r in path else "RecvWait"))
        flows += [("send", c, "SendPeerWait" if c in path else "SendGpuWait") for c in (2 * r + 1, 2 * r + 2)
                  if c < n]
        a = {sc.COMM_HASH: ids.comm_hash_hex(COMM), sc.COMM_NRANKS: n, sc.RANK: r, sc.COLL_SEQ: 90,
             sc.COLL_FUNC: "Broadcast", sc.SNAPSHOT_SEQ: 0, sc.ANOMALY: "stalled",
             sc.FLOW_CHANNEL: [0] * len(flows), sc.FLOW_DIRECTION: [d for d, _p, _w in flows],
             sc.FLOW_PEER: [p for _d, p, _w in flows], sc.FLOW_STEPS: [8] * len(flows),
             sc.FLOW_POSTED: [8] * len(flows), sc.FLOW_READY: [2] * len(flows),
             sc.FLOW_TRANSMITTED: [2] * len(flows), sc.FLOW_DONE: [2 if r == culprit else 1] * len(flows),
             sc.FLOW_WAIT_STATE: [w for _d, _p, w in flows],
             sc.FLOW_START: [1000] * len(flows), sc.FLOW_END: [sc.FLOW_NOT_YET] * len(flows),
             sc.FLOW_LAST_PROGRESS: [(100 if r == culprit else 300) * 1_000_000] * len(flows)}  # after T0
        out.append(span(tid, ids.span_id(tid, r, sc.ROLE_INFLIGHT, 0), sc.INFLIGHT_SPAN, T0, T0 + 2_000_000_000, a))
    return tid, out


def test_tree_layout_heat_map_and_transfer_times(tmp_path):
    tid, spans = _tree_hang()
    html = _render(tmp_path, spans + [root_cause(tid, "gpu_stalled", [5], seq=90)])
    topo = _svg(html, "topology")
    assert 'as a tree"' in topo
    assert re.findall(r'data-culprit-rank="(\d+)"', topo) == ["5"]
    # levels: the root on top, its children one level down, the culprit (a leaf) at the bottom
    ys = {int(r): float(y) for y, r in re.findall(r'<circle cx="[\d.]+" cy="([\d.]+)" r="\d+"[^>]*/><text[^>]*>(\d+)<',
                                                  topo)}
    assert ys[0] < ys[1] == ys[2] < ys[5]
    heat = _svg(html, "heatmap")
    # painted as the hang walk reads them: the culprit as the verdict names it, the others by whom they wait on
    assert ("<title>rank 5: verdict hang gpu_stalled; its evidence: data arrived; its own GPU neither consumes "
            "nor produces</title>") in heat
    assert "<title>rank 3: waits for rank 1's data on ch0</title>" in heat
    assert "<title>rank 0: waits for rank 2's free buffer on ch0</title>" in heat
    assert 'data-state="own GPU"' not in heat and 'data-state="network"' not in heat
    transfers = _svg(html, "transfers")
    # the culprit's flow stopped progressing first: 100 ms of progress, then stuck until the snapshot
    assert "rank 5 ch0 recv ← r2: 2 s, no progress for the last 1.9 s" in transfers
    assert "rank 3 ch0 recv ← r1: 2 s, no progress for the last 1.7 s" in transfers


def test_big_communicator_skips_the_ring(tmp_path):
    tid, spans = ring_hang(n=8, culprit=3)
    for s in spans:
        _set(s, sc.COMM_NRANKS, 4096)
    html = _render(tmp_path, spans + [root_cause(tid, "gpu_stalled", [3])])
    assert "communicator of 4096 ranks: too large for the ring picture" in html
    assert 'class="heatmap"' in html
