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
below every other candidate and needs more recurrences (pipeline.SOFT_CONFIRM). A weak one
(>= WEAK_RATIO, flagged too) ranks lower still and must name the same rank in most of the
communicator's latest collectives (pipeline.WEAK_CONFIRM of WEAK_OF).

Each verdict here is a *candidate*: the pipeline emits it only when the same culprit
and category recur (a fault persists; jitter moves around).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np

from mycroft_otel import semconv as sc
from mycroft_otel.processor import rca
from mycroft_otel.processor.rca import COMPLETED, IN_FLIGHT, Finding, RankView, build_views
from mycroft_otel.processor.spans import SpanRef, evidence_attributes, flow_table
from mycroft_otel.processor.state import P2P, TraceState

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
WEAK_RATIO = 6.0  # weaker still, flagged too: a candidate only when it names one rank in most collectives in a row
SOFT_HISTORY = 8  # ... once the communicator's history for the size, or the job's, holds this many collectives' values
STRONG_RATIO = 500.0  # so far beyond any jitter that two collectives suffice (confidence 0.95, pipeline.STRONG_CONFIRM)
STEP_FLOOR_NS = 2000.0  # per-step waits below this are noise
# Finding.reason of the milder outliers: "soft" (>= SOFT_*), "weak" (>= WEAK_RATIO); each needs more recurrences
MILD = ("soft", "weak")

# Finding.reason of a culprit inferred from the collective being slow as a whole (its ranks' counters name
# nobody): any slow member explains that, so the pipeline drops it while a culprit among them is named.
WHOLE = "whole"

_NO_ARRIVAL = np.iinfo(np.int64).max


class History:
    """The last ``size`` values of one per-step measure (a ring: the median needs no order)."""

    def __init__(self, size: int):
        self._buf = np.empty(size, dtype=np.float64)
        self._n = 0
        self._at = 0

    def __len__(self) -> int:
        return self._n

    def extend(self, values: np.ndarray) -> None:
        size = len(self._buf)
        values = values[-size:]
        k = len(values)
        first = min(k, size - self._at)
        self._buf[self._at:self._at + first] = values[:first]
        self._buf[:k - first] = values[first:]
        self._at = (self._at + k) % size
        self._n = min(size, self._n + k)

    def values(self) -> np.ndarray:
        return self._buf[:self._n]


def new_history(size: int) -> dict[str, History]:
    """What a communicator (or a job) has seen: per-step GPU waits and network waits."""
    return {"gpu": History(size), "net": History(size)}


@dataclass(slots=True)
class Measures:
    """One completed collective's numbers: a row per completed rank (``refs`` order) or per flow."""

    refs: list[SpanRef]
    ranks: np.ndarray      # per rank
    arrival: np.ndarray    # per rank: when it really started (its first step posted; else its launch)
    duration: np.ndarray   # per rank: its span's duration
    end: int               # when the last rank completed
    gpu_of: np.ndarray     # the ranks (indices) with receive flows ...
    gpu: np.ndarray        # ... and their GPU wait per step (data there, not consumed)
    src: np.ndarray        # per send flow into a completed rank: its sender (index) ...
    dst: np.ndarray        # ... receiver (index) ...
    channel: np.ndarray    # ... channel ...
    net: np.ndarray        # ... and network wait per step, less the time its receiver was not there yet
    sent_of: np.ndarray    # the ranks (indices) with send flows that had steps ...
    sent_wait: np.ndarray  # ... and their send steps' GPU + network wait per step (the proxy's share is the rest)
    steps: np.ndarray      # per send flow into a completed rank: the steps it announced ...
    expected: np.ndarray   # ... and those its receiver's flow from it announced (-1: not known)


# The flow counters the comparisons read (the rest of each span is not decoded for them).
MEASURE_COLUMNS = (sc.FLOW_CHANNEL, sc.FLOW_DIRECTION, sc.FLOW_PEER, sc.FLOW_STEPS, sc.FLOW_START, sc.FLOW_GPU_WAIT,
                   sc.FLOW_NET_WAIT)
