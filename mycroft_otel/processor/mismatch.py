"""Collectives whose ranks disagree: different calls at one sequence number, or connections whose two ends
announce different step counts (a rank called with another count). Named at once, hang or not."""

from __future__ import annotations

from typing import Callable, Iterable

import numpy as np

from mycroft_otel import semconv as sc
from mycroft_otel.processor.spans import SpanRef, flow_table
from mycroft_otel.processor.state import P2P, TraceState
from mycroft_otel.processor.views import Finding, ranks_text

def _signature(ref: SpanRef) -> tuple | None:
    func = "Send/Recv" if ref.func in P2P else ref.func  # a p2p trace holds both halves of one transfer
    if not func:
        return None
    return (func, ref.count if ref.count >= 0 else None, ref.datatype or None)


def _agreed(traces: Iterable[TraceState]) -> set[tuple]:
    """The calls of these collectives on which all their completed ranks agreed."""
    out = set()
    for o in traces:
        sigs = {_signature(ref) for ref in o.op.values()}
        if len(sigs) == 1:
            out |= sigs
    return out


def check_mismatch(st: TraceState, earlier: Callable[[], Iterable[TraceState]] | None = None) -> Finding | None:
    """Ranks that called different functions, sizes or types at the same sequence number (as their
    completed or in-flight spans say: status spans carry no size). As many ranks on each side (a DP pair,
    one of two): the side that made a call the communicator's ``earlier`` collectives all agreed on is the
    usual one. A training step repeats its collectives, so the rank that changed its call is the other."""
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
    tie = len(ordered[0][1]) == len(ordered[1][1])
    usual = _agreed(earlier()) if tie and earlier is not None else set()
    if usual:
        ordered.sort(key=lambda kv: (-len(kv[1]), kv[0] not in usual, min(kv[1])))
    majority_sig, majority = ordered[0]
    culprits = sorted(r for _, rs in ordered[1:] for r in rs)
    sig = _signature(ref_of[culprits[0]])
    what = []
    names = ("function", "count", "datatype")
    for i, name in enumerate(names):
        if sig[i] != majority_sig[i]:
            what.append(f"{name} {sig[i]} (others {majority_sig[i]})")
    # a tie told apart by the communicator's history is weaker evidence than a majority, stronger than none
    conf = 0.95 if len(majority) > len(culprits) else 0.8 if majority_sig in usual else 0.6
    return Finding(
        kind=sc.KIND_HANG, category="coll_mismatch", ranks=culprits, confidence=conf,
        evidence=(f"rank{'s' if len(culprits) > 1 else ''} {ranks_text(culprits)} called {', '.join(what)} "
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
