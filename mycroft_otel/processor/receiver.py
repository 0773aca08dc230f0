"""OTLP receiver: gRPC ``TraceService/Export`` and HTTP ``POST /v1/traces`` (protobuf or JSON).

Both decode ``ExportTraceServiceRequest`` themselves (raw bytes in, so every
malformed payload is answered with a protocol error and counted, never an
exception escaping into the server): gRPC answers INVALID_ARGUMENT, HTTP 400;
oversized payloads get RESOURCE_EXHAUSTED / 413, gzip bombs are cut at the same
limit, slow or stuck HTTP clients time out, and concurrency is bounded (gRPC
``maximum_concurrent_rpcs``, an HTTP semaphore) so hostile traffic cannot wedge
the processor. Loopback by default; TLS optional (certificate + key files).
"""

from __future__ import annotations

import logging
import ssl
import struct
import threading
import time
import zlib
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

log = logging.getLogger("mycroft_otel.processor.receiver")

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
DEFAULT_MAX_BYTES = 32 << 20
_RESPONSE = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()


def _decode(data: bytes, content_type: str = "application/x-protobuf"):
    req = trace_service_pb2.ExportTraceServiceRequest()
    if content_type.startswith("application/json"):
        json_format.Parse(data.decode("utf-8"), req, ignore_unknown_fields=True, max_recursion_depth=64)
    else:
        req.ParseFromString(data)
    return req