F_CHANNEL, F_SEND, F_PEER, F_STEPS, F_START, F_GPU_WAIT, F_NET_WAIT = range(len(MEASURE_COLUMNS))
_RANK_BITS = 21  # ranks are < 2**20 (spans.py): (trace, rank) packs into one int64 key


def measure(traces: list[TraceState]) -> list[Measures]:
    """The completed ranks' numbers of several traces at once (numpy over all their flows: one tick's
    collectives cost a few array operations, not a few per collective)."""
    refs = [ref for st in traces for ref in st.op.values()]
    per = np.array([len(st.op) for st in traces], dtype=np.int64)
    bounds = np.concatenate(([0], np.cumsum(per)))
    trace_of = np.repeat(np.arange(len(traces)), per)  # per rank: its trace
    ranks = np.array([ref.rank for ref in refs], dtype=np.int64)
    ends = [ref.end_ns for ref in refs]
    duration = np.maximum(0.0, np.array(ends, dtype=np.float64) - np.array([ref.start_ns for ref in refs],
                                                                           dtype=np.float64))
    table, counts = flow_table(refs, MEASURE_COLUMNS)
    row = np.repeat(np.arange(len(refs)), counts)  # per flow: its rank (index into refs)
    # arrival
    starts = table[:, F_START]
    posted = starts > 0
    arrival = np.full(len(refs), _NO_ARRIVAL, dtype=np.int64)
    np.minimum.at(arrival, row[posted], starts[posted])
    for i in np.flatnonzero(arrival == _NO_ARRIVAL).tolist():
        a = evidence_attributes(refs[i])
        t = next((a[k] for k in (sc.TIME_LAUNCH, sc.TIME_ENQUEUE, sc.TIME_API) if type(a.get(k)) is int and a[k] > 0),
                 refs[i].start_ns)
        arrival[i] = min(t, _NO_ARRIVAL - 1)
    send = table[:, F_SEND] == 1
    steps = np.maximum(table[:, F_STEPS], 1).astype(np.float64)
    # GPU: receive side
    recv = ~send
    gpu_of = np.flatnonzero(np.bincount(row[recv], minlength=len(refs)))
    gpu = (np.bincount(row[recv], weights=table[recv, F_GPU_WAIT].astype(np.float64), minlength=len(refs))[gpu_of]
           / np.bincount(row[recv], weights=steps[recv], minlength=len(refs))[gpu_of])
    # network: send flows into a rank of the same trace we heard from (one we did not may simply have
    # been late: no fair comparison); the receiver found by its (trace, rank) key
    out_rows = np.flatnonzero(send)
    src = row[out_rows]
    peer = table[out_rows, F_PEER]
    at = rca.lookup((trace_of << _RANK_BITS) | ranks,
                    (trace_of[src] << _RANK_BITS) | np.clip(peer, 0, (1 << _RANK_BITS) - 1))
    ok = (peer >= 0) & (peer < 1 << 20) & (at >= 0)
    out_rows, src, dst = out_rows[ok], src[ok], at[ok]
    early = np.maximum(0.0, (arrival[dst] - arrival[src]).astype(np.float64))
    net = np.maximum(0.0, table[out_rows, F_NET_WAIT] - np.minimum(steps[out_rows], 8) * early) / steps[out_rows]
    # the other end's step count (rca.step_mismatch)
    rx = np.flatnonzero(recv)
    expected = rca.receiver_steps(dst, table[out_rows, F_CHANNEL], ranks[src], row[rx], table[rx, F_CHANNEL],
                                  table[rx, F_PEER], table[rx, F_STEPS])
    # proxy: the send steps' GPU + network wait per step
    sent = send & (table[:, F_STEPS] > 0)
    sent_of = np.flatnonzero(np.bincount(row[sent], minlength=len(refs)))
    waited = (table[sent, F_GPU_WAIT] + table[sent, F_NET_WAIT]).astype(np.float64)
    sent_wait = (np.bincount(row[sent], weights=waited, minlength=len(refs))[sent_of]
                 / np.bincount(row[sent], weights=table[sent, F_STEPS].astype(np.float64), minlength=len(refs))[sent_of])
    # per trace: its slice of each array, rank indices made local to the trace
    first = bounds[trace_of]  # per rank: the index of its trace's first rank
    gpu_at, src_at, dst_at, sent_at = (gpu_of - first[gpu_of], src - first[src], dst - first[src],
                                       sent_of - first[sent_of])
    channel = table[out_rows, F_CHANNEL]
    # where each trace's part starts in the per-rank, per-GPU, per-send-flow and per-sender arrays (send
    # flows come in rank order)
    r, g, f, p = (c.tolist() for c in (bounds, np.searchsorted(gpu_of, bounds), np.searchsorted(src, bounds),
                                       np.searchsorted(sent_of, bounds)))
    out = []
    for t in range(len(traces)):
        out.append(Measures(
            refs=refs[r[t]:r[t + 1]], ranks=ranks[r[t]:r[t + 1]], arrival=arrival[r[t]:r[t + 1]],
            duration=duration[r[t]:r[t + 1]], end=max(ends[r[t]:r[t + 1]]),
            gpu_of=gpu_at[g[t]:g[t + 1]], gpu=gpu[g[t]:g[t + 1]],
            src=src_at[f[t]:f[t + 1]], dst=dst_at[f[t]:f[t + 1]], channel=channel[f[t]:f[t + 1]],
            net=net[f[t]:f[t + 1]], sent_of=sent_at[p[t]:p[t + 1]], sent_wait=sent_wait[p[t]:p[t + 1]],
            steps=table[out_rows[f[t]:f[t + 1]], F_STEPS], expected=expected[f[t]:f[t + 1]]))
    return out


