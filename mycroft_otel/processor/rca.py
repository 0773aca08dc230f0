"""Root-cause analysis of one trace (one collective): the walk over span links.

Hang (design §5, Mycroft's Table 4 as a traversal): every rank whose latest
evidence is in flight says, per flow, what it waits for. A recv flow in
``RecvWait`` waits for its peer's data; a send flow in ``SendPeerWait`` waits for
the receiver's credit; ``SendWait`` waits for the network to complete. Those are
edges to the peer. The edge is *followed* when the peer's matching flow shows
that the peer itself is the blocker (its GPU has not produced / consumed, or it
waits upstream); it *ends* the walk at the flow when both sides wait on each
other (the network between them is to blame), and at the peer when the peer's
span is missing, says ``not_entered``, is SIGSTOPped or says ``process_exited``.
A rank with no edge left but GPU waits (data arrived, nothing consumed or
produced) is the root itself (``gpu_stalled``). Each stalled rank votes for the
root its walk ends at; flow roots that share a rank are aggregated to that rank's
NIC (culprit channel unset). Classification uses the chunk counters.

Slowdowns are analysed in ``slowdown.py`` (which reuses this walk for stalls
that recovered).

Everything here reads one :class:`~mycroft_otel.processor.state.TraceState`; it
needs nothing outside the trace (that is what lets processors scale out by trace id).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mycroft_otel import semconv as sc
from mycroft_otel.processor.spans import Flow, SpanRef, evidence_attributes, flow_table, flows_by_span, flows_of
from mycroft_otel.processor.state import P2P, TraceState

# Rank states as the analysis sees them.
COMPLETED, IN_FLIGHT, NOT_ENTERED, EXITED, STOPPED, MISSING = (
    "completed", "in_flight", "not_entered", "process_exited", "stopped", "missing")


@dataclass
class Finding:
    """What the analysis concluded about one trace."""

    kind: str                      # hang | slowdown
    category: str
    ranks: list[int]               # culprit ranks in the communicator
    confidence: float
    evidence: str
    onset_ns: int
    channel: int | None = None
    peer: int | None = None
    culprit_spans: list[bytes] = field(default_factory=list)   # span ids (8 bytes)
    evidence_spans: list[bytes] = field(default_factory=list)
    global_ranks: list[int] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    reason: str = ""               # how the walk ended: silent, not_entered, stopped, exited, gpu, flow, ...
    job: str = ""                  # the job's MYCROFT_JOB_ID: incidents never merge across jobs
    recovered: bool = False        # a slowdown read from a stall that recovered (in-flight snapshots)
    waiting: list[int] = field(default_factory=list)  # ranks in flight that wait (the walk's start points)
    # the explanation that won (a place and what went wrong there), the best one of another place, and by how
    # much the winner led it: for a hang the share of the walks' votes, for a slowdown the CUSUM evidence S
    hypothesis: str = ""
    runner_up: str = ""
    margin: float | None = None


class RankView:
    """One rank's evidence in a trace; its attributes and flows are decoded on first use (the walk over
    a 16k-rank collective decodes only the ranks it visits)."""

    __slots__ = ("rank", "state", "ref", "host", "global_rank", "_attrs", "_flows")

    def __init__(self, rank: int, state: str, ref: SpanRef | None):
        self.rank, self.state, self.ref = rank, state, ref
        self.host = ref.resource.host if ref is not None else ""
        self.global_rank = ref.global_rank if ref is not None else -1
        self._attrs: dict | None = None
        self._flows: list[Flow] | None = None

    @property
    def attrs(self) -> dict:
        if self._attrs is None:
            self._attrs = {} if self.ref is None else evidence_attributes(self.ref)
        return self._attrs

    @property
    def flows(self) -> list[Flow]:
        if self._flows is None:
            self._flows = [] if self.ref is None else flows_of(self.ref)
        return self._flows

    @staticmethod
    def load_flows(views: list[RankView]) -> None:
        """Decodes the flows of several views in one pass over their spans (cheaper than one by one)."""
        todo = [v for v in views if v._flows is None and v.ref is not None]
        for v, flows in zip(todo, flows_by_span([v.ref for v in todo])):
            v._flows = flows

    def send_flow(self, channel: int, peer: int) -> Flow | None:
        alt = None
        for f in self.flows:
            if f.send and f.channel == channel:
                if f.peer == peer:
                    return f
                alt = alt or f
        return alt

    def recv_flow(self, channel: int, peer: int) -> Flow | None:
        alt = None
        for f in self.flows:
            if not f.send and f.channel == channel:
                if f.peer == peer:
                    return f
                alt = alt or f
        return alt


def _stopped(ref: SpanRef | None) -> bool:
    return ref is not None and ref.stopped


def build_views(st: TraceState) -> dict[int, RankView]:
    """One RankView per rank that said anything about this trace."""
    views: dict[int, RankView] = {}
    ranks = set(st.op) | set(st.inflight) | set(st.status)
    for r in ranks:
        op, inf, status = st.op.get(r), st.inflight.get(r), st.status.get(r)
        if op is not None:
            ref, state = op, COMPLETED
        elif status is not None and status.status == sc.STATUS_PROCESS_EXITED:
            ref, state = inf or status, EXITED
        elif inf is not None:
            ref, state = inf, (STOPPED if _stopped(inf) else IN_FLIGHT)
        else:
            ref, state = status, (STOPPED if _stopped(status) else NOT_ENTERED)
        views[r] = RankView(r, state, ref)
    return views


def _signature(ref: SpanRef) -> tuple | None:
    func = "Send/Recv" if ref.func in P2P else ref.func  # a p2p trace holds both halves of one transfer
    if not func:
        return None
    return (func, ref.count if ref.count >= 0 else None, ref.datatype or None)


def check_mismatch(st: TraceState) -> Finding | None:
    """Ranks that called different functions, sizes or types at the same sequence number (as their
    completed or in-flight spans say: status spans carry no size)."""
    ref_of = {**st.inflight, **st.op}
    if len({(ref.func, ref.count, ref.datatype) for ref in ref_of.values()}) < 2:
        return None  # all alike (the usual case, told without grouping)
    groups: dict[tuple, list[int]] = {}
    for r, ref in ref_of.items():
        sig = _signature(ref)
        if sig is not None:
            groups.setdefault(sig, []).append(r)
    if len(groups) < 2:
        return None
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), min(kv[1])))
    majority_sig, majority = ordered[0]
    culprits = sorted(r for _, rs in ordered[1:] for r in rs)
    sig = _signature(ref_of[culprits[0]])
    what = []
    names = ("function", "count", "datatype")
    for i, name in enumerate(names):
        if sig[i] != majority_sig[i]:
            what.append(f"{name} {sig[i]} (others {majority_sig[i]})")
    conf = 0.95 if len(majority) > len(culprits) else 0.6
    return Finding(
        kind=sc.KIND_HANG, category="coll_mismatch", ranks=culprits, confidence=conf,
        evidence=(f"rank{'s' if len(culprits) > 1 else ''} {_ranks(culprits)} called {', '.join(what)} "
                  f"at collective {st.seq} of communicator {st.comm}"),
        onset_ns=min(ref_of[r].start_ns for r in culprits),
    )


# --- step counts: the two ends of a connection ---------------------------------------------------

# A connection's two ends move the same steps: NCCL derives a channel's steps from the collective's count, so a
# send flow and its receiver's recv flow from that sender on the same channel announce the same number. A
# rank called with another count than its peers (every rank still reporting its own count -- or the same
# one, as a buggy caller may) shows as a rank whose connections all disagree with its neighbours'.
STEP_COLUMNS = (sc.FLOW_CHANNEL, sc.FLOW_DIRECTION, sc.FLOW_PEER, sc.FLOW_STEPS)
_KEY_PEER_BITS, _KEY_CHANNEL_BITS = 21, 8


def lookup(have: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Per value of ``want``, the index of the first equal value in ``have``; -1 where there is none."""
    out = np.full(len(want), -1, dtype=np.int64)
    if not len(have) or not len(want):
        return out
    order = np.argsort(have, kind="stable")
    at = np.minimum(np.searchsorted(have[order], want), len(have) - 1)
    hit = have[order[at]] == want
    out[hit] = order[at[hit]]
    return out


