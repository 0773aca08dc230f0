"""What a recorded run says, arranged for the report: verdicts, collective traces, wait chains.

Works from spans alone (docs/span-schema.md), like the processor, but only to *show* evidence:
the verdict is the processor's ``mycroft.root_cause`` span; the wait chain drawn here is the
same walk (follow each rank to the peer it waits on until a rank whose wait no peer explains)
recomputed from the latest evidence of every rank, so a reader can check the verdict by eye.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mycroft_otel import ids
from mycroft_otel import semconv as sc
from mycroft_otel.report.otlp_json import Problem, Span

#: Largest communicator the report believes. NCCL communicators of the largest jobs reach tens of
#: thousands of ranks; a span claiming more (or a rank beyond it) is hostile or corrupt, and
#: believing it would make the pictures iterate over billions of absent ranks.
MAX_RANKS = 1 << 20
#: Flows read from one span (NCCL runs at most MAXCHANNELS=64 channels, two directions, a few peers).
MAX_FLOWS_PER_SPAN = 4096
#: Span attributes that must be integers for the pictures to place them (rank, counts, times).
_INT_ATTRS = (sc.RANK, sc.GLOBAL_RANK, sc.COMM_NRANKS, sc.SNAPSHOT_SEQ, sc.TIME_API, sc.TIME_END,
              sc.RCA_ONSET, sc.RCA_DETECTED, sc.RCA_CULPRIT_CHANNEL, sc.RCA_CULPRIT_PEER)
#: Nanosecond times beyond this (year ~2262, int64) cannot come from a clock.
_MAX_NS = (1 << 63) - 1

# Waits explained by a peer: the data (recv) or a free buffer (send) has not come from it yet.
_PEER_WAITS = {"RecvWait": "waits for data", "SendPeerWait": "waits for the peer's buffer"}
_SELF_WAITS = {"SendGpuWait": "its GPU has not produced the data", "RecvGpuWait": "its GPU does not consume",
               "RecvFlushWait": "flush (network/PCIe) not done", "SendWait": "sent data not completed by the NIC"}


@dataclass
class Flow:
    channel: int
    direction: str
    peer: int
    steps: int
    posted: int
    ready: int
    transmitted: int
    done: int
    wait_state: str
    start_ns: int = 0
    end_ns: int = 0          # 0 while the flow runs
    bytes: int = 0
    last_progress_ns: int = 0

    @property
    def unfinished(self) -> bool:
        return self.steps > 0 and self.done < self.steps or bool(self.wait_state)


def flows_of(span: Span) -> list[Flow]:
    a = span.attrs
    ch = a.get(sc.FLOW_CHANNEL) or []
    n = len(ch) if isinstance(ch, list) else 0

    def col(key, default):
        v = a.get(key)
        if v is not None and key in sc.FLOW_OFFSETS:
            v = [sc.flow_time(x, span.start_ns) if type(x) is int else default for x in v] if isinstance(v, list) \
                else None
        if v is None and key in sc.FLOW_ABSOLUTE:  # an older agent's times
            v = a.get(sc.FLOW_ABSOLUTE[key])
        if v is None and key in sc.FLOW_SAME_AS:  # left out as equal to that array
            return col(sc.FLOW_SAME_AS[key], default)
        return [v[i] if isinstance(v, list) and i < len(v) else default for i in range(n)]
    cols = [col(sc.FLOW_DIRECTION, "?"), col(sc.FLOW_PEER, -1), col(sc.FLOW_STEPS, 0), col(sc.FLOW_POSTED, 0),
            col(sc.FLOW_READY, 0), col(sc.FLOW_TRANSMITTED, 0), col(sc.FLOW_DONE, 0), col(sc.FLOW_WAIT_STATE, ""),
            col(sc.FLOW_START, 0), col(sc.FLOW_END, 0), col(sc.FLOW_BYTES, 0), col(sc.FLOW_LAST_PROGRESS, 0)]
    out = []
    for i in range(min(n, MAX_FLOWS_PER_SPAN)):
        try:
            out.append(Flow(int(ch[i]), str(cols[0][i]), int(cols[1][i]), int(cols[2][i]), int(cols[3][i]),
                            int(cols[4][i]), int(cols[5][i]), int(cols[6][i]), str(cols[7][i] or ""),
                            int(cols[8][i] or 0), int(cols[9][i] or 0), int(cols[10][i] or 0),
                            int(cols[11][i] or 0)))
        except (TypeError, ValueError, OverflowError):
            continue
    return out


@dataclass
class RankView:
    rank: int
    op: Span | None = None
    snapshots: list[Span] = field(default_factory=list)   # in-flight, by snapshot number
    statuses: list[Span] = field(default_factory=list)
    # process-exited statuses that are no evidence: the job's own end, or an exit outside the collective
    # (after completing it, or while nobody was in it); see _sort_exits
    ended: list[Span] = field(default_factory=list)

    @property
    def latest(self) -> Span | None:
        if self.op is not None:
            return self.op
        if self.snapshots:
            return self.snapshots[-1]
        return self.statuses[-1] if self.statuses else None

    @property
    def status_kind(self) -> str:
        kinds = [str(s.attrs.get(sc.STATUS_KIND, "")) for s in self.statuses]
        return sc.STATUS_PROCESS_EXITED if sc.STATUS_PROCESS_EXITED in kinds else (kinds[-1] if kinds else "")

    def attr(self, key, default=None):
        for s in ([self.op] if self.op else []) + self.snapshots[::-1] + self.statuses[::-1] + self.ended:
            if key in s.attrs:
                return s.attrs[key]
        return default


@dataclass
class Verdict:
    span: Span

    @property
    def a(self) -> dict:
        return self.span.attrs

    @property
    def category(self) -> str:
        return str(self.a.get(sc.RCA_CATEGORY, "?"))

    @property
    def kind(self) -> str:
        return str(self.a.get(sc.RCA_KIND, "?"))

    @property
    def ranks(self) -> list[int]:
        v = self.a.get(sc.RCA_CULPRIT_RANKS)
        return [x for x in (v if isinstance(v, list) else [])
                if isinstance(x, int) and not isinstance(x, bool) and 0 <= x < MAX_RANKS]

    @property
    def onset_ns(self) -> int:
        return int(self.a.get(sc.RCA_ONSET) or 0)

    @property
    def detected_ns(self) -> int:
        return int(self.a.get(sc.RCA_DETECTED) or self.span.end_ns or 0)

    @property
    def latency_s(self) -> float | None:
        return (self.detected_ns - self.onset_ns) / 1e9 if self.onset_ns > 0 and self.detected_ns else None

    def linked(self, role: str) -> list[str]:
        return [sid for _t, sid, la in self.span.links if la.get(sc.LINK_ROLE) == role]


_RESOLVE_RANKS = 1 << 14   # absent ranks searched when naming a link target (one hash each)


@dataclass
class Hop:
    rank: int
    via: str = ""          # how it waits on the next rank: "ch0 recv RecvWait"
    why: str = ""          # for the last hop: why the walk stops here


@dataclass
class CollTrace:
    trace_id: str
    ranks: dict[int, RankView] = field(default_factory=dict)
    verdicts: list[Verdict] = field(default_factory=list)
    by_span_id: dict[str, tuple[int, str]] = field(default_factory=dict)  # span id -> (rank, label)
    _op_ids: dict[str, int] | None = field(default=None, repr=False)     # op span id -> rank (resolve)

    def attr(self, key, default=None):
        for rv in self.ranks.values():
            v = rv.attr(key)
            if v is not None:
                return v
        for v in self.verdicts:
            if key in v.a:
                return v.a[key]
        return default

    @property
    def nranks(self) -> int:
        n = [rv.attr(sc.COMM_NRANKS) or 0 for rv in self.ranks.values()]   # ints <= MAX_RANKS (build)
        return max(n + [max(self.ranks) + 1 if self.ranks else 0])

    @property
    def func(self) -> str:
        return str(self.attr(sc.COLL_FUNC, "") or "collective")

    @property
    def seq(self):
        return self.attr(sc.COLL_SEQ, "?")

    @property
    def comm(self) -> str:
        return str(self.attr(sc.COMM_HASH, "?"))

    @property
    def state(self) -> str:
        if any(rv.status_kind == sc.STATUS_PROCESS_EXITED for rv in self.ranks.values()):
            return "process exited"
        if any(rv.op is None and rv.snapshots for rv in self.ranks.values()):
            return "in flight"
        if any(rv.op is None and rv.statuses for rv in self.ranks.values()):
            return "rank(s) not entered"
        if all(rv.op is None for rv in self.ranks.values()):
            return "never started: the job ended"
        anomalies = {str(rv.op.attrs.get(sc.ANOMALY)) for rv in self.ranks.values()
                     if rv.op is not None and rv.op.attrs.get(sc.ANOMALY)}
        return "completed" + (f" ({', '.join(sorted(anomalies))})" if anomalies else "")

    @property
    def job_ended(self) -> int:
        """Ranks whose processes ended with the job (or outside this collective): no evidence here."""
        return sum(1 for rv in self.ranks.values() if rv.ended)

    @property
    def interest(self) -> int:
        """Sort key: verdicts first, then hangs, then anomalies."""
        s = self.state
        if s.startswith("never started"):
            return 100 if self.verdicts else 0
        return (100 if self.verdicts else 0) + (10 if not s.startswith("completed") else 0) + \
            (1 if "(" in s else 0)

    def resolve(self, span_id: str) -> tuple[int | None, str, bool]:
        """(rank, what, arrived) of a linked span id; op ids of absent spans are recomputed."""
        if span_id in self.by_span_id:
            r, label = self.by_span_id[span_id]
            return r, label, True
        r = self._op_span_ids().get(span_id)
        if r is not None:
            return r, "op span", False
        return None, "unknown span", False

    def _op_span_ids(self) -> dict[str, int]:
        """The op span id of each culprit and of the communicator's ranks up to a bound, hashed once per
        trace: a verdict may link to thousands of spans that never arrived (one pass over the ranks per
        link took > 120 s for 2,000 of them)."""
        if self._op_ids is None:
            self._op_ids = {}
            try:
                tid = int(self.trace_id, 16)
            except ValueError:
                return self._op_ids
            for r in list(self.culprits()) + list(range(min(self.nranks, _RESOLVE_RANKS))):
                self._op_ids.setdefault(f"{ids.span_id(tid, r, sc.ROLE_OP):016x}", r)  # culprits first
        return self._op_ids

    def culprits(self) -> set[int]:
        return {r for v in self.verdicts for r in v.ranks}

    def waits(self) -> dict[int, list[tuple[int, str]]]:
        """rank -> [(peer, how)] for every unfinished flow whose wait a peer explains."""
        out: dict[int, list[tuple[int, str]]] = {}
        for r, rv in self.ranks.items():
            s = rv.latest
            if s is None or rv.op is not None:
                continue
            for f in flows_of(s):
                if not f.unfinished or f.peer < 0:
                    continue
                if f.direction == "send" and f.ready > f.transmitted:
                    continue  # data ready but not on the wire: stuck at this rank, not at the peer
                if f.wait_state in _PEER_WAITS or (f.direction == "recv" and not f.wait_state
                                                   and f.ready < max(f.posted, 1)):
                    out.setdefault(r, []).append((f.peer, f"ch{f.channel} {f.direction} {f.wait_state or 'idle'}"))
        return out

    def stop_reason(self, r: int) -> str:
        rv = self.ranks.get(r)
        if rv is None:
            return "no span from this rank (silent)"
        if rv.op is not None:
            return "completed"
        if rv.status_kind == sc.STATUS_PROCESS_EXITED:
            return "process exited"
        if rv.statuses and not rv.snapshots:
            return "not entered: " + str(rv.attr(sc.STATUS_LAST_STATE, "") or "idle")
        s = rv.latest
        if s is not None and s.attrs.get(sc.PROCESS_STOPPED):
            return "process stopped (SIGSTOP)"
        flows = [f for f in flows_of(s) if f.unfinished] if s else []
        why = []
        for f in flows:
            if f.direction == "send" and f.ready > f.transmitted:
                why.append(f"ch{f.channel} send: ready {f.ready} > transmitted {f.transmitted} (data not on the wire)")
            elif f.direction == "send" and f.transmitted > f.done:
                why.append(f"ch{f.channel} send: transmitted {f.transmitted} > done {f.done} (not completed)")
        states = sorted({f.wait_state for f in flows if f.wait_state and f.wait_state not in _PEER_WAITS})
        why += [f"{st}: {_SELF_WAITS.get(st, st)}" for st in states]
        if why:
            return "; ".join(why[:4]) + (f" (+{len(why) - 4} more)" if len(why) > 4 else "")
        return "in flight, no flow waiting on a peer"

    def walk(self) -> list[Hop]:
        """The longest wait chain (preferring one that ends at a culprit); [] when nobody waits.

        Each rank follows one peer it waits on (a culprit first, else the lowest rank); a culprit
        ends the chain. Depths are memoised, so a 16k-rank ring costs O(ranks)."""
        waits = self.waits()
        if not waits:
            return []
        culprits = self.culprits()
        nxt: dict[int, tuple[int, str]] = {}
        for r, lst in waits.items():
            if r not in culprits:
                nxt[r] = min(lst, key=lambda x: (x[0] not in culprits, x[0]))
        depth: dict[int, int] = {}
        end: dict[int, int] = {}
        for s0 in sorted(waits):
            stack, on = [], set()
            r = s0
            while r in nxt and r not in depth and r not in on:
                stack.append(r)
                on.add(r)
                r = nxt[r][0]
            if r in depth:
                d, e = depth[r], end[r]
            else:          # a rank that waits on nobody (or a cycle closing on itself)
                d, e = (0 if r in on else 1), r
                if r not in on:
                    depth[r], end[r] = d, e
            while stack:
                x = stack.pop()
                d += 1
                depth[x], end[x] = d, e
        start = max(sorted(depth), key=lambda r: (end[r] in culprits, depth[r]))
        path: list[Hop] = []
        seen: set[int] = set()
        r = start
        while True:
            seen.add(r)
            if r in nxt and nxt[r][0] not in seen:
                path.append(Hop(r, via=nxt[r][1]))
                r = nxt[r][0]
                continue
            cyc = r in nxt
            path.append(Hop(r, why="waits in a cycle" if cyc else self.stop_reason(r)))
            return path


@dataclass
class Run:
    spans: int
    traces: dict[str, CollTrace]
    verdicts: list[Verdict]
    files: list[str]
    other_spans: int = 0      # summaries and spans of no known shape
    evals: list = field(default_factory=list)  # (file, `mycroft-otel eval --json` document)
    # what the processor decided about each collective it judged (replayed recordings only: processor/outcome.py)
    decisions: list = field(default_factory=list)
    decision_counts: dict[str, int] = field(default_factory=dict)


def _checked(s: Span, problems: list[Problem] | None) -> bool:
    """Drop attributes the pictures cannot trust (non-integers where integers belong, ranks and
    sizes beyond MAX_RANKS, times beyond int64), noting each; False: the span is unusable."""
    def note(what: str) -> None:
        if problems is not None:
            problems.append(Problem(f"span {s.name or '?'} {s.span_id} (trace {s.trace_id})", what))
    for key in _INT_ATTRS:
        if key not in s.attrs:
            continue
        v = s.attrs[key]
        if not isinstance(v, int) or isinstance(v, bool):
            note(f"{key} = {str(v)[:40]!r} is not an integer; ignored")
            del s.attrs[key]
        elif key in (sc.RANK, sc.GLOBAL_RANK) and not 0 <= v < MAX_RANKS or \
                key == sc.COMM_NRANKS and not 1 <= v <= MAX_RANKS:
            note(f"{key} = {v} is outside 0..{MAX_RANKS} (the largest communicator the report draws); ignored")
            del s.attrs[key]
        elif not -_MAX_NS <= v <= _MAX_NS:
            note(f"{key} = {v} does not fit in 64 bits; ignored")
            del s.attrs[key]
    if not (0 <= s.start_ns <= _MAX_NS and 0 <= s.end_ns <= _MAX_NS):
        note(f"start/end time ({s.start_ns}, {s.end_ns}) does not fit in 64 bits; span skipped")
        return False
    return True


def build(spans: list[Span], files: list[str], problems: list[Problem] | None = None) -> Run:
    """The run's model; spans with values the pictures cannot trust are noted in ``problems``."""
    spans = [s for s in spans if _checked(s, problems)]
    traces: dict[str, CollTrace] = {}
    verdicts: list[Verdict] = []
    other = 0
    latest: dict[tuple[str, str], Span] = {}
    for s in spans:  # a re-emitted span (status back-off, duplicates) counts once, at its latest end
        key = (s.trace_id, s.span_id)
        if key not in latest or s.end_ns > latest[key].end_ns:
            latest[key] = s
    for s in latest.values():
        t = traces.get(s.trace_id)
        if s.name == sc.ROOT_CAUSE_SPAN:
            t = t or traces.setdefault(s.trace_id, CollTrace(s.trace_id))
            v = Verdict(s)
            t.verdicts.append(v)
            verdicts.append(v)
            continue
        rank = s.attrs.get(sc.RANK)
        is_rank_span = s.name.startswith(sc.OP_SPAN_PREFIX) or s.name in (sc.INFLIGHT_SPAN, sc.STATUS_SPAN)
        if not is_rank_span or not isinstance(rank, int):
            other += 1
            continue
        t = t or traces.setdefault(s.trace_id, CollTrace(s.trace_id))
        rv = t.ranks.setdefault(rank, RankView(rank))
        if s.name == sc.INFLIGHT_SPAN:
            rv.snapshots.append(s)
            label = f"in-flight snapshot {s.attrs.get(sc.SNAPSHOT_SEQ, '?')}"
        elif s.name == sc.STATUS_SPAN:
            rv.statuses.append(s)
            label = f"status {s.attrs.get(sc.STATUS_KIND, '?')}"
        else:
            if rv.op is None or s.end_ns > rv.op.end_ns:
                rv.op = s
            label = s.name
        t.by_span_id[s.span_id] = (rank, label)
    for t in traces.values():
        for rv in t.ranks.values():
            rv.snapshots.sort(key=lambda s: (s.attrs.get(sc.SNAPSHOT_SEQ) or 0, s.end_ns))  # ints (_checked)
            rv.statuses.sort(key=lambda s: s.end_ns)
    _sort_exits(traces)
    verdicts.sort(key=lambda v: v.detected_ns)
    return Run(len(spans), traces, verdicts, files, other)


