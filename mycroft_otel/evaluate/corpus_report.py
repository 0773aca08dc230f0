"""The corpus's report: what the rows of ``evaluate.corpus`` say against the simulator's ground truth.

* the detection curve: per slowdown fault and magnitude, the share of runs whose first verdict after the
  onset names the true culprit with the true category ("named right"), and the share with any verdict;
* culprit and category accuracy of the first verdict, per fault;
* false verdicts per 10^6 healthy collectives: verdicts on healthy runs, verdicts before the onset of a
  fault run, and verdicts after it naming a rank that is not the culprit, over every collective (and p2p
  group) the healthy runs issued plus those the fault runs issued before their onset. A ``late_rank``
  verdict naming a rank the ``stragglers`` noise really delayed (``Simulation.noise_events``) is excused;
* collectives of the faulty communicator from the onset to the first right verdict (median, p90);
* the headline figures (``headline``: named right at >= 1.25x and >= 1.5x, hangs, one-off late calls >= 1 s,
  false verdicts per 10^6 healthy collectives) per job shape and, within a shape, per communicator the
  faults targeted: a detector that is right on 8-rank rings and wrong on TP x DP must not hide behind the
  average, so ``every_shape`` gives the worst shape's figures.

``curve_svg`` draws the curve (named-right rate against magnitude, one line per fault) as an SVG.
"""

from __future__ import annotations

import math

from mycroft_otel.sim.faults import CATALOGUE, SLOWDOWN_PARAM

HEALTHY = "healthy"


def _is_hang(fault: str) -> bool:
    return CATALOGUE.get(fault, ("", ""))[1] == "hang"


def _pct(values: list, q: float):
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))] if v else None


def _rate(rows: list[dict], key: str) -> float | None:
    return round(sum(bool(r[key]) for r in rows) / len(rows), 3) if rows else None


def _comm(r: dict) -> str:
    return r.get("comm") or "dp"  # rows written before faults could target TP were all DP


def _fault_key(r: dict) -> str:
    """The curve's line of a row: the fault, and the communicator when it is not DP (``slow_gpu (tp)``): a
    slow GPU seen first in an NVLink all-reduce is a different detection problem from one in a DP ring."""
    return r["fault"] if _comm(r) == "dp" else f"{r['fault']} ({_comm(r)})"


def _sustained(rows: list[dict]) -> list[dict]:
    """Fault runs whose fault stays from its onset on and has a magnitude (not the one-off late call)."""
    return [r for r in rows if r["fault"] in SLOWDOWN_PARAM and r["fault"] != "late_once"
            and r["magnitude"] is not None]


def headline(rows: list[dict]) -> dict:
    """The figures a corpus is judged by, over ``rows`` (one shape, one communicator, or all): named right
    at >= 1.25x and >= 1.5x (with how many runs), hangs and one-off late calls >= 1 s named right, and false
    verdicts per 10^6 healthy collectives (those the rows' healthy runs issued plus the fault runs' before
    their onset)."""
    faulty = [r for r in rows if r["fault"] != HEALTHY]
    sustained = _sustained(faulty)
    hangs = [r for r in faulty if _is_hang(r["fault"])]
    late = [r for r in faulty if r["fault"] == "late_once" and r["magnitude"] is None and (r["param"] or 0) >= 1000.0]
    coll = sum(r["healthy_collectives"] for r in rows)
    false_v = sum(r["false_verdicts"] for r in rows)
    out: dict = {"runs": len(rows), "fault_runs": len(faulty), "healthy_runs": len(rows) - len(faulty)}
    for lo in (1.25, 1.5):
        rs = [r for r in sustained if r["magnitude"] >= lo]
        out[f"named_right_ge_{lo:g}x"], out[f"runs_ge_{lo:g}x"] = _rate(rs, "named_right"), len(rs)
    out.update(hangs_named_right=_rate(hangs, "named_right"), hang_runs=len(hangs),
               late_once_ge_1s_named_right=_rate(late, "named_right"), false_verdicts=false_v,
               healthy_collectives=coll, false_per_1e6_healthy_collectives=round(false_v * 1e6 / coll, 1)
               if coll else None)
    return out


def per_shape(rows: list[dict]) -> dict[str, dict]:
    """topology -> its headline, with ``by_comm``: the headline of its fault runs per targeted communicator."""
    out: dict[str, dict] = {}
    for topo in dict.fromkeys(r["topology"] for r in rows):
        rs = [r for r in rows if r["topology"] == topo]
        faulty = [r for r in rs if r["fault"] != HEALTHY]
        out[topo] = dict(headline(rs), by_comm={c: headline([r for r in faulty if _comm(r) == c])
                                                for c in dict.fromkeys(_comm(r) for r in faulty)})
    return out


