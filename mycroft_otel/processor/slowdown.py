"""Root cause of a slow *completed* collective (one trace), or nothing when no culprit is clear.

In order:

1. A stall that recovered: the trace holds in-flight snapshots taken while it was
   stuck. The hang walk (rca.py) runs on those snapshots; what it finds maps to the
   slowdown it was: ready > transmitted at a rank (its proxy left ready chunks
   unposted: ``slow_proxy``), a stalled flow (``slow_flow``), a GPU that consumed
   nothing (``slow_gpu``), a rank that was not there (``late_rank``).
2. Comparisons across ranks and flows on the completed spans, with the job's
   arrival skew factored out (a rank that starts early waits for its peers in every
   counter, so raw wait times blame the wrong rank):
   - GPU wait per step on the receive side (data arrived, the GPU had not consumed it):
     one rank >= GPU_RATIO x the reference -> ``slow_gpu``;
   - network wait per step of each send flow, less the time its receiver was not
     there yet, >= NET_RATIO x the reference: one flow -> ``slow_flow``; all flows out of one rank or into one rank
     -> ``slow_nic`` (sender or receiver side);
   - effective arrival (first step posted, i.e. the kernel really started) of the last
     rank >= LATE_RATIO x the transfer time and >= 30% of the whole collective -> ``late_rank``.

Below the bars, a milder outlier (>= SOFT_RATIO) is a candidate only when the culprit's own
agent flagged the collective slow (its flows or GPU far above their own history); it ranks
below every other candidate and needs more recurrences (pipeline.SOFT_CONFIRM).

Each verdict here is a *candidate*: the pipeline emits it only when the same culprit
and category recur (a fault persists; jitter moves around).
"""

from __future__ import annotations

import statistics

from mycroft_otel import semconv as sc
from mycroft_otel.processor import rca
from mycroft_otel.processor.rca import COMPLETED, IN_FLIGHT, Finding, RankView, build_views
from mycroft_otel.processor.spans import evidence_attributes, flows_of
from mycroft_otel.processor.state import TraceState

_FROM_HANG = {"net_send_stalled": "slow_proxy", "net_delivery_stalled": "slow_flow", "gpu_stalled": "slow_gpu",
              "rank_absent": "late_rank"}

# An outlier is this many times the reference (median of the others and of the communicator's history).
# Per-step waits are heavy-tailed in a healthy job (a rank that waits once for a late peer multiplies
# its per-step average), so the bars are high; a real fault is usually 100x and recurs.
GPU_RATIO = 50.0
NET_RATIO = 50.0
LATE_RATIO = 50.0  # the last arrival's lateness over the transfer time (healthy skew stays well below)
SOFT_RATIO = 12.0  # a milder outlier, when the culprit's own local rule flagged the collective (needs SOFT_CONFIRM)
SOFT_GPU_RATIO = 20.0  # the GPU's (healthy GPU waits per step reach ~14x the median on a loaded machine)
SOFT_HISTORY = 8  # ... and only once the communicator's own history holds this many earlier collectives' values
STRONG_RATIO = 500.0  # so far beyond any jitter that two collectives suffice (confidence 0.95, pipeline.STRONG_CONFIRM)
STEP_FLOOR_NS = 2000.0  # per-step waits below this are noise


def _arrival(v: RankView) -> int:
    starts = [f.start_ns for f in v.flows if f.start_ns > 0]
    if starts:
        return min(starts)
    for key in (sc.TIME_LAUNCH, sc.TIME_ENQUEUE, sc.TIME_API):
        a = v.attrs.get(key)
        if isinstance(a, int) and a > 0:
            return a
    return v.ref.start_ns if v.ref else 0


def _outlier(values: dict, ratio: float, floor: float, history=()):
    """(key, value, ratio to the reference) of a clear top outlier, else None. The reference is the
    median of the other values in this trace and of the communicator's recent history."""
    if not values:
        return None
    items = sorted(values.items(), key=lambda kv: -kv[1])
    top_k, top_v = items[0]
    pool = [v for _, v in items[1:]] + list(history)
    if len(pool) < 2 or (len(items) < 3 and len(history) < 8):
        return None
    med = statistics.median(pool)
    r = top_v / max(med, floor)
    if top_v < floor * ratio or r < ratio:
        return None
    return top_k, top_v, r


def _reference(history: dict, name: str):
    own = history.get(name, ())
    if len(own) >= 8:
        return own
    return history.get("job", {}).get(name, ()) or own


