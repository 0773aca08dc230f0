"""The report's pictures, inline SVG: a collective's timeline, a rank's flow counters, the wait chain.

Timeline: ranks x time, each rank's op span (arrival to end), in-flight snapshots (ticks), status
evidence (not entered, process exited) and ranks without spans; the culprit's row highlighted,
onset and detection marked. Flows: per (channel, direction) posted / ① ready / ② transmitted /
③ done against the steps NCCL announced. Wait chain: boxes from the first waiting rank to where
the walk stops. Big communicators are capped at MAX_ROWS rows, culprit and chain end kept.
"""

from __future__ import annotations

import html
import math
import time
from dataclasses import dataclass

from mycroft_otel import semconv as sc
from mycroft_otel.report.model import CollTrace, flows_of

MAX_ROWS = 64
MAX_FLOWS = 32

_COL = {"op": "#4c78a8", "anomalous": "#f58518", "stalled": "#e45756", "inflight": "#eeca3b",
        "not_entered": "#bab0ac", "process_exited": "#7f0000", "culprit_bg": "#fde2e2"}


def esc(x) -> str:
    return html.escape(str(x), quote=True)


def fmt_time(ns: int) -> str:
    if not ns:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ns / 1e9)) + f".{ns % 1_000_000_000 // 1_000_000:03d} UTC"


def fmt_dur(ns: float) -> str:
    a = abs(ns)
    if a >= 1e9:
        return f"{ns / 1e9:.3g} s"
    if a >= 1e6:
        return f"{ns / 1e6:.3g} ms"
    if a >= 1e3:
        return f"{ns / 1e3:.3g} µs"
    return f"{ns:.0f} ns"


def _nice_step(span: float, n: int = 6) -> float:
    raw = max(span / n, 1.0)
    mag = 10 ** (len(str(int(raw))) - 1)
    for m in (1, 2, 5, 10):
        if m * mag >= raw:
            return m * mag
    return 10 * mag


# --- timeline -----------------------------------------------------------------------------------

_NO_SPAN = {False: "no span from this rank (silent)",
            True: "no span exported (healthy ranks of a flagged collective are sampled)"}


def _rows(t: CollTrace, walk_ranks: list[int]) -> tuple[list[tuple[int, int]], int]:
    """Rows to draw as (first rank, last rank): one rank each, except runs of 3+ ranks without spans
    (one row); capped at MAX_ROWS, keeping culprits, walk, anomalies. Returns (rows, ranks not drawn)."""
    n = max(t.nranks, max(t.ranks, default=-1) + 1)
    rows: list[tuple[int, int]] = []
    prev = -1
    for r in sorted(t.ranks) + [n]:   # O(ranks reported), however many the communicator claims
        a, e = prev + 1, r - 1        # the gap of ranks without spans before r
        rows += [(a, e)] if e - a >= 2 else [(i, i) for i in range(a, e + 1)]
        if r < n:
            rows.append((r, r))
        prev = r
    if len(rows) <= MAX_ROWS:
        return rows, 0
    # priority: culprits, the end of the wait chain (nearest the culprit first), silent or collapsed
    # ranks, ranks in flight or flagged, the rest in rank order
    by_start = {a: (a, b) for a, b in rows}
    order = sorted(t.culprits()) + list(reversed(walk_ranks))
    order += [a for a, b in rows if a != b or a not in t.ranks]
    order += [r for r, rv in sorted(t.ranks.items()) if rv.op is None or rv.op.attrs.get(sc.ANOMALY)]
    order += [a for a, _b in rows]
    keep: list[tuple[int, int]] = []
    chosen = set()
    for a in order:
        row = by_start.get(a)
        if row is None or row in chosen:
            continue
        chosen.add(row)
        keep.append(row)
        if len(keep) >= MAX_ROWS:
            break
    keep.sort()
    drawn = sum(b - a + 1 for a, b in keep)
    return keep, n - drawn


