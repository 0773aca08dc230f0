"""The HTML page of ``mycroft-otel report``: one self-contained file, no script, no network.

Sections: input problems, the verdicts (table and one card each), the collective traces (verdicts'
first; pictures from pictures.py), the traces not drawn, evaluation results when given.
"""

from __future__ import annotations

import time

from mycroft_otel import semconv as sc
from mycroft_otel.processor.open_incidents import trace_link
from mycroft_otel.processor.outcome import NO_CANDIDATE
from mycroft_otel.report.model import CollTrace, Run, Verdict
from mycroft_otel.report.otlp_json import Problem
from mycroft_otel.report.communicator import heatmap_svg, topology_svg, transfers_svg
from mycroft_otel.report.pictures import esc, flows_svg, fmt_dur, fmt_time, timeline_svg, walk_svg


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;color:#222;max-width:1100px}
h1{font-size:22px;margin-bottom:4px} h2{font-size:18px;margin-top:32px;border-bottom:1px solid #ddd}
h3{font-size:15px;margin:24px 0 6px} .meta{color:#666;font-size:13px}
table{border-collapse:collapse;font-size:13px;margin:6px 0} td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}
th{background:#f4f4f4} .card{border:1px solid #e0b4b4;background:#fff7f7;border-radius:6px;padding:10px 14px;margin:10px 0}
.card.slowdown{border-color:#e8cf9a;background:#fffaf0} .big{font-size:16px;font-weight:600}
.problems{border:1px solid #d9a400;background:#fff8e0;padding:8px 14px;border-radius:6px}
.mono{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px} .muted{color:#777}
svg{display:block;margin:6px 0 12px} svg text{font-family:system-ui,Helvetica,Arial,sans-serif}
"""



_CULPRIT_CELL = ' class="culprit"'


# --- verdicts -----------------------------------------------------------------------------------

_DECISIONS_SHOWN = 60  # decisions listed (the counts cover all)

def _where(v: Verdict) -> str:
    a = v.a
    parts = []
    if v.ranks:
        parts.append(f"rank{'s' if len(v.ranks) > 1 else ''} {', '.join(map(str, v.ranks))}")
    g = a.get(sc.RCA_CULPRIT_GLOBAL_RANKS)
    if g:
        parts.append(f"global rank{'s' if len(g) > 1 else ''} {', '.join(map(str, g))}")
    h = a.get(sc.RCA_CULPRIT_HOSTS)
    if h:
        parts.append("on " + ", ".join(map(str, h)))
    if a.get(sc.RCA_CULPRIT_CHANNEL) is not None:
        parts.append(f"channel {a.get(sc.RCA_CULPRIT_CHANNEL)}"
                     + (f" towards rank {a.get(sc.RCA_CULPRIT_PEER)}" if a.get(sc.RCA_CULPRIT_PEER) is not None
                        else ""))
    return "; ".join(parts) or "unknown"


def _contest(a: dict) -> str:
    """The winning explanation, the best one elsewhere and the margin between them (processor/outcome.py)."""
    won, second, margin = a.get(sc.RCA_HYPOTHESIS), a.get(sc.RCA_RUNNER_UP), a.get(sc.RCA_MARGIN)
    if not isinstance(won, str) or not won:
        return "- (not recorded)"
    text = won
    if isinstance(second, str) and second:
        text += f", ahead of {second}"
    if isinstance(margin, (int, float)) and not isinstance(margin, bool):
        text += f" by {margin:g}"
    return text


def decisions_section(decisions: list, counts: dict) -> str:
    """Why the processor decided what it did about each collective it judged (replayed recordings): the
    count per outcome, then the latest decisions per communicator that were not warm-up."""
    rows = "".join(f"<tr><td>{esc(o)}</td><td>{n}</td></tr>" for o, n in sorted(counts.items(), key=lambda x: -x[1]))
    parts = ['<p>Every completed collective the slowdown analysis judged, by outcome (a verdict, or why it '
             "stayed silent):</p><table><tr><th>outcome</th><th>collectives</th></tr>" + rows + "</table>"]
    # the ones with something to say: a verdict, or a silence with a candidate gathering evidence
    shown = [d for d in decisions if d.outcome.value != "warmup" and d.detail != NO_CANDIDATE][-_DECISIONS_SHOWN:]
    if shown:
        parts.append(f"<p>The latest {len(shown)} decisions:</p><table><tr><th>communicator</th><th>collective</th>"
                     "<th>outcome</th><th>why</th></tr>")
        parts += [f'<tr><td class="mono">{esc(d.comm)}</td><td>#{esc(d.seq)}</td><td>{esc(d.outcome.value)}</td>'
                  f"<td>{esc(d.detail)}</td></tr>" for d in shown]
        parts.append("</table>")
    return "".join(parts)


def trace_ref(trace_id: str, trace_ui: str = "", drawn: bool = False) -> str:
    """A trace id as a link: to the trace UI (MYCROFT_TRACE_UI_URL) where one is configured, else to the
    trace's section of this report when it is drawn here, else the bare id."""
    tid = esc(trace_id)
    if trace_ui:
        return (f'<a class="mono trace-link" href="{esc(trace_link(trace_ui, trace_id))}" '
                f'title="open in the trace UI">{tid}</a>')
    if drawn:
        return f'<a class="mono trace-link" href="#t-{tid}">{tid}</a>'
    return f'<span class="mono">{tid}</span>'


def verdict_card(v: Verdict, idx: int, t: CollTrace | None, trace_ui: str = "") -> str:
    a = v.a
    conf = a.get(sc.RCA_CONFIDENCE)
    lat = v.latency_s
    rows = [
        ("culprit", _where(v)),   # the row the reader looks for first (class culprit)
        ("evidence", a.get(sc.RCA_EVIDENCE, "")),
        ("confidence", f"{conf:.2f}" if isinstance(conf, (int, float)) else "-"),
        ("hypothesis", _contest(a)),
        ("detection latency", f"{lat:.2f} s after the estimated onset" if lat is not None else "- (no onset estimate)"),
        ("onset / detected", f"{fmt_time(v.onset_ns)} / {fmt_time(v.detected_ns)}"),
        ("collective", f"{a.get(sc.COLL_FUNC, '?')} #{a.get(sc.COLL_SEQ, '?')} on communicator "
                       f"{a.get(sc.COMM_HASH, '?')}"),
        ("trace", trace_ref(v.span.trace_id, trace_ui, t is not None and bool(t.ranks))),
    ]
    linked = [(role, sid) for role in (sc.LINK_CULPRIT, sc.LINK_EVIDENCE) for sid in v.linked(role)]
    links = []
    for role, sid in linked[:12]:  # (only those shown are resolved)
        if t is None:
            links.append(f"{role}: span {sid}")
            continue
        r, what, arrived = t.resolve(sid)
        who = f"rank {r} {what}" if r is not None else f"span {sid}"
        links.append(f"{role}: {who}" + ("" if arrived else " (never arrived)"))
    if links:
        more = f" (+{len(linked) - 12} more)" if len(linked) > 12 else ""
        rows.append(("linked spans", "; ".join(links) + more))
    body = "".join(f"<tr><th>{esc(k)}</th><td{_CULPRIT_CELL if k == 'culprit' else ''}>"
                   f"{val if k == 'trace' else esc(val)}</td></tr>" for k, val in rows)
    anchor = f"#t-{v.span.trace_id}" if t is not None and t.ranks else ""
    title = f"{esc(v.kind)}: <b>{esc(v.category)}</b>"
    if anchor:
        title += f' <a href="{anchor}" class="muted">(collective below)</a>'
    return (f'<div class="card {esc(v.kind)}" id="v-{idx}"><div class="big">Verdict {idx + 1} — {title}</div>'
            f"<table>{body}</table></div>")


def arrivals(t: CollTrace) -> str:
    rows = []
    for r, rv in t.ranks.items():
        if rv.op is not None:
            rows.append((rv.op.attrs.get(sc.TIME_API) or rv.op.start_ns, r))
    if len(rows) < 2:
        return ""
    rows.sort()
    first = rows[0][0]
    med = rows[len(rows) // 2][0]
    late = rows[-3:][::-1]
    cells = ", ".join(f"rank {r} +{fmt_dur(a - first)}" for a, r in late)
    return (f'<p class="meta">no rank is waiting (the collective completed). Latest arrivals: {esc(cells)} '
            f"(median arrival +{esc(fmt_dur(med - first))}).</p>")


# --- eval results -------------------------------------------------------------------------------

def eval_section(evals: list) -> str:
    out = []
    yes = {True: "yes", False: "no", None: ""}
    for path, doc in evals:
        s = doc["summary"]
        out.append(f'<h3>Evaluation <span class="mono muted">{esc(path)}</span></h3>')
        keys = [("faults", "faults"), ("detection_rate", "detected"), ("top1_culprit_accuracy", "top-1 culprit"),
                ("category_accuracy", "category"), ("latency_median_s", "latency median (s)"),
                ("latency_p90_s", "latency p90 (s)"), ("healthy_false_positives", "healthy false positives")]
        out.append("<table><tr>" + "".join(f"<th>{esc(h)}</th>" for _k, h in keys) + "</tr><tr>"
                   + "".join(f"<td>{esc(_pct(s.get(k)) if 'rate' in k or 'accuracy' in k else s.get(k, '-'))}</td>"
                             for k, _h in keys) + "</tr></table>")
        out.append("<table><tr><th>scenario</th><th>expected</th><th>detected</th><th>latency</th><th>culprit</th>"
                   "<th>category</th><th>top verdict</th></tr>")
        for r in doc["scenarios"]:
            if not isinstance(r, dict):
                continue
            lat = r.get("latency_s")
            out.append(f"<tr><td>{esc(r.get('scenario', '?'))}</td><td>{esc(r.get('expected') or '(healthy)')}</td>"
                       f"<td>{yes.get(r.get('detected'), esc(r.get('detected')))}</td>"
                       f"<td>{f'{lat:.1f} s' if isinstance(lat, (int, float)) else ''}</td>"
                       f"<td>{yes.get(r.get('culprit_ok'), '')}</td><td>{yes.get(r.get('category_ok'), '')}</td>"
                       f"<td>{esc(r.get('top') or 'no verdict')}</td></tr>")
        out.append("</table>")
    return "\n".join(out)


def _pct(v) -> str:
    return f"{v:.0%}" if isinstance(v, (int, float)) else "-"


# --- page ---------------------------------------------------------------------------------------

def trace_section(t: CollTrace, verdict_index: dict, trace_ui: str = "") -> str:
    hops = t.walk()
    out = [f'<section class="trace" id="t-{t.trace_id}">',
           f"<h3>{esc(t.func)} #{esc(t.seq)} · communicator {esc(t.comm)} · "
           f"{len(t.ranks)}/{t.nranks} ranks reported · {esc(t.state)}"
           + (f" · {t.job_ended} rank(s) ended with the job" if t.job_ended else "") + "</h3>",
           f'<div class="meta mono">trace {trace_ref(t.trace_id, trace_ui, True)}</div>']
    for v in t.verdicts:
        out.append(f'<p>Verdict {verdict_index[id(v)] + 1}: <b>{esc(v.category)}</b> at {esc(_where(v))}</p>')
    walk_ranks = [h.rank for h in hops]
    for v in t.verdicts[:1]:
        topo = topology_svg(t, hops, v)
        if topo:
            out.append("<h4>The communicator: culprit and blocked flow</h4>" + topo)
        heat = heatmap_svg(t, walk_ranks, v)
        if heat:
            out.append("<h4>What each rank waited in, over time</h4>" + heat)
        out.append("<h4>Per-flow transfer times</h4>" + transfers_svg(t, v))
    out.append("<h4>Timeline</h4>" if t.verdicts else "")
    out.append(timeline_svg(t, walk_ranks))
    for v in t.verdicts[:1]:
        for r in v.ranks[:2]:
            out.append(f"<h4>Flow counters of culprit rank {r}</h4>")
            out.append(flows_svg(t, r, v.a.get(sc.RCA_CULPRIT_CHANNEL), v.a.get(sc.RCA_CULPRIT_PEER)))
    if hops:
        out.append("<h4>Wait chain (link walk)</h4>" + walk_svg(t, hops))
    else:
        out.append(arrivals(t))
    out.append("</section>")
    return "\n".join(out)


def page(run: Run, problems: list[Problem], max_traces: int, source: str, trace_ui: str = "") -> str:
    """The report; ``trace_ui``: the trace UI its trace ids link to (open_incidents.trace_link's template)."""
    verdict_index = {id(v): i for i, v in enumerate(run.verdicts)}
    traces = sorted(run.traces.values(), key=lambda t: (-t.interest, str(t.comm), str(t.seq)))
    drawn = [t for t in traces if t.ranks][:max_traces]
    rest = [t for t in traces if t.ranks][max_traces:]
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             "<title>mycroft-otel report</title>", f"<style>{CSS}</style></head><body>",
             "<h1>mycroft-otel report</h1>",
             f'<div class="meta">input {esc(source)} ({len(run.files)} file{"s" if len(run.files) != 1 else ""}); '
             f"{run.spans} spans, {len(run.traces)} traces, {len(run.verdicts)} verdict(s); generated "
             f"{esc(fmt_time(time.time_ns()))}</div>"]
    if problems:
        shown = problems[:50]
        parts.append(f'<h2>Problems with the input ({len(problems)})</h2><div class="problems"><p>These parts '
                     "could not be read; everything else is shown below.</p><ul>"
                     + "".join(f"<li class=\"mono\">{esc(p)}</li>" for p in shown)
                     + (f"<li>… {len(problems) - 50} more</li>" if len(problems) > 50 else "") + "</ul></div>")
    if run.evals:
        parts.append("<h2>Evaluation runs</h2>" + eval_section(run.evals))
    parts.append("<h2>Verdicts</h2>")
    if not run.verdicts:
        parts.append('<p class="muted">No <span class="mono">mycroft.root_cause</span> span in the input: the '
                     "processor found nothing (or its verdicts were not recorded).</p>")
    else:
        parts.append("<table><tr><th>#</th><th>kind</th><th>category</th><th>culprit</th><th>confidence</th>"
                     "<th>detection latency</th></tr>")
        for i, v in enumerate(run.verdicts):
            c = v.a.get(sc.RCA_CONFIDENCE)
            parts.append(f'<tr><td><a href="#v-{i}">{i + 1}</a></td><td>{esc(v.kind)}</td><td><b>{esc(v.category)}'
                         f"</b></td><td>{esc(_where(v))}</td><td>"
                         f"{f'{c:.2f}' if isinstance(c, (int, float)) else '-'}</td>"
                         f"<td>{f'{v.latency_s:.2f} s' if v.latency_s is not None else '-'}</td></tr>")
        parts.append("</table>")
        for i, v in enumerate(run.verdicts):
            parts.append(verdict_card(v, i, run.traces.get(v.span.trace_id), trace_ui))
    if run.decision_counts:
        parts.append("<h2>Decisions</h2>" + decisions_section(run.decisions, run.decision_counts))
    parts.append("<h2>Collectives</h2>")
    if not drawn:
        parts.append('<p class="muted">No rank spans (nccl.*, mycroft.inflight, mycroft.status) in the input.</p>')
    for t in drawn:
        parts.append(trace_section(t, verdict_index, trace_ui))
    if rest:
        parts.append(f"<h3>{len(rest)} more collective trace(s), not drawn</h3><table><tr><th>trace</th>"
                     "<th>collective</th><th>communicator</th><th>ranks</th><th>state</th></tr>")
        for t in rest[:500]:
            parts.append(f'<tr><td>{trace_ref(t.trace_id, trace_ui)}</td><td>{esc(t.func)} #{esc(t.seq)}</td>'
                         f"<td>{esc(t.comm)}</td><td>{len(t.ranks)}/{t.nranks}</td><td>{esc(t.state)}</td></tr>")
        parts.append("</table>")
    if run.other_spans:
        parts.append(f'<p class="muted">{run.other_spans} other span(s) (summaries, foreign spans) not shown.</p>')
    parts.append("</body></html>")
    return "\n".join(parts)
