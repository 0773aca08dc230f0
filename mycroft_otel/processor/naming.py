"""Which hypothesis names the culprit when candidates of one collective alarm: one explanation table.

A fault at one place moves the measures of its neighbours too: a slow GPU holds back the GPU before it in the
ring (that one blocks on a FIFO slot), a slow link delays its sender's kernel and delivers in bursts that wait
for its receiver's GPU, a late rank leaves its peers' sends waiting for credit, a proxy that posts ready data
late holds its upstream's GPUs, and a rank's kernels run in order on its stream, so whatever keeps it in one
communicator's collective makes it late into its other communicators'. So an alarm is a symptom until the
table (EXPLAINED_BY) finds nothing likelier behind it: the explanations of each measure, as data, each a
place whose evidence (half way to h) the network and the stream order make a cause of that alarm. One
resolver reads it for every collective. The verdict carries the winning hypothesis, the best other one in
the collective, and the margin of evidence between them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Callable

from mycroft_otel import semconv as sc
from mycroft_otel.processor import slowdown
from mycroft_otel.processor.candidates import Alarm
from mycroft_otel.processor.links import Links, alarmed_path, upstream
from mycroft_otel.processor.memory import NAMED_KEPT, JobMemory, get_or_put
from mycroft_otel.processor.outcome import Decision, Outcome, silent
from mycroft_otel.processor.views import Finding
from mycroft_otel.processor.sequential import Cusum
from mycroft_otel.processor.settings import Settings
from mycroft_otel.processor.state import TraceState

# The explanation table. Rows are tried in this order, each row's alarms strongest first (a GPU row: the one
# whose data waits longest, _source_gpu); an alarm's explanations in order. The first that holds evidence
# decides: NAME names that explanation for the alarm's evidence (it may be only half way to h: what it holds
# back reached h), WAIT leaves the alarm unnamed until that cause reaches a verdict of its own (its
# communicator, or its own test). An alarm nothing explains is named itself; when every alarm waits, the
# decision is DEFERRED with the first one's reason.


class Act(Enum):
    NAME = "name"   # the explanation is the culprit, named for the alarm's evidence
    WAIT = "wait"   # the explanation must reach its own verdict; this alarm names nothing meanwhile


@dataclass(frozen=True)
class Explanation:
    cause: str      # in words, for a DEFERRED decision's detail and docs/algorithm.md
    find: Callable[["Naming", "_Collective", Alarm], "Alarm | bool | None"]  # NAME: the culprit; WAIT: truthy
    act: Act


@dataclass(slots=True)
class _Collective:
    st: TraceState
    ev: slowdown.Evidence
    by: dict[str, list[Alarm]]  # this collective's alarms per measure


@dataclass(frozen=True)
class Row:
    measures: tuple[str, ...]
    explanations: tuple[Explanation, ...] = ()
    # the one alarm the row is judged by, given its strongest (its others are its symptoms); None: each
    # alarm is tried, strongest first
    first: Callable[["Naming", "_Collective", Alarm], Alarm] | None = None


def _strongest(n: "Naming", c: _Collective, a: Alarm) -> Alarm:
    return a


def _source(n: "Naming", c: _Collective, a: Alarm) -> Alarm:
    return n._source_gpu(c.st, c.ev, a)


def _held_back(n: "Naming", c: _Collective, a: Alarm) -> bool:
    return n._busy_before(c.st, a.unit, c.ev)


def _link_elsewhere(n: "Naming", c: _Collective, a: Alarm) -> bool:
    return n.mem.link_gathers(c.st)


def _late_rank(n: "Naming", c: _Collective, a: Alarm) -> Alarm | None:
    late = n._waited_for(c.st, c.ev, a.unit)
    return None if late is None else a.led_to(slowdown.LATE, c.ev.late_rank, late)


def _proxy(n: "Naming", c: _Collective, a: Alarm) -> Alarm | None:
    return None if (found := n._proxy_behind(c.st, c.ev, a.unit)) is None else a.led_to(slowdown.PROXY, *found)


def _gpu_path(n: "Naming", c: _Collective, a: Alarm) -> Alarm | None:
    held = {g.unit for g in c.by[slowdown.GPU]}
    found = n._held_back_path(c.st, c.ev, a.unit, held)
    # (a path too fast to have held the GPU back explains nothing: the GPU is named, the path its runner-up)
    return a.led_to(*found) if found is not None and _can_hold_back(c.ev, found[:2], a.unit) else None


def _can_hold_back(ev: slowdown.Evidence, path: tuple, gpu: int) -> bool:
    """Whether a network path is slow enough to explain what a GPU waits. A GPU held back by a link waits, per
    step, for a FIFO slot that the link frees once per step of its own: the sender's send primitive blocks
    until then, and every GPU upstream waits on the one after it in turn. So none waits much longer per step
    than the link takes per step (a NIC's: its least-waiting flow's). A path that takes less than half the
    GPU's wait per step (half: one collective's noise) is a symptom beside it, not its cause: a GPU's slow
    consumption moves its neighbours' links a little (the rank before it consumes late, and its process
    notices arrivals late). Where either is not measured here, the path's accumulated evidence stands."""
    link, waited = ev.value(*path), ev.value(slowdown.GPU, gpu)
    return link is None or waited is None or link >= waited / 2


