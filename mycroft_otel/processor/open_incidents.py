"""Open incidents: which jobs have an incident that still holds, for the page that must stay up until it ends.

A verdict is emitted once (incidents.py); a page has to last as long as the fault. One :class:`OpenIncident`
per job: it opens with the job's first verdict and every later verdict of that job joins it (one page per
incident, secondary verdicts inside it). Its face (kind, category, culprit) is its most severe open member:
a hang named during a slowdown takes the page over. A member stays open while its evidence persists:

- hang: until the job moves again: a collective of the hung communicator at or after the hung one
  completes after the verdict (the fault cleared in place), or a culprit process completes collectives in
  a communicator it was not in when the verdict was made (the job restarted, as torchrun does, under the
  same job id). A hung job keeps sending in-flight snapshots (every MYCROFT_SNAPSHOT_MS), so a hang does
  not age out while the job hangs;
- slowdown: until no finding of it (its verdict, or one attributed to it) for ``quiet_s``: a slowdown has
  no single event that ends it, and the agents stop flagging once their baselines learn a lasting one.

The whole incident closes when every member closed, or when the job sent nothing for ``quiet_s`` (it was
stopped; nobody is left to recover). Jobs come from the network, so at most :data:`MAX_OPEN` incidents are
open at once; a verdict beyond that opens nothing and is counted (``refused``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Protocol

from mycroft_otel import semconv as sc
from mycroft_otel.processor.spans import OP, SUMMARY, SpanRef
from mycroft_otel.processor.state import ProcKey, TraceStore, proc_key

log = logging.getLogger("mycroft_otel.processor")

MAX_OPEN = 256  # open incidents per processor (each is two Prometheus series)
_SEVERITY = {sc.KIND_HANG: 0, sc.KIND_SLOWDOWN: 1}  # the face of an incident: lowest first


@dataclass
class Member:
    """One verdict of an incident, and what ends it."""

    trace_id: bytes
    kind: str
    category: str
    comm: str
    seq: int
    detected_ns: int
    opened: float                      # incident clock
    touched: float                     # incident clock: its latest finding
    global_ranks: tuple[int, ...]
    ranks: tuple[int, ...]             # in the communicator
    hosts: tuple[str, ...]
    evidence: str
    confidence: float = 0.0
    procs: frozenset = frozenset()     # culprit processes (ProcKey)
    known_comms: frozenset = frozenset()  # communicators the culprit processes were in at the verdict
    closed: bool = False

    def culprit_label(self) -> str:
        """Global ranks as torchrun logs them; the communicator's own ranks, said so, when RANK is unknown."""
        if self.global_ranks:
            return ",".join(map(str, self.global_ranks))
        return "comm " + ",".join(map(str, self.ranks)) if self.ranks else ""


@dataclass
class OpenIncident:
    job: str
    members: list[Member] = field(default_factory=list)
    heard: float = 0.0                 # incident clock: the job's latest span
    shown: Member | None = None        # the face the sink shows

    def face(self) -> Member:
        """The member the page shows: the most severe open one, the earliest among equals."""
        live = [m for m in self.members if not m.closed] or self.members
        return min(live, key=lambda m: (_SEVERITY.get(m.kind, 2), m.opened))

    @property
    def verdicts(self) -> int:
        return len(self.members)


@dataclass(frozen=True)
class PageLinks:
    """What a page links to: the face's trace in the trace UI and its category's section of the runbook;
    '' where none is configured."""

    trace_url: str = ""
    runbook_url: str = ""


class IncidentSink(Protocol):
    """Where the open incidents are shown (metrics.py's gauges)."""

    def incident_shown(self, inc: OpenIncident, face: Member, links: PageLinks) -> None:
        """The job's incident is open with this face (replacing any face shown before)."""

    def incident_closed(self, job: str) -> None:
        """The job's incident closed."""


