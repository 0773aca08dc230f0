"""Slowdown evidence of one *completed* collective (one trace): what each rank and flow measured.

:func:`measure` reads the flow counters of many traces at once (numpy over one int64 table); for each
trace :func:`evidence` turns them into per-candidate values of the measures the sequential test
(detector.py) compares across ranks and over time:

- ``gpu``: a rank's receive-side GPU busy time per step (some arrived data waited for its GPU);
- ``flow``: one send flow's network busy time per step (some step of it was on the network). Busy times are
  the union of the steps' waits, not their sum: up to NCCL_STEPS steps queue on one link, and the sum counts
  the queue again for every step (a tree's leaf, producing faster than its link drains, reads 7x its parent's
  flows by construction); the union is the link's own time per step. A late receiver holds the sender's
  credit (SendPeerWait), not its SendWait;
- ``nic_send`` / ``nic_recv``: the least-waiting flow out of / into a rank (every flow of that NIC slow);
- ``proxy``: the time per step a rank's ready data moved at neither end: its send steps waited for credit
  (SendPeerWait: the time of its flow in neither GPU nor network wait) longer than the receiver's GPU held
  the buffers, while the receiver's buffer was posted (RecvWait), and not before the receiver started (a late
  receiver's lateness). A receiver with a buffer posted has sent its credit, so what is left is the sender's
  proxy, which posts the ready step to the network late;
- ``late``: how late a rank really started (its first step posted) after the others' median start, as a
  share of the collective's makespan.

Two findings need no test: a straggler everybody waited for (:func:`straggler`) and a mismatch
(mismatch.py); a stall that recovered is recovered.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import itemgetter
from typing import Callable, Iterable

import numpy as np

from mycroft_otel import semconv as sc
from mycroft_otel.processor import mismatch
from mycroft_otel.processor.views import Finding, build_views, decorate
from mycroft_otel.processor.sequential import median
from mycroft_otel.processor.spans import SpanRef, evidence_attributes, flow_table
from mycroft_otel.processor.state import P2P, TraceState

# The measures (detector.py keeps a null and the candidates' CUSUMs per measure).
GPU, FLOW, NIC_SEND, NIC_RECV, PROXY, LATE = "gpu", "flow", "nic_send", "nic_recv", "proxy", "late"
CATEGORY_OF = {GPU: sc.CAT_SLOW_GPU, FLOW: sc.CAT_SLOW_FLOW, NIC_SEND: sc.CAT_SLOW_NIC, NIC_RECV: sc.CAT_SLOW_NIC,
               PROXY: sc.CAT_SLOW_PROXY, LATE: sc.CAT_LATE_RANK}
MEASURE_OF = {sc.CAT_SLOW_GPU: GPU, sc.CAT_SLOW_FLOW: FLOW, sc.CAT_SLOW_PROXY: PROXY, sc.CAT_LATE_RANK: LATE}

_NO_ARRIVAL = np.iinfo(np.int64).max


@dataclass(slots=True)
class Measures:
    """One completed collective's numbers: a row per completed rank (``refs`` order) or per flow."""

    refs: list[SpanRef]
    ranks: np.ndarray      # per rank
    arrival: np.ndarray    # per rank: when it really started (its first step posted; else its launch)
    duration: np.ndarray   # per rank: its span's duration
    end: int               # when the last rank completed
    gpu_of: np.ndarray     # the ranks (indices) with receive flows ...
    gpu: np.ndarray        # ... and their GPU busy time per step (data there, not consumed)
    src: np.ndarray        # per send flow into a completed rank: its sender (index) ...
    dst: np.ndarray        # ... receiver (index) ...
    channel: np.ndarray    # ... channel ...
    net: np.ndarray        # ... and network busy time per step
    sent_of: np.ndarray    # the ranks (indices) with send flows whose receiving end we know ...
    unsent: np.ndarray     # ... and the time per step their ready data waited at both ends (``proxy``)
    steps: np.ndarray      # per send flow into a completed rank: the steps it announced ...
    expected: np.ndarray   # ... and those its receiver's flow from it announced (-1: not known)