def _one_flow(n: "Naming", c: _Collective, a: Alarm) -> Alarm | None:
    touching = [f for f in c.by[slowdown.FLOW] if a.unit in f.unit[:2]]
    if len(touching) == 1 and not c.by[slowdown.NIC_SEND] and not c.by[slowdown.NIC_RECV] and \
            _can_hold_back(c.ev, (slowdown.FLOW, touching[0].unit), a.unit):
        return touching[0]
    return None


def _proxy_at_end(n: "Naming", c: _Collective, a: Alarm) -> Alarm | None:
    """A proxy thread that posts ready steps late, at an end of the slow path, whose process's other flows
    read slow too. A proxy thread moves every flow of its process, in every communicator, and a starved one
    notices arrivals and completions late on all of them; a slow link, though, holds its sender's ready
    steps waiting for credit too (the receiver's buffers wait for data in flight), so the proxy measure
    rises with the link, and only the flows beside it can tell the two apart (with none, the proxy). A sending
    NIC whose flows all go to one receiver (a ring's) is the path into that receiver too, and a receiver's
    starved proxy notices their arrivals late: that end's proxy is asked as well."""
    if a.measure == slowdown.FLOW:
        ends = a.unit[:2]
    else:
        peer = n.links.one_receiver(c.ev, a.unit) if a.measure == slowdown.NIC_SEND else None
        ends = (a.unit,) if peer is None else (a.unit, peer)
    on_path = alarmed_path(a)
    found = []
    for u in ends:
        cs = n.mem.gathering(c.st, slowdown.PROXY, u)
        if cs is not None:
            beside, slow = n.links.flows_beside(c.st, u, on_path)
            if slow or not beside:
                found.append((u, cs))
    return None if not found else a.led_to(slowdown.PROXY, *max(found, key=lambda x: x[1].s))


def _receiving_nic(n: "Naming", c: _Collective, a: Alarm) -> Alarm | None:
    found = n.links.receiver_of(c.st, c.ev, a) if a.measure == slowdown.NIC_SEND else None
    return None if found is None else a.led_to(*found)


def _flow_path(n: "Naming", c: _Collective, a: Alarm) -> Alarm | None:
    found = n.links.path_out(c.st, c.ev, a.unit[0])
    return None if found is None else a.led_to(*found)


def _late_or_link(n: "Naming", c: _Collective, a: Alarm) -> bool:
    return n._late_here(c.st, c.ev, besides=a.unit) or \
        n.mem.accumulating(c.st, (slowdown.NIC_SEND, slowdown.NIC_RECV, slowdown.FLOW))


EXPLAINED_BY: tuple[Row, ...] = (
    Row((slowdown.LATE,), (
        Explanation("a GPU, proxy, link or late peer that held it back gathers evidence", _held_back, Act.WAIT),)),
    Row((slowdown.GPU,), (
        Explanation("a link of a joined communicator gathers evidence", _link_elsewhere, Act.WAIT),
        Explanation("the rank that started last gathers lateness", _late_rank, Act.NAME),
        Explanation("the proxy of its rank or of a neighbour gathers evidence", _proxy, Act.NAME),
        Explanation("a network path out of it, out of a rank upstream, or out of a GPU it holds back", _gpu_path,
                    Act.NAME),
        Explanation("the one flow that touches it alarms", _one_flow, Act.NAME)), first=_source),
    Row((slowdown.NIC_SEND, slowdown.NIC_RECV), (
        Explanation("its own proxy thread leaves ready data unposted", _proxy_at_end, Act.NAME),
        Explanation("the one receiver its flows go to reads slow from other senders too", _receiving_nic,
                    Act.NAME),)),
    Row((slowdown.FLOW,), (
        Explanation("the proxy thread of one of its ends leaves ready data unposted", _proxy_at_end, Act.NAME),
        Explanation("its receiver's or its sender's NIC, or its sender's slowest flow", _flow_path, Act.NAME),),
        first=_strongest),
    Row((slowdown.PROXY,), (
        Explanation("a rank late into this collective or a link gathers evidence", _late_or_link, Act.WAIT),),
        first=_strongest),
)