def trace_link(template: str, trace_id: str) -> str:
    """The trace's page in the trace UI: ``template`` with ``{trace_id}`` replaced (Grafana Explore, any UI),
    else a base URL that Jaeger's ``/trace/<id>`` is appended to; '' when no UI is configured."""
    if not template:
        return ""
    if "{trace_id}" in template:
        return template.replace("{trace_id}", trace_id)
    return f"{template.rstrip('/')}/trace/{trace_id}"


def runbook_link(base: str, category: str) -> str:
    """The category's section of the runbook at ``base`` (its headings are the categories); '' for no
    runbook."""
    return f"{base.partition('#')[0]}#{category}" if base else ""


class OpenIncidents:
    """The open incidents of one processor, by job. Not thread-safe: the processor calls it under its lock."""

    def __init__(self, store: TraceStore, quiet_s: float, trace_ui_url: str = "", runbook_url: str = "",
                 sink: IncidentSink | None = None, clock: Callable[[], float] = time.monotonic):
        self.store = store
        self.quiet_s = quiet_s
        self.trace_ui_url = trace_ui_url  # trace_link's template
        self.runbook_url = runbook_url    # runbook_link's base
        self.sink = sink
        self.clock = clock
        self.by_job: dict[str, OpenIncident] = {}
        self._by_trace: dict[bytes, OpenIncident] = {}
        self.refused = 0   # verdicts that found MAX_OPEN incidents open
        self.closed = 0

    def __bool__(self) -> bool:
        return bool(self.by_job)

    def restore(self, by_job: dict[str, OpenIncident]) -> None:
        """The open incidents of a checkpoint (checkpoint.py), shown again (a restarted processor's page)."""
        for inc in list(by_job.values())[:MAX_OPEN]:
            self.by_job[inc.job] = inc
            for m in inc.members:
                self._by_trace[m.trace_id] = inc
            inc.shown = None  # not shown by this process yet
            self._show(inc)

    # -- verdicts and findings -------------------------------------------------------------------
    def verdict(self, v) -> None:
        """A verdict was published: it opens its job's incident, or joins it."""
        f = v.finding
        now = self.clock()
        known = self._by_trace.get(v.trace_id)
        if known is not None and any(m.trace_id == v.trace_id for m in known.members):
            self.touch(v.trace_id)  # named again (a restarted processor): the same member, still open
            return
        m = Member(trace_id=v.trace_id, kind=f.kind, category=f.category, comm=v.comm, seq=v.seq,
                   detected_ns=v.detected_ns, opened=now, touched=now, global_ranks=tuple(f.global_ranks),
                   ranks=tuple(f.ranks), hosts=tuple(f.hosts), evidence=f.evidence,
                   confidence=float(f.confidence))
        if f.kind == sc.KIND_HANG:  # (one pass over the process index per hang verdict: verdicts are rare)
            m.procs = frozenset(p for p in (self.store.proc_of.get((v.comm, r)) for r in f.ranks) if p is not None)
            m.known_comms = frozenset(c for (c, _), p in self.store.proc_of.items() if p in m.procs)
        inc = self.by_job.get(f.job)
        if inc is None:
            if len(self.by_job) >= MAX_OPEN:
                self.refused += 1
                log.warning("%d incidents open: job %r's verdict opens no page", MAX_OPEN, f.job)
                return
            inc = self.by_job[f.job] = OpenIncident(f.job, heard=now)
        inc.members.append(m)
        self._by_trace[v.trace_id] = inc
        self._show(inc)

    def touch(self, trace_id: bytes) -> None:
        """A finding attributed to the incident of ``trace_id``: its evidence persists."""
        inc = self._by_trace.get(trace_id)
        if inc is not None:
            now = self.clock()
            for m in inc.members:
                if m.trace_id == trace_id:
                    m.touched = now

    # -- the jobs' spans ---------------------------------------------------------------------------
    def heard(self, refs: Iterable[SpanRef]) -> None:
        """Spans received: the job is alive, and a completed collective may show that a hang ended."""
        now = self.clock()
        hangs_of: dict[str, _OpenHangs] = {}  # job -> its incident's hangs open when the request came
        for ref in refs:
            inc = self.by_job.get(ref.resource.job)
            if inc is None:
                continue
            inc.heard = now
            if ref.kind != OP and ref.kind != SUMMARY:
                continue
            open_hangs = hangs_of.get(inc.job)
            if open_hangs is None:
                open_hangs = hangs_of[inc.job] = _OpenHangs.of(inc)
            if not open_hangs.members:
                continue
            # no hang's communicator and no culprit's process: _moves is False for each (a span from another
            # host than the culprits' is from none of their processes: most of a job's spans, let go before
            # their process key is built)
            in_comm = ref.comm in open_hangs.comms
            if not in_comm and ref.resource.host not in open_hangs.hosts:
                continue
            proc = proc_key(ref)
            if not in_comm and proc not in open_hangs.procs:
                continue
            changed = False
            for m in open_hangs.members:
                if not m.closed and _moves(m, ref, proc):
                    m.closed = changed = True
                    log.warning("incident of job %r: the hang in comm %s #%d is over (%s %s of rank %d)",
                                inc.job, m.comm, m.seq, ref.kind, ref.comm, ref.rank)
            if changed:
                self._settle(inc)

    def expire(self) -> None:
        """Close the slowdowns quiet for ``quiet_s``, and the incidents of jobs silent that long."""
        now = self.clock()
        for inc in list(self.by_job.values()):
            if now - inc.heard >= self.quiet_s:
                log.warning("incident of job %r closed: no span of the job for %.0f s", inc.job, now - inc.heard)
                for m in inc.members:
                    m.closed = True
                self._settle(inc)
                continue
            changed = False
            for m in inc.members:
                if not m.closed and m.kind != sc.KIND_HANG and now - m.touched >= self.quiet_s:
                    m.closed = changed = True
            if changed:
                self._settle(inc)

    # -- internals ---------------------------------------------------------------------------------
    def _settle(self, inc: OpenIncident) -> None:
        """After members closed: the incident closes, or shows its next open member."""
        if all(m.closed for m in inc.members):
            del self.by_job[inc.job]
            for m in inc.members:
                self._by_trace.pop(m.trace_id, None)
            self.closed += 1
            if self.sink is not None:
                self.sink.incident_closed(inc.job)
            return
        self._show(inc)

    def _show(self, inc: OpenIncident) -> None:
        """Show the incident's face; it changes when a more severe verdict joins or the one shown closed (the
        alert's labels then change: Alertmanager groups both under the job)."""
        face = inc.face()
        if face is inc.shown:
            return
        inc.shown = face
        if self.sink is not None:
            self.sink.incident_shown(inc, face, PageLinks(trace_link(self.trace_ui_url, face.trace_id.hex()),
                                                          runbook_link(self.runbook_url, face.category)))