def receiver_flow(dst: np.ndarray, channel: np.ndarray, sender: np.ndarray, rx_span: np.ndarray,
                  rx_channel: np.ndarray, rx_peer: np.ndarray) -> np.ndarray:
    """Per send flow (its receiver's span index ``dst``, ``channel``, its sender's rank): the index of its
    receiver's recv flow from that sender on that channel among the ``rx_*`` rows, -1 where it is not known."""
    def key(span, ch, peer):
        return ((span.astype(np.int64) << (_KEY_CHANNEL_BITS + _KEY_PEER_BITS))
                | ((ch & ((1 << _KEY_CHANNEL_BITS) - 1)) << _KEY_PEER_BITS)
                | np.clip(peer, 0, (1 << _KEY_PEER_BITS) - 1))
    at = lookup(key(rx_span, rx_channel, rx_peer), key(dst, channel, sender))
    hit = np.flatnonzero(at >= 0)
    at[hit[rx_peer[at[hit]] < 0]] = -1  # a negative peer was clipped to rank 0's key
    return at


def receiver_steps(at: np.ndarray, rx_steps: np.ndarray) -> np.ndarray:
    """Per send flow (its receiver's flow ``at``, from :func:`receiver_flow`): the steps that flow announced,
    -1 where it is not known."""
    return np.where(at >= 0, rx_steps[np.maximum(at, 0)] if len(rx_steps) else -1, -1)


