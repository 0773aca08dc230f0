"""The processor's settings: one typed object, read and checked once from the environment (MYCROFT_*).

Knobs a user sets are environment variables (mycroft_otel/config.py documents and validates each); the
constants below them are the detector's design, each with the reason for its value.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from mycroft_otel import config
from mycroft_otel.processor.sequential import SequentialDesign


@dataclass(frozen=True, slots=True)
class Settings:
    # -- knobs (environment) --------------------------------------------------------------------
    stall_ms: float = 3000.0        # MYCROFT_STALL_MS, >= 1: no progress this long is a hang
    slow_factor: float = 2.0        # MYCROFT_SLOW_FACTOR, >= 1: a collective this many times its baseline
                                    #   duration is analysed for a slowdown even when no agent flagged it
    trace_ttl_s: float = 120.0      # MYCROFT_TRACE_TTL_S, > 0
    max_traces: int = 20000         # MYCROFT_MAX_TRACES, >= 1
    max_trace_bytes: int = 512 << 20  # MYCROFT_MAX_TRACE_BYTES, >= 1 MiB: span evidence held, all traces together
    incident_quiet_s: float = 300.0  # MYCROFT_INCIDENT_QUIET_S, > 0: a page resolves when its job is silent this
                                    #   long, or its slowdown unseen (open_incidents.py)
    trace_ui_url: str = ""          # MYCROFT_TRACE_UI_URL: Jaeger base URL, or a URL with {trace_id}
    runbook_url: str = ""           # MYCROFT_RUNBOOK_URL: the runbook the page links to (#<category> appended);
                                    #   '' until cli.py fills in the processor's own /runbook (own_runbook_url)
    max_history_bytes: int = 512 << 20  # MYCROFT_MAX_HISTORY_BYTES, >= 1 MiB: the detector's learned history
    # -- detector design ------------------------------------------------------------------------
    cusum: SequentialDesign = field(default_factory=SequentialDesign)
    null_size: int = 512            # healthy scores kept per measure (a few dozen collectives of 8-16 ranks)
    null_min_values: int = 32       # scores, and ...
    null_min_collectives: int = 8   # ... collectives, before a measure's null is trusted
    own_size: int = 64              # a candidate's own healthy scores kept, and ...
    own_min_values: int = 16        # ... how many before its own spread counts (the measure's null's until then)
    duration_history: int = 256     # a communicator's recent collective durations kept per function and size:
                                    #   a verdict needs those since the evidence began to be slower than before
    min_scale: float = 0.05         # log units: below a 5% spread the measure is treated as 5% noisy
    late_prior_scale: float = 0.2   # lateness (a share of the makespan, 0 for all but the last rank) is judged
                                    #   against (0, this) until its null is trusted: a late rank is usually
                                    #   flagged only in its first few collectives (the agents' baselines then
                                    #   learn it), which a null still learning would spend; 20% of the
                                    #   makespan, 4x the floor, is no evidence yet
    evidence_ttl_s: float = 60.0    # a candidate's evidence older than this is forgotten (consecutive collectives)
    straggler_ns: int = 1_000_000_000  # a rank everybody waited >= 1 s for is named from one collective
    warmup_seq: int = 8             # a communicator's first collectives name no slowdown: NCCL connects peers
                                    #   and registers buffers on first use, so they are slow by construction
    step_floor_ns: float = 1000.0   # per-step waits are compared as (wait + floor): sub-us waits are noise
    # -- incidents ------------------------------------------------------------------------------
    incident_window_s: float = 120.0  # a culprit named this recently is the same incident
    measure_batch: int = 256        # completed collectives measured in one pass over their flows

    def design(self) -> tuple:
        """The detector's design constants (every field from ``cusum`` on): what a learned history
        (checkpoint.py) is valid under."""
        names = [f.name for f in fields(self)]
        return tuple(getattr(self, n) for n in names[names.index("cusum"):])

    @classmethod
    def from_env(cls, env=None, stall_ms: float | None = None) -> "Settings":
        """The knobs from ``env`` (os.environ when None); a bad value raises naming the variable."""
        return cls(
            stall_ms=float(stall_ms if stall_ms is not None else config.get_int("MYCROFT_STALL_MS", env, lo=1)),
            slow_factor=config.get_float("MYCROFT_SLOW_FACTOR", env, lo=1.0),
            trace_ttl_s=config.get_float("MYCROFT_TRACE_TTL_S", env, lo=0.001),
            max_traces=config.get_int("MYCROFT_MAX_TRACES", env, lo=1),
            max_trace_bytes=config.get_int("MYCROFT_MAX_TRACE_BYTES", env, lo=1 << 20),
            incident_quiet_s=config.get_float("MYCROFT_INCIDENT_QUIET_S", env, lo=0.001),
            trace_ui_url=_url("MYCROFT_TRACE_UI_URL", config.get_str("MYCROFT_TRACE_UI_URL", env)),
            runbook_url=_url("MYCROFT_RUNBOOK_URL", config.get_str("MYCROFT_RUNBOOK_URL", env)),
            max_history_bytes=config.get_int("MYCROFT_MAX_HISTORY_BYTES", env, lo=1 << 20),
        )


def _url(name: str, value: str) -> str:
    """An http(s) URL or ''; anything else is named (a page must not link to a bad address)."""
    if value and not value.startswith(("http://", "https://")):
        raise config.ConfigError(f"{name}={value!r} must be an http:// or https:// URL")
    return value