def timeline_svg(t: CollTrace, walk_ranks: list[int]) -> str:
    rows, omitted = _rows(t, walk_ranks)
    completed = all(rv.op is not None for rv in t.ranks.values())
    culprits = t.culprits()
    spans = [s for rv in t.ranks.values() for s in ([rv.op] if rv.op else []) + rv.snapshots + rv.statuses]
    starts = [s.start_ns for s in spans if s.start_ns] + [s.attrs.get(sc.TIME_API) or 0 for s in spans]
    starts = [x for x in starts if x]
    ends = [s.end_ns for s in spans if s.end_ns]
    marks = []
    for v in t.verdicts:
        if v.onset_ns:
            marks.append(("onset", v.onset_ns, "#b00020", "4,3"))
        if v.detected_ns:
            marks.append(("detected", v.detected_ns, "#b00020", ""))
    allt = starts + ends + [m[1] for m in marks]
    if not allt:
        return '<p class="muted">no timed spans in this trace</p>'
    t0, t1 = min(allt), max(allt)
    if t1 <= t0:
        t1 = t0 + 1
    W, L, R, RH, TOP = 960, 200, 50, 16, 30
    PW = W - L - R
    H = TOP + RH * len(rows) + 26

    def x(ns):
        return L + (ns - t0) / (t1 - t0) * PW
    out = [f'<svg class="timeline" width="{W}" height="{H}" viewBox="0 0 {W} {H}" role="img" '
           f'aria-label="timeline of trace {t.trace_id}">']
    grid = []
    step = _nice_step(t1 - t0)
    k = 0
    yb = TOP + RH * len(rows)
    grid.append(f'<line x1="{L}" x2="{L + PW}" y1="{yb}" y2="{yb}" stroke="#999"/>')
    while k * step <= (t1 - t0) and k < 50:
        xx = x(t0 + k * step)
        grid.append(f'<line x1="{xx:.1f}" x2="{xx:.1f}" y1="{TOP}" y2="{yb + 4}" stroke="#ddd"/>'
                    f'<text x="{xx:.1f}" y="{yb + 16}" font-size="10" text-anchor="middle">'
                    f'{"+" + fmt_dur(k * step) if k else "0"}</text>')
        k += 1
    for i, (r, last) in enumerate(rows):
        y = TOP + i * RH
        if r in culprits:
            out.append(f'<rect x="0" y="{y}" width="{W}" height="{RH}" fill="{_COL["culprit_bg"]}"/>')
        elif i % 2:
            out.append(f'<rect x="{L}" y="{y}" width="{PW}" height="{RH}" fill="#f7f7f7"/>')
    out.extend(grid)
    for i, (r, last) in enumerate(rows):
        y = TOP + i * RH
        rv = t.ranks.get(r)
        if last != r:
            out.append(f'<text x="4" y="{y + 12}" font-size="11" fill="#999">ranks {r}–{last}</text>'
                       f'<text x="{L + 4}" y="{y + 12}" font-size="11" font-style="italic" fill="#999">'
                       f"{_NO_SPAN[completed]} ({last - r + 1} ranks)</text>")
            continue
        host = rv.attr(sc.HOST) if rv else None
        g = rv.attr(sc.GLOBAL_RANK) if rv else None
        label = f"rank {r}" + (f" (g{g})" if g is not None else "") + (f" {host}" if host else "")
        weight = ' font-weight="bold" fill="#b00020"' if r in culprits else ""
        out.append(f'<text x="4" y="{y + 12}" font-size="11"{weight}>{esc(label[:30])}'
                   f'{" ★" if r in culprits else ""}</text>')
        if rv is None:
            out.append(f'<text x="{L + 4}" y="{y + 12}" font-size="11" font-style="italic" fill="#999">'
                       f"{_NO_SPAN[completed]}</text>")
            continue
        if rv.op is not None:
            s = rv.op
            a0 = s.attrs.get(sc.TIME_API) or s.start_ns
            an = s.attrs.get(sc.ANOMALY)
            col = _COL["anomalous"] if an else _COL["op"]
            w = max(x(s.end_ns) - x(a0), 1.5)
            out.append(f'<rect x="{x(a0):.1f}" y="{y + 3}" width="{w:.1f}" height="{RH - 6}" fill="{col}">'
                       f"<title>{esc(s.name)} rank {r}: {fmt_dur(s.end_ns - a0)}"
                       f"{' (' + esc(an) + ')' if an else ''}</title></rect>")
        if rv.snapshots and rv.op is None:
            last = rv.snapshots[-1]
            stalled = any(sn.attrs.get(sc.ANOMALY) == sc.ANOMALY_STALLED for sn in rv.snapshots)
            col = _COL["stalled"] if stalled else _COL["inflight"]
            w = max(x(last.end_ns) - x(last.start_ns), 1.5)
            out.append(f'<rect x="{x(last.start_ns):.1f}" y="{y + 3}" width="{w:.1f}" height="{RH - 6}" '
                       f'fill="{col}" fill-opacity="0.85"><title>in flight rank {r}: {len(rv.snapshots)} '
                       f"snapshot(s), {'stalled' if stalled else 'progressing'}, "
                       f"{fmt_dur(last.end_ns - last.start_ns)}</title></rect>")
            for sn in rv.snapshots:
                out.append(f'<line x1="{x(sn.end_ns):.1f}" x2="{x(sn.end_ns):.1f}" y1="{y + 1}" y2="{y + RH - 1}" '
                           f'stroke="#333" stroke-width="1.2"><title>snapshot {esc(sn.attrs.get(sc.SNAPSHOT_SEQ))}'
                           f"</title></line>")
        for st in rv.statuses:
            kind = str(st.attrs.get(sc.STATUS_KIND, ""))
            col = _COL.get(kind, "#999")
            w = max(x(st.end_ns) - x(st.start_ns), 1.5)
            dash = ' stroke="#666" stroke-dasharray="3,2"' if kind == sc.STATUS_NOT_ENTERED else ""
            # beside an op/in-flight bar the status is a strip under it, else the whole bar
            sy, sh = (y + RH - 5, 4) if (rv.op is not None or rv.snapshots) else (y + 4, RH - 8)
            out.append(f'<rect x="{x(st.start_ns):.1f}" y="{sy}" width="{w:.1f}" height="{sh}" '
                       f'fill="{col}"{dash}><title>rank {r}: {esc(kind)} — '
                       f"{esc(st.attrs.get(sc.STATUS_LAST_STATE, ''))}</title></rect>")
            out.append(f'<text x="{min(x(st.end_ns) + 3, W - 90):.1f}" y="{y + 12}" font-size="10" '
                       f'fill="{col}">{esc(kind.replace("_", " "))}</text>')
    for i, (name, ns, col, dash) in enumerate(marks):
        xx = x(ns)
        da = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(f'<line x1="{xx:.1f}" x2="{xx:.1f}" y1="{TOP - 4}" y2="{yb}" stroke="{col}" '
                   f'stroke-width="1.5"{da}/><text x="{xx:.1f}" y="{10 + (i % 2) * 11}" font-size="10" '
                   f'fill="{col}" text-anchor="{"end" if xx > W - 40 else "middle"}">{name}</text>')
    out.append("</svg>")
    legend = ('<div class="meta">bars: <span style="color:#4c78a8">■</span> completed op '
              '<span style="color:#f58518">■</span> flagged slow/late '
              '<span style="color:#eeca3b">■</span> in flight '
              '<span style="color:#e45756">■</span> stalled (ticks: snapshots) '
              '<span style="color:#bab0ac">■</span> '
              'not entered <span style="color:#7f0000">■</span> process exited; ★ culprit; time from '
              f"{esc(fmt_time(t0))}"
              + (f"; {omitted} ranks not drawn" if omitted else "") + "</div>")
    return "".join(out) + legend