def write_record(f, data: bytes, content_type: str) -> None:
    """Append one received payload to a recording: <u64 time_ns><u8 json?><u32 len><payload>."""
    f.write(struct.pack("<QBI", time.time_ns(), content_type.startswith("application/json"), len(data)))
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
                 record: str | None = None):
        self.processor = processor
        self.bind = bind
        self.max_bytes = max_bytes
        self.metrics = metrics
        self.tls = (tls_cert, tls_key) if tls_cert and tls_key else None
        self.grpc_port = grpc_port
        self.http_port = http_port
        self.workers = workers
        self.http_timeout_s = http_timeout_s
        self.rejected = {"grpc": 0, "http": 0}
        self._grpc: grpc.Server | None = None
        self._http: ThreadingHTTPServer | None = None
        self._http_thread: threading.Thread | None = None
        self._record = open(record, "ab") if record else None
        self._record_lock = threading.Lock()

    # -- shared ---------------------------------------------------------------------------------
    def _reject(self, protocol: str, reason: str) -> None:
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
                data = _decode(data, content_type).SerializeToString()
            self.processor.ingest_payload(data)
        except (DecodeError, json_format.ParseError, UnicodeDecodeError, RecursionError, ValueError) as exc:
            raise ValueError(f"malformed ExportTraceServiceRequest: {exc}") from None

    # -- gRPC -----------------------------------------------------------------------------------
    def _grpc_export(self, data: bytes, context: grpc.ServicerContext) -> bytes:
        if len(data) > self.max_bytes:
            self._reject("grpc", "oversized")
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "request too large")
        try:
            self.handle(data)
        except ValueError as exc:
            self._reject("grpc", "malformed")
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except Exception:  # noqa: BLE001 - an internal error must still be an answer
            log.exception("gRPC export failed")
            self._reject("grpc", "internal")
            context.abort(grpc.StatusCode.INTERNAL, "internal error")
        return _RESPONSE

    def start_grpc(self) -> int:
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="otlp-grpc"),
            maximum_concurrent_rpcs=64,
            options=[("grpc.max_receive_message_length", self.max_bytes),
                     ("grpc.max_send_message_length", 1 << 20),
                     ("grpc.so_reuseport", 0)],
        )
        handler = grpc.method_handlers_generic_handler(SERVICE, {
            "Export": grpc.unary_unary_rpc_method_handler(self._grpc_export, request_deserializer=None,
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
        server.start()
        self._grpc = server
        self.grpc_port = port
        return port

    # -- HTTP -----------------------------------------------------------------------------------
    def start_http(self) -> int:
        receiver = self
        slots = threading.BoundedSemaphore(32)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body are separate writes: no 40 ms delayed-ACK stalls
            timeout = receiver.http_timeout_s
            server_version = "mycroft-otel-processor"

            def log_message(self, fmt, *args):  # quiet
                pass

            def _reply(self, code: int, body: bytes = b"", ctype: str = "text/plain", close: bool = False) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                if close:
                    self.send_header("Connection", "close")
                    self.close_connection = True
                self.end_headers()
                if body:
                    self.wfile.write(body)

            def do_GET(self):
                self._reply(405, b"use POST /v1/traces\n")

            do_PUT = do_DELETE = do_PATCH = do_GET

            def do_POST(self):
                if not slots.acquire(blocking=False):
                    receiver._reject("http", "overloaded")
                    self._reply(503, b"overloaded\n", close=True)
                    return
                try:
                    self._post()
                finally:
                    slots.release()

            def _post(self):
                if self.path.split("?", 1)[0] != "/v1/traces":
                    receiver._reject("http", "not_found")
                    self._reply(404, b"not found\n", close=True)
                    return
                try:
                    length = int(self.headers.get("Content-Length", ""))
                except ValueError:
                    receiver._reject("http", "no_length")
                    self._reply(411, b"Content-Length required\n", close=True)
                    return
                if length < 0 or length > receiver.max_bytes:
                    receiver._reject("http", "oversized")
                    self._reply(413, b"request too large\n", close=True)
                    return
                data = self.rfile.read(length)
                if len(data) != length:
                    receiver._reject("http", "truncated")
                    self._reply(400, b"truncated body\n", close=True)
                    return
                enc = (self.headers.get("Content-Encoding") or "identity").strip().lower()
                if enc == "gzip":
                    try:
                        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
                        data = d.decompress(data, receiver.max_bytes + 1)
                        if len(data) > receiver.max_bytes or d.unconsumed_tail:
                            receiver._reject("http", "oversized")
                            self._reply(413, b"decompressed request too large\n", close=True)
                            return
                    except zlib.error:
                        receiver._reject("http", "malformed")
                        self._reply(400, b"bad gzip body\n")
                        return
                elif enc not in ("identity", ""):
                    receiver._reject("http", "encoding")
                    self._reply(415, b"unsupported Content-Encoding\n")
                    return
                ctype = (self.headers.get("Content-Type") or "application/x-protobuf").split(";")[0].strip().lower()
                if ctype not in ("application/x-protobuf", "application/protobuf", "application/json"):
                    receiver._reject("http", "content_type")
                    self._reply(415, b"unsupported Content-Type\n")
                    return
                try:
                    receiver.handle(data, ctype)
                except ValueError as exc:
                    receiver._reject("http", "malformed")
                    self._reply(400, str(exc).encode() + b"\n")
                    return
                except Exception:  # noqa: BLE001
                    log.exception("HTTP export failed")
                    receiver._reject("http", "internal")
                    self._reply(500, b"internal error\n")
                    return
                if ctype == "application/json":
                    self._reply(200, b"{}", "application/json")
                else:
                    self._reply(200, _RESPONSE, "application/x-protobuf")

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            allow_reuse_address = True
            request_queue_size = 64

            def handle_error(self, request, client_address):  # a broken client is not our error
                pass

        server = Server((self.bind, self.http_port or 0), Handler)
        if self.tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(self.tls[0], self.tls[1])
            server.socket = ctx.wrap_socket(server.socket, server_side=True)
        self._http = server
        self.http_port = server.server_address[1]
        self._http_thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                                             name="otlp-http", daemon=True)
        self._http_thread.start()
        return self.http_port

    def start(self) -> "Receiver":  # noqa: D401
        if self.grpc_port is not None:
            self.start_grpc()
        if self.http_port is not None:
            self.start_http()
        return self

    def shutdown(self) -> None:
        if self._grpc is not None:
            self._grpc.stop(grace=1).wait(3)
            self._grpc = None
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
        if self._record is not None:
            self._record.close()
            self._record = None