def every_shape(shapes: dict[str, dict]) -> dict:
    """The worst shape's figures: the corpus meets a bar only if every shape does."""
    def worst(key: str, pick) -> dict | None:
        have = {t: h[key] for t, h in shapes.items() if h[key] is not None}
        if not have:
            return None
        t = pick(have, key=have.get)
        return {"value": have[t], "shape": t}

    return {k: worst(k, min) for k in ("named_right_ge_1.25x", "named_right_ge_1.5x", "hangs_named_right")} | {
        "false_per_1e6_healthy_collectives": worst("false_per_1e6_healthy_collectives", max)}


def report(rows: list[dict]) -> dict:
    faulty = [r for r in rows if r["fault"] != HEALTHY]
    healthy = [r for r in rows if r["fault"] == HEALTHY]
    faults = list(dict.fromkeys(_fault_key(r) for r in faulty))
    curve: dict[str, dict[str, dict]] = {}
    for f in faults:
        if f.split(" ")[0] not in SLOWDOWN_PARAM:
            continue
        mags = sorted({r["magnitude"] for r in faulty if _fault_key(r) == f and r["magnitude"] is not None})
        if not mags:
            continue
        by_m: dict[str, dict] = {}
        for m in mags:
            rs = [r for r in faulty if _fault_key(r) == f and r["magnitude"] == m]
            measured = [r["slowdown"] for r in rs if r.get("slowdown") is not None]
            by_m[f"{m:g}"] = {"runs": len(rs), "named_right": _rate(rs, "named_right"),
                              "detected": _rate(rs, "detected"), "measured_slowdown": _pct(measured, 0.5)}
        curve[f] = by_m
    per_fault = {}
    for f in faults:
        rs = [r for r in faulty if _fault_key(r) == f]
        det = [r for r in rs if r["detected"]]
        lat = [r["right_latency_collectives"] for r in rs if r["right_latency_collectives"] is not None]
        per_fault[f] = {"runs": len(rs), "detected": _rate(rs, "detected"), "named_right": _rate(rs, "named_right"),
                        "culprit_accuracy": _rate(det, "culprit_ok"), "category_accuracy": _rate(det, "category_ok"),
                        "latency_collectives_median": _pct(lat, 0.5), "latency_collectives_p90": _pct(lat, 0.9)}
    healthy_coll = sum(r["healthy_collectives"] for r in rows)
    healthy_run_coll = sum(r["collectives"] for r in healthy)
    fv_healthy = sum(r["false_verdicts"] for r in healthy)
    fv_all = sum(r["false_verdicts"] for r in rows)
    lat_all = [r["right_latency_collectives"] for r in faulty if r["right_latency_collectives"] is not None]
    sustained = _sustained(faulty)

    def per_m(rs: list[dict], lo: float) -> float | None:
        return _rate([r for r in rs if r["magnitude"] >= lo], "named_right")

    def per_measured(lo: float) -> dict:  # by how much slower the collectives really ran (the noise included)
        rs = [r for r in sustained if (r.get("slowdown") or 0.0) >= lo]
        return {"runs": len(rs), "named_right": _rate(rs, "named_right")}

    return {
        "runs": len(rows), "fault_runs": len(faulty), "healthy_runs": len(healthy),
        "hangs_named_right": _rate([r for r in faulty if _is_hang(r["fault"])], "named_right"),
        # a one-off late call everybody waits >= 1 s for (Mycroft's straggler bar): the fixed late_once_ms cases
        "late_once_ge_1s_named_right": _rate([r for r in faulty if r["fault"] == "late_once" and r["magnitude"] is None
                                              and (r["param"] or 0) >= 1000.0], "named_right"),
        "sustained_named_right_ge_1_5x": per_m(sustained, 1.5),
        "sustained_named_right_ge_1_25x": per_m(sustained, 1.25),
        "sustained_named_right_ge_3x": per_m(sustained, 3.0),
        "sustained_by_measured_slowdown": {f"{lo:g}": per_measured(lo) for lo in (1.1, 1.25, 1.5, 3.0)},
        "culprit_accuracy": _rate([r for r in faulty if r["detected"]], "culprit_ok"),
        "category_accuracy": _rate([r for r in faulty if r["detected"]], "category_ok"),
        "latency_collectives_median": _pct(lat_all, 0.5), "latency_collectives_p90": _pct(lat_all, 0.9),
        "healthy_collectives": healthy_coll, "healthy_run_collectives": healthy_run_coll,
        "false_verdicts": fv_all, "false_verdicts_on_healthy_runs": fv_healthy,
        "false_verdicts_before_onset_or_wrong_culprit": fv_all - fv_healthy,
        "excused_straggler_verdicts": sum(r["excused_verdicts"] for r in rows),
        "false_per_1e6_healthy_collectives": round(fv_all * 1e6 / healthy_coll, 1) if healthy_coll else None,
        "false_per_1e6_healthy_run_collectives": (round(fv_healthy * 1e6 / healthy_run_coll, 1)
                                                  if healthy_run_coll else None),
        "false_by_noise": {n: sum(r["false_verdicts"] for r in rows if r["noise"] == n)
                           for n in dict.fromkeys(r["noise"] for r in rows)},
        "sim_s": round(sum(r["sim_s"] for r in rows), 1), "wall_s": round(sum(r["wall_s"] for r in rows), 1),
        "events": sum(r["events"] for r in rows),
        "curve": curve, "per_fault": per_fault,
        "per_shape": (shapes := per_shape(rows)), "every_shape": every_shape(shapes),
    }


