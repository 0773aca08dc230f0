"""The report's pictures, inline SVG: a collective's timeline, a rank's flow counters, the wait chain.

Timeline: ranks x time, each rank's op span (arrival to end), in-flight snapshots (ticks), status
evidence (not entered, process exited) and ranks without spans; the culprit's row highlighted,
onset and detection marked. Flows: per (channel, direction) posted / ① ready / ② transmitted /
③ done against the steps NCCL announced. Wait chain: boxes from the first waiting rank to where
the walk stops. Big communicators are capped at MAX_ROWS rows, culprit and chain end kept.
"""

from __future__ import annotations

import html
import time

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


def drawn_rows(t: CollTrace, walk_ranks: list[int]) -> tuple[list[tuple[int, int]], int]:
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
    rows, omitted = drawn_rows(t, walk_ranks)
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
        host = rv.attr(sc.HOST_NAME) if rv else None
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
            host = (rv.attr(sc.HOST_NAME) or "") if rv else "silent"
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
