"""Export: a bounded queue of encoded spans, one thread, OTLP per OTEL_*.

The poll loop hands over encoded spans with :meth:`ExportQueue.put` and never
blocks: when the queue holds ``MYCROFT_EXPORT_QUEUE`` spans, new spans are dropped
and counted (collector down, slow or erroring). The export thread batches up to
``MYCROFT_EXPORT_BATCH`` spans per request and sends them through an OTLP
transport (:mod:`.transport`: gRPC or HTTP/protobuf on public grpcio/http.client
APIs, configured by OTEL_* -- endpoint, headers, TLS certificates, compression,
timeout -- with retry and back-off); the payload is already protobuf bytes
(:mod:`.otlp`).

Every item also carries per-ring cursor marks; once its spans are exported (or
given up on), the marks become the committed cursors that :mod:`.state` persists,
so a restart resumes after the last exported record.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from typing import Any, Callable, Iterator, Sequence

from mycroft_otel.agent import otlp
from mycroft_otel.agent.health import Health
from mycroft_otel.agent.transport import Transport, otlp_transport

log = logging.getLogger("mycroft_otel.agent")

__all__ = ["ExportQueue", "OtlpTransport", "Transport"]


class OtlpTransport(Transport):
    """OTLP over gRPC or HTTP/protobuf, configured by OTEL_* only (:mod:`.transport`)."""

    def __init__(self, protocol: str = "grpc"):
        self.protocol = protocol
        self._transport = otlp_transport(protocol)

    def send(self, payload: bytes, n_spans: int) -> bool:
        return self._transport.send(payload, n_spans)

    def shutdown(self) -> None:
        self._transport.shutdown()


class ExportQueue:
    """Bounded FIFO of (resource, spans, cursor marks) with one export thread."""

    def __init__(self, transport: Transport, health: Health, max_spans: int = 20000, batch: int = 2048,
                 on_committed: Callable[[dict], None] | None = None, scope: bytes = b"",
                 max_bytes: int = 64 << 20):
        self.transport = transport
        self.health = health
        self.max_spans = max_spans
        self.batch = batch
        self.on_committed = on_committed
        self.scope = scope
        self._items: deque = deque()
        self._queued = 0
        self._bytes = 0
        self.max_bytes = max_bytes
        self._cv = threading.Condition()
        self._stop = False
        self._closing = False
        self._busy = False
        self.committed: dict[str, Any] = {}
        self._thread = threading.Thread(target=self._run, name="mycroft-agent-export", daemon=True)
        self._thread.start()

    # --- producer side (poll loop), never blocks ------------------------------------------
    def put(self, resource: bytes, spans: Sequence[bytes], marks: dict | None = None) -> int:
        """Queue spans of one resource; returns how many were accepted (the rest are dropped, counted)."""
        n = len(spans)
        with self._cv:
            if self._stop:
                self.health.dropped_export_queue += n
                return 0
            if n and self._queued + n > self.max_spans:
                room = max(0, self.max_spans - self._queued)
                self.health.dropped_export_queue += n - room
                spans = list(spans[:room])
                n = room
            if n:
                size = sum(map(len, spans))
                if self._bytes + size > self.max_bytes:  # huge spans (64 flows each): bound bytes too
                    self.health.dropped_export_queue += n
                    spans, n, size = [], 0, 0
                self._bytes += size
            if not n and not marks:
                return 0
            now = time.monotonic()
            for i in range(0, n - self.batch, self.batch):  # big hand-overs travel as several requests
                self._items.append((now, resource, spans[i:i + self.batch], None))
            last = ((n - 1) // self.batch) * self.batch if n else 0
            self._items.append((now, resource, spans[last:], marks))
            self._queued += n
            self.health.queue_spans = self._queued
            self._cv.notify()
        return n

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Keep the export thread from taking items while the caller queues (the caller's own puts still
        go in: the condition's lock is re-entrant). What is queued inside then leaves in batches that
        depend only on what was queued, not on when the thread woke: a run on virtual time sends the
        same requests every time."""
        with self._cv:
            yield

    def pending(self) -> int:
        with self._cv:
            return self._queued + (1 if self._busy else 0)

    # --- export thread --------------------------------------------------------------------
    def _take(self) -> list:
        taken, n = [], 0
        while self._items and (n < self.batch or not taken):
            item = self._items[0]
            if taken and n + len(item[2]) > self.batch and n > 0:
                break
            self._items.popleft()
            taken.append(item)
            n += len(item[2])
        self._queued -= n
        self._bytes -= sum(len(sp) for item in taken for sp in item[2])
        self.health.queue_spans = self._queued
        return taken

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._items and not self._stop:
                    self._cv.wait()
                if not self._items and self._stop:
                    return
                taken = self._take()
                self._busy = True
            try:
                self._export(taken)
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()

    def _export(self, taken: list) -> None:
        groups: dict[bytes, list[bytes]] = {}
        n = 0
        for _, resource, spans, _ in taken:
            if spans:
                groups.setdefault(resource, []).extend(spans)
                n += len(spans)
        if n:
            self.health.export_lag_s = max(0.0, time.monotonic() - taken[0][0])
            payload = otlp.request([(res, self.scope, spans) for res, spans in groups.items()])
            self.health.export_requests += 1
            try:
                ok = self.transport.send(payload, n)
            except Exception as exc:  # a transport must not kill the thread
                log.warning("export failed: %s", exc)
                ok = False
            if ok:
                self.health.spans_exported += n
            else:
                self.health.export_errors += 1
                self.health.dropped_export_failed += n
                if self._closing:
                    return  # aborted by shutdown: leave the cursors, a restart reads these records again
        marks: dict = {}
        for _, _, _, m in taken:
            if m:
                marks.update(m)
        if marks:
            with self._cv:
                self.committed.update(marks)
            if self.on_committed:
                self.on_committed(marks)

    def take_committed(self) -> dict:
        """Cursor marks committed since the last call (swapped out atomically)."""
        with self._cv:
            out, self.committed = self.committed, {}
        return out

    # --- lifecycle ------------------------------------------------------------------------
    def flush(self, timeout_s: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while self._items or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
        return True

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Flush what can be flushed in ``timeout_s``, then stop (idempotent)."""
        self.flush(timeout_s)
        with self._cv:
            self._closing = True
            self._stop = True
            dropped = self._queued
            self._items.clear()
            self._queued = 0
            self._bytes = 0
            self.health.dropped_export_queue += dropped
            self._cv.notify_all()
        self.transport.shutdown()  # ends an exchange in flight (transport.py): the thread is free within a second
        self._thread.join(timeout=1.0)