# --- flows --------------------------------------------------------------------------------------

def flows_svg(t: CollTrace, rank: int, channel, peer) -> str:
    rv = t.ranks.get(rank)
    if rv is None or rv.latest is None:
        return f'<p class="muted">rank {rank}: no span in this trace, so no flow counters (a silent rank).</p>'
    s = rv.latest
    flows = flows_of(s)
    if not flows:
        return (f'<p class="muted">rank {rank}: no network flows in its {esc(s.name)} span (intra-node transport, '
                f"not entered, or no proxy activity).</p>")
    shown = flows[:MAX_FLOWS]
    top = max(max(f.steps, f.posted, f.ready, f.transmitted, f.done) for f in shown) or 1
    W, L, BH, GAP = 960, 260, 5, 8
    GH = 4 * BH + GAP
    PW = W - L - 110
    H = 22 + GH * len(shown)
    cols = (("posted", "#9e9e9e"), ("ready ①", "#4c78a8"), ("transmitted ②", "#f58518"), ("done ③", "#54a24b"))
    out = [f'<svg class="flows" width="{W}" height="{H}" viewBox="0 0 {W} {H}" role="img" '
           f'aria-label="flow counters of rank {rank}">']
    lx = L
    for name, col in cols:
        out.append(f'<rect x="{lx}" y="4" width="10" height="8" fill="{col}"/>'
                   f'<text x="{lx + 13}" y="12" font-size="10">{esc(name)}</text>')
        lx += 110
    out.append(f'<text x="{W - 220}" y="12" font-size="10" fill="#777">frame = steps NCCL announced</text>')
    for i, f in enumerate(shown):
        y = 20 + i * GH
        hit = channel is not None and f.channel == channel and (peer is None or f.peer == peer)
        if hit:
            out.append(f'<rect x="0" y="{y - 2}" width="{W}" height="{GH - 2}" fill="{_COL["culprit_bg"]}"/>')
        arrow = "→" if f.direction == "send" else "←"
        label = f"ch{f.channel} {f.direction} {arrow} r{f.peer}  {f.wait_state or 'idle'}"
        bold = ' font-weight="bold"' if hit else ""
        out.append(f'<text x="4" y="{y + 2 * BH + 3}" font-size="11"{bold}>{esc(label)}</text>')
        out.append(f'<rect x="{L}" y="{y}" width="{f.steps / top * PW:.1f}" height="{4 * BH}" fill="none" '
                   f'stroke="#bbb"/>')
        for j, (val, (name, col)) in enumerate(zip((f.posted, f.ready, f.transmitted, f.done), cols)):
            out.append(f'<rect x="{L}" y="{y + j * BH}" width="{val / top * PW:.1f}" height="{BH - 1}" fill="{col}">'
                       f"<title>{esc(name)}: {val} of {f.steps}</title></rect>")
        out.append(f'<text x="{L + max(f.steps, f.posted) / top * PW + 4:.1f}" y="{y + 2 * BH + 3}" font-size="10" '
                   f'fill="#555">{f.posted}/{f.ready}/{f.transmitted}/{f.done} of {f.steps}</text>')
    out.append("</svg>")
    more = f" ({len(flows) - MAX_FLOWS} more flows not drawn)" if len(flows) > MAX_FLOWS else ""
    return (f'<div class="meta">rank {rank}, from its {esc(s.name)} span'
            f"{' #' + esc(s.attrs.get(sc.SNAPSHOT_SEQ)) if s.name == sc.INFLIGHT_SPAN else ''}{more}</div>"
            + "".join(out))


