"""What the analysis reads of one trace and what it concludes: each rank's view, and the Finding.

A :class:`RankView` is one rank's evidence in a collective's trace (its op span, latest in-flight snapshot or
status), decoded lazily; a :class:`Finding` is a conclusion about the trace (hang or slowdown, category,
culprit), decorated with the culprit's and the evidence's span ids, global ranks and hosts before it becomes a
verdict (incidents.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mycroft_otel import semconv as sc
from mycroft_otel.processor.spans import Flow, SpanRef, evidence_attributes, flows_by_span, flows_of
from mycroft_otel.processor.state import TraceState

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

    def __init__(self, rank: int, state: str, ref: SpanRef | None, flows: list[Flow] | None = None,
                 attrs: dict | None = None):
        """``flows``, ``attrs``: already decoded (a reader that holds them in another form, e.g. the report);
        else decoded from ``ref`` on first use."""
        self.rank, self.state, self.ref = rank, state, ref
        self.host = ref.resource.host if ref is not None else ""
        self.global_rank = ref.global_rank if ref is not None else -1
        self._attrs: dict | None = attrs
        self._flows: list[Flow] | None = flows

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

    @property
    def kernel_started(self) -> bool:
        """Whether the rank's GPU started the collective's kernel on any channel (a KernelCh event: NCCL starts
        it when the GPU's own work counter says the channel began)."""
        kc = self.attrs.get(sc.KERNEL_CHANNELS)
        if kc is None:  # left out as the whole: every channel NCCL used started and stopped
            return int(self.attrs.get(sc.COLL_NCHANNELS) or 0) > 0
        return bool(kc) and int(kc[0]) > 0

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


def ranks_text(rs: list[int]) -> str:
    """Up to 8 ranks for an evidence sentence, and how many more."""
    return ", ".join(str(r) for r in rs[:8]) + (f" (+{len(rs) - 8})" if len(rs) > 8 else "")
