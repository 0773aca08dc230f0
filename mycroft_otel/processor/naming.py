"""Which alarm names the culprit when several candidates of one collective alarm.

A fault at one place moves the measures of its neighbours too: a slow GPU holds back the GPU before it in the
ring (that one blocks on a FIFO slot), a slow link delays its sender's kernel and delivers in bursts that wait
for its receiver's GPU, a late rank leaves its peers' sends waiting for credit, a proxy that posts ready data
late holds its upstream's GPUs. So the most specific explanation wins: a late rank (everybody waited for it),
unless a link, or its own GPU, that would have held it back gathers evidence in a joined communicator; a late
rank over the GPUs before it; a gathering proxy over the GPUs it blocks; a slow GPU over slow flows into it
unless a network path out of it, into it or out of a held-back GPU gathers evidence, or exactly one flow
touching it is slow (its kernel queued behind the collective that flow delayed); a NIC over its single
flows; a proxy unless a late rank or a link gathers. The verdict carries the winning hypothesis, the best
other one in the collective, and the margin of evidence between them.
"""

from __future__ import annotations

from mycroft_otel import semconv as sc
from mycroft_otel.processor import slowdown
from mycroft_otel.processor.candidates import Alarm
from mycroft_otel.processor.memory import NAMED_KEPT, JobMemory, get_or_put
from mycroft_otel.processor.outcome import Decision, Outcome, silent
from mycroft_otel.processor.views import Finding
from mycroft_otel.processor.sequential import Cusum
from mycroft_otel.processor.settings import Settings
from mycroft_otel.processor.state import TraceState

# precedence when several candidates of one collective alarm (see the module docstring)
_ORDER = (slowdown.LATE, slowdown.GPU, slowdown.NIC_SEND, slowdown.NIC_RECV, slowdown.FLOW, slowdown.PROXY)


def label(measure: str, unit) -> str:
    """A hypothesis in words: the measure and the place (a rank, or a flow sender -> receiver on a channel)."""
    if isinstance(unit, tuple):
        return f"{measure} {unit[0]}->{unit[1]} ch{unit[2]}"
    return f"{measure} rank {unit}"