# --- wait chain ---------------------------------------------------------------------------------

def walk_svg(t: CollTrace, hops) -> str:
    if not hops:
        return ""
    culprits = t.culprits()
    items: list = list(hops)
    if len(items) > 9:
        items = items[:2] + [None] + items[-6:]
    BW, BH, GAP = 78, 34, 60
    W = 10 + len(items) * (BW + GAP)
    H = BH + 40
    mid = f"arr-{t.trace_id[:12]}"
    out = [f'<svg class="walk" width="{W}" height="{H}" viewBox="0 0 {W} {H}" role="img" aria-label="wait chain">',
           f'<defs><marker id="{mid}" markerWidth="8" markerHeight="8" refX="7" refY="4" orient="auto">'
           '<path d="M0,0 L8,4 L0,8 z" fill="#555"/></marker></defs>']
    for i, h in enumerate(items):
        x0 = 5 + i * (BW + GAP)
        if h is None:
            out.append(f'<text x="{x0 + BW / 2}" y="{BH / 2 + 14}" font-size="12" text-anchor="middle">'
                       f"… {len(hops) - 8} more …</text>")
        else:
            cul = h.rank in culprits
            fill = "#f8c9c9" if cul else ("#fff1c1" if i == len(items) - 1 else "#e8eef7")
            rv = t.ranks.get(h.rank)
            host = (rv.attr(sc.HOST) or "") if rv else "silent"
            out.append(f'<rect x="{x0}" y="10" width="{BW}" height="{BH}" rx="5" fill="{fill}" '
                       f'stroke="{"#b00020" if cul else "#888"}"/>'
                       f'<text x="{x0 + BW / 2}" y="25" font-size="12" text-anchor="middle" font-weight="bold">'
                       f"rank {h.rank}</text><text x=\"{x0 + BW / 2}\" y=\"38\" font-size=\"9\" "
                       f'text-anchor="middle">{esc(str(host)[:14])}</text>')
        if i < len(items) - 1:
            xa = x0 + BW
            via = h.via if h is not None else ""
            out.append(f'<line x1="{xa + 2}" y1="{10 + BH / 2}" x2="{xa + GAP - 3}" y2="{10 + BH / 2}" '
                       f'stroke="#555" marker-end="url(#{mid})"/>'
                       f'<text x="{xa + GAP / 2}" y="{BH + 26}" font-size="8" text-anchor="middle">'
                       f"{esc(' '.join(via.split(' ')[::2]) if via else '')}</text>")
    out.append("</svg>")
    last = hops[-1]
    lead = (f"each rank waits on the next ({esc(hops[0].via)} …); the walk stops at rank {last.rank}"
            if len(hops) > 1 else f"no rank waits on another; rank {last.rank}")
    return ("".join(out) + f'<div class="meta">{lead}: {esc(last.why)}'
            + (" — the verdict's culprit" if last.rank in culprits else "") + "</div>")


# --- communicator: ring or tree -----------------------------------------------------------------

MAX_TOPO_RANKS = 64
_DASHED = ' stroke-dasharray="3,2"'
_BOLD_RED = ' font-weight="bold" fill="#b00020"'
_OUTLINE = ' stroke="#000" stroke-width="2"'

