"""What other traces say about a hang: its culprit is stuck elsewhere (propagation), or already moved on.

- A hang whose walk ends at a rank that is silent or not entered, while that rank's process is in flight in
  another hung trace (another communicator, or an earlier collective of this one), is a consequence of that
  trace: TP peers wait for a rank stuck in its DP all-reduce. So is an intra-node collective (no network
  flows, so no walk) whose waiting ranks are in flight in another hung trace: a GPU runs its stream's
  kernels in launch order, and a TP all-reduce launched behind a stuck DP one waits for it. It waits for
  that trace's verdict (or, when that one is queued behind an earlier collective of its communicator, that
  one's) and is then attributed to it. Likewise a GPU the walk finds neither consuming nor producing while
  its process is in flight in another hung trace: its stream is busy in that one's kernel. Both only behind
  a trace the process entered first: the stream runs kernels in launch order, so a DP kernel queued behind a
  stuck TP one is that one's consequence, never its cause. While the other collective still moves, the
  culprit is slow there, not absent here, so this one waits too; once that one is hung as well it waits up
  to 2 x the stall threshold (a cycle of waits must not block forever), and a cycle where every trace waits
  for this one names this one at once.
- The ranks a hang waits for have evidence in a *later* collective of the communicator: they completed this
  one, and the waiting ranks expect data nobody sends -- the ranks disagree on the collective's size.
"""

from __future__ import annotations

from typing import Callable

from mycroft_otel import semconv as sc
from mycroft_otel.processor import detect, rca
from mycroft_otel.processor.views import Finding, build_views, decorate
from mycroft_otel.processor.state import ProcKey, TraceState, TraceStore, proc_key

_KEPT = 4096


def _launched_before(o: TraceState, key: ProcKey, start_ns: int) -> bool:
    """Whether process ``key`` entered trace ``o``'s collective before ``start_ns``. A GPU runs its stream's
    kernels in launch order, so a rank present here waits behind another communicator's kernel only when that
    one was launched first: a TP kernel stuck on a stalled peer holds the DP kernel queued behind it, never
    the other way round. Unknown (no span of the process there yet): assumed first, as before."""
    for ref in o.inflight.values():
        if proc_key(ref) == key:
            return ref.start_ns <= start_ns
    return True


