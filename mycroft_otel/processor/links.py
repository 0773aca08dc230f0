"""Which part of a network path is slow: a flow, the sender's NIC or the receiver's NIC.

A slow link's evidence shows at both of its ends: the sender's flows out and the receiver's flows in read slow
alike. What tells the ends apart is the other traffic of each end: a NIC's send side slows every flow it sends,
its receive side every flow it takes in, whatever the communicator, while one slow flow slows only itself.
:class:`Links` reads that from the job's evidence (memory.py) for the naming table (naming.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from mycroft_otel.processor import slowdown
from mycroft_otel.processor.candidates import Alarm
from mycroft_otel.processor.memory import JobMemory
from mycroft_otel.processor.sequential import Cusum
from mycroft_otel.processor.settings import Settings
from mycroft_otel.processor.state import TraceState


class Links:
    """The network paths behind a collective's alarms, read from the job's accumulated evidence."""

    def __init__(self, settings: Settings, memory: JobMemory):
        self.s, self.mem = settings, memory

    def path_out(self, st: TraceState, ev: slowdown.Evidence, sender: int) -> NetworkPath | None:
        """Who holds whom back, once a rank's GPU or one of its flows out reads slow: the network path its
        evidence points at (measure, unit, evidence), else None: the first row of :data:`PATH_OUT` that holds.

        A slow GPU posts its sends late, but once posted they move at the network's speed: slow flows *out* of
        a rank are the network's doing. They also hold its GPU back (the kernel's send primitive blocks until
        a FIFO slot frees, so data received meanwhile waits for the GPU), and with two similar effects the one
        that crosses h first is a matter of noise, so the rows read each flow's accumulated evidence (half way
        to h), not only this collective's alarms."""
        flows = ev.units(slowdown.FLOW)
        out = [u for u in flows if u[0] == sender]
        slow = [(u, c) for u in out if (c := self.mem.gathering(st, slowdown.FLOW, u)) is not None]
        crosses = any(self.mem.crosses_hosts(st.comm, sender, u[1]) for u in out)
        # its least-waiting flow out reads slow: every flow of its NIC does (with one flow out, that flow)
        nic = self.mem.gathering(st, slowdown.NIC_SEND, sender) if crosses and len(out) > 1 else None
        p = _Out(st, flows, sender, out, slow, max(slow, key=lambda x: x[1].s) if slow else None, crosses, nic)
        return next((found for _, row in PATH_OUT if (found := row(self, p)) is not None), None)

    def flows_beside(self, st: TraceState, rank: int, skip: Callable[[int, int], bool]) -> tuple[int, int]:
        """(how many flows of any communicator carry data to or from the process of ``rank``, how many of
        them are half way to an alarm), leaving out this communicator's flows ``skip(sender, receiver)``
        names: what a proxy thread of that process moves besides the link in question."""
        me = self.mem.process_of(st.comm, rank)
        seen = gathering = 0
        half = self.s.cusum.h / 2
        for k, c in self.mem.cusums.items():
            if k.job != st.job or k.measure != slowdown.FLOW:
                continue
            s, d, _ = k.unit
            if k.place == st.comm:
                if rank not in (s, d) or skip(s, d):
                    continue
            elif me is None or me not in (self.mem.process_of(k.place, s), self.mem.process_of(k.place, d)):
                continue
            seen += 1
            gathering += c.s >= half
        return seen, gathering

    def one_receiver(self, ev: slowdown.Evidence, sender: int) -> int | None:
        """The only rank ``sender``'s flows of this collective go to (a ring's downstream neighbour on every
        channel), else None."""
        to = {u[1] for u in ev.units(slowdown.FLOW) if u[0] == sender}
        return next(iter(to)) if len(to) == 1 else None

    def twin(self, st: TraceState, ev: slowdown.Evidence, a: Alarm) -> int | None:
        """The receiver whose NIC, taking data in slowly, would move exactly the flows a sending NIC's alarm
        measured, with nothing to tell the two apart: the one rank its flows go to, hearing from it alone in
        this collective, neither end with flows in another communicator (a DP pair, or a DP ring whose ranks'
        other traffic stays on NVLink). A tie: whichever end is named, the other is as likely."""
        r = self.one_receiver(ev, a.unit) if a.measure == slowdown.NIC_SEND else None
        if r is None or any(u[1] == r and u[0] != a.unit for u in ev.units(slowdown.FLOW)):
            return None
        alone = all(self.flows_beside(st, x, lambda s, d: True)[0] == 0 for x in (a.unit, r))
        return r if alone else None

    def receiver_of(self, st: TraceState, ev: slowdown.Evidence, a: Alarm) -> tuple[str, object, Cusum] | None:
        """A sending NIC whose flows all go to one receiver slows exactly the flows that receiver's NIC would,
        were it slow to take data in: the receiver is named when the evidence into it from others says so (its
        own least-waiting flow in, another sender's flow into it here, or another communicator's flow into it
        from elsewhere, half way to an alarm)."""
        r = self.one_receiver(ev, a.unit)
        if r is None or not self._taking_in(st, ev.units(slowdown.FLOW), r, a.unit, 0.0):
            return None
        into = self.mem.gathering(st, slowdown.NIC_RECV, r)
        return slowdown.NIC_RECV, r, into if into is not None else a.cusum

    def _taking_in(self, st: TraceState, flows: list, receiver: int, sender: int, least: float) -> bool:
        """Whether the evidence at ``receiver`` says its NIC is slow, rather than the link from ``sender``:
        its least-waiting flow in gathers with >= ``least``, another sender's flow into it in this collective
        gathers, its other communicators' traffic reads slower than the sender's (receiver_likelier), or every
        flow it sends on to other hosts gathers too (its ``nic_send``, the least-waiting of them). A NIC
        trained down, or a bad port or cable, slows both directions: the flows into it and out of it read
        slow alike, which one fault at the receiver explains, where slow sending NICs at both ends would be
        two."""
        into = self.mem.gathering(st, slowdown.NIC_RECV, receiver)
        return (into is not None and into.s >= least) or any(
            v[1] == receiver and v[0] != sender and self.mem.gathering(st, slowdown.FLOW, v) is not None
            for v in flows) or self.receiver_likelier(st, receiver, sender) or \
            self._sends_slow(st, flows, receiver, sender)

    def _sends_slow(self, st: TraceState, flows: list, rank: int, sender: int) -> bool:
        """Every flow ``rank`` sends in this collective goes to another host than ``sender``'s and its NIC's
        send side (its least-waiting flow out) gathers evidence: its own sends are slow, not just its
        upstream's."""
        out = [u for u in flows if u[0] == rank]
        return bool(out) and all(self.mem.crosses_hosts(st.comm, rank, u[1]) and u[1] != sender for u in out) \
            and self.mem.gathering(st, slowdown.NIC_SEND, rank) is not None

    def receiver_likelier(self, st: TraceState, receiver: int, sender: int) -> bool:
        """Of a link's two ends, whose other traffic reads slow: the receiver, when a flow of another
        communicator into it from elsewhere holds more evidence than any flow out of the sender elsewhere, and
        at least one strong score's worth (a PP stage's transfer into a DP ring's rank). Only the other
        communicators can tell: within this one, the link's flows are all either end has."""
        into = self.mem.evidence_elsewhere(st, receiver, sender, into=True)
        return into >= self.s.cusum.cap - self.s.cusum.k and \
            into > self.mem.evidence_elsewhere(st, sender, receiver, into=False)


