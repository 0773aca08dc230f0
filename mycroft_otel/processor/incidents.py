"""Incidents: which findings become root-cause spans, one per incident, and the verdict they carry.

A finding is owned by the module that makes it (rca.py for hangs, detector.py for slowdowns, mismatch.py); here it is
completed with who the culprit is (job, global ranks, hosts from other traces of the communicator) and
either emitted as a :class:`Verdict` or attributed to an incident already named:

- one verdict per trace (its root-cause span id is deterministic: a replayed input makes no second one);
- a hang whose culprit processes a live hang verdict already named is that incident (a dead host seen from
  each of its communicators);
- one slowdown incident per culprit process: a slow GPU shows in every communicator of its process; and
  per host for late ranks and idle proxies: the host's other ranks wait for the culprit in their intra-node
  collectives, so they start late next (a symptom); likewise a slow flow into or out of a named culprit
  (a slow GPU drains the flows into it), and a slow GPU at the receiving end of a named slow flow (its
  kernel queues behind the collective the flow delays);
- a weak hang reading (a cycle nobody explains) in a communicator a named slowdown is slowing right now.
Jobs never merge: every key carries the job id.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from mycroft_otel import ids
from mycroft_otel import semconv as sc
from mycroft_otel.processor.views import Finding
from mycroft_otel.processor.state import TraceState, TraceStore

_KEPT = 4096  # incidents remembered per table (oldest forgotten first)
MAX_VERDICTS = 4096  # verdicts kept in Incidents.verdicts (the latest; each was published when made)


@dataclass
class Verdict:
    """One incident's root cause, as the root-cause span carries it."""

    trace_id: bytes
    span_id: bytes
    comm: str
    seq: int
    func: str
    finding: Finding
    detected_ns: int
    analysis_s: float

    @property
    def kind(self) -> str:
        return self.finding.kind

    @property
    def category(self) -> str:
        return self.finding.category

    def attributes(self) -> dict:
        f = self.finding
        a = {
            sc.RCA_KIND: f.kind, sc.RCA_CATEGORY: f.category, sc.RCA_CULPRIT_RANKS: list(f.ranks),
            sc.RCA_CONFIDENCE: float(f.confidence), sc.RCA_EVIDENCE: f.evidence, sc.RCA_ONSET: int(f.onset_ns),
            sc.RCA_DETECTED: int(self.detected_ns), sc.COMM_HASH: self.comm, sc.COLL_SEQ: int(self.seq),
            sc.COLL_FUNC: self.func, sc.RCA_TRACE_ID: self.trace_id.hex(),
        }
        if f.global_ranks:
            a[sc.RCA_CULPRIT_GLOBAL_RANKS] = list(f.global_ranks)
        if f.hosts:
            a[sc.RCA_CULPRIT_HOSTS] = list(f.hosts)
        if f.channel is not None:
            a[sc.RCA_CULPRIT_CHANNEL] = int(f.channel)
        if f.peer is not None:
            a[sc.RCA_CULPRIT_PEER] = int(f.peer)
        if f.hypothesis:
            a[sc.RCA_HYPOTHESIS] = f.hypothesis
            a[sc.RCA_RUNNER_UP] = f.runner_up
        if f.margin is not None:
            a[sc.RCA_MARGIN] = float(f.margin)
        return a

    def summary(self) -> str:
        f = self.finding
        where = f"rank{'s' if len(f.ranks) > 1 else ''} {', '.join(map(str, f.ranks))}"
        if f.global_ranks:  # the numbers torchrun and the job's logs use
            where += f" (global {', '.join(map(str, f.global_ranks))})"
        if f.hosts:
            where += f" on {', '.join(f.hosts)}"
        if f.channel is not None:
            where += f", channel {f.channel} -> peer {f.peer}"
        return (f"{f.kind}/{f.category} at {where} ({self.func} #{self.seq}, comm {self.comm}, "
                f"confidence {f.confidence:.2f}): {f.evidence}")