def _median(values: np.ndarray) -> float:
    k = len(values) // 2
    if len(values) % 2:
        return float(np.partition(values, k)[k])
    p = np.partition(values, (k - 1, k))
    return (float(p[k - 1]) + float(p[k])) / 2


def _outlier(values: np.ndarray, floor: float, history: np.ndarray, bar: float):
    """(index, value, ratio to the reference, strong) of the top value when it is at least ``bar`` x the
    reference -- the median of the other values in this trace and of the communicator's recent
    history -- and ``bar`` x the floor; else None. Strong: beyond any jitter (STRONG_RATIO)."""
    if len(values) == 0:
        return None
    top = int(np.argmax(values))
    top_v = float(values[top])
    if top_v < floor * bar:
        return None
    pool = np.concatenate((values[:top], values[top + 1:], history))
    if len(pool) < 2 or (len(values) < 3 and len(history) < 8):
        return None
    med = _median(pool)
    r = top_v / max(med, floor)
    # beyond any jitter only against a typical wait that is one: where most flows never waited (a median
    # below the floor: a pipeline's p2p flows mostly find their receiver ready), a loaded host's one
    # descheduling reads thousands of times the floor (conformance pp_slow_transfer named bystanders)
    return (top, top_v, r, r >= STRONG_RATIO and med >= floor) if r >= bar else None


def _grade(o, strict: float, soft: float) -> str:
    """An outlier's reason: "" beyond the strict bar (or no outlier), "soft" beyond the soft one, else "weak"."""
    if o is None:
        return ""
    val, ratio = o[1], o[2]
    if ratio >= strict and val >= STEP_FLOOR_NS * strict:
        return ""
    return "soft" if ratio >= soft and val >= STEP_FLOOR_NS * soft else "weak"