def alarmed_path(a: Alarm) -> Callable[[int, int], bool]:
    """Whether a flow (sender, receiver) of the alarm's communicator is on the path the alarm measured: the
    link's two ends (any channel), or every flow out of (into) a NIC alarm's rank."""
    if a.measure == slowdown.FLOW:
        ends = set(a.unit[:2])
        return lambda s, d: {s, d} == ends
    if a.measure == slowdown.NIC_SEND:
        return lambda s, d: s == a.unit
    if a.measure == slowdown.NIC_RECV:
        return lambda s, d: d == a.unit
    return lambda s, d: False  # a GPU, proxy or lateness measures no network path


def upstream(flows: list, rank: int) -> set:
    """The ranks whose data reaches ``rank`` through this collective's flows (sender, receiver, channel),
    hop by hop: a tree's subtree below it, a whole ring."""
    senders: dict[int, set] = {}
    for s, d, _ in flows:
        senders.setdefault(d, set()).add(s)
    seen, todo = set(), [rank]
    while todo:
        for s in senders.get(todo.pop(), ()):
            if s not in seen and s != rank:
                seen.add(s)
                todo.append(s)
    return seen


#: a network path found: (measure, unit, its evidence)
NetworkPath = tuple[str, object, Cusum]


@dataclass(slots=True)
class _Out:
    """What the rows of :data:`PATH_OUT` read about one rank's flows out in one collective."""

    st: TraceState
    flows: list                 # every flow of the collective (sender, receiver, channel)
    sender: int
    out: list                   # the sender's flows
    slow: list                  # (flow, its evidence) of those half way to an alarm
    top: tuple | None           # the slowest of them
    crosses: bool               # a flow out goes to another host: a NIC is on the path
    nic: Cusum | None           # its NIC's send side (least-waiting flow out of >= 2), half way