def _recovered_stall(st: TraceState, views: dict[int, RankView]) -> Finding | None:
    sviews = dict(views)
    for r, ref in st.inflight.items():
        attrs = evidence_attributes(ref)
        sviews[r] = RankView(rank=r, state=IN_FLIGHT, ref=ref, attrs=attrs, flows=flows_of(attrs),
                             host=ref.resource.host, global_rank=ref.global_rank)
    # the waiters' stalled flows point at peers; one peer that was not stuck itself is the one they waited for
    waited: dict[int, int] = {}
    for r in st.inflight:
        for fl in sviews[r].flows:
            if not fl.finished and fl.peer in views and fl.peer not in st.inflight:
                waited[fl.peer] = waited.get(fl.peer, 0) + 1
    if len(waited) == 1:
        (y, n), = waited.items()
        yv = views[y]
        snap = min(ref.end_ns for ref in st.inflight.values())
        if yv.state == COMPLETED and yv.ref is not None:
            waiters = sorted(st.inflight)
            stall_s = (snap - min(ref.start_ns for ref in st.inflight.values())) / 1e9
            if yv.ref.start_ns > snap:  # it had not even started when they were seen waiting
                cat, why = "late_rank", "had not started yet"
            else:
                cat, why = "slow_proxy", "was running but did not move its flows (its proxy was late)"
            f = Finding(kind=sc.KIND_SLOWDOWN, category=cat, ranks=[y], confidence=0.8,
                        evidence=(f"stalled, then recovered: rank{'s' if len(waiters) > 1 else ''} "
                                  f"{', '.join(map(str, waiters[:8]))} waited {stall_s:.1f} s in {st.func} {st.seq} "
                                  f"on {n} flow{'s' if n > 1 else ''} of rank {y}, which {why}"),
                        onset_ns=min(ref.start_ns for ref in st.inflight.values()), recovered=True)
            rca._decorate(st, views, f)
            return f
    f = rca.analyse_hang(st, sviews)
    if f is None or f.category not in _FROM_HANG or f.reason == "silent":
        return None  # a rank we did not hear from in a collective that completed was simply not slow
    cat = _FROM_HANG[f.category]
    f.kind = sc.KIND_SLOWDOWN
    f.recovered = True
    if cat == "slow_proxy":
        f.channel = f.peer = None
        f.evidence = "stalled, then recovered: " + f.evidence.replace("stalled:", "waited:") + \
            " -- its proxy left ready chunks unposted"
    else:
        f.evidence = "stalled, then recovered: " + f.evidence
    f.category = cat
    f.confidence = round(min(0.9, f.confidence), 3)
    return f


