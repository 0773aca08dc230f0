"""OTLP/HTTP ``POST /v1/traces`` on Tornado's HTTP/1.1 server, bounded against hostile clients.

Why Tornado rather than ``http.server``: one event loop serves every connection
(no thread per connection), the TLS handshake runs on that loop without blocking
accept, and its HTTP/1.1 connection enforces a deadline on the *whole* header block
(``header_timeout``, which also closes idle keep-alive connections) and on the
*whole* body (``body_timeout``), not per ``recv``. On top of that this module caps
open connections and the bytes of bodies being received or waiting for ingest, and
takes an ingest slot only once a body is complete, so clients that drip bytes cost
a socket each and never a legitimate request's answer (benchmarks/processor/
http_server.py measures the cost per request against ``http.server``). One client
address holds at most ``max_connections_per_client`` of the open connections, so a
client that opens a thousand idle ones cannot take everybody else's places.

JSON costs ~0.5 s of CPU and ~12 bytes of Python objects per byte to parse (protobuf's
json_format), against microseconds for the native protobuf decoder: JSON bodies are
bounded by their own, smaller limit (``max_json_bytes``, checked on the declared
length, on the bytes received and after gzip, before any parsing) and are parsed on
one thread of their own, so JSON clients can neither starve protobuf ingest nor
parse several large bodies at once.

Decoding and ingest run on the receiver's worker threads, off the loop -- except a
small uncompressed protobuf body that finds the processor's lock free, which is
ingested at once on the loop (no thread hop; it cannot wait there, and its decode
is bounded by INLINE_MAX_BYTES).

The seam with :mod:`.receiver` runs one way: the receiver imports this module and
builds an :class:`OtlpHttpServer` around itself; this module never imports the
receiver and reaches it only through :class:`IngestTarget`, the public protocol it
declares here (limits and token to enforce, the worker pool, ``handle`` to decode and
ingest a body, ``reject`` to count a refusal).
"""

from __future__ import annotations

import hmac
import logging
import ssl
import zlib
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Protocol

import tornado.httpserver
import tornado.httputil
import tornado.iostream

EXPORT_RESPONSE = b""  # an empty ExportTraceServiceResponse (no partial success) is zero bytes on the wire

log = logging.getLogger("mycroft_otel.processor.receiver")

TRACES_PATH = "/v1/traces"
_PROTOBUF = ("application/x-protobuf", "application/protobuf")
_JSON = "application/json"
_MAX_HEADER_BYTES = 64 << 10
INLINE_MAX_BYTES = 64 << 10  # uncompressed protobuf bodies up to this are ingested on the loop when they can be
_UNBOUNDED = 1 << 62  # Tornado's own body limit answers 400; ours (in data_received) answers 413


@dataclass(frozen=True)
class HttpLimits:
    """What one hostile client, or many, can hold of the HTTP receiver."""

    request_timeout_s: float = 10.0     # whole header block, and again whole body (and idle keep-alive)
    max_connections: int = 1024         # open connections; more are closed at accept
    max_connections_per_client: int = 128  # open connections from one client address (clients behind one NAT
                                        #   share it); more are closed at accept
    max_json_bytes: int = 8 << 20       # largest OTLP/JSON body, also after gzip (protobuf: the receiver's max_bytes)
    max_body_bytes_in_flight: int = 256 << 20  # bodies being received or queued for ingest, all connections
    max_pending_ingest: int = 64        # complete requests queued for the ingest threads


class _Lock(Protocol):
    """A threading.Lock or RLock: the inline path only tries it, never waits on it."""

    def acquire(self, blocking: bool = ..., timeout: float = ...) -> bool: ...
    def release(self) -> None: ...


class IngestTarget(Protocol):
    """What the HTTP server needs from whoever owns it (:class:`~mycroft_otel.processor.receiver.Receiver`)."""

    token: bytes | None                  # the bearer token clients must present, or None
    max_bytes: int                       # largest request body, after gzip
    ingest_lock: _Lock | None            # the processor's lock: free means a small body can be ingested inline
    pool: Executor                       # the worker threads that decode and ingest
    json_pool: Executor                  # the one thread that parses JSON bodies (then ingests them)

    def handle(self, data: bytes, content_type: str) -> None:
        """Decode and ingest one uncompressed body; ValueError when it is malformed."""

    def reject(self, protocol: str, reason: str) -> None:
        """Count one request answered with an error."""