class Propagation:
    def __init__(self, store: TraceStore, stall_ms: float, clock_ns: Callable[[], int]):
        self.store = store
        self.stall_ms = stall_ms
        self.clock_ns = clock_ns
        self._deferred: dict[bytes, float] = {}   # hang trace -> when it started waiting for another's verdict
        self._waits_on: dict[bytes, set] = {}     # hang trace -> the hung traces it waits for
        self.propagated = 0

    def moved_on(self, st: TraceState, f: Finding) -> Finding:
        """``f``, or a mismatch when every silent rank it names has evidence in a later collective."""
        if not (f.category == sc.CAT_RANK_ABSENT and f.reason == "silent" and f.waiting):
            return f
        moved = [r for r in f.ranks if self.store.seq_of.get((st.comm, r), -1) > st.seq]
        if not moved or len(moved) != len(f.ranks):
            return f
        stuck = f.waiting
        nxt = min(self.store.seq_of[(st.comm, r)] for r in moved)
        detail = ""
        ref = st.inflight.get(stuck[0])
        if ref is not None:
            try:
                flows = rca.flows_of(ref)
                if flows:
                    detail = f" ({flows[0].done} of {flows[0].steps} steps done, expecting more)"
            except Exception:  # noqa: BLE001 -- hostile flow arrays only lose the detail
                pass
        nf = Finding(
            kind=sc.KIND_HANG, category=sc.CAT_COLL_MISMATCH, ranks=list(stuck),
            confidence=round(0.7 if len(stuck) < len(moved) + len(stuck) else 0.5, 3),
            evidence=(f"rank{'s' if len(stuck) > 1 else ''} {', '.join(map(str, stuck[:8]))} still wait in "
                      f"{st.func} {st.seq}{detail} while rank{'s' if len(moved) > 1 else ''} "
                      f"{', '.join(map(str, moved[:8]))} completed it and moved on to collective {nxt}: "
                      f"they disagree on the collective's size"),
            onset_ns=f.onset_ns, reason="moved_on", waiting=list(stuck))
        decorate(st, build_views(st), nf)
        return nf

    def _elsewhere(self, st: TraceState, ranks: list[int], missing: bool = True) -> list[TraceState]:
        """The hung traces these ranks' processes are busy in (``missing``: ranks absent from this trace)."""
        others = []
        for r in ranks:
            prev = self.store.seq_of.get((st.comm, r), -1)
            if 0 <= prev < st.seq:  # still in an earlier collective of this communicator
                tid = self.store.trace_at.get((st.comm, prev))
                o = self.store.get(tid) if tid else None
                if o is not None and o.has_hang_evidence():
                    others.append(o)
            ref = st.status.get(r) or st.inflight.get(r)
            key = (proc_key(ref) if ref is not None else None) or self.store.proc_of.get((st.comm, r))
            if key is None:
                continue
            if missing and key[1] == "p" and any(proc_key(x) == key for x in st.inflight.values()):
                # known only by its process, which holds another rank waiting right here: that process is
                # not stuck elsewhere, this rank of it is missing (several GPUs per process)
                continue
            mine = None if missing else st.inflight.get(r)  # when this rank's process launched this one
            others += [o for o in self.store.busy_elsewhere(key, st.trace_id)
                       if (o.comm != st.comm or o.seq < st.seq) and o.has_hang_evidence()
                       and (mine is None or _launched_before(o, key, mine.start_ns))]
        return others

    def waits_for(self, st: TraceState) -> bool:
        """Whether this hang waits for the verdict of hung traces it named (not yet explained by one)."""
        return st.trace_id in self._deferred and st.explained_by is None

    def waits(self, st: TraceState, f: Finding, mono: float) -> bool:
        """True while this hang is (or will be) explained by another trace's verdict: ``st.explained_by`` is
        set once that verdict exists."""
        if f.category == sc.CAT_RANK_ABSENT and f.reason in ("silent", "not_entered"):
            others = self._elsewhere(st, f.ranks)
        elif f.reason == "noflow":
            others = self._elsewhere(st, f.waiting, missing=False)
        elif f.category == sc.CAT_GPU_STALLED:
            # a GPU that neither consumes nor produces here may be busy in a hung kernel of another
            # communicator, launched before this one on its stream: then this one waits for that one
            others = self._elsewhere(st, f.ranks, missing=False)
        else:
            return False
        if not others:
            return False
        for o in others:
            root, hops = o, 0
            while root.verdict is None and not root.elsewhere and hops < 8:
                # explained by another trace's verdict, or queued behind an earlier collective of its
                # communicator (NCCL runs them in order: that one's verdict is this one's)
                nxt = self.store.get(root.explained_by) if root.explained_by is not None else \
                    self.store.queued_behind(root)
                if nxt is None:
                    break
                root, hops = nxt, hops + 1
            if root.verdict is not None or root.elsewhere:  # (elsewhere: another shard's processor names it)
                st.explained_by = root.trace_id
                self._deferred.pop(st.trace_id, None)
                self.propagated += 1
                return True
        now_ns = self.clock_ns()
        if any(not detect.is_hung(o, now_ns, self.stall_ms) for o in others):
            self._deferred.pop(st.trace_id, None)
            return True
        self._waits_on[st.trace_id] = {o.trace_id for o in others}
        if len(self._waits_on) > _KEPT:
            self._waits_on.pop(next(iter(self._waits_on)))
        if f.reason != "noflow" and all(st.trace_id in self._waits_on.get(o.trace_id, ()) for o in others):
            # a cycle: waiting breaks no tie, so this one is named and the others find its verdict. Not a
            # collective without network flows: its culprit is only a guess (the rank that stopped first),
            # and the trace it waits for has flows that name one: that one is named when it looks again
            self._deferred.pop(st.trace_id, None)
            return False
        first = self._deferred.setdefault(st.trace_id, mono)
        if len(self._deferred) > _KEPT:
            self._deferred.pop(next(iter(self._deferred)))
        return mono - first < max(2.0 * self.stall_ms / 1000.0, 1.0)
