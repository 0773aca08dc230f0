"""OTLP transports for already-encoded requests, on public APIs only (grpcio, http.client, ssl).

The agent's spans are protobuf bytes before they are queued (:mod:`.otlp`), so they
are sent as they are: gRPC ``TraceService/Export`` with an identity serializer, or
``POST /v1/traces`` with ``application/x-protobuf``. Configuration follows the OTLP
exporter specification's OTEL_* variables, per-signal ``TRACES_`` first (endpoint,
headers, certificate, client key and certificate, compression, timeout, insecure),
checked earlier by :func:`mycroft_otel.agent.settings.check_otel_env`. Failures the
specification calls transient (gRPC UNAVAILABLE and friends, HTTP 429/502/503/504,
a refused connection) are retried with exponential back-off until the timeout;
:meth:`Transport.shutdown` cuts a back-off short.

Every export ends by its deadline (OTEL_EXPORTER_OTLP[_TRACES]_TIMEOUT, default 10 s), whatever the
collector does: gRPC calls carry it as their deadline; over HTTP a timer shuts the socket down when it
passes, because a socket timeout bounds each read, not the exchange (a collector that trickles its reply a
byte at a time held the export thread forever), and a reply body is read up to MAX_REPLY_BYTES (a 1 GiB
body used to be read whole). :meth:`Transport.shutdown` aborts an exchange in flight the same way.

Why not the SDK's OTLPSpanExporter: its public ``export()`` takes SDK span objects,
and reusing it for bytes meant overriding private methods that change between
releases (``_translate_data``, ``_initialize_channel_and_stub``, ``_client``).
"""

from __future__ import annotations

import gzip
import http.client
import logging
import os
import socket
import ssl
import threading
import time
import zlib
from dataclasses import dataclass
from typing import Mapping
from urllib.parse import unquote, urlsplit

import grpc

from mycroft_otel.redact import check_headers, safe_url

log = logging.getLogger("mycroft_otel.agent")

EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
TRACES_PATH = "/v1/traces"
DEFAULT_TIMEOUT_S = 10.0
_RETRYABLE_GRPC = frozenset({grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED,
                             grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.ABORTED,
                             grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.UNAVAILABLE,
                             grpc.StatusCode.DATA_LOSS})
_RETRYABLE_HTTP = frozenset({408, 429, 502, 503, 504})
_FIRST_BACKOFF_S = 0.5
MAX_REPLY_BYTES = 64 << 10  # an OTLP reply is a few bytes (partial_success); more is read no further


@dataclass(frozen=True)
class OtlpConfig:
    """The trace exporter's OTEL_* settings, resolved."""

    protocol: str                 # grpc | http/protobuf
    endpoint: str                 # gRPC: the URL or host:port; HTTP: the full URL of the traces path
    insecure: bool                # gRPC without TLS
    headers: tuple[tuple[str, str], ...]
    certificate: str | None       # CA bundle that verifies the server
    client_key: str | None
    client_certificate: str | None
    compression: str              # gzip | deflate | none
    timeout_s: float

    @classmethod
    def from_env(cls, protocol: str, env: Mapping[str, str] | None = None) -> "OtlpConfig":
        env = os.environ if env is None else env

        def get(name: str) -> str | None:
            for var in (f"OTEL_EXPORTER_OTLP_TRACES_{name}", f"OTEL_EXPORTER_OTLP_{name}"):
                v = env.get(var, "").strip()
                if v:
                    return v
            return None

        traces_endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
        base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
        if protocol == "grpc":
            endpoint = traces_endpoint or base or "http://localhost:4317"
            scheme = urlsplit(endpoint).scheme if "://" in endpoint else ""
            flag = get("INSECURE")
            insecure = (flag.lower() == "true") if flag is not None else scheme == "http"
            if scheme == "https":
                insecure = False
        else:
            endpoint = traces_endpoint or ((base.rstrip("/") + TRACES_PATH) if base else
                                           "http://localhost:4318" + TRACES_PATH)
            insecure = False
        headers: list[tuple[str, str]] = []
        for var in ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS"):
            raw = env.get(var, "").strip()
            if raw:
                check_headers(var, raw)
                for item in raw.split(","):
                    if item.strip():
                        k, v = item.split("=", 1)
                        headers.append((unquote(k).strip().lower(), unquote(v).strip()))
                break
        timeout = get("TIMEOUT")
        return cls(protocol=protocol, endpoint=endpoint, insecure=insecure, headers=tuple(headers),
                   certificate=get("CERTIFICATE"), client_key=get("CLIENT_KEY"),
                   client_certificate=get("CLIENT_CERTIFICATE"), compression=(get("COMPRESSION") or "none").lower(),
                   timeout_s=float(timeout) if timeout else DEFAULT_TIMEOUT_S)


def _read(path: str | None) -> bytes | None:
    if not path:
        return None
    with open(path, "rb") as f:
        return f.read()


class Transport:
    """Sends one encoded ExportTraceServiceRequest; True on success."""

    def send(self, payload: bytes, n_spans: int) -> bool:  # pragma: no cover - interface
        raise NotImplementedError

    def shutdown(self) -> None:
        pass


class _Retrying(Transport):
    """Exponential back-off within the timeout, cut short by shutdown."""

    def __init__(self, cfg: OtlpConfig):
        self.cfg = cfg
        self._stop = threading.Event()

    def _attempt(self, payload: bytes, timeout_s: float) -> tuple[bool, bool, str]:
        """(sent, worth retrying, why not)."""
        raise NotImplementedError  # pragma: no cover

    def send(self, payload: bytes, n_spans: int) -> bool:
        deadline = time.monotonic() + self.cfg.timeout_s
        backoff = _FIRST_BACKOFF_S
        while not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ok, retry, why = self._attempt(payload, left)
            if ok:
                return True
            left = deadline - time.monotonic()
            if not retry or left <= backoff:
                log.warning("export of %d spans to %s failed: %s", n_spans, safe_url(self.cfg.endpoint), why)
                return False
            if self._stop.wait(backoff):
                break
            backoff *= 2
        return False

    def shutdown(self) -> None:
        self._stop.set()