class _Request(tornado.httputil.HTTPMessageDelegate):
    """One POST: headers checked before any body byte is read, body bounded, ingest off the loop."""

    def __init__(self, server: "OtlpHttpServer", conn: tornado.httputil.HTTPConnection):
        self.server = server
        self.rx = server.receiver
        self.conn = conn
        self.chunks: list[bytes] = []
        self.size = 0            # body bytes reserved against the in-flight budget
        self.refused = False     # an answer was sent; drop whatever else arrives
        self.headers: tornado.httputil.HTTPHeaders | None = None
        self.deferred: tuple[int, str, bytes, dict | None] | None = None  # answer once the body is read
        self.discarded = 0
        self.limit = self.rx.max_bytes  # largest body of this request's content type (JSON: max_json_bytes)
        self.limit_name = "--max-request-bytes"

    # -- answers ----------------------------------------------------------------------------
    def _reply(self, code: int, body: bytes = b"", ctype: str = "text/plain", close: bool = False,
               extra: dict | None = None) -> None:
        h = tornado.httputil.HTTPHeaders({"Content-Type": ctype, "Content-Length": str(len(body))})
        if close:
            h["Connection"] = "close"
        for k, v in (extra or {}).items():
            h[k] = v
        try:
            self.conn.write_headers(tornado.httputil.ResponseStartLine("HTTP/1.1", code, ""), h, body)
            self.conn.finish()
        except tornado.iostream.StreamClosedError:
            pass
        # (an answer sent before the body was read makes Tornado close the connection once it is flushed:
        # nothing more is read from that client, a declared body it never sends costs no timeout)

    def _refuse(self, code: int, reason: str, text: bytes, close: bool = True, extra: dict | None = None) -> None:
        self.refused = True
        self._release()
        self.rx.reject("http", reason)
        self._reply(code, text, close=close, extra=extra)

    def _too_large(self, declared: int | None = None) -> bytes:
        """The 413's text: which limit, its value, and what to do."""
        what = "JSON " if self.limit_name == "--max-json-bytes" else ""
        size = f"of {declared} bytes " if declared is not None else ""
        hint = "send OTLP protobuf or smaller batches" if what else "send smaller batches"
        return (f"{what}request body {size}exceeds the limit of {self.limit} bytes ({self.limit_name}); "
                f"{hint}\n").encode()

    def _release(self) -> None:
        if self.size:
            self.server.in_flight -= self.size
            self.size = 0
        self.chunks = []

    # -- HTTPMessageDelegate ----------------------------------------------------------------
    def headers_received(self, start_line, headers) -> None:
        self.headers = headers
        if _content_type(headers) == _JSON:
            self.limit = min(self.rx.max_bytes, self.server.limits.max_json_bytes)
            self.limit_name = "--max-json-bytes"
        # refusals that do not depend on the body are answered once it has been read (and discarded, within
        # the same size and time bounds): a client still writing its body when the connection closes sees
        # a reset, not the answer
        if start_line.method != "POST":
            self.deferred = (405, "method", b"use POST /v1/traces\n", None)
        elif start_line.path.split("?", 1)[0] != TRACES_PATH:
            self.deferred = (404, "not_found", b"not found\n", None)
        elif self.rx.token is not None and not bearer_ok(headers.get("Authorization", ""), self.rx.token):
            self.deferred = (401, "unauthenticated", b"missing or wrong bearer token\n",
                             {"WWW-Authenticate": 'Bearer realm="otlp"'})
        length = headers.get("Content-Length")
        if length is not None:
            try:
                n = int(length)
            except ValueError:
                self._refuse(400, "malformed", b"bad Content-Length\n")
                return
            if n < 0 or n > self.rx.max_bytes:
                self._refuse(413, "oversized", self._too_large(n))
                return
            if n > self.limit and self.deferred is None:
                # (read and discarded within the same bounds, so that the client reads the reason)
                self.deferred = (413, "oversized", self._too_large(n), None)
        elif "chunked" not in headers.get("Transfer-Encoding", "").lower() and self.deferred is None:
            self._refuse(411, "no_length", b"Content-Length required\n")

    def data_received(self, chunk: bytes) -> None:
        if self.refused:
            return
        n = len(chunk)
        if self.deferred is not None:  # read to answer, not to keep
            self.discarded += n
            if self.discarded > self.rx.max_bytes:
                self._refuse(413, "oversized", self.deferred[2] if self.deferred[0] == 413 else self._too_large())
            return
        if self.size + n > self.limit:
            self._refuse(413, "oversized", self._too_large())
            return
        if self.server.in_flight + n > self.server.limits.max_body_bytes_in_flight:
            self._refuse(503, "overloaded", b"overloaded\n")
            return
        self.server.in_flight += n
        self.size += n
        self.chunks.append(chunk)

    def finish(self) -> None:
        if self.refused:
            return
        if self.deferred is not None:
            code, reason, text, extra = self.deferred
            self._refuse(code, reason, text, close=False, extra=extra)
            return
        if self.server.pending >= self.server.limits.max_pending_ingest:
            self._refuse(503, "overloaded", b"overloaded\n")
            return
        assert self.headers is not None
        enc = (self.headers.get("Content-Encoding") or "identity").strip().lower()
        if enc not in ("identity", "", "gzip"):
            self._refuse(415, "encoding", b"unsupported Content-Encoding\n", close=False)
            return
        ctype = _content_type(self.headers)
        if ctype not in _PROTOBUF and ctype != _JSON:
            self._refuse(415, "content_type", b"unsupported Content-Type\n", close=False)
            return
        data = b"".join(self.chunks)
        self.chunks = []
        lock = self.rx.ingest_lock
        if (enc != "gzip" and ctype in _PROTOBUF and len(data) <= INLINE_MAX_BYTES and lock is not None
                and lock.acquire(blocking=False)):
            # small and the processor free right now: ingest here, saving the hop to a worker thread (~80 µs
            # of CPU a request, benchmarks/processor/http_server.py); the loop waits on nothing
            try:
                self._answer(_ingest(self.rx, data, False, ctype, self.limit, self.limit_name))
            finally:
                lock.release()
            return
        self.server.pending += 1
        pool = self.rx.json_pool if ctype == _JSON else self.rx.pool
        fut = self.server.loop.run_in_executor(pool, _ingest, self.rx, data, enc == "gzip", ctype, self.limit,
                                               self.limit_name)
        fut.add_done_callback(self._ingested)

    def _ingested(self, fut) -> None:
        self.server.pending -= 1
        self._answer(fut.result())

    def _answer(self, result: tuple[int, bytes, str, str]) -> None:
        self._release()
        code, body, ctype, reason = result
        if reason:
            self.rx.reject("http", reason)
        self._reply(code, body, ctype)

    def on_connection_close(self) -> None:
        self._release()