#: Exits this close to the run's last one, from several processes, are the job ending (the launcher or the
#: demo stopping every rank), not a fault: the agent notices them at the same poll.
JOB_END_WINDOW_NS = 1_000_000_000


def _process(s: Span) -> tuple:
    r = s.resource
    pid = r.get(sc.PROCESS_PID) if isinstance(r, dict) else None
    host = r.get(sc.HOST_NAME) if isinstance(r, dict) else None
    return (host, pid) if pid is not None else (host, s.attrs.get(sc.GLOBAL_RANK), s.attrs.get(sc.COMM_HASH),
                                                s.attrs.get(sc.RANK))


def _sort_exits(traces: dict[str, CollTrace]) -> None:
    """An exit is evidence about a collective only if the process died while the collective was in flight
    (the rank itself, or a peer waiting in it) and before the job ended. Moves the others to ``ended``:
    the exits of a completed rank, of a trace nobody was in, and the job's own end (several processes
    exiting together as the run's last exits, JOB_END_WINDOW_NS)."""
    exits = [(rv, s) for t in traces.values() for rv in t.ranks.values() for s in rv.statuses
             if s.attrs.get(sc.STATUS_KIND) == sc.STATUS_PROCESS_EXITED]
    if not exits:
        return
    last = max(s.end_ns for _rv, s in exits)
    final = [s for _rv, s in exits if s.end_ns >= last - JOB_END_WINDOW_NS]
    job_end = len({_process(s) for s in final}) > 1
    for t in traces.values():
        in_flight = any(rv.op is None and rv.snapshots for rv in t.ranks.values())
        for rv in t.ranks.values():
            for s in [s for s in rv.statuses if s.attrs.get(sc.STATUS_KIND) == sc.STATUS_PROCESS_EXITED]:
                if rv.op is not None or not in_flight or job_end and s.end_ns >= last - JOB_END_WINDOW_NS:
                    rv.statuses.remove(s)
                    rv.ended.append(s)
