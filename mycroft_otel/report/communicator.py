"""The communicator pictures of a verdict's trace: its ring or tree, a ranks x time heat map of wait states,
per-flow transfer times.

Ring or tree: the flows both sides of each pair report (model.flows_of), drawn in the direction the
data moves, the culprit and its blocked flows red, the wait chain orange. Heat map: what each rank
waited for, as the processor's hang walk reads its evidence at each moment (waits.py). Transfer times: each flow's time from its first step,
split where it stopped making progress.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mycroft_otel import semconv as sc
from mycroft_otel.report.model import CollTrace, flows_of
from mycroft_otel.report.pictures import drawn_rows, esc, fmt_dur
from mycroft_otel.report.waits import (NETWORK, NOT_STARTED, OWN_GPU, PEER_CREDIT, PEER_DATA, PEER_GONE, ROOT_STATES,
                                       Cell, TraceAt, exited, wait_cell)

CULPRIT, NOT_ARRIVED = "culprit", "not arrived"


# --- communicator: ring or tree -----------------------------------------------------------------

MAX_TOPO_RANKS = 64
_DASHED = ' stroke-dasharray="3,2"'
_BOLD_RED = ' font-weight="bold" fill="#b00020"'
_OUTLINE = ' stroke="#000" stroke-width="2"'

#: Heat-map states: (colour, legend). An in-flight rank is painted by what the processor's hang walk reads
#: as its wait (waits.py); outside a wait, by what its evidence says. The verdict's culprit, where its own
#: state ends the walk, is painted as the verdict names it.
_STATES: dict[str, tuple[str, str]] = {
    CULPRIT: ("#b00020", "the verdict's culprit, in the state the verdict names"),
    OWN_GPU: ("#e45756", "its own GPU: data arrived, nothing consumed or produced"),
    NETWORK: ("#7b3294", "the network: a flow both sides wait on"),
    NOT_STARTED: ("#c2a5cf", "in the collective, no flow started"),
    PEER_GONE: ("#f58518", "waits on a peer that is silent, not entered or exited"),
    PEER_DATA: ("#9ecae9", "waits for a peer's data"),
    PEER_CREDIT: ("#c6dbef", "waits for a peer's free buffer"),
    "idle": ("#eeca3b", "in flight, no step waited on"),
    "stopped": ("#5a5a5a", "process stopped (SIGSTOP)"),
    "entered": ("#f2e6a0", "in the collective, before its first snapshot"),
    NOT_ARRIVED: ("#f4f4f4", "not in the collective yet (it completed it later)"),
    "running": ("#4c78a8", "in the collective (completed later)"),
    "done": ("#d9e6c3", "collective completed"),
    "not entered": ("#bab0ac", "not entered"),
    "exited": ("#7f0000", "process exited while in the collective"),
}
_UNKNOWN_STATE = ("#999999", "")


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


def _state_at(at: TraceAt, rv, ns: int) -> Cell:
    if rv.op is not None:
        a0 = rv.op.attrs.get(sc.TIME_API) or rv.op.start_ns
        if ns >= rv.op.end_ns:
            return Cell("done")
        if ns >= a0:
            return Cell("running")
        if not rv.snapshots and not rv.statuses:
            return Cell(NOT_ARRIVED)
    if exited(rv, ns):
        return Cell("exited", str(rv.attr(sc.STATUS_LAST_STATE, "") or ""))
    cell = wait_cell(at, rv.rank, ns)
    if cell is not None:
        return cell
    v = at.at(ns).get(rv.rank)
    if v is not None and v.state == "stopped":
        return Cell("stopped")
    if any(sn.start_ns <= ns for sn in rv.snapshots):
        return Cell("entered")
    if v is not None and v.state == "not_entered":
        return Cell("not entered", str(rv.attr(sc.STATUS_LAST_STATE, "") or ""))
    return Cell("")


def _culprit_cell(cell: Cell, verdict) -> Cell:
    """The culprit's own root state (for a slowdown: its late arrival or its slow run), named as the verdict
    names it; a culprit whose wait the walk follows elsewhere keeps that wait (the picture disagrees openly)."""
    roots = ROOT_STATES | ({NOT_ARRIVED, "running"} if verdict.kind == sc.KIND_SLOWDOWN else set())
    if cell.state not in roots:
        return cell
    return Cell(CULPRIT, f"verdict {verdict.kind} {verdict.category}; its evidence: "
                         f"{cell.text or _STATES[cell.state][1]}")


def heat_cells(t: CollTrace, rows: list[int], verdict=None) -> dict[int, list[Cell]]:
    """rank -> HEAT_COLS cells: the state each rank waited in at the end of each time column."""
    spans = [s for rv in t.ranks.values() for s in ([rv.op] if rv.op else []) + rv.snapshots + rv.statuses]
    times = [x for s in spans for x in (s.start_ns, s.end_ns) if x]
    if not rows or not times or max(times) <= min(times):
        return {}
    t0, t1 = min(times), max(times)
    at = TraceAt(t)
    culprits = set(verdict.ranks) if verdict is not None else set()
    out: dict[int, list[Cell]] = {}
    for r in rows:
        cells = [_state_at(at, t.ranks[r], int(t0 + (c + 1) * (t1 - t0) / HEAT_COLS)) for c in range(HEAT_COLS)]
        out[r] = [_culprit_cell(c, verdict) for c in cells] if r in culprits else cells
    return out


def heatmap_svg(t: CollTrace, walk_ranks: list[int], verdict=None) -> str:
    """Ranks x time: each cell what the rank waited for then, as the hang walk reads its latest evidence."""
    rows, _ = drawn_rows(t, walk_ranks)
    rows = [(a, b) for a, b in rows if a == b and a in t.ranks]
    spans = [s for rv in t.ranks.values() for s in ([rv.op] if rv.op else []) + rv.snapshots + rv.statuses]
    times = [x for s in spans for x in (s.start_ns, s.end_ns) if x]
    if not rows or not times:
        return ""
    t0, t1 = min(times), max(times)
    if t1 <= t0:
        return ""
    culprits = t.culprits()
    cells = heat_cells(t, [a for a, _b in rows], verdict)
    W, L, TOP, RH = 960, 200, 8, 12
    CW = (W - L - 20) / HEAT_COLS
    H = TOP + RH * len(rows) + 22
    out = [f'<svg class="heatmap" width="{W}" height="{H}" viewBox="0 0 {W} {H}" role="img" '
           f'aria-label="wait states of the ranks over time">']
    seen: set[str] = set()
    for i, (r, _b) in enumerate(rows):
        y = TOP + i * RH
        cul = r in culprits
        out.append(f'<text x="4" y="{y + 10}" font-size="10"{_BOLD_RED if cul else ""}>rank {r}'
                   f'{" ★" if cul else ""}</text>')
        prev, start = None, 0
        row = cells[r] + [None]
        for c, cell in enumerate(row):   # runs of equal state become one rect
            if cell != prev:
                if prev is not None and prev.state:
                    seen.add(prev.state)
                    col, label = _STATES.get(prev.state, _UNKNOWN_STATE)
                    out.append(f'<rect class="heat" data-rank="{r}" data-state="{esc(prev.state)}" '
                               f'x="{L + start * CW:.1f}" y="{y}" width="{(c - start) * CW:.1f}" '
                               f'height="{RH - 1}" fill="{col}"><title>rank {r}: '
                               f"{esc(prev.text or label or prev.state)}</title></rect>")
                prev, start = cell, c
    yb = TOP + RH * len(rows)
    out.append(f'<text x="{L}" y="{yb + 14}" font-size="10">0</text><text x="{W - 20}" y="{yb + 14}" '
               f'font-size="10" text-anchor="end">+{esc(fmt_dur(t1 - t0))}</text>')
    out.append("</svg>")
    legend = " ".join(f'<span style="display:inline-block;width:10px;height:10px;background:{col};'
                      f'border:1px solid #ccc"></span> {esc(label)}&nbsp;&nbsp;'
                      for st, (col, label) in _STATES.items() if st in seen)
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