def text(rep: dict, spec_name: str) -> str:
    mags = sorted({float(m) for c in rep["curve"].values() for m in c}, key=float)
    lines = [f"corpus {spec_name}: {rep['runs']} runs ({rep['fault_runs']} with a fault, "
             f"{rep['healthy_runs']} healthy), "
             f"{rep['sim_s']} s simulated in {rep['wall_s']} s of wall time (summed over runs)",
             "", "named right (first verdict after the onset: true culprit and category) / any verdict, "
             "by magnitude (x of the collective's time):"]
    head = ["fault"] + [f"{m:g}x" for m in mags]
    table = [head]
    for f, by_m in rep["curve"].items():
        row = [f]
        for m in mags:
            c = by_m.get(f"{m:g}")
            row.append("" if c is None else f"{c['named_right']:.0%}/{c['detected']:.0%} (n={c['runs']})")
        table.append(row)
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    lines += ["  " + "  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in table]
    lines += ["", "how much slower the faulty communicator's collectives really ran (median over the runs of "
              "after / before the onset; the magnitude sets the fault without noise):"]
    table = [head]
    for f, by_m in rep["curve"].items():
        cells = [(by_m.get(f"{m:g}") or {}).get("measured_slowdown") for m in mags]
        table.append([f] + ["" if c is None else f"{c:.2f}x" for c in cells])
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    lines += ["  " + "  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in table]
    lines += ["", "per fault: runs, named right, detected, culprit / category accuracy of the first verdict, "
              "collectives from onset to the first right verdict (median, p90):"]
    for f, p in rep["per_fault"].items():
        fmt = lambda x: "-" if x is None else (f"{x:.0%}" if isinstance(x, float) else str(x))  # noqa: E731
        lines.append(f"  {f:14s} {p['runs']:4d}  named right {fmt(p['named_right']):>4s}  detected "
                     f"{fmt(p['detected']):>4s}  culprit {fmt(p['culprit_accuracy']):>4s}  category "
                     f"{fmt(p['category_accuracy']):>4s}  latency {p['latency_collectives_median']} / "
                     f"{p['latency_collectives_p90']} collectives")
    lines += ["",
              f"hangs named right: {rep['hangs_named_right']}; one-off late call >= 1 s named right: "
              f"{rep['late_once_ge_1s_named_right']}; sustained slowdowns named right at >= 1.25x: "
              f"{rep['sustained_named_right_ge_1_25x']}, >= 1.5x: {rep['sustained_named_right_ge_1_5x']}, >= 3x: "
              f"{rep['sustained_named_right_ge_3x']}",
              "  by how much slower the faulty collectives really ran: " + ", ".join(
                  f">= {lo}x: {c['named_right']} of {c['runs']}"
                  for lo, c in rep["sustained_by_measured_slowdown"].items()),
              f"onset to right verdict: median {rep['latency_collectives_median']}, p90 "
              f"{rep['latency_collectives_p90']} collectives of the faulty communicator",
              f"false verdicts: {rep['false_verdicts']} ({rep['false_verdicts_on_healthy_runs']} on healthy runs, "
              f"{rep['false_verdicts_before_onset_or_wrong_culprit']} before the onset or naming a non-culprit; "
              f"{rep['excused_straggler_verdicts']} naming a real straggler excused) over "
              f"{rep['healthy_collectives']} healthy collectives: {rep['false_per_1e6_healthy_collectives']} per "
              f"10^6 (healthy runs alone: {rep['false_per_1e6_healthy_run_collectives']} per 10^6 of "
              f"{rep['healthy_run_collectives']}); by noise {rep['false_by_noise']}"]
    if rep.get("per_shape"):
        lines += ["", *_shape_table(rep["per_shape"], rep["every_shape"])]
    return "\n".join(lines)


def _shape_table(shapes: dict[str, dict], worst: dict) -> list[str]:
    """Per shape (and within it per targeted communicator) the headline figures, then the worst shape's."""
    def pct(h: dict, key: str, n_key: str | None) -> str:
        v = h[key]
        return "-" if v is None else f"{v:.0%}" + (f" (n={h[n_key]})" if n_key else "")

    head = ["shape", "faults in", "named right >= 1.25x", ">= 1.5x", "hangs", "late >= 1 s", "false / 10^6 healthy"]
    table = [head]
    for topo, h in shapes.items():
        for who, x in [("all", h)] + list(h["by_comm"].items()):
            false = "" if who != "all" else (
                f"{x['false_per_1e6_healthy_collectives']} ({x['false_verdicts']} of {x['healthy_collectives']})")
            table.append([topo if who == "all" else "", who, pct(x, "named_right_ge_1.25x", "runs_ge_1.25x"),
                          pct(x, "named_right_ge_1.5x", "runs_ge_1.5x"), pct(x, "hangs_named_right", "hang_runs"),
                          pct(x, "late_once_ge_1s_named_right", None), false])
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    out = ["per shape (every shape counts; a shape's false verdicts are over its healthy runs and its fault "
           "runs before their onset):"]
    out += ["  " + "  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in table]
    out.append("worst shape: " + ", ".join(f"{k} -" if w is None else f"{k} {w['value']} on {w['shape']}"
                                           for k, w in worst.items()))
    return out


# --- the picture -----------------------------------------------------------------------------------

_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")


def curve_svg(rep: dict, title: str, key: str = "named_right") -> str:
    """The detection curve as a standalone SVG: x = magnitude (log scale), y = rate, one line per fault."""
    w, h, left, right, top, bottom = 640, 400, 60, 150, 40, 50
    pw, ph = w - left - right, h - top - bottom
    mags = sorted({float(m) for c in rep["curve"].values() for m in c})
    lo, hi = (math.log(min(mags)), math.log(max(mags))) if mags else (0.0, 1.0)
    span = (hi - lo) or 1.0

    def x(m: float) -> float:
        return left + (math.log(m) - lo) / span * pw

    def y(v: float) -> float:
        return top + (1.0 - v) * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
           'font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{left + pw / 2}" y="22" text-anchor="middle" font-size="14">{_esc(title)}</text>']
    for v in (0.0, 0.25, 0.5, 0.75, 1.0):
        out.append(f'<line x1="{left}" y1="{y(v):.1f}" x2="{left + pw}" y2="{y(v):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.0%}</text>')
    for m in mags:
        out.append(f'<line x1="{x(m):.1f}" y1="{top}" x2="{x(m):.1f}" y2="{top + ph}" stroke="#eee"/>')
        out.append(f'<text x="{x(m):.1f}" y="{top + ph + 16}" text-anchor="middle" font-size="10">{m:g}x</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>')
    out.append(f'<text x="{left + pw / 2}" y="{h - 10}" text-anchor="middle">slowdown of the faulty collective '
               '(x of its own time)</text>')
    out.append(f'<text x="16" y="{top + ph / 2}" text-anchor="middle" transform="rotate(-90 16 {top + ph / 2})">'
               f'{"named right" if key == "named_right" else "detected"}</text>')
    for i, (f, by_m) in enumerate(rep["curve"].items()):
        c = _COLOURS[i % len(_COLOURS)]
        pts = [(float(m), v[key]) for m, v in by_m.items() if v[key] is not None]
        pts.sort()
        if pts:
            d = " ".join(f"{x(m):.1f},{y(v):.1f}" for m, v in pts)
            out.append(f'<polyline points="{d}" fill="none" stroke="{c}" stroke-width="2"/>')
            out += [f'<circle cx="{x(m):.1f}" cy="{y(v):.1f}" r="3" fill="{c}"/>' for m, v in pts]
        ly = top + 10 + i * 18
        out.append(f'<line x1="{left + pw + 12}" y1="{ly}" x2="{left + pw + 32}" y2="{ly}" stroke="{c}" '
                   'stroke-width="2"/>')
        out.append(f'<text x="{left + pw + 36}" y="{ly + 4}">{_esc(f)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _esc(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")