@dataclass(slots=True)
class _OpenHangs:
    """An incident's open hangs, and the communicators and culprit processes a span must be in to end one."""

    members: list[Member]
    comms: frozenset
    procs: frozenset
    hosts: frozenset = frozenset()  # the culprit processes' hosts (a ProcKey's first item)

    @classmethod
    def of(cls, inc: OpenIncident) -> "_OpenHangs":
        hangs = [m for m in inc.members if not m.closed and m.kind == sc.KIND_HANG]
        procs = frozenset().union(*(m.procs for m in hangs))
        return cls(hangs, frozenset(m.comm for m in hangs), procs,
                   frozenset(p[0] for p in procs if isinstance(p, tuple) and p))


def _moves(m: Member, ref: SpanRef, proc: ProcKey | None) -> bool:
    """This completed collective (op span) or window of them (summary span: sent only when the window
    completed some) shows the hung job moving."""
    if ref.kind == OP and ref.comm == m.comm and ref.seq >= m.seq and ref.end_ns > m.detected_ns:
        return True
    # a culprit process at work after the verdict, in a communicator it was not in: a restarted job. Both
    # conditions: a summary closing after the verdict may count collectives from before the hang, and a
    # process hung in one communicator may still finish collectives of another one on another stream
    return (proc is not None and proc in m.procs and ref.start_ns > m.detected_ns
            and ref.comm not in m.known_comms)
