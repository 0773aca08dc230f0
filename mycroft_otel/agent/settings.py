"""The agent's settings, read once from MYCROFT_* (mycroft_otel.config) and checked OTEL_*.

Export itself is configured only by the standard OTEL_* variables, which the
OpenTelemetry exporters read; this module validates the ones they would otherwise
reject late or obscurely, so a bad value fails at start with a message naming it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping
from urllib.parse import urlparse

from mycroft_otel import config
from mycroft_otel.config import ConfigError
from mycroft_otel.redact import check_headers, safe_url


@dataclass
class AgentSettings:
    ring_dir: Path
    state_dir: Path
    poll_s: float = 0.1
    inflight_after_ns: int = 1_000_000_000
    snapshot_ns: int = 1_000_000_000
    idle_after_ns: int = 2_000_000_000
    sample_ratio: float = 0.01
    slow_factor: float = 2.0
    warmup_ops: int = 8
    slow_min_ns: int = 1_000_000
    peer_export: bool = True
    detail_chunk: bool = False
    summary_ns: int = 10_000_000_000
    export_queue: int = 20000
    export_batch: int = 2048
    shard_ranks: int = 0  # MYCROFT_SHARD_RANKS: global ranks per shard of a job (0: unsharded)
    protocol: str = "grpc"
    service_name: str = "mycroft-otel-agent"
    all_users: bool = False  # root agent at the per-user default ring dir: follow every user's default dir
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, ring_dir: str | None = None,
                 state_dir: str | None = None) -> "AgentSettings":
        env = os.environ if env is None else env
        rd = Path(ring_dir or config.get_str("MYCROFT_RING_DIR", env))
        sd_raw = state_dir or config.get_str("MYCROFT_STATE_DIR", env)
        sd = Path(sd_raw) if sd_raw else Path(config.default_state_dir(env))
        if not sd.is_absolute():
            raise ConfigError(f"MYCROFT_STATE_DIR={str(sd)!r} must be an absolute path")
        ms = 1_000_000
        return cls(
            ring_dir=rd,
            state_dir=sd,
            poll_s=config.get_int("MYCROFT_POLL_MS", env, 1, 60_000) / 1000.0,
            inflight_after_ns=config.get_int("MYCROFT_INFLIGHT_AFTER_MS", env, 1, 3_600_000) * ms,
            snapshot_ns=config.get_int("MYCROFT_SNAPSHOT_MS", env, 10, 3_600_000) * ms,
            idle_after_ns=config.get_int("MYCROFT_IDLE_AFTER_MS", env, 1, 86_400_000) * ms,
            sample_ratio=config.get_float("MYCROFT_SAMPLE_RATIO", env, 0.0, 1.0),
            slow_factor=config.get_float("MYCROFT_SLOW_FACTOR", env, 1.0, 1000.0),
            warmup_ops=config.get_int("MYCROFT_WARMUP_OPS", env, 1, 1_000_000),
            slow_min_ns=int(config.get_float("MYCROFT_SLOW_MIN_MS", env, 0.0, 3_600_000.0) * ms),
            peer_export=config.get_bool("MYCROFT_PEER_EXPORT", env),
            detail_chunk=config.get_str("MYCROFT_DETAIL", env, ("op", "chunk")) == "chunk",
            summary_ns=config.get_int("MYCROFT_SUMMARY_MS", env, 100, 86_400_000) * ms,
            export_queue=config.get_int("MYCROFT_EXPORT_QUEUE", env, 1, 10_000_000),
            export_batch=config.get_int("MYCROFT_EXPORT_BATCH", env, 1, 100_000),
            shard_ranks=config.get_int("MYCROFT_SHARD_RANKS", env, 0, 1 << 30),
            protocol=check_otel_env(env),
            service_name=env.get("OTEL_SERVICE_NAME", "").strip() or "mycroft-otel-agent",
            all_users=(not ring_dir and not env.get("MYCROFT_RING_DIR", "").strip() and os.geteuid() == 0),
        )


_PROTOCOLS = ("grpc", "http/protobuf")


def check_otel_env(env: Mapping[str, str] | None = None) -> str:
    """Validate the OTEL_* variables the trace exporter reads; return the protocol."""
    env = os.environ if env is None else env

    def get(name: str) -> str | None:
        v = env.get(name)
        return v.strip() if v is not None and v.strip() != "" else None

    protocol = get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc"
    name = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL" if get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") else \
        "OTEL_EXPORTER_OTLP_PROTOCOL"
    if protocol not in _PROTOCOLS:
        raise ConfigError(f"{name}={protocol!r} must be one of {', '.join(_PROTOCOLS)} (http/json is not supported)")
    for var in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        v = get(var)
        if v is None:
            continue
        u = urlparse(v if "://" in v else "http://" + v)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ConfigError(f"{var}={safe_url(v)!r} is not an http(s) URL with a host")
        try:
            u.port
        except ValueError:
            raise ConfigError(f"{var}={safe_url(v)!r} has an invalid port") from None
    for var in ("OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"):
        v = get(var)
        if v is None:
            continue
        try:
            t = float(v)
        except ValueError:
            raise ConfigError(f"{var}={v!r} is not a number (seconds)") from None
        if not 0 < t <= 3600:
            raise ConfigError(f"{var}={v!r} is out of range (0, 3600] seconds")
    for var in ("OTEL_EXPORTER_OTLP_COMPRESSION", "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION"):
        v = get(var)
        if v is not None and v.lower() not in ("gzip", "none", "deflate"):
            raise ConfigError(f"{var}={v!r} must be one of gzip, deflate, none")
        if v is not None and v.lower() == "deflate" and protocol == "grpc":
            raise ConfigError(f"{var}={v!r}: deflate works only with http/protobuf; use gzip or none")
    for var in ("OTEL_EXPORTER_OTLP_CERTIFICATE", "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
                "OTEL_EXPORTER_OTLP_CLIENT_KEY", "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
                "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE"):
        v = get(var)
        if v is not None and not os.path.isfile(v):
            raise ConfigError(f"{var}={v!r}: no such file")
    for var in ("OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"):
        v = get(var)
        if v is not None:
            check_headers(var, v)  # (never echoes a value: they carry tokens)
    v = get("OTEL_RESOURCE_ATTRIBUTES")
    for item in (v or "").split(","):
        if item.strip() and ("=" not in item or not item.split("=", 1)[0].strip()):
            raise ConfigError(f"OTEL_RESOURCE_ATTRIBUTES: {item.strip()!r} is not key=value")
    v = get("OTEL_EXPORTER_OTLP_INSECURE")
    if v is not None and v.lower() not in ("true", "false"):
        raise ConfigError(f"OTEL_EXPORTER_OTLP_INSECURE={v!r} must be true or false")
    return protocol