def analyse_slowdown(st: TraceState, baseline_ns: float | None = None, factor: float = 2.0,
                     views: dict[int, RankView] | None = None, history: dict | None = None) -> Finding | None:
    """``history``: the communicator's recent per-step values ({"gpu": deque, "net": deque}), updated here."""
    views = build_views(st) if views is None else views
    done = {r: v for r, v in views.items() if v.state == COMPLETED and v.ref is not None}
    mm = rca.check_mismatch(st, views)
    if mm is not None:
        rca._decorate(st, views, mm)
        return mm
    # stalled, then recovered: what the in-flight snapshots show -- unless the completed counters name a
    # clear outlier themselves (a slow GPU stalls every collective, and snapshots of waits in a ring of
    # waiting ranks often read as a cycle at a bystander)
    recovered = _recovered_stall(st, views) if st.inflight else None
    if not done:
        return recovered
    history = history if history is not None else {}
    missing = [r for r in range(st.nranks) if r not in views] if st.nranks <= 4096 else []
    arrival = {r: _arrival(v) for r, v in done.items()}
    end = max(v.ref.end_ns for v in done.values())
    last_r = max(arrival, key=lambda r: arrival[r])
    first = min(arrival.values())
    makespan = max(1, end - first)
    transfer = max(1, end - arrival[last_r])
    cands: list[tuple[float, Finding]] = []

    # GPU: receive-side GPU wait per step (data there, not consumed)
    gpu: dict[int, float] = {}
    for r, v in done.items():
        w = [(f.gpu_wait_ns, max(f.steps, 1)) for f in v.flows if not f.send]
        if w:
            gpu[r] = sum(x for x, _ in w) / sum(n for _, n in w)
    def flagged(r: int) -> bool:  # the rank's own local rule found this collective slow
        return r in done and done[r].ref.anomaly == sc.ANOMALY_SLOW

    def known(name: str, n: int) -> bool:  # milder outliers only once the communicator has a history of its own
        return len(history.get(name, ())) >= min(SOFT_HISTORY * n, 200)

    soft = False
    o = _outlier(gpu, GPU_RATIO, STEP_FLOOR_NS, _reference(history, "gpu"))
    if o is None and known("gpu", len(gpu)):  # a milder outlier counts when the rank itself flagged it (it needs more recurrences)
        o = _outlier(gpu, SOFT_GPU_RATIO, STEP_FLOOR_NS, _reference(history, "gpu"))
        if o is not None and not flagged(o[0]):
            o = None
        soft = o is not None
    if o is not None:
        r, val, ratio = o
        cands.append((3.0 + min(ratio, 20) / 10 - 4.0 * soft, Finding(
            kind=sc.KIND_SLOWDOWN, category="slow_gpu", ranks=[r], reason="soft" if soft else "",
            confidence=0.95 if ratio >= STRONG_RATIO else round(min(0.9, 0.5 + 0.01 * ratio), 3),
            evidence=(f"rank {r}'s GPU took {val / 1e3:.0f} us per step to consume received data, {ratio:.0f}x "
                      f"the other ranks, in {st.func} {st.seq}"), onset_ns=arrival[r])))

    # network: send-side wait per step, less the time the receiver was not there yet
    net: dict[tuple, float] = {}
    out_of: dict[int, set] = {}
    into: dict[int, set] = {}
    for s, v in done.items():
        for f in v.flows:
            if not f.send or f.peer not in arrival:
                continue  # a receiver we did not hear from may simply have been late: no fair comparison
            early = max(0, arrival[f.peer] - arrival[s])
            adj = max(0.0, f.net_wait_ns - min(max(f.steps, 1), 8) * early)
            key = (s, f.peer, f.channel)
            net[key] = adj / max(f.steps, 1)
            out_of.setdefault(s, set()).add(key)
            into.setdefault(f.peer, set()).add(key)
    bar = NET_RATIO
    o = _outlier(net, NET_RATIO, STEP_FLOOR_NS, _reference(history, "net"))
    soft = False
    if o is None and known("net", len(net)):  # a milder outlier counts when its sender or receiver flagged it (more recurrences)
        o = _outlier(net, SOFT_RATIO, STEP_FLOOR_NS, _reference(history, "net"))
        if o is not None and not (flagged(o[0][0]) or flagged(o[0][1])):
            o = None
        soft, bar = o is not None, SOFT_RATIO
    if o is not None:
        (s, d, ch), val, ratio = o
        med = val / ratio  # the reference: the other flows and the history (in a p2p all flows may be slow)
        slow = {k for k, x in net.items() if x >= max(val / 3, bar / 2 * max(med, STEP_FLOOR_NS))}
        if len(out_of.get(s, ())) > 1 and out_of[s] <= slow:
            cat, who, chan, peer = "slow_nic", s, None, None
            ev = f"all {len(out_of[s])} flows sent by rank {s} wait {ratio:.0f}x longer per step on the network"
        elif len(into.get(d, ())) > 1 and into[d] <= slow:
            cat, who, chan, peer = "slow_nic", d, None, None
            ev = f"all {len(into[d])} flows into rank {d} wait {ratio:.0f}x longer per step on the network"
        else:
            cat, who, chan, peer = "slow_flow", s, ch, d
            ev = f"flow rank {s} -> rank {d} on channel {ch} waits {ratio:.0f}x the typical wait per step"
        cands.append((2.0 + min(ratio, 20) / 10 - 4.0 * soft, Finding(
            kind=sc.KIND_SLOWDOWN, category=cat, ranks=[who], channel=chan, peer=peer, reason="soft" if soft else "",
            confidence=0.95 if ratio >= STRONG_RATIO else round(min(0.9, 0.5 + 0.01 * ratio), 3),
            evidence=ev + f" in {st.func} {st.seq}",
            onset_ns=arrival[s])))

    # a flow far slower than its siblings that leads into (or out of) the GPU outlier explains it: the
    # receiver's kernel queues behind the collective that flow delayed, so its other channels show GPU
    # waits -- queueing, not a slow GPU
    # (a slow GPU itself slows every flow into it alike: that reads slow_nic, never one slow_flow)
    if len(cands) == 2 and cands[0][1].category == "slow_gpu" and cands[1][1].category == "slow_flow":
        g, n = cands[0][1], cands[1][1]
        if g.ranks[0] in (n.ranks[0], n.peer):
            cands.pop(0)
    # the history learns what is normal: not from a collective where it just found an outlier of that kind
    # (a p2p trace brings 2 values: two slow ones would soon make slow the norm)
    found = {"gpu" if c[1].category == "slow_gpu" else "net" for c in cands if c[1].reason != "soft"}
    for name, vals in (("gpu", list(gpu.values())), ("net", list(net.values()))):
        if name in found:
            continue
        for h in (history.get(name), history.get("job", {}).get(name)):
            if h is not None:
                h.extend(vals)
    # arrival: the last rank started so late that the others mostly waited for it
    others = sorted(a for r, a in arrival.items() if r != last_r)
    late = arrival[last_r] - statistics.median(others) if others else 0
    if len(done) >= 3 and late >= 0.3 * makespan and (late >= LATE_RATIO * transfer or
                                                      (late >= 0.9 * makespan and late >= LATE_RATIO / 2.5 * transfer)):
        cands.append((5.0 + min(late / transfer, 20) / 20, Finding(
            kind=sc.KIND_SLOWDOWN, category="late_rank", ranks=[last_r],
            confidence=round(min(0.9, 0.5 + 0.02 * late / transfer), 3),
            evidence=(f"rank {last_r} started {st.func} {st.seq} {late / 1e6:.1f} ms after the others, who waited; "
                      f"the transfer itself took {transfer / 1e6:.1f} ms"), onset_ns=arrival[last_r] - int(late))))
    # proxy: a rank whose send steps spent much less time waiting on GPU and network than everybody else's
    # spent the rest between ready and transmitted -- its proxy posted late (Mycroft's ready->transmitted gap)
    acc: dict[int, float] = {}
    for r, v in done.items():
        sf = [f for f in v.flows if f.send and f.steps > 0]
        if sf:
            acc[r] = sum(f.gpu_wait_ns + f.net_wait_ns for f in sf) / sum(f.steps for f in sf)
    # (only in a collective that is slow as a whole: a late proxy delays the transfer itself, while in a
    # healthy one some rank always waits least)
    durs = sorted(v.ref.duration_ns for v in done.values())
    slow_whole = baseline_ns is not None and durs[len(durs) // 2] >= factor * baseline_ns
    if len(acc) >= 3 and slow_whole and all(c[1].reason == "soft" for c in cands):
        low = min(acc, key=lambda r: acc[r])
        rest = [x for r, x in acc.items() if r != low]
        med = statistics.median(rest)
        if med >= 100 * STEP_FLOOR_NS and acc[low] <= 0.6 * med and all(x >= 0.8 * med for x in rest):
            cands.append((1.5, Finding(
                kind=sc.KIND_SLOWDOWN, category="slow_proxy", ranks=[low], confidence=0.6,
                evidence=(f"rank {low}'s send steps waited {acc[low] / 1e3:.0f} us on GPU and network vs "
                          f"{med / 1e3:.0f} us for the others in {st.func} {st.seq}: the rest of its time went "
                          f"between GPU-ready and transmission (its proxy posted late)"), onset_ns=arrival[low])))
    # the late rank's own collective was short, so the agent did not export it: everybody else waited
    if not cands and len(missing) == 1 and len(done) >= 2:
        bases = [v.ref.baseline_ns for v in done.values() if v.ref.baseline_ns > 0]
        all_flagged = all(v.ref.anomaly in ("slow", "stalled") for v in done.values())
        if all_flagged and bases and min(durs) >= 4 * max(factor, 2.0) / 2 * statistics.median(bases):
            r = missing[0]
            cands.append((0.5, Finding(
                kind=sc.KIND_SLOWDOWN, category="late_rank", ranks=[r], confidence=0.6,
                evidence=(f"all {len(done)} other ranks waited {statistics.median(durs) / 1e6:.1f} ms in {st.func} "
                          f"{st.seq} (>= {min(durs) / statistics.median(bases):.0f}x their baseline) while rank {r} "
                          f"was not slow at all: it arrived late"), onset_ns=first)))
    cands.sort(key=lambda c: -c[0])
    if recovered is not None and (not cands or cands[0][1].reason == "soft"):
        return recovered
    if not cands:
        return None
    f = cands[0][1]
    rca._decorate(st, views, f)
    return f