_WAIT_COL = {"not sent": "#7b3294", "not completed": "#c2a5cf", "RecvWait": "#9ecae9", "SendPeerWait": "#c6dbef", "SendGpuWait": "#e45756", "RecvGpuWait": "#b00020",
             "RecvFlushWait": "#f58518", "SendWait": "#ff9d9a", "idle": "#eeca3b", "entered": "#f2e6a0",
             "running": "#4c78a8",
             "done": "#d9e6c3", "not entered": "#bab0ac", "exited": "#7f0000", "": "#ffffff"}
_WAIT_LABEL = {"not sent": "data ready, not on the wire (① > ②)",
               "not completed": "on the wire, not completed (② > ③)", "RecvWait": "RecvWait: waits for a peer's data", "SendPeerWait": "SendPeerWait: waits for a peer's buffer",
               "SendGpuWait": "SendGpuWait: its GPU has not produced", "RecvGpuWait": "RecvGpuWait: its GPU does not consume",
               "RecvFlushWait": "RecvFlushWait: flush not done", "SendWait": "SendWait: the NIC has not completed",
               "idle": "in flight, no step waited on", "entered": "in the collective, before its first snapshot",
               "running": "in the collective (completed later)",
               "done": "collective completed", "not entered": "not entered", "exited": "process exited",
               "": "no evidence"}


@dataclass
class Edge:
    src: int                  # data flows src -> dst
    dst: int
    labels: list[str]         # "ch0 3/3/2 of 16 SendWait", one per channel and side that reported it
    unfinished: bool


def edges_of(t: CollTrace) -> dict[tuple[int, int], Edge]:
    """The communicator's data flows seen in the trace: (src, dst) -> Edge, from both sides' flows."""
    out: dict[tuple[int, int], Edge] = {}
    n = t.nranks
    for r, rv in t.ranks.items():
        s = rv.latest
        if s is None:
            continue
        for f in flows_of(s):
            if not 0 <= f.peer < n or f.peer == r or f.direction not in ("send", "recv"):
                continue
            key = (r, f.peer) if f.direction == "send" else (f.peer, r)
            e = out.setdefault(key, Edge(key[0], key[1], [], False))
            side = f"r{r} ch{f.channel} {f.direction} {f.posted}/{f.ready}/{f.transmitted}/{f.done} of {f.steps}"
            e.labels.append(side + (f" {f.wait_state}" if f.wait_state else ""))
            e.unfinished = e.unfinished or (rv.op is None and f.unfinished)
    return out


def _tree_levels(n: int, edges) -> dict[int, tuple[int, int]] | None:
    """rank -> (level, index in level) when the flows form a tree (n-1 undirected edges, connected)."""
    und = {frozenset(k) for k in edges}
    if len(und) != n - 1 or n < 3:
        return None
    adj: dict[int, set[int]] = {r: set() for r in range(n)}
    for e in und:
        a, b = tuple(e)
        adj[a].add(b)
        adj[b].add(a)
    root = min(range(n), key=lambda r: (-len(adj[r]) if r == 0 else 0, r))
    level = {root: 0}
    order = [root]
    for r in order:
        for p in sorted(adj[r]):
            if p not in level:
                level[p] = level[r] + 1
                order.append(p)
    if len(level) != n:
        return None
    pos: dict[int, tuple[int, int]] = {}
    counts: dict[int, int] = {}
    for r in order:
        lv = level[r]
        pos[r] = (lv, counts.get(lv, 0))
        counts[lv] = counts.get(lv, 0) + 1
    return pos