class GrpcTransport(_Retrying):
    """OTLP/gRPC: one channel (grpcio reconnects it), pre-encoded bytes through an identity serializer."""

    def __init__(self, cfg: OtlpConfig):
        super().__init__(cfg)
        u = urlsplit(cfg.endpoint if "://" in cfg.endpoint else "//" + cfg.endpoint)
        target = f"{u.hostname}:{u.port or 4317}"
        compression = grpc.Compression.Gzip if cfg.compression == "gzip" else grpc.Compression.NoCompression
        if cfg.insecure:
            self._channel = grpc.insecure_channel(target, compression=compression)
        else:
            creds = grpc.ssl_channel_credentials(root_certificates=_read(cfg.certificate),
                                                 private_key=_read(cfg.client_key),
                                                 certificate_chain=_read(cfg.client_certificate))
            self._channel = grpc.secure_channel(target, creds, compression=compression)
        self._export = self._channel.unary_unary(EXPORT_METHOD, request_serializer=None, response_deserializer=None)
        self._metadata = cfg.headers or None

    def _attempt(self, payload: bytes, timeout_s: float) -> tuple[bool, bool, str]:
        try:
            self._export(payload, timeout=timeout_s, metadata=self._metadata)
            return True, False, ""
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
            return False, code in _RETRYABLE_GRPC, f"{code.name if code else 'UNKNOWN'}"

    def shutdown(self) -> None:
        super().shutdown()
        self._channel.close()


class HttpTransport(_Retrying):
    """OTLP/HTTP with protobuf bodies on one persistent connection (reopened after an error)."""

    def __init__(self, cfg: OtlpConfig):
        super().__init__(cfg)
        u = urlsplit(cfg.endpoint)
        self._https = u.scheme == "https"
        self._host, self._port = u.hostname or "localhost", u.port or (443 if self._https else 80)
        self._path = (u.path or TRACES_PATH) + (f"?{u.query}" if u.query else "")
        self._ctx: ssl.SSLContext | None = None
        if self._https:
            self._ctx = ssl.create_default_context(cafile=cfg.certificate)
            if cfg.client_certificate:
                self._ctx.load_cert_chain(cfg.client_certificate, cfg.client_key)
        self._headers = {"Content-Type": "application/x-protobuf", **dict(cfg.headers)}
        if cfg.compression in ("gzip", "deflate"):
            self._headers["Content-Encoding"] = cfg.compression
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()
        self._sock_lock = threading.Lock()  # guards the socket handed to the deadline timer and shutdown

    def _connection(self, timeout_s: float) -> http.client.HTTPConnection:
        if self._conn is None:
            self._conn = (http.client.HTTPSConnection(self._host, self._port, timeout=timeout_s, context=self._ctx)
                          if self._https else http.client.HTTPConnection(self._host, self._port, timeout=timeout_s))
        else:
            self._conn.timeout = timeout_s
            if self._conn.sock is not None:
                self._conn.sock.settimeout(timeout_s)
        return self._conn

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _abort(self) -> None:
        """Wake a blocked send or receive at once (deadline passed, or shutdown): the socket is shut down."""
        with self._sock_lock:
            conn = self._conn
            sock = conn.sock if conn is not None else None
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _attempt(self, payload: bytes, timeout_s: float) -> tuple[bool, bool, str]:
        body = payload
        if self.cfg.compression == "gzip":
            body = gzip.compress(payload)
        elif self.cfg.compression == "deflate":
            body = zlib.compress(payload)
        with self._lock:
            if self._stop.is_set():
                return False, False, "shut down"
            timer = threading.Timer(timeout_s, self._abort)
            timer.daemon = True
            try:
                with self._sock_lock:
                    conn = self._connection(timeout_s)
                timer.start()
                conn.request("POST", self._path, body=body, headers=self._headers)
                resp = conn.getresponse()
                length = resp.getheader("Content-Length")
                resp.read(MAX_REPLY_BYTES)
                if (resp.getheader("Connection", "").lower() == "close" or not resp.isclosed()
                        or (length is not None and not length.isdigit())):
                    self._close_locked()  # a reply longer than we read: the connection cannot be reused
            except (OSError, http.client.HTTPException, ValueError) as exc:
                self._close_locked()
                why = "deadline passed" if not timer.is_alive() and not self._stop.is_set() else type(exc).__name__
                return False, not self._stop.is_set(), why
            finally:
                timer.cancel()
        if 200 <= resp.status < 300:
            return True, False, ""
        return False, resp.status in _RETRYABLE_HTTP, f"HTTP {resp.status}"

    def _close_locked(self) -> None:
        with self._sock_lock:
            self._close()

    def shutdown(self) -> None:
        super().shutdown()
        self._abort()  # never waits for the exchange in flight (it holds self._lock): it ends it
        if self._lock.acquire(timeout=1.0):
            try:
                self._close_locked()
            finally:
                self._lock.release()


def otlp_transport(protocol: str, env: Mapping[str, str] | None = None) -> Transport:
    """The transport OTEL_* asks for (``protocol`` as :func:`check_otel_env` resolved it)."""
    cfg = OtlpConfig.from_env(protocol, env)
    return GrpcTransport(cfg) if protocol == "grpc" else HttpTransport(cfg)