def _inside_host(lk: Links, p: _Out) -> NetworkPath | None:
    # every flow out stays inside the host (NVLink, PCIe): no NIC on the path, the slowest link is it
    return (slowdown.FLOW,) + p.top if not p.crosses and p.top else None


def _into_receiver(lk: Links, p: _Out) -> NetworkPath | None:
    # the slow flows all go to one receiver on another host whose own evidence says it takes in slowly
    # (_taking_in): congestion into that receiver's NIC
    if not (p.crosses and p.top) or len({v[1] for v, _ in p.slow}) > 1:
        return None
    (u, c) = p.top
    if not (lk.mem.crosses_hosts(p.st.comm, p.sender, u[1]) and lk._taking_in(p.st, p.flows, u[1], p.sender, c.s)):
        return None
    into = lk.mem.gathering(p.st, slowdown.NIC_RECV, u[1])
    return slowdown.NIC_RECV, u[1], into if into is not None else c


def _common_to_all(lk: Links, p: _Out) -> NetworkPath | None:
    # a NIC's least-waiting flow (a minimum) rises when any one of its flows slows down: it reads as much
    # evidence as the slowest flow, or every flow out half of it, or every flow out gathers, only when what
    # slows them is common: the sender's NIC (a ring's one peer cannot tell the two ends apart: the sender)
    if not (p.crosses and p.top):
        return None
    c = p.top[1]
    if (p.nic is not None and (p.nic.s >= c.s or all(
            lk.mem.evidence(p.st, slowdown.FLOW, v) >= c.s / 2 for v in p.out))) or len(p.slow) == len(p.out) > 1:
        return slowdown.NIC_SEND, p.sender, p.nic if p.nic is not None else c
    return None


def _one_flow(lk: Links, p: _Out) -> NetworkPath | None:
    # the rest is its slowest flow (a link, a route, a QP); a rank with one flow out names that flow
    return (slowdown.FLOW,) + p.top if p.crosses and p.top else None


def _quiet_nic(lk: Links, p: _Out) -> NetworkPath | None:
    # no flow of its own reads slow yet, but its NIC's send side does
    return (slowdown.NIC_SEND, p.sender, p.nic) if p.crosses and not p.slow and p.nic is not None else None


def _receivers_nic(lk: Links, p: _Out) -> NetworkPath | None:
    # no flow of its own reads slow yet, but the NIC it sends into does: congestion into that receiver slows
    # every sender's flow a little and holds their kernels back
    if not p.crosses or p.slow:
        return None
    into = [(u[1], c) for u in p.out if (c := lk.mem.gathering(p.st, slowdown.NIC_RECV, u[1])) is not None]
    return (slowdown.NIC_RECV,) + max(into, key=lambda x: x[1].s) if into else None


#: the network path behind a rank's slow GPU or flows out, in order: the first row that holds names it
PATH_OUT: tuple[tuple[str, Callable[[Links, _Out], NetworkPath | None]], ...] = (
    ("a link inside the host", _inside_host),
    ("the receiver's NIC, taking in slowly", _into_receiver),
    ("the sender's NIC, slow on every flow", _common_to_all),
    ("one slow flow", _one_flow),
    ("the sender's NIC, no flow slow yet", _quiet_nic),
    ("a receiver's NIC, no flow slow yet", _receivers_nic),
)