# The flow counters the comparisons read (the rest of each span is not decoded for them).
MEASURE_COLUMNS = (sc.FLOW_CHANNEL, sc.FLOW_DIRECTION, sc.FLOW_PEER, sc.FLOW_STEPS, sc.FLOW_START, sc.FLOW_END,
                   sc.FLOW_GPU_WAIT, sc.FLOW_NET_WAIT, sc.FLOW_GPU_BUSY, sc.FLOW_NET_BUSY, sc.FLOW_PEER_BUSY)
F_CHANNEL, F_SEND, F_PEER, F_STEPS, F_START, F_END, F_GPU_WAIT, F_NET_WAIT, F_GPU_BUSY, F_NET_BUSY, F_PEER_BUSY = \
    range(len(MEASURE_COLUMNS))
_RANK_BITS = 21  # ranks are < 2**20 (spans.py): (trace, rank) packs into one int64 key
_RANK, _START, _END = (itemgetter(SpanRef._fields.index(f)) for f in ("rank", "start_ns", "end_ns"))


def measure(traces: list[TraceState]) -> list[Measures]:
    """The completed ranks' numbers of several traces at once (numpy over all their flows: one tick's
    collectives cost a few array operations, not a few per collective)."""
    refs = [ref for st in traces for ref in st.op.values()]
    per = np.array([len(st.op) for st in traces], dtype=np.int64)
    bounds = np.concatenate(([0], np.cumsum(per)))
    trace_of = np.repeat(np.arange(len(traces)), per)  # per rank: its trace
    ranks = np.fromiter(map(_RANK, refs), dtype=np.int64, count=len(refs))
    ends = list(map(_END, refs))
    duration = np.maximum(0.0, np.array(ends, dtype=np.float64)
                          - np.fromiter(map(_START, refs), dtype=np.float64, count=len(refs)))
    table, counts = flow_table(refs, MEASURE_COLUMNS)
    row = np.repeat(np.arange(len(refs)), counts)  # per flow: its rank (index into refs)
    arrival = _arrivals(refs, table, row)
    send = table[:, F_SEND] == 1
    steps = np.maximum(table[:, F_STEPS], 1).astype(np.float64)
    # GPU: receive side
    recv = ~send
    gpu_of = np.flatnonzero(np.bincount(row[recv], minlength=len(refs)))
    gpu = (np.bincount(row[recv], weights=_busy(table[recv], F_GPU_BUSY), minlength=len(refs))[gpu_of]
           / np.bincount(row[recv], weights=steps[recv], minlength=len(refs))[gpu_of])
    # network: send flows into a rank of the same trace we heard from (one we did not may simply have
    # been late: no fair comparison); the receiver found by its (trace, rank) key
    out_rows = np.flatnonzero(send)
    src = row[out_rows]
    peer = table[out_rows, F_PEER]
    at = mismatch.lookup((trace_of << _RANK_BITS) | ranks,
                    (trace_of[src] << _RANK_BITS) | np.clip(peer, 0, (1 << _RANK_BITS) - 1))
    ok = (peer >= 0) & (peer < 1 << 20) & (at >= 0)
    out_rows, src, dst = out_rows[ok], src[ok], at[ok]
    net = _busy(table[out_rows], F_NET_BUSY) / steps[out_rows]
    # the other end's flow: its step count (mismatch.step_mismatch) and its wait for data (proxy)
    rx = np.flatnonzero(recv)
    rx_at = mismatch.receiver_flow(dst, table[out_rows, F_CHANNEL], ranks[src], row[rx], table[rx, F_CHANNEL],
                              table[rx, F_PEER])
    known = rx_at >= 0
    expected = mismatch.receiver_steps(rx_at, table[rx, F_STEPS])
    sent_of, unsent = _unsent(table[out_rows[known]], table[rx[rx_at[known]]], src[known], steps[out_rows[known]],
                              len(refs))
    # per trace: its slice of each array, rank indices made local to the trace
    first = bounds[trace_of]  # per rank: the index of its trace's first rank
    gpu_at, src_at, dst_at, sent_at = (gpu_of - first[gpu_of], src - first[src], dst - first[src],
                                       sent_of - first[sent_of])
    channel = table[out_rows, F_CHANNEL]
    # where each trace's part starts in the per-rank, per-GPU, per-send-flow and per-sender arrays (send
    # flows come in rank order)
    r, g, f, p = (c.tolist() for c in (bounds, np.searchsorted(gpu_of, bounds), np.searchsorted(src, bounds),
                                       np.searchsorted(sent_of, bounds)))
    flow_steps = table[out_rows, F_STEPS]
    return [Measures(refs=refs[r[t]:r[t + 1]], ranks=ranks[r[t]:r[t + 1]], arrival=arrival[r[t]:r[t + 1]],
                     duration=duration[r[t]:r[t + 1]], end=max(ends[r[t]:r[t + 1]]),
                     gpu_of=gpu_at[g[t]:g[t + 1]], gpu=gpu[g[t]:g[t + 1]],
                     src=src_at[f[t]:f[t + 1]], dst=dst_at[f[t]:f[t + 1]], channel=channel[f[t]:f[t + 1]],
                     net=net[f[t]:f[t + 1]], sent_of=sent_at[p[t]:p[t + 1]], unsent=unsent[p[t]:p[t + 1]],
                     steps=flow_steps[f[t]:f[t + 1]], expected=expected[f[t]:f[t + 1]])
            for t in range(len(traces))]


