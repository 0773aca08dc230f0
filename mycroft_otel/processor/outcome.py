"""Every decision the analysis takes about one collective, as a named outcome.

A verdict and a silence are both outcomes: the detector returns a :class:`Decision` for each completed
collective it judges, the hang walk one for each stalled collective it names (or finds waiting on another's
culprit), the pipeline adds the outcomes it decides after (held while a stall is open, the same incident), the
processor counts every one (``mycroft_processor_decisions_total{outcome}``) and ``mycroft-otel report``
shows them for a recording, so "why did it not alert?" is read, not debugged. The values are label values
and stable: dashboards and alert rules may select on them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:  # the report reads outcomes without loading the analysis
    from mycroft_otel.processor.views import Finding


class Outcome(str, Enum):
    # a verdict
    NAMED = "named"                        # a candidate's evidence crossed h and the collectives are slower
    STRAGGLER = "straggler"                # everybody waited >= the straggler bar for one rank, once
    MISMATCH = "mismatch"                  # ranks disagree on the collective or its step counts
    HANG = "hang"                          # a stalled collective's culprit, named by the hang walk
    # silences the detector decides
    WARMUP = "warmup"                      # within the communicator's first collectives (NCCL's setup)
    NOT_MEASURED = "not_measured"          # no completed rank's evidence to compare
    HELD_BACK = "held_back"                # the late rank spent its lateness in another communicator's wait
    SAME_STRAGGLER = "same_straggler"      # a wait overlapping a straggler already named (its consequence)
    BELOW_BAR = "below_bar"                # no candidate's evidence reached h
    EXPLAINED = "explained"                # a slowdown named in a joined communicator still holds
    NOT_SLOWER = "not_slower"              # evidence stands, but the communicator's kernels are not slower
    DEFERRED = "deferred"                  # evidence stands, but a likelier cause is still gathering evidence
    # silences the pipeline decides after the detector or the hang walk named something
    WAITS_ON = "waits_on"                  # a stalled collective whose ranks wait for another's culprit
    OTHER_SHARD = "other_shard"            # a stalled collective whose waits all lead into another processor's
                                           # shard of the job (§7): that processor names its culprit
    HELD_FOR_STALL = "held_for_stall"      # the job has a stall open: its outcome decides (a hang's symptom?)
    SAME_INCIDENT = "same_incident"        # an incident already named covers it
    ERROR = "error"                        # the analysis raised on this trace (hostile evidence): logged

    @property
    def verdict(self) -> bool:
        return self in _VERDICTS


NO_CANDIDATE = "no candidate off its peers"  # the detail of a silence where nothing gathers evidence

_VERDICTS = frozenset({Outcome.NAMED, Outcome.STRAGGLER, Outcome.MISMATCH, Outcome.HANG})


@dataclass(slots=True)
class Decision:
    """What the detector decided about one collective: an outcome, the finding when it is a verdict, and
    for a silence a short reason a person can read (which candidate, how far from the bar)."""

    outcome: Outcome
    finding: "Finding | None" = None
    detail: str = ""


def silent(outcome: Outcome, detail: str = "") -> Decision:
    return Decision(outcome, None, detail)


class Decided(NamedTuple):
    """One decision as the processor keeps it (the latest few thousand): which collective, what, why."""

    comm: str
    seq: int
    outcome: Outcome
    detail: str