def topology_svg(t: CollTrace, hops, verdict=None) -> str:
    """The communicator as a ring (ranks on a circle) or a tree (levels), arrows in the data's direction;
    the culprit rank red, the blocked flow (the verdict's channel/peer, else the culprit's unfinished
    flows) red and thick, the wait chain's flows orange."""
    n = t.nranks
    if n < 2:
        return ""
    if n > MAX_TOPO_RANKS:
        return (f'<p class="muted">communicator of {n} ranks: too large for the ring picture '
                f"({MAX_TOPO_RANKS} at most); the timeline and heat map below show its ranks.</p>")
    edges = edges_of(t)
    culprits = t.culprits()
    peer = verdict.a.get(sc.RCA_CULPRIT_PEER) if verdict is not None else None
    chain = {(hops[i + 1].rank, hops[i].rank) for i in range(len(hops) - 1)}  # data comes from the next hop

    def blocked(e: Edge) -> bool:
        if not culprits & {e.src, e.dst}:
            return False
        if peer is not None:
            return {e.src, e.dst} == {next(iter(culprits & {e.src, e.dst})), peer}
        return e.unfinished and (e.src, e.dst) in chain or e.unfinished and e.src in culprits
    tree = _tree_levels(n, edges)
    W = 560
    if tree is None:
        H = 400
        cx, cy, R = W / 2, H / 2 - 6, min(W, H) / 2 - 50
        pos = {r: (cx + R * math.sin(2 * math.pi * r / n), cy - R * math.cos(2 * math.pi * r / n)) for r in range(n)}
        shape = "ring"
    else:
        levels = max(lv for lv, _ in tree.values()) + 1
        width = {lv: sum(1 for l2, _ in tree.values() if l2 == lv) for lv in range(levels)}
        H = 60 + levels * 70
        pos = {r: ((i + 0.5) * W / width[lv], 40 + lv * 70) for r, (lv, i) in tree.items()}
        shape = "tree"
    NR = 15 if n <= 16 else 11
    mid = f"tarr-{t.trace_id[:12]}"
    out = [f'<svg class="topology" width="{W}" height="{H}" viewBox="0 0 {W} {H}" role="img" '
           f'aria-label="communicator {esc(t.comm)} as a {shape}">',
           f'<defs><marker id="{mid}" markerWidth="7" markerHeight="7" refX="6" refY="3.5" orient="auto">'
           f'<path d="M0,0 L7,3.5 L0,7 z" fill="#666"/></marker>'
           f'<marker id="{mid}-b" markerWidth="7" markerHeight="7" refX="6" refY="3.5" orient="auto">'
           f'<path d="M0,0 L7,3.5 L0,7 z" fill="#b00020"/></marker></defs>']
    # blocked flows last, so they are drawn on top
    for e in sorted(edges.values(), key=lambda e: (blocked(e), (e.src, e.dst) in chain)):
        (x1, y1), (x2, y2) = pos[e.src], pos[e.dst]
        dx, dy = x2 - x1, y2 - y1
        d = max((dx * dx + dy * dy) ** 0.5, 1e-6)
        # both directions of a pair are drawn side by side, offset from the centre line
        ox, oy = -dy / d * 3, dx / d * 3
        ax, ay = x1 + dx / d * NR + ox, y1 + dy / d * NR + oy
        bx, by = x2 - dx / d * (NR + 2) + ox, y2 - dy / d * (NR + 2) + oy
        if blocked(e):
            style, cls, m = 'stroke="#b00020" stroke-width="3.5"', "flow blocked", f"{mid}-b"
        elif (e.src, e.dst) in chain:
            style, cls, m = 'stroke="#f58518" stroke-width="2.5"', "flow chain", mid
        else:
            style, cls, m = 'stroke="#999" stroke-width="1.2"', "flow", mid
        out.append(f'<line class="{cls}" data-from="{e.src}" data-to="{e.dst}" x1="{ax:.1f}" y1="{ay:.1f}" '
                   f'x2="{bx:.1f}" y2="{by:.1f}" {style} marker-end="url(#{m})">'
                   f"<title>rank {e.src} → rank {e.dst}: {esc('; '.join(e.labels[:6]))}</title></line>")
    for r in range(n):
        x, y = pos[r]
        rv = t.ranks.get(r)
        cul = r in culprits
        fill = "#e45756" if cul else ("#ffffff" if rv is None else "#e8eef7")
        extra = f' id="culprit-{t.trace_id[:12]}-{r}" data-culprit-rank="{r}"' if cul else ""
        what = t.stop_reason(r) if rv is not None and rv.op is None else ("completed" if rv else "no span (silent)")
        out.append(f'<g class="rank{" culprit" if cul else ""}"{extra}><circle cx="{x:.1f}" cy="{y:.1f}" r="{NR}" '
                   f'fill="{fill}" stroke="{"#7f0000" if cul else "#4c78a8"}" stroke-width="{3 if cul else 1.2}"'
                   f'{_DASHED if rv is None else ""}/>'
                   f'<text x="{x:.1f}" y="{y + 4:.1f}" font-size="{11 if NR > 12 else 9}" text-anchor="middle" '
                   f'font-weight="bold" fill="{"#fff" if cul else "#222"}">{r}</text>'
                   f"<title>rank {r}: {esc(what)}</title></g>")
    out.append("</svg>")
    n_blocked = sum(1 for e in edges.values() if blocked(e))
    return ("".join(out) + f'<div class="meta">{esc(shape)} of {n} ranks, arrows in the direction the data '
            f"flows; red: the culprit and {n_blocked} blocked flow{'s' if n_blocked != 1 else ''}; orange: the "
            f"wait chain; dashed: no span from that rank</div>")


# --- heat map: ranks x time, the state each rank waited in --------------------------------------

HEAT_COLS = 60