def _arrivals(refs: list[SpanRef], table: np.ndarray, row: np.ndarray) -> np.ndarray:
    """Per rank, when it really started: its first step posted, else (no flow posted: NVLink, or nothing yet)
    its kernel's launch time, failing that its enqueue or API call time, failing that its span's start."""
    starts = table[:, F_START]
    posted = starts > 0
    arrival = np.full(len(refs), _NO_ARRIVAL, dtype=np.int64)
    np.minimum.at(arrival, row[posted], starts[posted])
    for i in np.flatnonzero(arrival == _NO_ARRIVAL).tolist():
        a = evidence_attributes(refs[i])
        t = next((a[k] for k in (sc.TIME_LAUNCH, sc.TIME_ENQUEUE, sc.TIME_API) if type(a.get(k)) is int and a[k] > 0),
                 refs[i].start_ns)
        arrival[i] = min(t, _NO_ARRIVAL - 1)
    return arrival


def _unsent(sends: np.ndarray, receives: np.ndarray, by: np.ndarray, steps: np.ndarray,
            nranks: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``proxy`` measure: per rank with send flows whose receiving end we know (``sends`` and their
    ``receives``, rows of the flow table), the credit wait per step (steps ready, SendPeerWait) beyond the
    time its receiver's GPU held the buffers (a slow or blocked receiver returns credit late), as far as the
    receiver's buffer was posted meanwhile (its RecvWait busy time): ready data neither end moved. An agent
    before peer_busy_ns exports none: its proxies read 0 (not named from this measure). A receiver that started
    after the sender (a late rank, or one whose other communicator held it back) had no buffer to give credit
    for until then: that part of the wait is the receiver's lateness (the ``late`` measure's), not the proxy's."""
    started = (sends[:, F_START] > 0) & (receives[:, F_START] > 0)
    not_there = np.where(started, np.maximum(receives[:, F_START] - sends[:, F_START], 0), 0)
    held = np.clip(sends[:, F_PEER_BUSY] - _busy(receives, F_GPU_BUSY) - not_there, 0.0,
                   _busy(receives, F_NET_BUSY))
    sent_of = np.flatnonzero(np.bincount(by, minlength=nranks))
    unsent = (np.bincount(by, weights=held, minlength=nranks)[sent_of]
              / np.bincount(by, weights=steps, minlength=nranks)[sent_of])
    return sent_of, unsent


def _busy(rows: np.ndarray, busy: int) -> np.ndarray:
    """The flows' busy times: the union of their steps' waits (their summed waits where the agent left the
    array out as equal to them, or an older agent did not export it: spans.flow_table)."""
    return rows[:, busy].astype(np.float64)