def label(measure: str, unit) -> str:
    """A hypothesis in words: the measure and the place (a rank, or a flow sender -> receiver on a channel)."""
    if isinstance(unit, tuple):
        return f"{measure} {unit[0]}->{unit[1]} ch{unit[2]}"
    return f"{measure} rank {unit}"


class Naming:
    """Names the culprit behind a collective's alarms by the explanation table (EXPLAINED_BY)."""

    def __init__(self, settings: Settings, memory: JobMemory):
        self.s, self.mem = settings, memory
        self.links = Links(settings, memory)

    def name(self, st: TraceState, m: slowdown.Measures, ev: slowdown.Evidence, alarms: list[Alarm],
              recovered: Finding | None) -> Decision:
        """The alarm that names the culprit (Outcome.NAMED), or why none does yet (Outcome.DEFERRED)."""
        c = _Collective(st, ev, {name: [a for a in alarms if a.measure == name] for name in slowdown.CATEGORY_OF})
        waits: list[str] = []
        for row in EXPLAINED_BY:
            tried = sorted((a for name in row.measures for a in c.by[name]), key=lambda a: -a.cusum.s)
            if row.first is not None and tried:
                tried = [row.first(self, c, tried[0])]
            for a in tried:
                culprit = self._explain(c, row, a, waits)
                if culprit is not None:
                    return Decision(Outcome.NAMED, self._finding(st, ev, culprit, recovered))
        return silent(Outcome.DEFERRED, waits[0] if waits else "no alarm")

    def _explain(self, c: _Collective, row: Row, a: Alarm, waits: list[str]) -> Alarm | None:
        """The culprit ``a`` names by the first of its row's explanations that holds evidence (itself when none
        does), or None when that explanation makes it wait (its reason appended to ``waits``)."""
        for e in row.explanations:
            found = e.find(self, c, a)
            if not found:
                continue
            if e.act is Act.WAIT:
                waits.append(f"{label(a.measure, a.unit)} alarms; {e.cause}")
                return None
            if found.cusum is not a.cusum and any(a.cusum is v for v in found.via):
                a.cusum.reset()  # what it measured was the culprit's doing: named once, as the culprit
            return found
        return a

    def _late_here(self, st: TraceState, ev: slowdown.Evidence, besides: int) -> bool:
        """Another rank of this collective started it late (its lateness score here beyond the strong test's
        drift) and gathers evidence of lateness into this communicator. A rank held back in one communicator
        (its DP ring waiting on a proxy) is late into its others (its TP group), where its lateness gathers
        too, so this collective's own score says whether its senders' credit waits are that rank's doing."""
        units = ev.units(slowdown.LATE)
        z = ev.z.get(slowdown.LATE)
        return z is not None and any(u != besides and z[i] > self.s.cusum.k and
                                     self.mem.gathering(st, slowdown.LATE, u) is not None
                                     for i, u in enumerate(units))

    def _proxy_behind(self, st: TraceState, ev: slowdown.Evidence, gpu: int) -> tuple[int, Cusum] | None:
        """The proxy gathering most (half way) that can hold ``gpu`` back: its rank's (unposted sends fill the
        GPU's slots) or a neighbour's in the flows (data in bursts, credit late). A farther one reaches it only
        through the GPUs between, whose waits _source_gpu reads first: its evidence is back-pressure's residue."""
        near = {gpu}.union(*({s, d} for s, d, _ in ev.units(slowdown.FLOW) if gpu in (s, d)))
        found = [(u, c) for u in ev.units(slowdown.PROXY)
                 if u in near and (c := self.mem.gathering(st, slowdown.PROXY, u)) is not None]
        return max(found, key=lambda x: x[1].s) if found else None

    def _busy_before(self, st: TraceState, rank: int, ev: slowdown.Evidence) -> bool:
        """The rank's lateness has a cause the test is gathering evidence of (half way to an alarm): its own
        GPU, or a link in a communicator it is in. A rank's kernels run in order on its stream,
        so a slow GPU or a slow transfer of its pipeline stage holds back its start in the next collective,
        and through a TP group the start of its peers' next collectives too. The reverse never holds: a rank
        that calls late leaves its peers' sends waiting for its credit (SendPeerWait), not on the link, and
        its own GPU idle. (Another rank's GPU can read slow behind a late rank: the rank before it blocks on
        a FIFO slot the late one has not freed.) So lateness waits for that verdict. Likewise a GPU or a proxy
        thread gathering evidence in another communicator the rank is in, its own or a peer's there: a proxy
        that posts ready chunks late, or a slow GPU, keeps every rank of that collective (a DP ring's) in it
        longer, and each enters its TP group's next collective late by as much. And another rank late into a
        communicator they share: the rank waited there for it.

        Its own GPU counts only where it does not read healthy in this very collective: a slow GPU is slow in every
        kernel, also this one's, while the GPU evidence of a rank that calls late gathers in its other
        communicators: their receives are posted when it launches, and their data waits behind this
        collective's kernel on its stream."""
        own = not self._gpu_healthy_here(ev, rank)
        return self.mem.held_in_shared(st, rank, own_gpu=own) or self.mem.waited_in_shared(st, rank)

    def _gpu_healthy_here(self, ev: slowdown.Evidence, rank: int) -> bool:
        """The rank's GPU was measured in this collective and read no slower than the test's drift (a
        collective without flows, NVLink's, has no GPU measure: nothing is known there)."""
        z = ev.score(slowdown.GPU, rank)
        return z is not None and z <= self.s.cusum.k

    def _waited_for(self, st: TraceState, ev: slowdown.Evidence, gpu: int) -> Cusum | None:
        """The evidence of another rank that started last and reads late, when it gathers: the ranks before
        it in the ring block on the FIFO slots it has not freed, so their received data waits for their GPUs,
        and a GPU's reading is its back-pressure. Not when a link or its own GPU explains its lateness
        (_busy_before)."""
        rank = ev.late_rank
        if rank in (gpu, -1) or ev.lateness_ns <= 0 or self._busy_before(st, rank, ev):
            return None
        return self.mem.gathering(st, slowdown.LATE, rank)

    def _source_gpu(self, st: TraceState, ev: slowdown.Evidence, g: Alarm) -> Alarm:
        """Of the GPUs gathering evidence in this collective, the one whose data waits longest: a slow GPU
        holds its ring neighbours back (the one before it blocks in its send primitive until a FIFO slot
        frees, so the data it received waits for its GPU too), and which of them crosses h first is a matter
        of noise; the held-back wait is the source's, less the slack of NCCL_STEPS slots."""
        best = g
        for u in ev.units(slowdown.GPU):
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
        full), so its receiver's data waits while the GPU reduces and forwards the ones before it. Its data
        comes hop by hop: in a tree's reduction a link late below a rank's child holds the child's reduce,
        so the ways into it are every sender upstream of it in this collective's flows, not only its own."""
        found = self.links.path_out(st, ev, source)
        if found is not None:
            return found
        flows = ev.units(slowdown.FLOW)
        behind = upstream(flows, source)
        behind.update(u for u in ev.units(slowdown.GPU)
                      if u != source and (u in alarmed or self.mem.gathering(st, slowdown.GPU, u) is not None))
        for u in sorted(behind):
            other = self.links.path_out(st, ev, u)
            if other is not None and other[2].s > (found[2].s if found is not None else 0.0):
                found = other
        return found

    @staticmethod
    def _path(alarm: Alarm, found: tuple[str, object, Cusum] | None) -> Alarm:
        """The network path found behind ``alarm`` (:meth:`Links.path_out`), named for its evidence, else ``alarm``."""
        if found is None:
            return alarm
        path = alarm.led_to(*found)
        if path.cusum is not alarm.cusum:
            alarm.cusum.reset()  # what it measured was the path's doing: named once, as the path
        return path

    def _runner_up(self, st: TraceState, ev: slowdown.Evidence, a: Alarm) -> tuple[str, float]:
        """The strongest other explanation in this collective: the candidate with the most evidence that is
        neither the named one, nor a symptom that led to it or that it explains by EXPLAINED_BY (a proxy's
        GPUs), nor a measure of the path it names (a NIC's own flows and its other side, a link's flows
        between the same two ends on other channels)."""
        mine = (a.cusum,) + a.via
        on_path = alarmed_path(a)
        nic = a.measure in (slowdown.NIC_SEND, slowdown.NIC_RECV)

        # a NIC slow both ways explains its flows in and out and its other side; a proxy that posts late, its
        # rank's flows and NIC sides, whose arrivals and completions it notices late (EXPLAINED_BY's
        # _proxy_at_end), and its receivers' GPUs, which it holds up (_proxy)
        at_rank = nic or a.measure == slowdown.PROXY

        def explained(name: str, u) -> bool:
            if name == slowdown.FLOW:
                return on_path(*u[:2]) or (at_rank and a.unit in u[:2])
            if name == slowdown.GPU:
                return a.measure == slowdown.PROXY
            return at_rank and name in (slowdown.NIC_SEND, slowdown.NIC_RECV) and u == a.unit

        others = [(c.s, label(name, u)) for name, u, c in self.mem.held(st, ev)
                  if c.s > 0 and not any(c is m for m in mine) and not explained(name, u)]
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
        if (twin := self.links.twin(st, ev, a)) is not None:  # the same evidence: margin 0
            runner_up, runner_s = label(slowdown.NIC_RECV, twin), won_s
            what += f" (rank {twin}'s NIC taking data in slowly would read the same: it hears from rank {who} alone)"
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
