"""What each rank waited for at a moment, read by the processor's own hang walk (processor/rca.rank_waits).

The heat map paints a rank by the wait the walk reads from its latest evidence at that time, against its
peers' evidence at the same time: the data or credit of a peer it is waiting on, the network between it
and a peer (both sides wait on each other), its own GPU, or a peer that went silent, never entered or
exited. So the picture and the verdict come from one reading of the counters: a rank whose RecvGpuWait
flow sits beside a RecvWait flow waits on its peer, as the walk says, not on its GPU.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

from mycroft_otel import semconv as sc
from mycroft_otel.processor import views as pv
from mycroft_otel.processor.rca import Wait, rank_waits
from mycroft_otel.processor.spans import Flow as ProcFlow
from mycroft_otel.report.model import CollTrace, RankView, flows_of

#: Heat-map states read from the walk. A "root" state ends the walk at the rank itself (or at a flow it
#: sends on): it must agree with the verdict, the rest point along the chain.
PEER_DATA, PEER_CREDIT, NETWORK, OWN_GPU, NOT_STARTED, PEER_GONE = (
    "peer data", "peer credit", "network", "own GPU", "not started", "peer gone")
UNKNOWN = "unknown"   # a rank's view before its first evidence in the trace: the walk follows a wait on it
ROOT_STATES = frozenset({NETWORK, OWN_GPU, NOT_STARTED, "not entered", "exited", "stopped"})


@dataclass(frozen=True)
class Cell:
    state: str        # a heat-map state (communicator._STATES)
    text: str = ""    # what the rank waits for, in words ("waits for rank 3's data on ch0")


def _proc_flow(f) -> ProcFlow:
    return ProcFlow(f.channel, f.direction == "send", f.peer, f.steps, f.posted, f.ready, f.transmitted, f.done,
                    f.bytes, f.start_ns, f.end_ns, f.last_progress_ns, f.wait_state, 0, 0, 0)


class TraceAt:
    """The trace's ranks as the walk sees them at a time: each rank's latest evidence by then."""

    def __init__(self, t: CollTrace):
        self.t = t
        self.nranks = t.nranks
        self._snap_ends = {r: [s.end_ns for s in rv.snapshots] for r, rv in t.ranks.items()}
        self._flows: dict[int, list[ProcFlow]] = {}   # id(span) -> decoded once

    def _flows_of(self, span) -> list[ProcFlow]:
        k = id(span)
        if k not in self._flows:
            self._flows[k] = [_proc_flow(f) for f in flows_of(span)]
        return self._flows[k]

    def view(self, r: int, ns: int) -> pv.RankView | None:
        rv = self.t.ranks.get(r)
        if rv is None:
            return None
        if rv.op is not None and ns >= rv.op.end_ns:
            return pv.RankView(r, pv.COMPLETED, None, self._flows_of(rv.op))
        if exited(rv, ns):
            return pv.RankView(r, pv.EXITED, None, [])
        i = bisect_right(self._snap_ends.get(r, []), ns)
        if i:
            sn = rv.snapshots[i - 1]
            state = pv.STOPPED if sn.attrs.get(sc.PROCESS_STOPPED) else pv.IN_FLIGHT
            return pv.RankView(r, state, None, self._flows_of(sn), sn.attrs)
        if any(str(st.attrs.get(sc.STATUS_KIND, "")) == sc.STATUS_NOT_ENTERED and st.start_ns <= ns
               for st in rv.statuses):
            return pv.RankView(r, pv.NOT_ENTERED, None, [])
        # no evidence of it by then, but it reports later: working, its state then unknown (never "silent")
        return pv.RankView(r, UNKNOWN, None, [])

    def at(self, ns: int) -> "_ViewsAt":
        return _ViewsAt(self, ns)


class _ViewsAt:
    """rank -> RankView at one time, built as the walk asks for them (``get``, as rca.rank_waits reads)."""

    def __init__(self, at: TraceAt, ns: int):
        self.at_, self.ns, self._memo = at, ns, {}

    def get(self, r: int, default=None):
        if r not in self._memo:
            self._memo[r] = self.at_.view(r, self.ns)
        return self._memo[r] if self._memo[r] is not None else default


def exited(rv: RankView, ns: int) -> bool:
    """The rank's process exited by ``ns`` while in the collective (its last evidence an exit status)."""
    last = rv.snapshots[-1].end_ns if rv.snapshots else 0
    return any(str(st.attrs.get(sc.STATUS_KIND, "")) == sc.STATUS_PROCESS_EXITED and st.start_ns <= ns
               and last < ns for st in rv.statuses) and rv.op is None


def _describe(w: Wait, rank: int) -> Cell:
    if w.terminal is not None and w.terminal[0] == "rank" and w.terminal[2] != rank:
        return Cell(PEER_GONE, f"waits on rank {w.peer}, whose walk ends there ({w.terminal[3]})")
    if w.kind == "gpu":
        return Cell(OWN_GPU, "data arrived; its own GPU neither consumes nor produces")
    if w.kind == "not_started":
        return Cell(NOT_STARTED, "in the collective, none of its flows started")
    if w.kind == "kernel":
        return Cell(OWN_GPU, "in the collective, its GPU never started the kernel")
    if w.kind == "noflow":
        return Cell("idle", "in flight without network flows")
    if w.terminal is not None:   # a flow: both sides wait on each other, the network between them is to blame
        _, s, d, ch = w.terminal
        return Cell(NETWORK, f"the network: flow rank {s} → rank {d} on ch{ch} waited on by both sides")
    if w.kind == "data":
        return Cell(PEER_DATA, f"waits for rank {w.peer}'s data on ch{w.channel}")
    if w.kind == "credit":
        return Cell(PEER_CREDIT, f"waits for rank {w.peer}'s free buffer on ch{w.channel}")
    return Cell(PEER_DATA, f"waits for rank {w.peer} to complete ch{w.channel}")


def wait_cell(at: TraceAt, r: int, ns: int) -> Cell | None:
    """Rank ``r``'s wait at ``ns`` as the walk reads it (None: an in-flight wait is not what it shows)."""
    views = at.at(ns)
    v = views.get(r)
    if v is None or v.state != pv.IN_FLIGHT:
        return None
    waits = [w if w.terminal is None or (views.get(w.peer) or v).state != UNKNOWN else Wait(w.kind, w.peer, w.channel)
             for w in rank_waits(v, views, at.nranks)]
    ends = [w for w in waits if w.terminal is not None]
    return _describe((ends or waits)[0], r)