def hang_identity(f: Finding) -> set:
    """The processes a hang verdict blames: (job, host, global rank); a dead process blames its whole host."""
    out = {(f.job, h, g) for g in f.global_ranks for h in (f.hosts or [""])}
    if f.category == sc.CAT_PROCESS_EXITED or f.reason == "stopped":
        out |= {(f.job, h, "*") for h in f.hosts}
    return out


def culprit(comm: str, global_ranks: list[int], ranks: list[int]) -> tuple:
    """Who a slowdown names: its processes' global ranks, else the communicator's ranks."""
    return tuple(global_ranks) or (comm, tuple(ranks))


def _trim(d: dict) -> None:
    while len(d) > _KEPT:
        d.pop(next(iter(d)))


class Incidents:
    """The live incidents of one processor (per job), and the verdicts emitted."""

    def __init__(self, store: TraceStore, window_s: float):
        self.store = store
        self.window_s = window_s
        self.verdicts: deque[Verdict] = deque(maxlen=MAX_VERDICTS)  # the latest (each was published when made)
        self._named: dict[tuple, tuple[float, bytes]] = {}            # incident key -> (mono, trace id)
        self._hang_culprits: list[tuple[float, bytes, set]] = []      # (mono, trace id, hang_identity)
        self._slow_hosts: list[tuple[float, bytes, str, set]] = []    # (mono, trace id, job, hosts)
        self._slow_comms: dict[tuple, tuple[float, bytes]] = {}       # (job, comm) -> its slowdown verdict
        self._flow_ends: dict[tuple, tuple[float, bytes]] = {}        # (job, comm, receiver) of a named slow flow
        self._hung_comms: dict[tuple, tuple[float, bytes]] = {}       # (job, comm) -> its hang verdict

    def expire(self, mono: float) -> None:
        for k, (t, _) in list(self._named.items()):
            if mono - t > self.window_s:
                del self._named[k]

    def hang_since(self, job: str, since: float) -> bytes | None:
        """A hang of this job named at or after ``since`` (monotonic), if any."""
        return next((tid for t, tid, who in reversed(self._hang_culprits)
                     if t >= since and any(j == job for j, _, _ in who)), None)

    def fill_identity(self, st: TraceState, f: Finding) -> None:
        """The job, and the global ranks and hosts of culprits that sent nothing in this trace (from other
        traces of the communicator)."""
        f.job = f.job or st.job
        if len(f.global_ranks) == len(f.ranks) and f.hosts:
            return
        g, hosts = [], list(f.hosts)
        for r in f.ranks:
            key = self.store.proc_of.get((st.comm, r))
            if key is not None:
                if key[1] == "g":
                    g.append(key[2])
                if key[0] and key[0] not in hosts:
                    hosts.append(key[0])
        if len(g) == len(f.ranks):
            f.global_ranks = g
        f.hosts = hosts

    def slowdown_of(self, job: str, comm: str, ranks: list[int], mono: float) -> bytes | None:
        """The live slowdown incident whose culprit process is one of these ranks of the communicator."""
        for r in ranks:
            proc = self.store.proc_of.get((comm, r))
            known = [proc[2]] if proc is not None and proc[1] == "g" else []
            for who in {culprit(comm, known, [r]), culprit(comm, [], [r])}:
                hit = self._named.get((sc.KIND_SLOWDOWN, job, who))
                if hit is not None and mono - hit[0] <= self.window_s:
                    return hit[1]
        return None

    def _explained(self, st: TraceState, f: Finding, mono: float) -> tuple[bytes | None, tuple]:
        """(the incident that already explains this finding or None, the finding's incident key)."""
        if f.kind == sc.KIND_HANG:
            mine = hang_identity(f)
            for t, tid, procs in self._hang_culprits:
                if mono - t <= self.window_s and (mine & procs or any((j, h, "*") in procs for j, h, _ in mine)):
                    return tid, ()
            # NCCL runs a communicator's collectives in order on every rank: while a named one is hung, a later
            # one is queued behind it (its CPU enqueued it, its kernel waits on the stream) and an earlier one's
            # snapshots are stale. Either is the same incident, whatever its partial evidence names -- a
            # processor restored from its checkpoint hears them in any order before the named one's again.
            hung = self._hung_comms.get((f.job, st.comm))
            if hung is not None and hung[1] != st.trace_id and mono - hung[0] <= self.window_s:
                named = self.store.get(hung[1])
                if named is None or not named.complete():
                    return hung[1], ()
            slow = self._slow_comms.get((f.job, st.comm))
            if f.confidence < 0.5 and slow is not None and mono - slow[0] <= self.window_s:
                return slow[1], ()
        if f.kind == sc.KIND_SLOWDOWN and f.category != sc.CAT_COLL_MISMATCH:
            # a flow into or out of a named culprit, a proxy read idle beside one: its symptoms
            near = [f.peer] if f.peer is not None else []
            if f.category == sc.CAT_SLOW_PROXY:
                near = list(st.op)
            hit = self.slowdown_of(f.job, st.comm, near, mono)
            if hit is None and f.category == sc.CAT_SLOW_GPU:
                # the receiver of a named slow flow: its kernel queues behind the collective the flow delays,
                # so its other channels show GPU waits
                end = self._flow_ends.get((f.job, st.comm, f.ranks[0])) if f.ranks else None
                hit = end[1] if end is not None and mono - end[0] <= self.window_s else None
            if hit is not None:
                return hit, ()
            # the host's other ranks wait for a named culprit in their intra-node collectives, so they start
            # late and their sends read idle: symptoms (direct evidence, a GPU or a flow, is its own fault)
            for t, tid, job, hosts in self._slow_hosts if f.category in (sc.CAT_LATE_RANK, sc.CAT_SLOW_PROXY) else ():
                if mono - t <= self.window_s and job == f.job and hosts & set(f.hosts):
                    return tid, ()
            key = (f.kind, f.job, culprit(st.comm, f.global_ranks, f.ranks))
        else:
            key = (f.kind, f.category, st.comm, tuple(f.ranks), f.channel)
        prev = self._named.get(key)
        if prev is not None and mono - prev[0] <= self.window_s:
            self._named[key] = (mono, prev[1])
            return prev[1], key
        return None, key

    def emit(self, st: TraceState, f: Finding, now_ns: int, mono: float, analysis_s: float) -> Verdict | None:
        """The verdict for this finding, or None when a named incident explains it (``st.explained_by``)."""
        self.fill_identity(st, f)
        same, key = self._explained(st, f, mono)
        if same is not None and same != st.trace_id:
            st.explained_by = same
            return None
        # (this very collective named before: a processor restored from its checkpoint finds a hang in flight
        # again; the verdict stands for it again, so the waits on it are explained, and `published` keeps
        # its root-cause span from being sent twice)
        tid = int.from_bytes(st.trace_id, "big")
        v = Verdict(trace_id=st.trace_id, span_id=ids.span_id(tid, -1, sc.ROLE_ROOT_CAUSE, 0).to_bytes(8, "big"),
                    comm=st.comm, seq=st.seq, func=st.func, finding=f, detected_ns=now_ns, analysis_s=analysis_s)
        if f.onset_ns <= 0 or f.onset_ns > now_ns:
            f.onset_ns = min(now_ns, st.stopped_ns or now_ns)
        st.verdict = v
        self._named[key] = (mono, st.trace_id)
        _trim(self._named)
        if f.kind == sc.KIND_HANG:
            self._hang_culprits.append((mono, st.trace_id, hang_identity(f)))
            del self._hang_culprits[:-256]
            self._hung_comms[(f.job, st.comm)] = (mono, st.trace_id)
            _trim(self._hung_comms)
        elif f.category != sc.CAT_COLL_MISMATCH:
            if f.hosts:
                self._slow_hosts.append((mono, st.trace_id, f.job, set(f.hosts)))
                del self._slow_hosts[:-256]
            self._slow_comms[(f.job, st.comm)] = (mono, st.trace_id)
            _trim(self._slow_comms)
            if f.category == sc.CAT_SLOW_FLOW and f.peer is not None:
                self._flow_ends[(f.job, st.comm, f.peer)] = (mono, st.trace_id)
                _trim(self._flow_ends)
        self.verdicts.append(v)
        return v