def _leave_one_out_medians(values: np.ndarray) -> np.ndarray:
    """Per element, the median of the others (one sort for all of them: the others' middle is the sorted
    array's middle shifted by one place on the side the element is taken from)."""
    n = len(values)
    order = np.argsort(values, kind="stable")
    s = values[order].astype(np.float64)
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)
    m = n - 1  # how many remain

    def kth(k: int) -> np.ndarray:  # the k-th smallest of the others, per element
        return np.where(pos > k, s[k], s[min(k + 1, n - 1)])

    if m % 2:
        return kth(m // 2)
    return (kth(m // 2 - 1) + kth(m // 2)) / 2


def _distinct_per_group(group: np.ndarray, value: np.ndarray, groups: int) -> np.ndarray:
    """Per group (``group`` holds each row's group, ranked 0..groups-1 in sorted order of its values), how
    many distinct ``value``s its rows hold."""
    order = np.lexsort((value, group))
    g, v = group[order], value[order]
    new = np.ones(len(g), dtype=bool)
    new[1:] = (g[1:] != g[:-1]) | (v[1:] != v[:-1])
    return np.add.reduceat(new.astype(np.int64), _run_starts(g)) if len(g) else np.zeros(groups, dtype=np.int64)


def _run_lengths(starts: np.ndarray, total: int) -> np.ndarray:
    """The length of each run that starts at ``starts`` (sorted, the first 0) in an array of ``total``
    (np.diff's ``append`` concatenates through its generic path: several times this on a few runs)."""
    out = np.empty(len(starts), dtype=np.int64)
    out[:-1] = starts[1:] - starts[:-1]
    out[-1:] = total - starts[-1:]
    return out


def _run_starts(ordered: np.ndarray) -> np.ndarray:
    """Where each run of equal values starts in a sorted array: np.unique's first indices, without the sort
    it would do again (a few times this work on a collective's hundred flows)."""
    new = np.empty(len(ordered), dtype=bool)
    new[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=new[1:])
    return np.flatnonzero(new)


@dataclass(slots=True)
class Evidence:
    """One collective's candidate values per measure: ``values[measure] = (units, values)``; a unit is a rank
    (int) or, for ``flow``, (sender, receiver, channel). ``late`` holds scores already (lateness as a share of
    the makespan); the others per-step waits in ns (larger = slower)."""

    values: dict[str, tuple[list, np.ndarray]]
    lateness_ns: int        # the last rank's start after the others' median start
    late_rank: int          # that rank (-1: fewer than 2 ranks)
    others_waited_ns: int   # the shortest time any other rank spent in the collective
    # per measure, the candidates' standardized scores in this collective (candidates.py fills it as it judges
    # them): what this collective says of a candidate, apart from the evidence it carries from others
    z: dict[str, np.ndarray] = field(default_factory=dict)
    # per measure, the candidates' evidence (Cusum or None, in units' order) as the test left it
    held: dict[str, list] = field(default_factory=dict)

    def units(self, measure: str) -> list:
        """The candidates this collective measured ``measure`` at (none: an empty list)."""
        got = self.values.get(measure)
        return [] if got is None else got[0]

    def value(self, measure: str, unit) -> float | None:
        """A candidate's value of ``measure`` in this collective; None where it was not measured."""
        units, values = self.values.get(measure, ((), None))
        try:
            return float(values[units.index(unit)])
        except ValueError:  # (not among the units: not measured)
            return None

    def score(self, measure: str, unit) -> float | None:
        """A candidate's standardized score of ``measure`` in this collective; None where it was not judged."""
        z = self.z.get(measure)
        units = self.units(measure)
        return float(z[units.index(unit)]) if z is not None and unit in units else None


def _crosses_hosts(m: Measures) -> np.ndarray:
    """Per send flow of ``m``, whether its two ends are on different hosts, or a host is not known (then it
    may)."""
    code: dict[str, int] = {}
    hosts = np.fromiter((code.setdefault(h, len(code)) if (h := ref.resource.host) else -1 for ref in m.refs),
                        dtype=np.int64, count=len(m.refs))
    hs, hd = hosts[m.src], hosts[m.dst]
    return (hs != hd) | (hs < 0)


def evidence(st: TraceState, m: Measures) -> Evidence:
    """The candidates' values of one collective."""
    ranks = m.ranks
    n = len(ranks)
    vals: dict[str, tuple[list, np.ndarray]] = {}
    if len(m.gpu):
        vals[GPU] = (ranks[m.gpu_of].tolist(), m.gpu)
    if len(m.net):
        s, d, ch = ranks[m.src], ranks[m.dst], m.channel
        vals[FLOW] = (list(zip(s.tolist(), d.tolist(), ch.tolist())), m.net)
        # a NIC carries a rank's traffic to other hosts only: flows between two GPUs of one host (NVLink, PCIe,
        # shared memory) are no NIC's evidence
        net = np.flatnonzero(_crosses_hosts(m))
        for name, side, other in ((NIC_SEND, m.src[net], m.dst[net]), (NIC_RECV, m.dst[net], m.src[net])):
            if not len(side):
                break
            order = np.argsort(side, kind="stable")
            ordered = side[order]
            first = _run_starts(ordered)
            keys, count = ordered[first], _run_lengths(first, len(ordered))
            many = count >= 2  # a NIC is all of a rank's flows: one flow alone is the flow measure
            if name == NIC_RECV:
                # flows into a rank from one sender only (a ring) read the same whether the sender's NIC or
                # the receiver's is slow: the sender is named (NIC_SEND), the receive side only when the
                # rank hears from several senders and all of them are slow
                many &= _distinct_per_group(side, other, len(keys)) >= 2
            if many.any():
                least = np.minimum.reduceat(m.net[net][order], first)
                vals[name] = (ranks[keys[many]].tolist(), least[many])
    if len(m.unsent):
        vals[PROXY] = (ranks[m.sent_of].tolist(), m.unsent)
    late_rank, lateness, waited = -1, 0, 0
    if n >= 2:
        last = int(np.argmax(m.arrival))
        rest = np.concatenate((m.arrival[:last], m.arrival[last + 1:]))  # (np.delete, without its checks)
        lateness = int(m.arrival[last] - median(rest))
        late_rank = int(ranks[last])
        waited = int(np.concatenate((m.duration[:last], m.duration[last + 1:])).min())
        if st.func not in P2P:
            # the share of the collective each rank's peers spent waiting for it to start: bounded, and
            # independent of how short the transfer after the last arrival was. A pair's "others" are its
            # one peer (a DP ring of two ranks across nodes): the later one reads its lag, the other 0. Not
            # a p2p transfer: a Recv posted before its Send waits for the upstream stage's compute
            makespan = max(1.0, float(m.end - int(m.arrival.min())))
            med = _leave_one_out_medians(m.arrival)
            vals[LATE] = (ranks.tolist(), np.maximum(0.0, m.arrival - med) / makespan)
    return Evidence(vals, lateness, late_rank, waited)


def straggler(st: TraceState, ev: Evidence, bar_ns: int) -> Finding | None:
    """A rank that started so late that every other rank waited >= ``bar_ns`` in the collective, most of it
    for that rank (it started after at least half of their wait), named from this one collective (Mycroft's
    straggler bar: a wait that long costs the job a second per rank, whatever caused it). The bar is on what
    the others spent, not on the lateness alone: a rank 1 s late behind peers that started a moment after its
    usual time is still everybody's 1 s wait; a long wait mostly after its arrival is a slow collective.
    Needs >= 3 ranks (a pair has no majority that waited: a late start there is often the pair waiting in
    turn for a straggler of another communicator). Not in a p2p transfer: a Recv
    posted before its Send waits for the sender's compute (a pipeline stage's upstream work), which is the
    dependency at work, not a late rank."""
    if st.func in P2P or len(st.op) < 3 or ev.late_rank < 0 or ev.others_waited_ns < bar_ns or \
            2 * ev.lateness_ns < ev.others_waited_ns:
        return None
    r = ev.late_rank
    return Finding(kind=sc.KIND_SLOWDOWN, category=sc.CAT_LATE_RANK, ranks=[r], confidence=0.9,
                   evidence=(f"rank {r} started {st.func} {st.seq} {ev.lateness_ns / 1e6:.0f} ms after the others, "
                             f"who all waited for it (>= {ev.others_waited_ns / 1e6:.0f} ms)"),
                   onset_ns=0, reason="straggler")


def check_mismatch(st: TraceState, m: Measures,
                   earlier: Callable[[], Iterable[TraceState]] | None = None) -> Finding | None:
    """Ranks that called different collectives at this number, or connections whose two ends announce
    different step counts (mismatch.py): named at once, slowdown or not. ``earlier``: the communicator's
    collectives before it (mismatch.check_mismatch)."""
    mm = mismatch.check_mismatch(st, earlier)
    if mm is None and st.op:
        mm = mismatch.step_mismatch(st, m.ranks[m.src], m.ranks[m.dst], m.channel, m.steps, m.expected)
    if mm is not None:
        decorate(st, build_views(st), mm)
    return mm