def _reference(history: dict, name: str) -> np.ndarray:
    own = history.get(name)
    if own is not None and len(own) >= 8:
        return own.values()
    job = history.get("job", {}).get(name)
    if job is not None and len(job):
        return job.values()
    return own.values() if own is not None else np.empty(0)


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
            rca._decorate(st, views, f)
            return f
    f = rca.analyse_hang(st, sviews)
    if f is None or f.category not in _FROM_HANG or f.reason == "silent":
        return None  # a rank we did not hear from in a collective that completed was simply not slow
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




def analyse_slowdown(st: TraceState, m: Measures | None = None, baseline_ns: float | None = None,
                     factor: float = 2.0, history: dict | None = None) -> Finding | None:
    """``m``: the trace's :func:`measure` (taken now when None). ``history``: the communicator's recent
    per-step values (:func:`new_history`, and the job's under "job"), updated here."""
    mm = rca.check_mismatch(st)
    if mm is not None:
        rca._decorate(st, build_views(st), mm)
        return mm
    # stalled, then recovered: what the in-flight snapshots show -- unless the completed counters name a
    # clear outlier themselves (a slow GPU stalls every collective, and snapshots of waits in a ring of
    # waiting ranks often read as a cycle at a bystander)
    recovered = _recovered_stall(st) if st.inflight else None
    if not st.op:
        return recovered
    m = measure([st])[0] if m is None else m
    refs, ranks, arrival = m.refs, m.ranks, m.arrival
    mm = rca.step_mismatch(st, ranks[m.src], ranks[m.dst], m.channel, m.steps, m.expected)
    if mm is not None:
        rca._decorate(st, build_views(st), mm)
        return mm
    history = history if history is not None else {}
    n = len(refs)
    heard = len(st.op.keys() | st.inflight.keys() | st.status.keys())
    missing = ([r for r in range(st.nranks) if r not in st.op and r not in st.inflight and r not in st.status]
               if heard < st.nranks <= 4096 else [])
    end = m.end
    last = int(np.argmax(arrival))
    first = int(arrival.min())
    makespan = max(1, end - first)
    transfer = max(1, end - int(arrival[last]))
    cands: list[tuple[float, Finding]] = []

    def flagged(i: int) -> bool:  # the rank's own local rule found this collective slow
        return refs[i].anomaly == sc.ANOMALY_SLOW

    def known(name: str, k: int) -> bool:  # milder outliers only once there is a history to tell them from jitter
        # (the communicator's for this size, or the job's: a job alternating sizes fills each size's slowly)
        need = min(SOFT_HISTORY * k, 200)
        return len(history.get(name, ())) >= need or len(history.get("job", {}).get(name, ())) >= need

    # GPU: receive-side GPU wait per step (data there, not consumed)
    gpu, gpu_of = m.gpu, m.gpu_of
    # (a milder outlier counts when the rank itself flagged it: it needs more recurrences)
    o = _outlier(gpu, STEP_FLOOR_NS, _reference(history, "gpu"), WEAK_RATIO if known("gpu", len(gpu)) else GPU_RATIO)
    mild = _grade(o, GPU_RATIO, SOFT_GPU_RATIO)
    if mild and not flagged(int(gpu_of[o[0]])):
        o, mild = None, ""
    if o is not None:
        i, val, ratio, strong = int(gpu_of[o[0]]), o[1], o[2], o[3]
        r = int(ranks[i])
        cands.append((3.0 + min(ratio, 20) / 10 - 4.0 * (mild != "") - 4.0 * (mild == "weak"), Finding(
            kind=sc.KIND_SLOWDOWN, category="slow_gpu", ranks=[r], reason=mild,
            confidence=0.95 if strong else round(min(0.9, 0.5 + 0.01 * ratio), 3),
            evidence=(f"rank {r}'s GPU took {val / 1e3:.0f} us per step to consume received data, {ratio:.0f}x "
                      f"the other ranks, in {st.func} {st.seq}"), onset_ns=int(arrival[i]))))

    # network: send-side wait per step, less the time the receiver was not there yet
    net, src, dst = m.net, m.src, m.dst
    # (a milder outlier counts when its sender or receiver flagged it: it needs more recurrences)
    o = _outlier(net, STEP_FLOOR_NS, _reference(history, "net"), WEAK_RATIO if known("net", len(net)) else NET_RATIO)
    mild = _grade(o, NET_RATIO, SOFT_RATIO)
    if mild and not (flagged(int(src[o[0]])) or flagged(int(dst[o[0]]))):
        o, mild = None, ""
    bar = {"": NET_RATIO, "soft": SOFT_RATIO, "weak": WEAK_RATIO}[mild]
    if o is not None:
        k, val, ratio, strong = o
        s_i, d_i = int(src[k]), int(dst[k])
        s, d, ch = int(ranks[s_i]), int(ranks[d_i]), int(m.channel[k])
        med = val / ratio  # the reference: the other flows and the history (in a p2p all flows may be slow)
        slow = net >= max(val / 3, bar / 2 * max(med, STEP_FLOOR_NS))
        out_of, into = src == s_i, dst == d_i
        if out_of.sum() > 1 and slow[out_of].all():
            cat, who, chan, peer = "slow_nic", s, None, None
            ev = f"all {int(out_of.sum())} flows sent by rank {s} wait {ratio:.0f}x longer per step on the network"
        elif into.sum() > 1 and slow[into].all():
            cat, who, chan, peer = "slow_nic", d, None, None
            ev = f"all {int(into.sum())} flows into rank {d} wait {ratio:.0f}x longer per step on the network"
        else:
            cat, who, chan, peer = "slow_flow", s, ch, d
            ev = f"flow rank {s} -> rank {d} on channel {ch} waits {ratio:.0f}x the typical wait per step"
        cands.append((2.0 + min(ratio, 20) / 10 - 4.0 * (mild != "") - 4.0 * (mild == "weak"), Finding(
            kind=sc.KIND_SLOWDOWN, category=cat, ranks=[who], channel=chan, peer=peer, reason=mild,
            confidence=0.95 if strong else round(min(0.9, 0.5 + 0.01 * ratio), 3),
            evidence=ev + f" in {st.func} {st.seq}",
            onset_ns=int(arrival[s_i]))))

    # a flow far slower than its siblings that leads into (or out of) the GPU outlier explains it: the
    # receiver's kernel queues behind the collective that flow delayed, so its other channels show GPU
    # waits -- queueing, not a slow GPU
    # (a slow GPU itself slows every flow into it alike: that reads slow_nic, never one slow_flow)
    if (len(cands) == 2 and cands[0][1].category == "slow_gpu" and cands[1][1].category == "slow_flow"
            and cands[1][1].reason != "weak"):
        g, nf = cands[0][1], cands[1][1]
        if g.ranks[0] in (nf.ranks[0], nf.peer):
            cands.pop(0)
    # the history learns what is normal: not from a collective where it just found an outlier of that kind
    # (a p2p trace brings 2 values: two slow ones would soon make slow the norm)
    found = {"gpu" if c[1].category == "slow_gpu" else "net" for c in cands if c[1].reason not in MILD}
    for name, vals in (("gpu", gpu), ("net", net)):
        if name in found:
            continue
        for h in (history.get(name), history.get("job", {}).get(name)):
            if h is not None:
                h.extend(vals)
    # arrival: the last rank started so late that the others mostly waited for it
    spread = int(arrival[last]) - first  # >= the lateness below: a cheap bound first
    late = (int(arrival[last]) - _median(np.delete(arrival, last))
            if n >= 3 and spread >= 0.3 * makespan and spread >= LATE_RATIO / 2.5 * transfer else 0)
    if n >= 3 and late >= 0.3 * makespan and (late >= LATE_RATIO * transfer or
                                               (late >= 0.9 * makespan and late >= LATE_RATIO / 2.5 * transfer)):
        r = int(ranks[last])
        cands.append((5.0 + min(late / transfer, 20) / 20, Finding(
            kind=sc.KIND_SLOWDOWN, category="late_rank", ranks=[r],
            confidence=round(min(0.9, 0.5 + 0.02 * late / transfer), 3),
            evidence=(f"rank {r} started {st.func} {st.seq} {late / 1e6:.1f} ms after the others, who waited; "
                      f"the transfer itself took {transfer / 1e6:.1f} ms"), onset_ns=int(arrival[last] - late))))
    # proxy: a rank whose send steps spent much less time waiting on GPU and network than everybody else's
    # spent the rest between ready and transmitted -- its proxy posted late (Mycroft's ready->transmitted gap)
    # (only in a collective that is slow as a whole: a late proxy delays the transfer itself, while in a
    # healthy one some rank always waits least)
    durs = np.sort(m.duration)
    slow_whole = baseline_ns is not None and durs[n // 2] >= factor * baseline_ns
    if slow_whole and all(c[1].reason in MILD for c in cands) and len(m.sent_wait) >= 3:
        acc = m.sent_wait
        low = int(np.argmin(acc))
        rest = np.delete(acc, low)
        med = _median(rest)
        if med >= 100 * STEP_FLOOR_NS and acc[low] <= 0.6 * med and bool((rest >= 0.8 * med).all()):
            i = int(m.sent_of[low])
            r = int(ranks[i])
            # a rank that launched last waits least too (everybody was ready for it): late, not its proxy
            # (its first posted step is late either way; its launch tells them apart, as in _recovered_stall)
            launched = refs[i].start_ns - _median(np.delete(np.array([ref.start_ns for ref in refs], np.float64), i))
            if launched >= 0.3 * makespan:
                cat, ev = "late_rank", (f"rank {r} launched {st.func} {st.seq} {launched / 1e6:.0f} ms after the "
                                        f"others, who then waited for it ({med / 1e3:.0f} us per send step vs "
                                        f"its {acc[low] / 1e3:.0f} us)")
            else:
                cat, ev = "slow_proxy", (f"rank {r}'s send steps waited {acc[low] / 1e3:.0f} us on GPU and network vs "
                                         f"{med / 1e3:.0f} us for the others in {st.func} {st.seq}: the rest of its "
                                         f"time went between GPU-ready and transmission (its proxy posted late)")
            cands.append((1.5, Finding(
                kind=sc.KIND_SLOWDOWN, category=cat, ranks=[r], confidence=0.6, reason=WHOLE, evidence=ev,
                onset_ns=int(arrival[i]))))
    # the late rank's own collective was short, so the agent did not export it: everybody else waited
    if all(c[1].reason == "weak" for c in cands) and len(missing) == 1 and n >= 2:
        bases = [ref.baseline_ns for ref in refs if ref.baseline_ns > 0]
        all_flagged = all(ref.anomaly in ("slow", "stalled") for ref in refs)
        if all_flagged and bases and durs[0] >= 4 * max(factor, 2.0) / 2 * statistics.median(bases):
            r = missing[0]
            cands.append((0.5, Finding(
                kind=sc.KIND_SLOWDOWN, category="late_rank", ranks=[r], confidence=0.6, reason=WHOLE,
                evidence=(f"all {n} other ranks waited {float(np.median(durs)) / 1e6:.1f} ms in {st.func} "
                          f"{st.seq} (>= {durs[0] / statistics.median(bases):.0f}x their baseline) while rank {r} "
                          f"was not slow at all: it arrived late"), onset_ns=first)))
    cands.sort(key=lambda c: -c[0])
    if recovered is not None and (not cands or cands[0][1].reason in MILD):
        return recovered
    if not cands:
        return None
    f = cands[0][1]
    rca._decorate(st, build_views(st), f)
    return f