# The most telling wait first: a rank whose own GPU or NIC holds the data explains its peers'
# waits. A send flow whose GPU-ready count runs ahead of what went on the wire is stuck at this
# rank (Mycroft's ① > ②), whatever step it waits on; SendGpuWait comes last, since a rank's
# kernel cannot produce what it has not yet received.
_NOT_SENT, _NOT_DONE = "not sent", "not completed"
_WAIT_PRIORITY = ("RecvGpuWait", _NOT_SENT, _NOT_DONE, "RecvFlushWait", "SendWait", "RecvWait", "SendPeerWait",
                  "SendGpuWait", "idle")


def _flow_state(f) -> str:
    if f.direction == "send" and f.ready > f.transmitted:
        return _NOT_SENT
    if f.direction == "send" and f.transmitted > f.done:
        return _NOT_DONE
    return f.wait_state or "idle"


def _snapshot_state(s) -> str:
    """What a rank waited on at a snapshot: the most telling state among its unfinished flows."""
    states = {_flow_state(f) for f in flows_of(s) if f.unfinished}
    for st in _WAIT_PRIORITY:
        if st in states:
            return st
    return min(states) if states else "idle"


def _state_at(rv, ns: int) -> str:
    if rv.op is not None:
        a0 = rv.op.attrs.get(sc.TIME_API) or rv.op.start_ns
        if ns >= rv.op.end_ns:
            return "done"
        if ns >= a0:
            return "running"
    state = ""
    last_seen = 0
    for sn in rv.snapshots:
        if sn.end_ns <= ns:
            state, last_seen = _snapshot_state(sn), sn.end_ns
        elif sn.start_ns <= ns and not state:
            state = "entered"
    for st in rv.statuses:   # an exit ends the rank's evidence: it shows after its last snapshot
        kind = str(st.attrs.get(sc.STATUS_KIND, ""))
        if kind == sc.STATUS_PROCESS_EXITED and max(st.start_ns, last_seen) <= ns and \
                not any(last_seen < sn.end_ns <= ns for sn in rv.snapshots) and \
                (not rv.snapshots or ns > rv.snapshots[-1].end_ns):
            return "exited"
    if state:
        return state
    for st in rv.statuses:
        if str(st.attrs.get(sc.STATUS_KIND, "")) == sc.STATUS_NOT_ENTERED and st.start_ns <= ns:
            return "not entered"
    return ""


def heatmap_svg(t: CollTrace, walk_ranks: list[int]) -> str:
    """Ranks x time: each cell the state the rank waited in then (its latest in-flight snapshot)."""
    rows, omitted = _rows(t, walk_ranks)
    rows = [(a, b) for a, b in rows if a == b and a in t.ranks]
    spans = [s for rv in t.ranks.values() for s in ([rv.op] if rv.op else []) + rv.snapshots + rv.statuses]
    times = [x for s in spans for x in (s.start_ns, s.end_ns) if x]
    if not rows or not times:
        return ""
    t0, t1 = min(times), max(times)
    if t1 <= t0:
        return ""
    culprits = t.culprits()
    W, L, TOP, RH = 960, 200, 8, 12
    CW = (W - L - 20) / HEAT_COLS
    H = TOP + RH * len(rows) + 22
    out = [f'<svg class="heatmap" width="{W}" height="{H}" viewBox="0 0 {W} {H}" role="img" '
           f'aria-label="wait states of the ranks over time">']
    seen: set[str] = set()
    for i, (r, _b) in enumerate(rows):
        rv = t.ranks[r]
        y = TOP + i * RH
        cul = r in culprits
        out.append(f'<text x="4" y="{y + 10}" font-size="10"{_BOLD_RED if cul else ""}>rank {r}'
                   f'{" ★" if cul else ""}</text>')
        prev, start = None, 0
        for c in range(HEAT_COLS + 1):   # runs of equal state become one rect
            st = _state_at(rv, int(t0 + (c + 1) * (t1 - t0) / HEAT_COLS)) if c < HEAT_COLS else None
            if st != prev:
                if prev:
                    seen.add(prev)
                    out.append(f'<rect x="{L + start * CW:.1f}" y="{y}" width="{(c - start) * CW:.1f}" '
                               f'height="{RH - 1}" fill="{_WAIT_COL.get(prev, "#999")}"><title>rank {r}: '
                               f"{esc(_WAIT_LABEL.get(prev, prev))}</title></rect>")
                prev, start = st, c
    yb = TOP + RH * len(rows)
    out.append(f'<text x="{L}" y="{yb + 14}" font-size="10">0</text><text x="{W - 20}" y="{yb + 14}" '
               f'font-size="10" text-anchor="end">+{esc(fmt_dur(t1 - t0))}</text>')
    out.append("</svg>")
    legend = " ".join(f'<span style="display:inline-block;width:10px;height:10px;background:{_WAIT_COL.get(st, "#999")};'
                      f'border:1px solid #ccc"></span> {esc(_WAIT_LABEL.get(st, st))}&nbsp;&nbsp;'
                      for st in _WAIT_COL if st in seen)
    more = f"; {len(t.ranks) - len(rows)} more reporting ranks not drawn" if len(t.ranks) > len(rows) else ""
    return "".join(out) + f'<div class="meta">{legend}{esc(more)}</div>'


