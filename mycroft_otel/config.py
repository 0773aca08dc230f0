"""Every MYCROFT_* environment variable, documented next to its name, read typed.

Like opentelemetry-sdk's ``environment_variables`` module, this is the one place
that knows our knobs. Components call the typed getters; a bad value raises
:class:`ConfigError` naming the variable. The native plugin reads the variables
marked (plugin) itself, with the same defaults (native/plugin/config.cc).
docs/configuration.md is generated from this table (``python -m mycroft_otel.config``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Mapping


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the variable."""


@dataclass(frozen=True)
class Var:
    name: str
    default: str
    doc: str
    used_by: str  # "plugin", "agent", "processor", ... (comma separated)
    shown: str = ""  # the default as documented, when it depends on who runs (a uid, a home directory)


RING_DIR_PREFIX = "/dev/shm/mycroft-otel-"


def default_ring_dir(uid: int | None = None) -> str:
    """Per user: ``/dev/shm/mycroft-otel-<euid>`` (native/plugin/config.cc builds the same path).

    One shared directory would belong to whoever created it first, and the plugin refuses
    a ring directory another user owns.
    """
    return f"{RING_DIR_PREFIX}{os.geteuid() if uid is None else uid}"


def default_state_dir(env: Mapping[str, str] | None = None) -> str:
    """The agent's own directory: ``$XDG_STATE_HOME/mycroft-otel``, else ``~/.local/state/mycroft-otel``.

    Never inside the ring directory, which the training user owns (a symlink planted there
    would make a root agent write wherever it points).
    """
    env = os.environ if env is None else env
    base = env.get("XDG_STATE_HOME", "").strip()
    if not os.path.isabs(base):
        home = env.get("HOME", "").strip() or os.path.expanduser("~")
        base = os.path.join(home, ".local", "state")
    return os.path.join(base, "mycroft-otel")


_JOB_ID_SOURCES = ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "JOB_ID", "FLUX_JOB_ID")