def step_mismatch(st: TraceState, sender: np.ndarray, receiver: np.ndarray, channel: np.ndarray, sent: np.ndarray,
                  expected: np.ndarray, final_s: np.ndarray | None = None,
                  final_r: np.ndarray | None = None) -> Finding | None:
    """The rank whose connections disagree on their step counts (per send flow: sender and receiver rank,
    channel, the steps the sender announced and those its receiver expects; -1 unknown). ``final_*``: the end's
    span completed (all its steps announced); an end still in flight may announce more, so only more than a
    completed other end counts against it. None unless every disagreeing connection has one rank in common and
    at least two do (one alone may be a lost record; in a ring the rank's in- and outgoing connections both
    disagree)."""
    known = (sent > 0) & (expected > 0)
    if final_s is None or final_r is None:
        bad = known & (sent != expected)
    else:
        bad = known & (((final_s & final_r) & (sent != expected)) | (~final_s & final_r & (sent > expected))
                       | (final_s & ~final_r & (expected > sent)))
    n = int(bad.sum())
    if n < 2:
        return None
    ends = np.concatenate((sender[bad], receiver[bad]))
    ranks, hits = np.unique(ends, return_counts=True)
    culprit = [int(r) for r in ranks[hits == n]]
    if len(culprit) != 1:
        return None
    r = culprit[0]
    k = int(np.flatnonzero(bad)[0])
    s, d = int(sender[k]), int(receiver[k])
    mine, theirs = (int(sent[k]), int(expected[k])) if s == r else (int(expected[k]), int(sent[k]))
    return Finding(
        kind=sc.KIND_HANG, category="coll_mismatch", ranks=[r], confidence=0.9,
        evidence=(f"rank {r}'s {n} connections disagree with its peers' on the steps of {st.func} {st.seq} "
                  f"(rank {s} -> rank {d}, channel {int(channel[k])}: rank {r} {mine} steps, the peer {theirs}): "
                  f"it was called with another count than its peers"),
        onset_ns=min((ref.start_ns for ref in (st.op.get(r), st.inflight.get(r)) if ref is not None), default=0))


def check_step_mismatch(st: TraceState) -> Finding | None:
    """:func:`step_mismatch` over the trace's completed and latest in-flight spans."""
    refs = [*st.op.values(), *(ref for r, ref in st.inflight.items() if r not in st.op)]
    if len(refs) < 2:
        return None
    table, counts = flow_table(refs, STEP_COLUMNS)
    if not len(table):
        return None
    span = np.repeat(np.arange(len(refs)), counts)
    rank = np.array([ref.rank for ref in refs], dtype=np.int64)
    final = np.arange(len(refs)) < len(st.op)
    ch, send, peer, steps = table[:, 0], table[:, 1] == 1, table[:, 2], table[:, 3]
    out = np.flatnonzero(send)
    dst = lookup(rank, peer[out])
    out, dst = out[dst >= 0], dst[dst >= 0]
    src = span[out]
    rx = np.flatnonzero(~send)
    at = receiver_flow(dst, ch[out], rank[src], span[rx], ch[rx], peer[rx])
    expected = receiver_steps(at, steps[rx])
    return step_mismatch(st, rank[src], rank[dst], ch[out], steps[out], expected, final[src], final[dst])