# --- per-flow transfer times --------------------------------------------------------------------

MAX_TRANSFERS = 40


def transfers_svg(t: CollTrace, verdict=None) -> str:
    """One bar per flow (rank, channel, direction) from its first step: solid while it progressed
    (to its end, or its last progress), pale from its last progress to the latest evidence while it
    still runs -- a blocked flow is the one whose pale part starts first. The culprit's flows red,
    the verdict's flow outlined."""
    culprits = t.culprits()
    ch = verdict.a.get(sc.RCA_CULPRIT_CHANNEL) if verdict is not None else None
    peer = verdict.a.get(sc.RCA_CULPRIT_PEER) if verdict is not None else None
    rows = []
    for r, rv in t.ranks.items():
        s = rv.latest
        if s is None or s.name == sc.STATUS_SPAN:
            continue
        for f in flows_of(s):
            if f.start_ns <= 0:
                continue
            running = f.end_ns <= 0
            moved = f.end_ns if not running else max(f.last_progress_ns, f.start_ns)
            end = f.end_ns if not running else max(s.end_ns, moved)
            if end > f.start_ns:
                rows.append((r, f, moved - f.start_ns, end - f.start_ns, running))
    if not rows:
        return '<p class="muted">no flow timing in this trace (the agent exports it per channel)</p>'
    # the culprit's flows, then the ones that stopped progressing earliest, then the slowest
    rows.sort(key=lambda x: (x[0] not in culprits, not x[4], x[2] if x[4] else -x[3]))
    shown = sorted(rows[:MAX_TRANSFERS], key=lambda x: (x[0], x[1].channel, x[1].direction))
    top = max(x[3] for x in shown)
    W, L, BH, PW = 960, 200, 13, 600
    H = 10 + BH * len(shown) + 22
    out = [f'<svg class="transfers" width="{W}" height="{H}" viewBox="0 0 {W} {H}" role="img" '
           f'aria-label="per-flow transfer times">']
    for i, (r, f, moved, total, running) in enumerate(shown):
        y = 6 + i * BH
        cul = r in culprits
        hit = cul and ch is not None and f.channel == ch and (peer is None or f.peer == peer)
        col = "#e45756" if cul else "#4c78a8"
        arrow = "→" if f.direction == "send" else "←"
        label = f"rank {r} ch{f.channel} {f.direction} {arrow} r{f.peer}"
        rate = f", {f.bytes / total:.3g} GB/s" if f.bytes and not running else ""
        wm, wt = max(moved / top * PW, 1.5), max(total / top * PW, 1.5)
        tip = (f"{label}: {fmt_dur(total)}" + (f", no progress for the last {fmt_dur(total - moved)}" if running
                                               else "") + f", {f.done}/{f.steps} steps done{rate}")
        out.append(f'<text x="4" y="{y + 10}" font-size="10"{_BOLD_RED if cul else ""}>{esc(label)}</text>')
        if running and wt > wm:
            out.append(f'<rect x="{L + wm:.1f}" y="{y + 1}" width="{wt - wm:.1f}" height="{BH - 3}" '
                       f'fill="#f4c7c7"><title>{esc(tip)}</title></rect>')
        out.append(f'<rect x="{L}" y="{y + 1}" width="{wm:.1f}" height="{BH - 3}" fill="{col}"'
                   f'{_OUTLINE if hit else ""}><title>{esc(tip)}</title></rect>'
                   f'<text x="{L + wt + 4:.1f}" y="{y + 10}" font-size="10" fill="#555">'
                   + esc(f"{fmt_dur(moved)} then stuck {fmt_dur(total - moved)}" if running and total > moved
                         else fmt_dur(total)) + "</text>")
    out.append("</svg>")
    more = f" ({len(rows) - len(shown)} more flows not drawn)" if len(rows) > len(shown) else ""
    return ("".join(out) + '<div class="meta">from each flow\'s first step: solid while it made progress, pale '
            "from its last progress to the latest evidence while it has not finished; red: the culprit's flows; "
            f"outlined: the verdict's flow{esc(more)}</div>")