VARS: dict[str, Var] = {
    v.name: v
    for v in (
        Var("MYCROFT_RING_DIR", default_ring_dir(),
            "Directory of the shared-memory files, one per (process, communicator, rank). Created 0700; files "
            "0600. The plugin refuses a symlink, a directory another user owns, or one group/others can write.",
            "plugin,agent,sim", shown="/dev/shm/mycroft-otel-<euid>"),
        Var("MYCROFT_JOB_ID", "",
            "Job id (a trace-id salt and the mycroft.job.id resource attribute). Defaults from "
            + ", ".join(_JOB_ID_SOURCES) + "; empty when none is set.", "plugin,agent"),
        Var("MYCROFT_LIVE_SLOTS", "64", "Operations in flight at once per communicator and rank (1..4096).", "plugin"),
        Var("MYCROFT_RING_RECORDS", "512", "Completion-ring records per communicator and rank (16..65536).", "plugin"),
        Var("MYCROFT_ENABLE", "1", "0 disables the plugin (NCCL runs as without it).", "plugin"),
        Var("MYCROFT_KERNEL_EVENTS", "auto", "Kernel events asked of NCCL: auto (KernelCh; plus v7 KernelPhase on "
            "NCCL 2.31.0-2.31.2), channel, phase (docs/native.md).", "plugin"),
        Var("MYCROFT_POLL_MS", "100", "Agent period for polling live tables and draining rings (ms).", "agent"),
        Var("MYCROFT_INFLIGHT_AFTER_MS", "1000",
            "An operation in flight longer than this is exported as in-flight snapshots (ms).", "agent"),
        Var("MYCROFT_SNAPSHOT_MS", "1000", "Period of in-flight snapshots and status spans (ms).", "agent"),
        Var("MYCROFT_IDLE_AFTER_MS", "2000",
            "A rank idle on a communicator while its peers are busy emits a not_entered status after this (ms).",
            "agent"),
        Var("MYCROFT_SAMPLE_RATIO", "0.01",
            "Share of healthy operations exported (consistent by trace id: every rank keeps the same ones).",
            "agent"),
        Var("MYCROFT_SLOW_FACTOR", "2.0",
            "An operation this many times slower than its running baseline is anomalous and always exported.",
            "agent,processor"),
        Var("MYCROFT_DETAIL", "op", "op: one span per rank and operation; chunk: adds per-step span events.",
            "agent"),
        Var("MYCROFT_STALL_MS", "3000", "In-flight evidence without progress this long is a hang (ms).", "processor"),
        Var("MYCROFT_TRACE_TTL_S", "120", "How long the processor keeps a trace's state after its last span (s).",
            "processor"),
        Var("MYCROFT_INCIDENT_QUIET_S", "300",
            "An open incident's page resolves when its job sent no span this long, and a slowdown when nothing "
            "was found of it this long (s; a hang resolves when the job moves again).", "processor"),
        Var("MYCROFT_TRACE_UI_URL", "",
            "Trace UI the page and `mycroft-otel report` link to: a base URL that /trace/<trace id> is appended to (Jaeger), or a URL "
            "with {trace_id} in it (Grafana Explore, any UI); empty: no link.", "processor"),
        Var("MYCROFT_RUNBOOK_URL", "",
            "Runbook the page links to, #<category> appended (its section); empty: the processor's own copy, "
            "http://<host>:<metrics port>/runbook, host the --bind address (the machine's FQDN for 0.0.0.0).",
            "processor"),
        Var("MYCROFT_MAX_TRACES", "20000", "Traces the processor holds at once; the oldest are evicted.",
            "processor"),
        Var("MYCROFT_OTLP_TOKEN", "",
            "Bearer token the processor's OTLP receivers require (Authorization: Bearer, gRPC and HTTP); empty: "
            "none. Or --token-file. Never logged.", "processor"),
        Var("MYCROFT_MAX_TRACE_BYTES", str(512 << 20),
            "Bytes of span evidence the processor holds, all traces together (each kept span at its wire size "
            "plus 512; a kept span never pins more than twice that); over it the least recently updated traces "
            "are evicted and their spans counted as dropped.", "processor"),
        Var("MYCROFT_MAX_HISTORY_BYTES", str(512 << 20),
            "Bytes of learned history the processor's slowdown detector holds (per-communicator nulls, levels, "
            "candidates' own scores, evidence, kernel times; estimated); over it the oldest half is forgotten "
            "(relearned from the next collectives: a verdict is delayed, never made up).", "processor"),
        Var("MYCROFT_SUMMARY_MS", "10000",
            "Window of the per-rank, per-communicator mycroft.summary span of unsampled healthy operations (ms).",
            "agent"),
        Var("MYCROFT_WARMUP_OPS", "8",
            "Operations per (communicator, function, size bucket) before the agent's slow/late rule may flag.",
            "agent"),
        Var("MYCROFT_SLOW_MIN_MS", "1",
            "An operation (or its start gap) must also exceed its baseline by this much to be slow/late (ms).",
            "agent"),
        Var("MYCROFT_PEER_EXPORT", "1",
            "1: when a local rank flags a collective anomalous, also export the other local ranks' spans of it.",
            "agent"),
        Var("MYCROFT_EXPORT_QUEUE", "20000",
            "Spans the agent holds for export at most; beyond this it drops and counts (collector down or slow).",
            "agent"),
        Var("MYCROFT_EXPORT_BATCH", "2048", "Spans per OTLP export request at most.", "agent"),
        Var("MYCROFT_SHARD_RANKS", "0",
            "0: a job is one shard (all its spans reach one processor). N > 0: a rank's spans carry "
            "mycroft.job.shard = its global rank // N, and the gateway gives each block of N global ranks its own "
            "processor; for jobs larger than one processor can hold (docs/algorithm.md §7). Set it alike on every "
            "agent, a multiple of the ranks per node.", "agent"),
        Var("MYCROFT_STATE_DIR", "",
            "Where the agent persists per-ring cursors for restarts (its own directory: 0700, owned by the agent's "
            "user); default $XDG_STATE_HOME/mycroft-otel, else ~/.local/state/mycroft-otel.", "agent"),
    )
}


def _raw(name: str, env: Mapping[str, str] | None) -> str:
    env = os.environ if env is None else env
    return env.get(name, VARS[name].default).strip()


def _number(name: str, env: Mapping[str, str] | None, parse: Callable[[str], float],
            lo: float | None, hi: float | None) -> float:
    raw = _raw(name, env)
    try:
        value = parse(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a valid {parse.__name__}") from None
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ConfigError(f"{name}={raw!r} is out of range [{lo}, {hi}]")
    return value


def get_int(name: str, env: Mapping[str, str] | None = None, lo: int | None = None, hi: int | None = None) -> int:
    return int(_number(name, env, int, lo, hi))


def get_float(name: str, env: Mapping[str, str] | None = None,
              lo: float | None = None, hi: float | None = None) -> float:
    return _number(name, env, float, lo, hi)


def get_str(name: str, env: Mapping[str, str] | None = None, choices: tuple[str, ...] | None = None) -> str:
    value = _raw(name, env)
    if choices is not None and value not in choices:
        raise ConfigError(f"{name}={value!r} must be one of {', '.join(choices)}")
    return value


def get_bool(name: str, env: Mapping[str, str] | None = None) -> bool:
    value = _raw(name, env).lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{name}={value!r} is not a boolean (1/0/true/false)")


def job_id(env: Mapping[str, str] | None = None) -> str:
    """MYCROFT_JOB_ID, else the first launcher variable that is set, else ''."""
    env = os.environ if env is None else env
    for name in ("MYCROFT_JOB_ID",) + _JOB_ID_SOURCES:
        if env.get(name):
            return env[name]
    return ""


def markdown_table() -> str:
    rows = ["| variable | default | used by | meaning |", "|---|---|---|---|"]
    rows += [f"| `{v.name}` | `{v.shown or v.default}` | {v.used_by} | {v.doc} |" for v in VARS.values()]
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
