"""What a processor that holds only some blocks of a job's ranks reads differently (docs/algorithm.md §7).

Agents that shard jobs (``MYCROFT_SHARD_RANKS``) put ``mycroft.job.shard`` (global rank // N) on each rank's
resource, and the gateway routes on (job id, shard): every span of a block of N global ranks reaches one
processor, and a communicator that crosses blocks (a DP ring, a pipeline, the world) is seen in parts. Its
ranks of this processor's blocks are the ones it has heard from: a shard's rank is heard from at its first
exported collective, and the others never are. So a collective is complete, or its set of ranks settled, when
those ranks have completed it or reported; and a hang walk that reaches a rank never heard from ends there
without naming it: the processor of that rank's block walks on (rca.walk's ``outside``).
"""

from __future__ import annotations

from typing import Callable

from mycroft_otel.processor.state import TraceState, TraceStore


def sharded(st: TraceState) -> bool:
    """Whether the trace's job is sharded: its spans carry a shard."""
    return st.resource.shard >= 0


def ranks_here(store: TraceStore, st: TraceState) -> int:
    """How many of the collective's ranks reach this processor: its communicator's size, or for a sharded job
    the ranks of it this processor has heard from (what a trace waits for before it is complete or settled)."""
    return store.members.get(st.comm, (0,))[0] if sharded(st) else st.nranks


def settling(store: TraceStore, st: TraceState, mono: float, settle_s: float) -> bool:
    """Whether the trace's set of ranks may still grow, for at most ``settle_s`` since it last heard from a new
    rank: fewer have reported than reach this processor, or (a sharded job) the ranks this processor holds of its
    communicator grew less than ``settle_s`` ago (at a communicator's first collectives they are learnt from
    the spans as they arrive: a rank not heard from yet is not yet known to be another processor's)."""
    if mono - st.ranks_changed_mono >= settle_s:
        return False
    if st.heard_from() < ranks_here(store, st):
        return True
    return sharded(st) and mono - store.members.get(st.comm, (0, -settle_s))[1] < settle_s


def outside(store: TraceStore, st: TraceState) -> Callable[[int], bool] | None:
    """For a sharded job's trace, whether a rank of its communicator is in a block another processor holds
    (none of its spans in this communicator ever reached this one); None for a whole job."""
    if not sharded(st):
        return None
    comm, known = st.comm, store.proc_of
    return lambda r: (comm, r) not in known