def _ranks(rs: list[int]) -> str:
    return ", ".join(str(r) for r in rs[:8]) + (f" (+{len(rs) - 8})" if len(rs) > 8 else "")


# --- hang walk ------------------------------------------------------------------------------------

# Terminals: ("rank", category, rank, why) or ("flow", sender, receiver, channel)
_FOLLOW_ORDER = {"data": 0, "credit": 1, "net": 2}


def _rank_terminal(pv: RankView | None, p: int) -> tuple | None:
    if pv is None:
        return ("rank", "rank_absent", p, "silent")
    if pv.state == NOT_ENTERED:
        return ("rank", "rank_absent", p, "not_entered")
    if pv.state == STOPPED:
        return ("rank", "rank_absent", p, "stopped")
    if pv.state == EXITED:
        return ("rank", "process_exited", p, "exited")
    return None


def _edges(v: RankView) -> tuple[list[tuple], bool]:
    """(edges (kind, peer, channel, flow), has_gpu_wait) of one stalled rank."""
    edges: list[tuple] = []
    gpu = False
    for f in v.flows:
        if f.finished or f.steps <= 0 and not f.wait_state:
            continue
        ws = f.wait_state
        if f.send:
            if ws == "SendPeerWait" or (not ws and f.ready > f.transmitted):
                edges.append(("credit", f.peer, f.channel, f))
            elif ws == "SendWait" or (not ws and f.transmitted > f.done):
                edges.append(("net", f.peer, f.channel, f))
            elif ws == "SendGpuWait" or not ws:
                gpu = True
        else:
            if ws == "RecvWait" or (not ws and f.ready < f.steps and f.ready <= f.done):
                edges.append(("data", f.peer, f.channel, f))
            else:
                gpu = True
    edges.sort(key=lambda e: _FOLLOW_ORDER[e[0]])
    return edges, gpu


def _resolve(v: RankView, views: dict[int, RankView], nranks: int) -> tuple[list[tuple], list[int]]:
    """(terminals reached directly, ranks to follow) from stalled rank ``v``."""
    terms: list[tuple] = []
    follow: list[int] = []
    edges, gpu = _edges(v)
    r = v.rank
    for kind, p, ch, f in edges:
        if p < 0 or p >= max(nranks, 1) or p == r:
            continue
        pv = views.get(p)
        t = _rank_terminal(pv, p)
        if t is not None:
            terms.append(t)
            continue
        if kind == "data":  # r receives from p on ch
            pf = pv.send_flow(ch, r)
            if pv.state == COMPLETED or (pf is not None and pf.finished):
                terms.append(("flow", p, r, ch))
            elif pf is not None and pf.wait_state in ("SendPeerWait", "SendWait"):
                terms.append(("flow", p, r, ch))
            else:
                follow.append(p)
        else:  # r sends to p on ch: waits for p's credit or for the network
            qf = pv.recv_flow(ch, r)
            if pv.state == COMPLETED or (qf is not None and qf.finished):
                terms.append(("flow", r, p, ch))
            elif qf is not None and (qf.wait_state == "RecvWait" or (kind == "net" and not qf.wait_state)):
                terms.append(("flow", r, p, ch))
            elif qf is None and kind == "net":
                terms.append(("flow", r, p, ch))
            else:
                follow.append(p)
    if not terms and not follow:
        if not v.flows:
            terms.append(("rank", "noflow", r, "no network flows"))
        elif all(f.posted == 0 and f.ready == 0 for f in v.flows):
            terms.append(("rank", "rank_absent", r, "not_started"))
        else:
            terms.append(("rank", "gpu_stalled", r, "gpu" if gpu else "gpu_unfinished"))
    return terms, follow


MAX_STARTS = 1024


