"""A stall that recovered: a collective whose in-flight snapshots showed ranks waiting, and which then
completed. The hang walk (rca.py) on those snapshots names who was waited for, and what was a hang's culprit
there is a slowdown's here: a rank that had not started is late, a proxy that left ready data unposted is slow,
a GPU that stalled and resumed is slow. A late rank that everybody waited for past the straggler bar is named
at once (detector.py); any other adds one capped score to its candidate, once per distinct stall
(candidates.py).
"""

from __future__ import annotations

from mycroft_otel import semconv as sc
from mycroft_otel.processor import rca
from mycroft_otel.processor.state import P2P, TraceState
from mycroft_otel.processor.views import COMPLETED, IN_FLIGHT, Finding, RankView, build_views, decorate

_FROM_HANG = {sc.CAT_NET_SEND_STALLED: sc.CAT_SLOW_PROXY, sc.CAT_NET_DELIVERY_STALLED: sc.CAT_SLOW_FLOW,
              sc.CAT_GPU_STALLED: sc.CAT_SLOW_GPU, sc.CAT_RANK_ABSENT: sc.CAT_LATE_RANK}


def _recovered_stall(st: TraceState) -> Finding | None:
    views = build_views(st)
    sviews = dict(views)
    for r, ref in st.inflight.items():
        sviews[r] = RankView(r, IN_FLIGHT, ref)
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
            starts = sorted(ref.start_ns for ref in st.inflight.values())
            stall_s = (snap - starts[0]) / 1e9
            # it arrived late when it started after most of the time they had waited when seen (a late rank
            # launches after its peers; a late proxy's rank launched with them)
            mid = starts[len(starts) // 2]
            late = yv.ref.start_ns - mid
            if yv.ref.start_ns > snap:  # it had not even started when they were seen waiting
                cat, why = "late_rank", "had not started yet"
            elif late >= (snap - mid) / 2:
                cat, why = "late_rank", f"started {late / 1e6:.0f} ms after them"
            else:
                cat, why = "slow_proxy", "was running but did not move its flows (its proxy was late)"
            if cat == "late_rank" and st.func in P2P:
                # a Recv posted before its Send waits for the sender's compute (a pipeline stage, its own
                # upstream Recv): a peer that started late is the dependency at work, not a late rank. A late
                # rank shows in its collectives; a transfer is judged on how it moved once both ends were there.
                return None
            f = Finding(kind=sc.KIND_SLOWDOWN, category=cat, ranks=[y], confidence=0.8,
                        evidence=(f"stalled, then recovered: rank{'s' if len(waiters) > 1 else ''} "
                                  f"{', '.join(map(str, waiters[:8]))} waited {stall_s:.1f} s in {st.func} {st.seq} "
                                  f"on {n} flow{'s' if n > 1 else ''} of rank {y}, which {why}"),
                        onset_ns=min(ref.start_ns for ref in st.inflight.values()), recovered=True)
            decorate(st, views, f)
            return f
    f = rca.analyse_hang(st, sviews)
    if f is None or f.category not in _FROM_HANG or f.reason in ("silent", "noflow"):
        # a rank we did not hear from in a collective that completed was simply not slow; and a collective
        # without network flows (NVLink) says nothing of which rank held it: its walk's culprit is a guess
        return None
    cat = _FROM_HANG[f.category]
    if cat == "late_rank" and st.func in P2P:  # (as above)
        return None
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


def recovered_stall(st: TraceState) -> Finding | None:
    """What the in-flight snapshots of a collective that stalled and then completed show (None without)."""
    return _recovered_stall(st) if st.inflight else None


def stall_window(st: TraceState) -> tuple[int, int]:
    """When a stall that recovered began and ended: its in-flight snapshots' earliest start, latest end."""
    return min(r.start_ns for r in st.inflight.values()), max(r.end_ns for r in st.inflight.values())
