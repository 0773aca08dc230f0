"""OTLP receiver: gRPC ``TraceService/Export`` and HTTP ``POST /v1/traces`` (protobuf or JSON).

Both servers run on one asyncio event loop thread (grpc.aio, and Tornado's HTTP/1.1
server in :mod:`.otlp_http`); decoding and ingest run on a small pool of worker
threads. A connection that is idle, mid-handshake or dripping bytes costs a socket
on the loop, never a thread, so it cannot stop anyone else's ingest. Each payload
is decoded by the receiver itself (raw bytes in, so every malformed payload is
answered with a protocol error and counted, never an exception escaping into a
server): gRPC answers INVALID_ARGUMENT, HTTP 400; oversized payloads get
RESOURCE_EXHAUSTED / 413, gzip bombs are cut at the same limit (JSON bodies at their
own, smaller one). Bounds: whole-header and whole-body deadlines, open HTTP connections
(all, and per client address), body bytes in flight, queued ingest
(:class:`~mycroft_otel.processor.otlp_http.HttpLimits`); on gRPC the same deadline
for a call's request message (from its headers on), queued ingest, streams per
connection, connections, handshake time and connection idle/age. Loopback by default;
TLS (certificate + key files) and a bearer token (``Authorization: Bearer``, on both
protocols) are optional.

Seams, each one way: this module builds :mod:`.otlp_http`'s server around a
:class:`Receiver`, which serves it as the :class:`~mycroft_otel.processor.otlp_http.IngestTarget`
that module declares (``handle``, ``reject``, limits, token, pool); :mod:`.otlp_http` never
imports this one. :func:`decode_export_request` is the one OTLP trace-request decoder
(protobuf or JSON), also used to read recordings (``--record``: :mod:`.replay`,
:mod:`mycroft_otel.report`).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import struct
import threading
import time
from concurrent import futures

import grpc
import tornado.netutil
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from mycroft_otel.processor.otlp_http import EXPORT_RESPONSE, HttpLimits, OtlpHttpServer, bearer_ok

log = logging.getLogger("mycroft_otel.processor.receiver")

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
DEFAULT_MAX_BYTES = 32 << 20
GRPC_MAX_STREAMS_PER_CONNECTION = 16
GRPC_MAX_CONNECTIONS = 1024
# calls in progress, most of them waiting for their message (a coroutine each, cut at the request deadline):
# as many as the connections can carry, so holding them all takes GRPC_MAX_CONNECTIONS connections
GRPC_MAX_CONCURRENT_RPCS = GRPC_MAX_CONNECTIONS * GRPC_MAX_STREAMS_PER_CONNECTION
GRPC_HANDSHAKE_TIMEOUT_MS = 10_000  # TCP accepted -> TLS and HTTP/2 settings done
GRPC_MAX_CONNECTION_IDLE_MS = 300_000
GRPC_MAX_CONNECTION_AGE_MS = 600_000   # then a GOAWAY; calls in progress get the grace below
GRPC_MAX_CONNECTION_AGE_GRACE_MS = 30_000


def decode_export_request(data: bytes, content_type: str = "application/x-protobuf"
                          ) -> trace_service_pb2.ExportTraceServiceRequest:
    """An ``ExportTraceServiceRequest`` from its OTLP bytes: JSON when ``content_type`` says so, else protobuf.

    Raises what the parsers raise (``DecodeError``, ``json_format.ParseError``, ``UnicodeDecodeError``,
    ``RecursionError``) on a malformed payload."""
    req = trace_service_pb2.ExportTraceServiceRequest()
    if content_type.startswith("application/json"):
        json_format.Parse(data.decode("utf-8"), req, ignore_unknown_fields=True, max_recursion_depth=64)
    else:
        req.ParseFromString(data)
    return req


def write_record(f, data: bytes, content_type: str, t_ns: int | None = None) -> None:
    """Append one received payload to a recording: <u64 time_ns><u8 json?><u32 len><payload>; ``t_ns``: when
    it was received (default now; a run on virtual time passes its own clock)."""
    f.write(struct.pack("<QBI", time.time_ns() if t_ns is None else t_ns, content_type.startswith("application/json"),
                        len(data)))
    f.write(data)
    f.flush()


def read_records(path: str):
    """Yield (time_ns, content_type, payload) from a recording made with ``--record``."""
    import gzip

    with (gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")) as f:
        while True:
            head = f.read(13)
            if len(head) < 13:
                return
            t, js, n = struct.unpack("<QBI", head)
            data = f.read(n)
            if len(data) < n:
                return
            yield t, "application/json" if js else "application/x-protobuf", data


class Receiver:
    """Owns the gRPC and HTTP servers that feed one :class:`~mycroft_otel.processor.pipeline.Processor`."""

    def __init__(self, processor, bind: str = "127.0.0.1", grpc_port: int | None = 4317,
                 http_port: int | None = 4318, max_bytes: int = DEFAULT_MAX_BYTES, tls_cert: str | None = None,
                 tls_key: str | None = None, metrics=None, workers: int = 4, http_timeout_s: float = 10.0,
                 record: str | None = None, token: str | None = None, limits: HttpLimits | None = None):
        self.processor = processor
        self.bind = bind
        self.max_bytes = max_bytes
        self.metrics = metrics
        self.tls = (tls_cert, tls_key) if tls_cert and tls_key else None
        self.grpc_port = grpc_port
        self.http_port = http_port
        self.workers = workers
        self.limits = limits or HttpLimits(request_timeout_s=http_timeout_s)
        self.token: bytes | None = token.encode() if token else None
        self.rejected = {"grpc": 0, "http": 0}
        self._grpc_pending = 0  # complete gRPC requests waiting for or in ingest (loop thread only)
        # tried without waiting by the HTTP loop for small payloads (otlp_http.INLINE_MAX_BYTES)
        self.ingest_lock = getattr(processor, "lock", None)
        self.pool = futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="otlp-ingest")
        # JSON bodies are parsed one at a time, beside the protobuf workers (otlp_http explains the cost)
        self.json_pool = futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="otlp-json")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._grpc: grpc.aio.Server | None = None
        self._http: OtlpHttpServer | None = None
        self._record = open(record, "ab") if record else None
        self._record_lock = threading.Lock()

    # -- shared ---------------------------------------------------------------------------------
    def reject(self, protocol: str, reason: str) -> None:
        """Count one request answered with an error (also called by the HTTP server)."""
        self.rejected[protocol] += 1
        if self.metrics is not None:
            self.metrics.request_rejected(protocol, reason)

    def handle(self, data: bytes, content_type: str = "application/x-protobuf") -> None:
        """Decode and ingest; raises ValueError (bad payload) for the caller to turn into a protocol error."""
        if self._record is not None:
            with self._record_lock:
                write_record(self._record, data, content_type)
        try:
            if content_type.startswith("application/json"):
                data = decode_export_request(data, content_type).SerializeToString()
            self.processor.ingest_payload(data)
        except (DecodeError, json_format.ParseError, UnicodeDecodeError, RecursionError, ValueError) as exc:
            raise ValueError(f"malformed ExportTraceServiceRequest: {exc}") from None

    def _ssl_context(self) -> ssl.SSLContext | None:
        if not self.tls:
            return None
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.tls[0], self.tls[1])
        return ctx

    # -- the loop thread ------------------------------------------------------------------------
    def _run_on_loop(self, coro, timeout_s: float = 30.0):
        if self._loop is None:
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            self._loop_thread = threading.Thread(target=run, name="otlp-receiver", daemon=True)
            self._loop_thread.start()
            ready.wait()
            self._loop = loop
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    # -- gRPC -----------------------------------------------------------------------------------
    async def _grpc_export(self, _requests, context: grpc.aio.ServicerContext) -> bytes:
        # Served as a client-streaming method (the wire is the same as unary): the handler starts when the call's
        # headers arrive, so the request message can be awaited with a deadline -- a unary handler would only run
        # once the whole message is in, and a client dripping it would hold its call, and a concurrency slot, as
        # long as it likes.
        if self.token is not None:
            auth = next((v for k, v in context.invocation_metadata() or () if k == "authorization"), "")
            if not bearer_ok(auth if isinstance(auth, str) else auth.decode("latin-1"), self.token):
                self.reject("grpc", "unauthenticated")
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
        try:
            data = await asyncio.wait_for(context.read(), self.limits.request_timeout_s)
        except asyncio.TimeoutError:
            self.reject("grpc", "timeout")
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                                f"request message not received within {self.limits.request_timeout_s:g} s")
        if data is grpc.aio.EOF or not isinstance(data, bytes):
            self.reject("grpc", "malformed")
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no request message")
        if len(data) > self.max_bytes:
            self.reject("grpc", "oversized")
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "request too large")
        if self._grpc_pending >= self.limits.max_pending_ingest:
            self.reject("grpc", "overloaded")
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "overloaded")
        self._grpc_pending += 1
        try:
            await asyncio.get_running_loop().run_in_executor(self.pool, self.handle, data)
        except ValueError as exc:
            self.reject("grpc", "malformed")
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except Exception:  # noqa: BLE001 - an internal error must still be an answer
            log.exception("gRPC export failed")
            self.reject("grpc", "internal")
            await context.abort(grpc.StatusCode.INTERNAL, "internal error")
        finally:
            self._grpc_pending -= 1
        return EXPORT_RESPONSE

    async def _start_grpc(self) -> int:
        server = grpc.aio.server(
            maximum_concurrent_rpcs=GRPC_MAX_CONCURRENT_RPCS,
            options=[("grpc.max_receive_message_length", self.max_bytes),
                     ("grpc.max_send_message_length", 1 << 20),
                     ("grpc.max_concurrent_streams", GRPC_MAX_STREAMS_PER_CONNECTION),
                     ("grpc.server_handshake_timeout_ms", GRPC_HANDSHAKE_TIMEOUT_MS),
                     ("grpc.max_connection_idle_ms", GRPC_MAX_CONNECTION_IDLE_MS),
                     ("grpc.max_connection_age_ms", GRPC_MAX_CONNECTION_AGE_MS),
                     ("grpc.max_connection_age_grace_ms", GRPC_MAX_CONNECTION_AGE_GRACE_MS),
                     ("grpc.max_allowed_incoming_connections", GRPC_MAX_CONNECTIONS),
                     ("grpc.so_reuseport", 0)],
        )
        handler = grpc.method_handlers_generic_handler(SERVICE, {
            "Export": grpc.stream_unary_rpc_method_handler(self._grpc_export, request_deserializer=None,
                                                           response_serializer=None)})
        server.add_generic_rpc_handlers((handler,))
        addr = f"{self.bind}:{self.grpc_port or 0}"
        try:
            if self.tls:
                with open(self.tls[0], "rb") as c, open(self.tls[1], "rb") as k:
                    creds = grpc.ssl_server_credentials([(k.read(), c.read())])
                port = server.add_secure_port(addr, creds)
            else:
                port = server.add_insecure_port(addr)
        except RuntimeError as exc:  # grpc reports a failed bind this way
            raise OSError(f"cannot bind OTLP/gRPC on {addr}: {exc}") from None
        if port == 0:
            raise OSError(f"cannot bind OTLP/gRPC on {addr}")
        await server.start()
        self._grpc = server
        return port

    def start_grpc(self) -> int:
        self.grpc_port = self._run_on_loop(self._start_grpc())
        return self.grpc_port

    # -- HTTP -----------------------------------------------------------------------------------
    async def _start_http(self) -> int:
        try:
            socks = tornado.netutil.bind_sockets(self.http_port or 0, self.bind, reuse_port=False, backlog=128)
        except OSError as exc:
            raise OSError(f"cannot bind OTLP/HTTP on {self.bind}:{self.http_port}: {exc.strerror or exc}") from None
        server = OtlpHttpServer(receiver=self, limits=self.limits, tls=self._ssl_context(),
                                loop=asyncio.get_running_loop())
        server.add_sockets(socks)
        self._http = server
        return socks[0].getsockname()[1]

    def start_http(self) -> int:
        self.http_port = self._run_on_loop(self._start_http())
        return self.http_port

    def start(self) -> "Receiver":  # noqa: D401
        if self.grpc_port is not None:
            self.start_grpc()
        if self.http_port is not None:
            self.start_http()
        return self

    async def _stop(self) -> None:
        if self._grpc is not None:
            await self._grpc.stop(grace=1)
            self._grpc = None
        if self._http is not None:
            self._http.stop()
            try:
                await asyncio.wait_for(self._http.close_all_connections(), 3)
            except asyncio.TimeoutError:
                pass
            self._http = None

    def shutdown(self) -> None:
        if self._loop is not None:
            try:
                self._run_on_loop(self._stop(), timeout_s=10)
            except Exception:  # noqa: BLE001 - shutting down: nothing left to answer
                log.debug("receiver shutdown", exc_info=True)
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._loop_thread is not None:
                self._loop_thread.join(timeout=5)
            self._loop.close()
            self._loop = None
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.json_pool.shutdown(wait=False, cancel_futures=True)
        if self._record is not None:
            self._record.close()
            self._record = None