class Naming:
    """Names the culprit behind a collective's alarms (None: a likelier cause still gathers evidence)."""

    def __init__(self, settings: Settings, memory: JobMemory):
        self.s, self.mem = settings, memory

    def name(self, st: TraceState, m: slowdown.Measures, ev: slowdown.Evidence, alarms: list[Alarm],
              recovered: Finding | None) -> Decision:
        """The alarm that names the culprit (Outcome.NAMED), or why none does yet (Outcome.DEFERRED)."""
        by = {name: [a for a in alarms if a.measure == name] for name in _ORDER}
        pick: Alarm | None = None
        late = [a for a in by[slowdown.LATE] if not self._busy_before(st, a.unit)]
        if late:
            pick = max(late, key=lambda a: a.cusum.s)
        elif by[slowdown.GPU]:
            held = {a.unit for a in by[slowdown.GPU]}
            g = self._source_gpu(st, ev, max(by[slowdown.GPU], key=lambda a: a.cusum.s))
            if self.mem.link_gathers(st, elsewhere=True):
                # its kernel queued behind a transfer of a joined communicator: that one's verdict
                return silent(Outcome.DEFERRED, f"{label(g.measure, g.unit)} alarms while a link of a joined "
                                                f"communicator gathers evidence")
            late_one = self._waited_for(st, ev, g.unit)
            if late_one is not None:
                g.cusum.reset()
                return Decision(Outcome.NAMED,
                                self._finding(st, ev, g.led_to(slowdown.LATE, ev.late_rank, late_one), recovered))
            proxy = self._proxy_behind(st, ev)
            if proxy is not None:
                # a rank whose proxy leaves its ready data unposted blocks its kernel on the send FIFO slots
                # that data holds, so its received data waits for that kernel, and the ranks sending into it
                # block in turn, hop by hop: their GPUs read slow. A slow GPU never reads as a proxy (its
                # upstream's credit wait is its own busy time)
                g.cusum.reset()
                g = g.led_to(slowdown.PROXY, *proxy)
            pick = self._path(g, self._held_back_path(st, ev, g.unit, held)) if g.measure == slowdown.GPU else g
            if pick is g:
                touching = [a for a in by[slowdown.FLOW] if g.unit in a.unit[:2]]
                if len(touching) == 1 and not by[slowdown.NIC_SEND] and not by[slowdown.NIC_RECV]:
                    pick = touching[0]  # its kernel queued behind the collective that one flow delayed
        elif by[slowdown.NIC_SEND] or by[slowdown.NIC_RECV]:
            pick = max(by[slowdown.NIC_SEND] + by[slowdown.NIC_RECV], key=lambda a: a.cusum.s)
        elif by[slowdown.FLOW]:
            f = max(by[slowdown.FLOW], key=lambda a: a.cusum.s)
            pick = self._path(f, self._network(st, ev, f.unit[0]))
        elif by[slowdown.PROXY]:
            # the ranks sending into a late rank wait for credit on buffers it posts late, and the network
            # may hold data it has not delivered yet: those verdicts come first (held-back GPUs are the
            # proxy's own doing, and so is its own rank's lateness elsewhere: _busy_before)
            p = max(by[slowdown.PROXY], key=lambda a: a.cusum.s)
            if self._late_here(st, ev, besides=p.unit) or \
                    self.mem.accumulating(st, (slowdown.NIC_SEND, slowdown.NIC_RECV, slowdown.FLOW)):
                return silent(Outcome.DEFERRED, f"{label(p.measure, p.unit)} alarms; a rank late into this "
                                                f"collective or a link gathers evidence")
            pick = p
        if pick is None:  # only late ranks alarmed, each held back by what it waited for
            first = by[slowdown.LATE][0]
            return silent(Outcome.DEFERRED, f"{label(first.measure, first.unit)} alarms; a GPU, proxy or link "
                                            f"that held it back gathers evidence")
        return Decision(Outcome.NAMED, self._finding(st, ev, pick, recovered))

    def _late_here(self, st: TraceState, ev: slowdown.Evidence, besides: int) -> bool:
        """Another rank of this collective started it late (its lateness score here beyond the strong test's
        drift) and gathers evidence of lateness. Lateness is kept per process across its communicators; a rank
        held back in one (its DP ring waiting on a proxy) is late only into its others (its TP group), so
        only this collective says whether its senders' credit waits are that rank's doing."""
        units = ev.values.get(slowdown.LATE, ([], None))[0]
        z = ev.z.get(slowdown.LATE)
        return z is not None and any(u != besides and z[i] > self.s.cusum.k and
                                     self.mem.gathering(st, slowdown.LATE, u) is not None
                                     for i, u in enumerate(units))

    def _proxy_behind(self, st: TraceState, ev: slowdown.Evidence) -> tuple[int, Cusum] | None:
        """The rank of this collective whose proxy gathers the most evidence (half way to an alarm), with it."""
        units = ev.values.get(slowdown.PROXY, ([], None))[0]
        found = [(u, c) for u in units if (c := self.mem.gathering(st, slowdown.PROXY, u)) is not None]
        return max(found, key=lambda x: x[1].s) if found else None

    def _busy_before(self, st: TraceState, rank: int) -> bool:
        """The rank's lateness has a cause the test is gathering evidence of (half way to an alarm): its own
        GPU, or a link in this communicator or one joined to it. A rank's kernels run in order on its stream,
        so a slow GPU or a slow transfer of its pipeline stage holds back its start in the next collective,
        and through a TP group the start of its peers' next collectives too. The reverse never holds: a rank
        that calls late leaves its peers' sends waiting for its credit (SendPeerWait), not on the link, and
        its own GPU idle. (Another rank's GPU can read slow behind a late rank: the rank before it blocks on
        a FIFO slot the late one has not freed.) So lateness waits for that verdict. Likewise a GPU or a proxy
        thread gathering evidence in another communicator the rank is in, its own or a peer's there: a proxy
        that posts ready chunks late, or a slow GPU, keeps every rank of that collective (a DP ring's) in it
        longer, and each enters its TP group's next collective late by as much."""
        return self.mem.held_in_shared(st, rank) or self.mem.link_gathers(st)

    def _waited_for(self, st: TraceState, ev: slowdown.Evidence, gpu: int) -> Cusum | None:
        """The evidence of another rank that started last and reads late, when it gathers: the ranks before
        it in the ring block on the FIFO slots it has not freed, so their received data waits for their GPUs,
        and a GPU's reading is its back-pressure. Not when a link or its own GPU explains its lateness
        (_busy_before)."""
        rank = ev.late_rank
        if rank in (gpu, -1) or ev.lateness_ns <= 0 or self._busy_before(st, rank):
            return None
        return self.mem.gathering(st, slowdown.LATE, rank)

    def _source_gpu(self, st: TraceState, ev: slowdown.Evidence, g: Alarm) -> Alarm:
        """Of the GPUs gathering evidence in this collective, the one whose data waits longest: a slow GPU
        holds its ring neighbours back (the one before it blocks in its send primitive until a FIFO slot
        frees, so the data it received waits for its GPU too), and which of them crosses h first is a matter
        of noise; the held-back wait is the source's, less the slack of NCCL_STEPS slots."""
        best = g
        for u in ev.values[slowdown.GPU][0]:
            c = self.mem.gathering(st, slowdown.GPU, u)
            if c is not None and c is not g.cusum and c.last_when_ns == g.cusum.last_when_ns and c.x > best.cusum.x:
                best = g.led_to(slowdown.GPU, u, c, c.z)
        if best is not g:
            g.cusum.reset()  # its evidence was the source's doing: named once, as the source
        return best

    def _held_back_path(self, st: TraceState, ev: slowdown.Evidence, source: int,
                        alarmed: set) -> tuple[str, object, Cusum] | None:
        """The network path that explains a GPU alarm: the source GPU's own way out, else the path with the
        most evidence among the ways into it and those out of the held-back GPUs (alarmed in this collective
        or gathering evidence), else None. A slow GPU cannot be behind a flow's network busy time: it posts
        its sends late, and its receive buffers late (the sender then waits for credit, SendPeerWait); once
        posted, a step moves at the network's speed. A slow link, though, shows at GPUs on both sides of it.
        It holds back its sender's kernel and, through the FIFO credits, every kernel upstream of it in the
        ring (in a large ring the sender is not always the one whose received data waits longest). And a
        link that delivers late delivers in bursts (the steps in flight land together once the window is
        full), so its receiver's data waits while the GPU reduces and forwards the ones before it."""
        found = self._network(st, ev, source)
        if found is not None:
            return found
        flows = ev.values.get(slowdown.FLOW, ([], None))[0]
        behind = {u[0] for u in flows if u[1] == source}
        behind.update(u for u in ev.values[slowdown.GPU][0]
                      if u != source and (u in alarmed or self.mem.gathering(st, slowdown.GPU, u) is not None))
        for u in sorted(behind):
            other = self._network(st, ev, u)
            if other is not None and other[2].s > (found[2].s if found is not None else 0.0):
                found = other
        return found

    @staticmethod
    def _path(alarm: Alarm, found: tuple[str, object, Cusum] | None) -> Alarm:
        """The network path found behind ``alarm`` (:meth:`_network`), named for its evidence, else ``alarm``."""
        if found is None:
            return alarm
        path = alarm.led_to(*found)
        if path.cusum is not alarm.cusum:
            alarm.cusum.reset()  # what it measured was the path's doing: named once, as the path
        return path

    def _network(self, st: TraceState, ev: slowdown.Evidence, sender: int) -> tuple[str, object, Cusum] | None:
        """Who holds whom back, once a rank's GPU or one of its flows out reads slow: the network path its
        evidence points at (measure, unit, evidence), else None.

        A slow GPU posts its sends late, but once posted they move at the network's speed: slow flows *out* of
        a rank are the network's doing. They also hold its GPU back (the kernel's send primitive blocks until
        a FIFO slot frees, so data received meanwhile waits for the GPU), and with two similar effects the one
        that crosses h first is a matter of noise, so the decision reads each flow's accumulated evidence
        (half way to h), not only this collective's alarms. Which part of the path: slow flows that all go to
        one receiver whose other senders' flows read slow too, or whose least-waiting flow in holds as much
        evidence as the slowest, are that receiver's NIC (congestion into it); else the sender's NIC when its
        least-waiting flow out (``nic_send``: every flow of that NIC) gathers and holds as much evidence as
        its slowest flow or every flow out holds half of it, or all its flows out gather evidence (a ring's
        one peer cannot tell the two ends apart: the sender is named); else its slowest flow (a link, a
        route, a QP), and a rank with one flow out names that flow. With no slow flow out, the NIC of a
        receiver it sends into, when that gathers evidence."""
        flows = ev.values.get(slowdown.FLOW, ([], None))[0]
        out = [u for u in flows if u[0] == sender]
        slow = [(u, c) for u in out if (c := self.mem.gathering(st, slowdown.FLOW, u)) is not None]
        # its least-waiting flow out reads slow: every flow of its NIC does (with one flow out, that flow)
        nic = self.mem.gathering(st, slowdown.NIC_SEND, sender) if len(out) > 1 else None
        if not slow:
            if nic is not None:
                return slowdown.NIC_SEND, sender, nic
            # no flow of its own reads slow yet, but the NIC it sends into does: congestion into that receiver
            # slows every sender's flow a little and holds their kernels back
            into = [(u[1], c) for u in out if (c := self.mem.gathering(st, slowdown.NIC_RECV, u[1])) is not None]
            return None if not into else (slowdown.NIC_RECV,) + max(into, key=lambda x: x[1].s)
        u, c = max(slow, key=lambda x: x[1].s)
        # a NIC's least-waiting flow (a minimum) rises when any one of its flows slows down: it reads as
        # much evidence as the slowest flow only when every flow of the NIC is slow
        into = self.mem.gathering(st, slowdown.NIC_RECV, u[1])
        if len({v[1] for v, _ in slow}) == 1 and ((into is not None and into.s >= c.s) or any(
                v[1] == u[1] and v[0] != sender and self.mem.gathering(st, slowdown.FLOW, v) is not None
                for v in flows)):
            return slowdown.NIC_RECV, u[1], into if into is not None else c
        if (nic is not None and (nic.s >= c.s or all(
                self.mem.evidence(st, slowdown.FLOW, v) >= c.s / 2 for v in out))) or len(slow) == len(out) > 1:
            # the least-waiting flow holds as much evidence as the slowest, or every flow out half of it:
            # what slows them is common
            return slowdown.NIC_SEND, sender, nic if nic is not None else c
        return slowdown.FLOW, u, c

    def _runner_up(self, st: TraceState, ev: slowdown.Evidence, a: Alarm) -> tuple[str, float]:
        """The strongest other explanation in this collective: the candidate with the most evidence that is
        neither the named one nor a symptom that led to it."""
        mine = (a.cusum,) + a.via
        others = [(c.s, label(name, u)) for name, u, c in self.mem.held(st, ev)
                  if c.s > 0 and not any(c is m for m in mine)]
        s, what = max(others, default=(0.0, ""))
        return what, s

    def _finding(self, st: TraceState, ev: slowdown.Evidence, a: Alarm, recovered: Finding | None) -> Finding:
        c = a.cusum
        n = c.collectives
        runner_up, runner_s = self._runner_up(st, ev, a)
        won_s = max(c.s, max((v.s for v in a.via), default=0.0))  # a path named for what it holds back
        cat = slowdown.CATEGORY_OF[a.measure]
        h = self.s.cusum.h
        # a path or source named for the evidence it explains may itself be only half way to h
        seen = (f"(sustained over {n} collectives: CUSUM {c.s:.1f} >= {h:g})" if c.s >= h else
                f"(sustained over {n} collectives: CUSUM {c.s:.1f}, and {h:g} reached by what it holds back)")
        chan = peer = None
        if a.measure == slowdown.FLOW:
            s, d, chan = a.unit
            who, peer = s, d
            what = f"flow rank {s} -> rank {d} on channel {chan} waits longer per step on the network than its siblings"
        else:
            who = a.unit
            what = {
                slowdown.GPU: f"rank {who}'s GPU takes longer per step to consume received data than the other ranks'",
                slowdown.NIC_SEND: f"every flow sent by rank {who} waits longer per step on the network",
                slowdown.NIC_RECV: f"every flow into rank {who} waits longer per step on the network",
                slowdown.PROXY: (f"rank {who}'s ready send steps wait for credit while their receivers' buffers are "
                                 f"posted: its proxy posts ready chunks late"),
                slowdown.LATE: f"rank {who} starts its collectives late and the others wait for it",
            }[a.measure]
        if recovered is not None and recovered.ranks == [who] and recovered.category == cat:
            what = recovered.evidence
        onset = c.onset_ns
        # the culprit and the symptoms that led to it: while any of them persists, so does this incident
        named = get_or_put(self.mem.named, st.job, list)
        for e in (c,) + a.via:
            if not any(n is e for _, n in named):
                named.append((st.comm, e))
        del named[:-NAMED_KEPT]
        c.reset()  # named: the incident window dedupes what follows; a fault that persists accumulates again
        return Finding(kind=sc.KIND_SLOWDOWN, category=cat, ranks=[who], channel=chan, peer=peer,
                       confidence=round(min(0.95, 0.6 + 0.02 * n), 3),
                       evidence=f"{what} in {st.func} {st.seq} {seen}", onset_ns=onset,
                       reason=a.measure, recovered=recovered is not None, hypothesis=label(a.measure, a.unit),
                       runner_up=runner_up, margin=round(won_s - runner_s, 2))