def walk(views: dict[int, RankView], nranks: int) -> dict[tuple, float]:
    """Votes per terminal: each stalled rank's walk ends somewhere; iterative, memoized, cycle-safe."""
    stalled = [r for r, v in views.items() if v.state == IN_FLIGHT]
    if len(stalled) > MAX_STARTS:
        # a huge collective: start from the ranks that stopped progressing first (the fault's neighbourhood:
        # further away the pipeline drains later); only the ranks the walks visit get decoded
        by_stop = sorted(stalled, key=lambda r: (views[r].ref.last_progress_ns, r))
        stalled = by_stop[:MAX_STARTS // 4]
    RankView.load_flows([views[r] for r in stalled])  # the starts' in one pass; the rest as the walks reach them
    memo: dict[int, list[tuple]] = {}
    direct: dict[int, tuple[list[tuple], list[int]]] = {}

    def step(r: int) -> tuple[list[tuple], list[int]]:
        d = direct.get(r)
        if d is None:
            d = direct[r] = _resolve(views[r], views, nranks)
        return d

    def result(start: int) -> list[tuple]:
        # follow the first follow-edge until a rank with terminals (or a cycle / known result)
        path: list[int] = []
        seen: set[int] = set()
        r = start
        out: list[tuple] | None = None
        while True:
            if r in memo:
                out = memo[r]
                break
            v = views.get(r)
            if v is None:
                out = [("rank", "rank_absent", r, "silent")]
                break
            if v.state != IN_FLIGHT:
                out = [_rank_terminal(v, r) or ("rank", "gpu_stalled", r, "gpu_unfinished")]
                break
            if r in seen:  # a cycle of waits with no explanation: the rank that waits longest
                cyc = path[path.index(r):]
                oldest = min(cyc, key=lambda x: _wait_since(views[x]))
                out = [("rank", "gpu_stalled", oldest, "cycle")]
                break
            seen.add(r)
            path.append(r)
            terms, follow = step(r)
            if terms:
                out = terms
                break
            r = follow[0]
        for x in path:
            memo[x] = out
        return out

    votes: dict[tuple, float] = {}
    for r in stalled:
        res = result(r)
        w = 1.0 / len(res)
        for t in res:
            votes[t] = votes.get(t, 0.0) + w
    return votes


def _wait_since(v: RankView) -> int:
    ws = [f.wait_since_ns for f in v.flows if f.wait_since_ns > 0 and not f.finished]
    return min(ws) if ws else (v.ref.last_progress_ns if v.ref else 0)


def _classify_flow(views: dict[int, RankView], s: int, d: int, ch: int) -> tuple[str, str]:
    sv = views.get(s)
    sf = sv.send_flow(ch, d) if sv else None
    if sf is None:
        return "net_delivery_stalled", "sent data never reached the receiver"
    if sf.wait_state == "SendWait" or (sf.transmitted > sf.done and sf.ready <= sf.transmitted):
        return ("net_delivery_stalled",
                f"transmitted {sf.transmitted} > done {sf.done} of {sf.steps} steps, receiver still waiting")
    if sf.ready > sf.transmitted:
        return ("net_send_stalled",
                f"GPU-ready {sf.ready} > transmitted {sf.transmitted} of {sf.steps} steps, receiver waiting for data")
    if sf.transmitted > sf.done:
        return ("net_delivery_stalled", f"transmitted {sf.transmitted} > done {sf.done} of {sf.steps} steps")
    return "net_send_stalled", f"sender and receiver wait on each other at step {sf.done} of {sf.steps}"


def analyse_hang(st: TraceState, views: dict[int, RankView] | None = None) -> Finding | None:
    views = build_views(st) if views is None else views
    mm = check_mismatch(st) or check_step_mismatch(st)
    if mm is not None:
        decorate(st, views, mm)
        return mm
    nranks = max(st.nranks, max(views) + 1 if views else 0)
    votes = walk(views, nranks)
    # status evidence about ranks that nobody's walk reached still counts (e.g. ranks with no flows)
    for r, v in views.items():
        t = _rank_terminal(v, r) if v.state in (NOT_ENTERED, STOPPED, EXITED) else None
        if t is not None:
            votes[t] = votes.get(t, 0.0) + 0.5
    if st.stalled_ranks():
        missing = [r for r in range(nranks) if r not in views]
        if missing and len(missing) <= max(1, nranks // 2):
            for r in missing:
                t = ("rank", "rank_absent", r, "silent")
                votes[t] = votes.get(t, 0.0) + 0.25
    if not votes:
        return None
    total = sum(votes.values())
    onset = max(st.last_progress_ns, st.first_evidence_ns)
    flow_votes = {t: w for t, w in votes.items() if t[0] == "flow"}
    rank_votes = {t: w for t, w in votes.items() if t[0] == "rank"}
    # noflow terminals are the weakest explanation: only when nothing else is there
    strong_rank = {t: w for t, w in rank_votes.items() if t[1] != "noflow"}
    best_rank = max(strong_rank.items(), key=lambda kv: (kv[1], -kv[0][2]), default=None)
    flow_total = sum(flow_votes.values())
    flow_won = bool(flow_votes) and (best_rank is None or flow_total > best_rank[1])
    if flow_won:
        f = _flow_finding(st, views, flow_votes, flow_total / total)
    elif best_rank is not None:
        f = _rank_finding(st, views, best_rank[0], best_rank[1] / total)
    else:
        # collectives without network flows (intra-node): the rank that stopped progressing first
        stalled = [views[t[2]] for t in rank_votes]
        v = min(stalled, key=lambda x: (x.ref.last_progress_ns if x.ref else 0, x.rank))
        f = Finding(kind=sc.KIND_HANG, category="gpu_stalled", ranks=[v.rank], confidence=0.3,
                    evidence=(f"all {len(stalled)} ranks wait in {st.func} without network flows; "
                              f"rank {v.rank} progressed last earliest"), onset_ns=onset, reason="noflow")
    if f.onset_ns == 0:
        f.onset_ns = onset
    _contest(f, flow_won, flow_total, strong_rank, total)
    f.waiting = sorted(r for r, v in views.items() if v.state == IN_FLIGHT)
    decorate(st, views, f)
    return f


def _contest(f: Finding, flow_won: bool, flow_total: float, rank_votes: dict[tuple, float], total: float) -> None:
    """The hang's winning explanation against the best one elsewhere, as shares of the walks' votes: the
    flows' stalls together, or each rank's own terminal (a rank that never entered, a GPU that stopped)."""
    where = f" ch{f.channel}" if f.channel is not None else ""
    f.hypothesis = f"{f.category} rank {f.ranks[0]}{where}" if f.ranks else f.category
    others = [(w, f"{t[1]} rank {t[2]}") for t, w in rank_votes.items() if t[2] not in f.ranks]
    if not flow_won and flow_total > 0:
        others.append((flow_total, "network flows"))
    won = flow_total if flow_won else max((w for t, w in rank_votes.items() if t[2] in f.ranks),
                                                    default=0.0)
    second = max(others, default=(0.0, ""))
    f.runner_up = second[1]
    f.margin = round((won - second[0]) / total, 3) if total > 0 else None


def _flow_finding(st: TraceState, views: dict[int, RankView], flow_votes: dict[tuple, float],
                  share: float) -> Finding:
    flows = sorted(flow_votes, key=lambda t: -flow_votes[t])
    # which rank touches the most stalled flows (a NIC: all flows of one rank)
    touch: dict[int, float] = {}
    for (_, s, d, _ch) in flows:
        touch[s] = touch.get(s, 0) + 1.0
        touch[d] = touch.get(d, 0) + 0.9  # ties go to the sender
    top = max(touch.items(), key=lambda kv: (kv[1], -kv[0]))[0]
    mine = [t for t in flows if t[1] == top or t[2] == top]
    cats = [_classify_flow(views, s, d, ch) for (_, s, d, ch) in mine]
    cat = max(set(c for c, _ in cats), key=lambda c: sum(1 for x, _ in cats if x == c))
    detail = next(txt for c, txt in cats if c == cat)
    onset = max((views[s].ref.last_progress_ns for (_, s, _, _) in mine if s in views and views[s].ref), default=0)
    if len(mine) == 1:
        _, s, d, ch = mine[0]
        return Finding(kind=sc.KIND_HANG, category=cat, ranks=[s], channel=ch, peer=d,
                       confidence=round(min(0.95, 0.5 + 0.45 * share), 3),
                       evidence=f"flow rank {s} -> rank {d} on channel {ch} stalled: {detail}", onset_ns=onset)
    peers = sorted({(d if s == top else s) for (_, s, d, _) in mine})
    chans = sorted({ch for (_, _, _, ch) in mine})
    return Finding(kind=sc.KIND_HANG, category=cat, ranks=[top],
                   confidence=round(min(0.95, 0.5 + 0.45 * share * len(mine) / len(flows)), 3),
                   evidence=(f"all {len(mine)} stalled flows touch rank {top}'s NIC (channels {_ranks(chans)}, "
                             f"peers {_ranks(peers)}): {detail}"), onset_ns=onset)


def _rank_finding(st: TraceState, views: dict[int, RankView], term: tuple, share: float) -> Finding:
    _, cat, r, why = term
    v = views.get(r)
    base = {"silent": 0.75, "not_entered": 0.9, "stopped": 0.9, "exited": 0.95, "gpu": 0.9,
            "gpu_unfinished": 0.6, "not_started": 0.6, "cycle": 0.4}.get(why, 0.5)
    conf = round(min(0.99, base * (0.5 + 0.5 * min(1.0, share))), 3)
    waiting = len(st.stalled_ranks())
    onset = 0
    if why == "silent":
        ev = f"rank {r} sent no span for collective {st.seq} while {waiting} ranks wait on it"
    elif why == "not_entered":
        last = v.attrs.get(sc.STATUS_LAST_SEQ, "?") if v else "?"
        state = v.attrs.get(sc.STATUS_LAST_STATE, "") if v else ""
        ev = (f"rank {r} never entered {st.func or 'the collective'} {st.seq} (idle after collective {last}"
              + (f"; last: {state}" if state else "") + f") while {waiting} ranks wait on it")
    elif why == "stopped":
        ev = f"rank {r}'s process is stopped (SIGSTOP) and went silent; {waiting} ranks wait on it"
    elif why == "exited":
        state = v.attrs.get(sc.STATUS_LAST_STATE, "") if v else ""
        ev = f"rank {r}'s process exited" + (f" ({state})" if state else "") + f"; {waiting} ranks wait on it"
    elif why == "not_started":
        ev = f"rank {r} is in {st.func} {st.seq} but none of its flows started; its peers wait on it"
    else:
        waits = ", ".join(f"ch{f.channel} {'send' if f.send else 'recv'} {f.wait_state or 'idle'} "
                          f"{f.ready}/{f.transmitted}/{f.done} of {f.steps}"
                          for f in (v.flows if v else [])[:4] if not f.finished)
        ev = (f"rank {r}'s GPU neither consumes nor produces: data arrived but its flows wait on the GPU "
              f"({waits}); {waiting} ranks wait on it")
        if v and v.ref:
            onset = v.ref.last_progress_ns
    return Finding(kind=sc.KIND_HANG, category=cat, ranks=[r], confidence=conf, evidence=ev, onset_ns=onset,
                   reason=why)


def decorate(st: TraceState, views: dict[int, RankView], f: Finding) -> None:
    """Culprit/evidence span ids, global ranks and hosts."""
    from mycroft_otel import ids
    tid = int.from_bytes(st.trace_id, "big")
    for r in f.ranks:
        f.culprit_spans.append(ids.span_id(tid, r, sc.ROLE_OP).to_bytes(8, "big"))
        v = views.get(r)
        if v is not None and v.ref is not None and v.ref.span_id not in f.culprit_spans:
            f.culprit_spans.append(v.ref.span_id)
        if v is not None:
            if v.global_rank >= 0:
                f.global_ranks.append(v.global_rank)
            if v.host and v.host not in f.hosts:
                f.hosts.append(v.host)
    if f.peer is not None and f.peer in views and views[f.peer].ref is not None:
        f.evidence_spans.append(views[f.peer].ref.span_id)
    # a few waiting ranks' evidence
    for r, v in list(views.items())[:16]:
        if r not in f.ranks and v.ref is not None and v.ref.span_id not in f.evidence_spans:
            f.evidence_spans.append(v.ref.span_id)
        if len(f.evidence_spans) >= 8:
            break
