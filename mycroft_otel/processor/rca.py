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

Everything here reads one :class:`~mycroft_otel.processor.state.TraceState` (and, for a sharded job, which
ranks another processor holds: shards.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from mycroft_otel import semconv as sc
from mycroft_otel.processor.mismatch import check_mismatch, check_step_mismatch
from mycroft_otel.processor.state import TraceState
from mycroft_otel.processor.views import (COMPLETED, EXITED, IN_FLIGHT, NOT_ENTERED, STOPPED, Finding, RankView,
                                          build_views, decorate, ranks_text)


# --- hang walk ------------------------------------------------------------------------------------

# Terminals: ("rank", category, rank, why) or ("flow", sender, receiver, channel)
OUTSIDE = "outside_shard"  # the category of a walk's end at a rank another processor's shard holds
_FOLLOW_ORDER = {"data": 0, "credit": 1, "net": 2}


def _rank_terminal(pv: RankView | None, p: int, outside: Callable[[int], bool] | None = None) -> tuple | None:
    if pv is None:
        return ("rank", OUTSIDE, p, "shard") if outside and outside(p) else ("rank", "rank_absent", p, "silent")
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


@dataclass(frozen=True)
class Wait:
    """What one stalled rank waits for, as the walk reads it (one per edge, or the rank's own wait).

    ``kind``: ``data`` (a recv flow waits for ``peer``'s data), ``credit`` (a send flow waits for ``peer``'s
    free buffer), ``net`` (sent data not completed by the network to ``peer``), or, when no peer explains the
    wait, the rank's own: ``gpu`` (data arrived, its GPU neither consumes nor produces), ``not_started``,
    ``noflow``. ``kernel``: no network flows; the kernel of ``peer`` (-1: this rank's own) never started.
    ``terminal``: where the walk ends on this wait (a rank or flow terminal tuple as ``walk``
    votes for), None when the walk follows it to ``peer``."""

    kind: str
    peer: int = -1
    channel: int = -1
    terminal: tuple | None = None


def kernel_not_started(views, nranks: int) -> list[int]:
    """Ranks in flight whose GPU has not started the collective's kernel while another rank's has (``views`` as
    for :func:`rank_waits`). A kernel moves data only with every rank's kernel running, so those inside wait for
    these: their GPU is stalled, or its stream is held by earlier work that does not finish. Empty when no
    GPU started it (all queued behind other work, or an NCCL that reports no KernelCh): nothing tells them apart."""
    inside, before = False, []
    # the ranks that said anything (a dict), else every rank of the communicator asked for by number
    said = sorted(views.items()) if isinstance(views, dict) else ((p, views.get(p)) for p in range(nranks))
    for p, pv in said:
        if pv is None or pv.state != IN_FLIGHT:
            continue
        if pv.kernel_started:
            inside = True
        else:
            before.append(p)
    return before if inside else []


def rank_waits(v: RankView, views, nranks: int, unstarted: list[int] | None = None,
               outside: Callable[[int], bool] | None = None) -> list[Wait]:
    """Every wait of stalled rank ``v``, in the order the walk reads them (``views``: rank -> RankView, any
    mapping with ``get``). The rank's walk ends at the terminals among them, else follows the first other.
    ``unstarted``: :func:`kernel_not_started` of the trace, when the caller has it; ``outside``: as for
    :func:`walk`."""
    out: list[Wait] = []
    edges, gpu = _edges(v)
    r = v.rank
    for kind, p, ch, f in edges:
        if p < 0 or p >= max(nranks, 1) or p == r:
            continue
        pv = views.get(p)
        t = _rank_terminal(pv, p, outside)
        if t is None and kind == "data":  # r receives from p on ch
            pf = pv.send_flow(ch, r)
            if pv.state == COMPLETED or (pf is not None and pf.finished):
                t = ("flow", p, r, ch)
            elif pf is not None and pf.wait_state in ("SendPeerWait", "SendWait"):
                t = ("flow", p, r, ch)
        elif t is None:  # r sends to p on ch: waits for p's credit or for the network
            qf = pv.recv_flow(ch, r)
            if pv.state == COMPLETED or (qf is not None and qf.finished):
                t = ("flow", r, p, ch)
            elif qf is not None and (qf.wait_state == "RecvWait" or (kind == "net" and not qf.wait_state)):
                t = ("flow", r, p, ch)
            elif qf is None and kind == "net":
                t = ("flow", r, p, ch)
        out.append(Wait(kind, p, ch, t))
    if not out and not v.flows:
        # no network flows (NVLink/P2P: no proxy steps): the only evidence is whose GPU started the kernel
        unstarted = kernel_not_started(views, nranks) if unstarted is None else unstarted
        if r in unstarted:
            out.append(Wait("kernel", terminal=("rank", "gpu_stalled", r, "kernel_not_started")))
        else:
            out += [Wait("kernel", p, terminal=("rank", "gpu_stalled", p, "kernel_not_started"))
                    for p in unstarted]
        if not out:
            out.append(Wait("noflow", terminal=("rank", "noflow", r, "no network flows")))
    elif not out and all(f.posted == 0 and f.ready == 0 for f in v.flows):
        out.append(Wait("not_started", terminal=("rank", "rank_absent", r, "not_started")))
    elif not out:
        out.append(Wait("gpu", terminal=("rank", "gpu_stalled", r, "gpu" if gpu else "gpu_unfinished")))
    return out


def _resolve(v: RankView, views: dict[int, RankView], nranks: int, unstarted: list[int] | None,
             outside: Callable[[int], bool] | None) -> tuple[list[tuple], list[int]]:
    """(terminals reached directly, ranks to follow) from stalled rank ``v``."""
    waits = rank_waits(v, views, nranks, unstarted, outside)
    return [w.terminal for w in waits if w.terminal is not None], [w.peer for w in waits if w.terminal is None]


MAX_STARTS = 1024


def _starts(views: dict[int, RankView]) -> list[int]:
    """The ranks the walks start from: every stalled one, or in a huge collective those that stopped
    progressing first (the fault's neighbourhood: further away the pipeline drains later); only the ranks the
    walks visit get decoded."""
    stalled = [r for r, v in views.items() if v.state == IN_FLIGHT]
    if len(stalled) > MAX_STARTS:
        stalled = sorted(stalled, key=lambda r: (views[r].ref.last_progress_ns, r))[:MAX_STARTS // 4]
    return stalled


def walk(views: dict[int, RankView], nranks: int, outside: Callable[[int], bool] | None = None) -> dict[tuple, float]:
    """Votes per terminal: each stalled rank's walk ends somewhere; iterative, memoized, cycle-safe. ``outside``
    (shards.py): rank r's missing span says nothing, another processor holds it: the walk ends at OUTSIDE."""
    stalled = _starts(views)
    RankView.load_flows([views[r] for r in stalled])  # the starts' in one pass; the rest as the walks reach them
    memo: dict[int, list[tuple]] = {}
    direct: dict[int, tuple[list[tuple], list[int]]] = {}

    unstarted: list[list[int]] = []  # kernel_not_started, once a rank without flows asks

    def step(r: int) -> tuple[list[tuple], list[int]]:
        d = direct.get(r)
        if d is None:
            v = views[r]
            if not v.flows and not unstarted:
                unstarted.append(kernel_not_started(views, nranks))
            d = direct[r] = _resolve(v, views, nranks, unstarted[0] if unstarted else None, outside)
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
                out = [_rank_terminal(None, r, outside)]
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


def analyse_hang(st: TraceState, views: dict[int, RankView] | None = None,
                 earlier: Callable[[], Iterable[TraceState]] | None = None,
                 outside: Callable[[int], bool] | None = None) -> Finding | None:
    """The hang's finding (``earlier``: the communicator's collectives before it, for a mismatch; ``outside``:
    as for :func:`walk`), None when no walk ends at a root this processor holds."""
    views = build_views(st) if views is None else views
    mm = check_mismatch(st, earlier) or check_step_mismatch(st)
    if mm is not None:
        decorate(st, views, mm)
        return mm
    nranks = max(st.nranks, max(views) + 1 if views else 0)
    votes = walk(views, nranks, outside)
    votes = {t: w for t, w in votes.items() if t[1] != OUTSIDE}  # no evidence for or against a root here
    # status evidence about ranks that nobody's walk reached still counts (e.g. ranks with no flows)
    for r, v in views.items():
        t = _rank_terminal(v, r) if v.state in (NOT_ENTERED, STOPPED, EXITED) else None
        if t is not None:
            votes[t] = votes.get(t, 0.0) + 0.5
    if st.stalled_ranks():
        missing = [r for r in range(nranks) if r not in views and not (outside and outside(r))]
        if missing and len(missing) <= max(1, (len(views) + len(missing)) // 2):
            for r in missing:
                t = ("rank", "rank_absent", r, "silent")
                votes[t] = votes.get(t, 0.0) + 0.25
    if not votes:
        return None
    total = sum(votes.values())
    onset = st.stopped_ns
    flow_votes = {t: w for t, w in votes.items() if t[0] == "flow"}
    rank_votes = {t: w for t, w in votes.items() if t[0] == "rank"}
    # noflow terminals are the weakest explanation: only when nothing else is there
    strong_rank = {t: w for t, w in rank_votes.items() if t[1] != "noflow"}
    # A member's process that is gone outranks the rest: no collective of its communicators can complete,
    # whatever the live ranks show. And what they show is no evidence against it: a peer's death resets its
    # connections, and NCCL's proxy thread stops progressing every op of its process on the first failed one,
    # so the neighbours' flows freeze wherever they were (real NCCL: sends transmitted but never completed,
    # read as a network stall). An exit that follows a stall instead (an abort on an NCCL error or a watchdog)
    # comes after the hang's threshold, and the hang is named by then: an exit cuts the wait to a third
    # (detect.py).
    dead = {t: w for t, w in strong_rank.items() if t[1] == sc.CAT_PROCESS_EXITED}
    best_rank = max((dead or strong_rank).items(), key=lambda kv: (kv[1], -kv[0][2]), default=None)
    flow_total = sum(flow_votes.values())
    flow_won = not dead and bool(flow_votes) and (best_rank is None or flow_total > best_rank[1])
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
                   evidence=(f"all {len(mine)} stalled flows touch rank {top}'s NIC (channels {ranks_text(chans)}, "
                             f"peers {ranks_text(peers)}): {detail}"), onset_ns=onset)


def _rank_finding(st: TraceState, views: dict[int, RankView], term: tuple, share: float) -> Finding:
    _, cat, r, why = term
    v = views.get(r)
    base = {"silent": 0.75, "not_entered": 0.9, "stopped": 0.9, "exited": 0.95, "gpu": 0.9,
            "gpu_unfinished": 0.6, "not_started": 0.6, "kernel_not_started": 0.8, "cycle": 0.4}.get(why, 0.5)
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
    elif why == "kernel_not_started":
        ev = (f"rank {r}'s GPU never started the kernel of {st.func} {st.seq} (no KernelCh) while the other ranks' "
              f"kernels wait inside it; {waiting} ranks wait")
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