def _content_type(headers: tornado.httputil.HTTPHeaders) -> str:
    return (headers.get("Content-Type") or _PROTOBUF[0]).split(";")[0].strip().lower()


def _ingest(rx: IngestTarget, data: bytes, gzipped: bool, ctype: str, limit: int,
            limit_name: str) -> tuple[int, bytes, str, str]:
    """On a worker thread: (status, body, content type, reject reason or ""). A gzip body is inflated to at
    most ``limit`` bytes (one byte more tells it is over), never further."""
    if gzipped:
        try:
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            data = d.decompress(data, limit + 1)
        except zlib.error:
            return 400, b"bad gzip body\n", "text/plain", "malformed"
        if len(data) > limit or d.unconsumed_tail:
            what = "JSON " if ctype == _JSON else ""
            return (413, f"decompressed {what}request body exceeds the limit of {limit} bytes ({limit_name})\n"
                    .encode(), "text/plain", "oversized")
    try:
        rx.handle(data, ctype)
    except ValueError as exc:
        return 400, str(exc).encode() + b"\n", "text/plain", "malformed"
    except Exception:  # noqa: BLE001 - an internal error must still be an answer
        log.exception("HTTP export failed")
        return 500, b"internal error\n", "text/plain", "internal"
    if ctype == _JSON:
        return 200, b"{}", _JSON, ""
    return 200, EXPORT_RESPONSE, _PROTOBUF[0], ""


def bearer_ok(header: str, token: bytes) -> bool:
    """``Authorization: Bearer <token>``, compared in constant time."""
    scheme, _, value = header.strip().partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), token)


class OtlpHttpServer(tornado.httpserver.HTTPServer):
    """Tornado's HTTP server with a cap on open connections; serves :class:`_Request`."""

    def initialize(self, receiver: IngestTarget, limits: HttpLimits, tls: ssl.SSLContext | None, loop) -> None:  # type: ignore[override]
        self.receiver = receiver
        self.limits = limits
        self.loop = loop
        self.in_flight = 0     # body bytes held (received, not yet ingested)
        self.pending = 0       # requests queued for ingest
        self.per_client: dict[str, int] = {}  # client address -> open connections
        self.client_of: dict[object, str] = {}  # stream -> its client address
        super().initialize(
            self, no_keep_alive=False, xheaders=False, ssl_options=tls, decompress_request=False,
            max_header_size=_MAX_HEADER_BYTES, max_body_size=_UNBOUNDED,  # (bounded here, answered 413)
            idle_connection_timeout=limits.request_timeout_s, body_timeout=limits.request_timeout_s)

    def handle_stream(self, stream, address) -> None:
        if len(self._connections) >= self.limits.max_connections:
            self.receiver.reject("http", "connections")
            stream.close()
            return
        client = str(address[0]) if isinstance(address, tuple) and address else ""
        held = self.per_client.get(client, 0)
        if held >= self.limits.max_connections_per_client:
            self.receiver.reject("http", "client_connections")
            stream.close()
            return
        self.per_client[client] = held + 1
        self.client_of[stream] = client
        super().handle_stream(stream, address)

    def on_close(self, server_conn) -> None:  # HTTPServerConnectionDelegate: a connection is gone
        client = self.client_of.pop(server_conn.stream, None)
        if client is not None:
            left = self.per_client[client] - 1
            if left:
                self.per_client[client] = left
            else:
                del self.per_client[client]
        super().on_close(server_conn)

    def start_request(self, server_conn, request_conn):  # HTTPServerConnectionDelegate
        return _Request(self, request_conn)
