"""The typed keys the slowdown detector files its memory under (memory.py), and what of a collective they read:
its kind (function and size bucket) and its place in the communicator's training step."""

from __future__ import annotations

from typing import NamedTuple

from mycroft_otel import semconv as sc
from mycroft_otel.processor.spans import MAX_STEP_INDEX, STEP_BEYOND, STEP_NONE, STEP_UNREAD, SpanRef, span_attributes
from mycroft_otel.processor.state import P2P, TraceState


def kind_of(st: TraceState) -> tuple[str, int]:
    """(function, size bucket) a collective's nulls and durations are kept under: p2p transfers as one
    function, sizes by their power of two."""
    return ("p2p" if st.func in P2P else st.func), (next(iter(st.op.values())).nbytes.bit_length() if st.op else 0)


_STEP_KEYS = frozenset({sc.COLL_STEP_INDEX})


def step_of(st: TraceState) -> int:
    """The collective's place in its communicator's training step, as the first of its completed spans to say
    gives it (agent/sampling.py StepPattern: the ranks of a communicator find the same one); -1 when none says,
    or says a place beyond MAX_STEP_INDEX (hostile input must not multiply the keys). The decoder read each
    span's place at ingest (SpanRef.step); a span it could not vouch for is read here."""
    if st.step is None:
        v = -1
        for ref in st.op.values():
            got = ref.step
            if got == STEP_UNREAD:
                got = _step_attribute(ref)
            if got != STEP_NONE:
                v = got if got >= 0 else -1
                break
        st.step = v
    return st.step


def _step_attribute(ref: SpanRef) -> int:
    """A span's place decoded from its kept bytes (raises ValueError on malformed ones), as SpanRef.step
    reads it."""
    got = span_attributes(ref, _STEP_KEYS).get(sc.COLL_STEP_INDEX)
    if isinstance(got, int) and not isinstance(got, bool):
        return got if 0 <= got < MAX_STEP_INDEX else STEP_BEYOND
    return STEP_NONE


class NullKey(NamedTuple):
    """Where a measure's null and healthy level are kept: per job, communicator, function, size bucket and
    measure; ``comm`` ("*", ranks) for the siblings' (the job's communicators of that size moving the same
    function), ``bucket`` "*" for all the communicator's sizes, (size bucket, step_of) for a lateness at one place
    of the training step; ``mode`` how its scores were taken (candidates.py:
    "x" against the collective's median, "h" against the healthy level; "" for a level)."""

    job: str
    comm: object
    func: str
    bucket: object
    measure: str
    mode: str = ""


class CandidateKey(NamedTuple):
    """Where a candidate's evidence is kept. ``place``: a flow's or a lateness's communicator (``unit`` the
    flow: sender, receiver, channel; or the rank); a GPU's, NIC's or proxy's process when it is known by its global rank (the same GPU
    in every communicator), else (communicator, rank). ``step``: a lateness's place in the training step
    (step_of; -1 for the other measures, or when not known)."""

    job: str
    measure: str
    place: object
    unit: object = None
    step: int = -1
