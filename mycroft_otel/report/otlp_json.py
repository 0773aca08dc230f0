"""Read and write OTLP/JSON trace files: what ``mycroft-otel report`` takes as input.

The format is the OpenTelemetry Collector ``file`` exporter's (and OTLP/HTTP's JSON encoding):
one ``ExportTraceServiceRequest`` (``{"resourceSpans": [...]}``) per line, trace and span ids as
hex strings, 64-bit integers as decimal strings. A file holding a single (pretty-printed) request
or a JSON list of requests is read too, as are ``.gz`` files, base64 ids (protobuf's own JSON
mapping) and snake_case field names. A processor recording (``mycroft-otel processor --record``,
binary) is read as well: its payloads are the spans the processor received; and the JSON that
``mycroft-otel eval --json`` prints (kept aside for the report's evaluation table).

Reading never stops at the first problem: every unreadable line, request or span is reported as
a :class:`Problem` naming the file, the line and what is wrong, and everything valid is kept.
Input is hostile until read: a file is read, and a ``.gz`` inflated, to at most ``max_bytes``
(:data:`DEFAULT_MAX_INPUT_BYTES`; a 510 KB gzip bomb inflated to 1 GB before), JSON nested past
what Python's parser can follow and AnyValues nested past :data:`MAX_VALUE_DEPTH` are problems
named as such, not crashes.

Writing (:class:`OtlpJsonWriter`) is for the producers of a recorded run (demo, eval): append
protobuf requests or SDK spans; :class:`OtlpJsonFileExporter` is a SpanExporter over it.
"""

from __future__ import annotations

import base64
import json
import os
import re
import struct
import threading
import zlib
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from mycroft_otel import semconv as sc

_HEX = re.compile(r"^[0-9a-fA-F]+$")
DEFAULT_MAX_INPUT_BYTES = 64 << 20  # a file's bytes, after gzip: the report holds ~10x this as Python objects
MAX_VALUE_DEPTH = 64                # AnyValue arrays/kvlists nested deeper are refused (ours nest one level)
_READ_CHUNK = 1 << 16
SUFFIXES = (".json", ".jsonl", ".ndjson", ".json.gz", ".jsonl.gz", ".ndjson.gz", ".rec", ".rec.gz", ".otlp",
            ".otlp.gz")


@dataclass
class Problem:
    where: str   # "file:line" (or "file")
    what: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


@dataclass
class Span:
    name: str
    trace_id: str          # 32 hex digits
    span_id: str           # 16 hex digits
    start_ns: int
    end_ns: int
    attrs: dict
    resource: dict
    links: list = field(default_factory=list)   # [(trace_id hex, span_id hex, attrs)]
    status: str = ""


class ShapeError(ValueError):
    pass


def _get(d: dict, camel: str, snake: str | None = None, default=None):
    if camel in d:
        return d[camel]
    if snake and snake in d:
        return d[snake]
    return default


def _snake(name: str) -> str:
    return re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), name)


def _g(d: dict, camel: str, default=None):
    return _get(d, camel, _snake(camel), default)


def any_value(v, depth: int = 0):
    """An OTLP/JSON AnyValue -> Python value."""
    if depth > MAX_VALUE_DEPTH:
        raise ShapeError(f"attribute value nested deeper than {MAX_VALUE_DEPTH} levels")
    if not isinstance(v, dict):
        raise ShapeError(f"attribute value is {type(v).__name__}, not an AnyValue object")
    if not v:
        return None
    key, val = next(iter(v.items()))
    k = key.replace("_", "").lower()
    if k == "stringvalue":
        return str(val)
    if k == "intvalue":
        return int(val)
    if k == "doublevalue":
        return float(val)
    if k == "boolvalue":
        return bool(val) if not isinstance(val, str) else val.lower() == "true"
    if k == "arrayvalue":
        return [any_value(x, depth + 1) for x in (val or {}).get("values", [])]
    if k == "kvlistvalue":
        return kv_list((val or {}).get("values", []), depth + 1)
    if k == "bytesvalue":
        return base64.b64decode(val).hex()
    raise ShapeError(f"unknown AnyValue kind {key!r}")


def kv_list(items, depth: int = 0) -> dict:
    if not isinstance(items, list):
        raise ShapeError("attributes is not a list")
    out = {}
    for kv in items:
        if not isinstance(kv, dict) or "key" not in kv:
            raise ShapeError("attribute without a key")
        out[kv["key"]] = any_value(kv.get("value", {}), depth)
    return out


def _id(v, nbytes: int, what: str) -> str:
    if not isinstance(v, str) or not v:
        raise ShapeError(f"{what} missing")
    if len(v) == 2 * nbytes and _HEX.match(v):
        return v.lower()
    try:
        raw = base64.b64decode(v, validate=True)
    except ValueError:
        raw = b""
    if len(raw) != nbytes:
        raise ShapeError(f"{what} {v!r} is neither {2 * nbytes} hex digits nor base64 of {nbytes} bytes")
    return raw.hex()


def span_from_json(s: dict, resource: dict) -> Span:
    if not isinstance(s, dict):
        raise ShapeError("span is not an object")
    links = []
    for ln in _g(s, "links", []) or []:
        links.append((_id(_g(ln, "traceId") or _g(s, "traceId"), 16, "link traceId"),
                      _id(_g(ln, "spanId"), 8, "link spanId"), kv_list(_g(ln, "attributes", []) or [])))
    status = _g(s, "status", {}) or {}
    return Span(
        name=str(_g(s, "name", "")), trace_id=_id(_g(s, "traceId"), 16, "traceId"),
        span_id=_id(_g(s, "spanId"), 8, "spanId"), start_ns=int(_g(s, "startTimeUnixNano", 0) or 0),
        end_ns=int(_g(s, "endTimeUnixNano", 0) or 0), attrs=sc.with_shared(kv_list(_g(s, "attributes", []) or []),
                                                                         resource),
        resource=resource, links=links, status=str(status.get("message", "")) if isinstance(status, dict) else "")


def spans_from_request(req, where: str, problems: list[Problem]) -> list[Span]:
    """Spans of one ExportTraceServiceRequest/TracesData JSON object; bad parts become problems."""
    if not isinstance(req, dict):
        problems.append(Problem(where, f"not an OTLP trace export: a JSON {type(req).__name__}, not an object"))
        return []
    rss = _g(req, "resourceSpans")
    if rss is None:
        keys = ", ".join(list(req)[:5]) or "nothing"
        problems.append(Problem(where, f"not an OTLP trace export: no 'resourceSpans' (found {keys})"))
        return []
    if not isinstance(rss, list):
        problems.append(Problem(where, "'resourceSpans' is not a list"))
        return []
    out: list[Span] = []
    for i, rs in enumerate(rss):
        try:
            resource = kv_list((_g(rs, "resource", {}) or {}).get("attributes", []))
            scopes = _g(rs, "scopeSpans") or _g(rs, "instrumentationLibrarySpans") or []
        except (ShapeError, AttributeError, TypeError, ValueError) as exc:
            problems.append(Problem(where, f"resourceSpans[{i}]: {exc}"))
            continue
        for j, ss in enumerate(scopes if isinstance(scopes, list) else []):
            for k, s in enumerate((_g(ss, "spans", []) or []) if isinstance(ss, dict) else []):
                try:
                    out.append(span_from_json(s, resource))
                except (ShapeError, AttributeError, TypeError, ValueError) as exc:
                    name = s.get("name") if isinstance(s, dict) else None
                    problems.append(Problem(where, f"resourceSpans[{i}].scopeSpans[{j}].spans[{k}]"
                                                   f"{' (' + str(name) + ')' if name else ''}: {exc}"))
    return out


RECORD_HEAD = struct.Struct("<QBI")  # processor/receiver.py: time_ns, is_json, length; then the payload


def read_records(raw: bytes):
    """(time_ns, content_type, payload) of a processor recording's bytes (a torn tail is dropped)."""
    i = 0
    while i + RECORD_HEAD.size <= len(raw):
        t, js, n = RECORD_HEAD.unpack_from(raw, i)
        i += RECORD_HEAD.size
        if i + n > len(raw):
            return
        yield t, "application/json" if js else "application/x-protobuf", bytes(raw[i:i + n])
        i += n


def looks_like_record(raw: bytes) -> bool:
    """A processor recording (``processor --record``): headers (time, kind 0 or 1, length) chained through their
    payloads, judged on the first three. Not by its first byte: a header's time is any 8 bytes and begins with
    ``{`` or ``[`` about once in a hundred recordings, while OTLP/JSON text never holds a byte 0 or 1 where a
    header's kind is. The last record may be torn (its writer killed)."""
    at = 0
    for i in range(3):
        if len(raw) - at < RECORD_HEAD.size:
            return i > 0
        _t, js, n = RECORD_HEAD.unpack_from(raw, at)
        at += RECORD_HEAD.size + n
        if js not in (0, 1) or (i == 0 and at > len(raw)):
            return False
        if at >= len(raw):
            return True
    return True


def _read_record(path: str, raw: bytes, problems: list[Problem]) -> list[Span]:
    """A processor recording (``processor --record``): decode each payload."""
    from google.protobuf import json_format

    from mycroft_otel.processor.receiver import decode_export_request

    out: list[Span] = []
    for i, (_t, ctype, data) in enumerate(read_records(raw)):
        where = f"{path}: payload {i}"
        try:
            req = decode_export_request(data, ctype)
        except Exception as exc:  # noqa: BLE001 - recordings may hold rejected payloads
            problems.append(Problem(where, f"undecodable OTLP payload ({type(exc).__name__})"))
            continue
        out += spans_from_request(json_format.MessageToDict(req), where, problems)
    return out


def is_eval_result(doc) -> bool:
    """``mycroft-otel eval --json`` output: {"summary": {...}, "scenarios": [...]}."""
    return isinstance(doc, dict) and isinstance(doc.get("summary"), dict) and isinstance(doc.get("scenarios"), list)


class TooLarge(ValueError):
    pass


class TooDeep(ValueError):
    pass


def _loads(text: str):
    """json.loads, with nesting past what its parser follows (Python's recursion limit, ~1,000 levels;
    OTLP needs fewer than 10) raised as :class:`TooDeep` rather than a RecursionError."""
    try:
        return json.loads(text)
    except RecursionError:
        raise TooDeep("JSON nested too deeply to read (more than ~1,000 levels; OTLP/JSON nests fewer than "
                      "10)") from None


def _inflate(f, max_bytes: int) -> bytearray:
    """A gzip stream's bytes (every member), inflated a chunk at a time and never past ``max_bytes`` + 1."""
    out = bytearray()
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    pending = b""
    while True:
        if not pending:
            pending = f.read(_READ_CHUNK)
            if not pending:
                if not d.eof:
                    raise EOFError("the file ends inside its gzip stream")
                return out
        out += d.decompress(pending, max_bytes + 1 - len(out))
        if len(out) > max_bytes:
            raise TooLarge(f"inflates to more than {max_bytes} bytes")
        pending = d.unconsumed_tail
        if d.eof:  # another member may follow (as gzip.decompress reads them)
            pending = d.unused_data
            if pending.strip(b"\0"):
                d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            else:
                pending = b""


def read_bytes(path: str, max_bytes: int = DEFAULT_MAX_INPUT_BYTES) -> bytearray:
    """The file's bytes, inflated when it is gzip; :class:`TooLarge` past ``max_bytes`` (reading stops
    there), OSError/EOFError/zlib.error when it cannot be read."""
    with open(path, "rb") as f:
        if f.read(2) == b"\x1f\x8b":
            f.seek(0)
            return _inflate(f, max_bytes)
        f.seek(0)
        raw = bytearray(f.read(max_bytes + 1))
    if len(raw) > max_bytes:
        raise TooLarge(f"larger than {max_bytes} bytes")
    return raw


def read_file(path: str, problems: list[Problem], evals: list | None = None,
              recordings: list | None = None, max_bytes: int = DEFAULT_MAX_INPUT_BYTES) -> list[Span]:
    try:
        raw = read_bytes(path, max_bytes)
    except TooLarge as exc:
        problems.append(Problem(path, f"{exc} (the limit, --max-input-mib {max_bytes / (1 << 20):g}): not read; "
                                      "split the run into smaller files, or raise the limit"))
        return []
    except OSError as exc:
        problems.append(Problem(path, f"cannot read: {exc.strerror or exc}"))
        return []
    except (EOFError, zlib.error) as exc:
        problems.append(Problem(path, f"broken gzip data: {exc}"))
        return []
    if looks_like_record(raw):
        if recordings is not None:
            recordings.append(path)
        return _read_record(path, raw, problems)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        problems.append(Problem(path, f"not UTF-8 text ({exc.reason} at byte {exc.start})"))
        return []
    del raw  # (the text is all that is read from here on)
    if not text.strip():
        problems.append(Problem(path, "empty file"))
        return []
    lines = text.splitlines()
    first = next(ln for ln in lines if ln.strip())
    try:  # JSON lines (the Collector's file exporter) unless the first line is not a document
        doc = _loads(first)
        whole = len([ln for ln in lines if ln.strip()]) == 1
    except json.JSONDecodeError:
        doc, whole = None, True
    except TooDeep as exc:
        doc, whole = None, len([ln for ln in lines if ln.strip()]) == 1
        if whole:
            problems.append(Problem(f"{path}:1" if len(lines) > 1 else path, str(exc)))
            return []
    if whole:  # one document: a request, or a list of them (possibly pretty-printed)
        try:
            doc = _loads(text) if doc is None else doc
        except json.JSONDecodeError:
            doc = None
        except TooDeep as exc:
            problems.append(Problem(path, str(exc)))
            return []
        else:
            if is_eval_result(doc):
                if evals is not None:
                    evals.append((path, doc))
                return []
            docs = doc if isinstance(doc, list) else [doc]
            out = []
            for i, d in enumerate(docs):
                out += spans_from_request(d, path if len(docs) == 1 else f"{path}: item {i}", problems)
            return out
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            d = _loads(line)
        except json.JSONDecodeError as exc:
            problems.append(Problem(f"{path}:{n}", f"invalid JSON ({exc.msg} at column {exc.colno})"))
            continue
        except TooDeep as exc:
            problems.append(Problem(f"{path}:{n}", str(exc)))
            continue
        out += spans_from_request(d, f"{path}:{n}", problems)
    return out


def read_path(path: str, problems: list[Problem], evals: list | None = None,
              recordings: list | None = None, max_bytes: int = DEFAULT_MAX_INPUT_BYTES
              ) -> tuple[list[Span], list[str]]:
    """(spans, files read) from a file or a directory (its OTLP/JSON and .rec files, not recursive);
    ``mycroft-otel eval --json`` results found on the way are appended to ``evals`` as (file, doc),
    processor recordings to ``recordings``."""
    if os.path.isdir(path):
        files = sorted(os.path.join(path, n) for n in os.listdir(path)
                       if n.endswith(SUFFIXES) and os.path.isfile(os.path.join(path, n)))
        if not files:
            problems.append(Problem(path, f"no input files in the directory (looked for {', '.join(SUFFIXES)})"))
    elif os.path.exists(path):
        files = [path]
    else:
        problems.append(Problem(path, "no such file or directory"))
        files = []
    spans: list[Span] = []
    for f in files:
        spans += read_file(f, problems, evals, recordings, max_bytes)
    return spans, files


# --- writing ------------------------------------------------------------------------------------

def request_to_json(req) -> dict:
    """A protobuf ExportTraceServiceRequest -> OTLP/JSON dict (hex ids, as the Collector writes)."""
    from google.protobuf import json_format

    d = json_format.MessageToDict(req)

    def fix(o):
        if isinstance(o, dict):
            for k, v in o.items():
                if k in ("traceId", "spanId", "parentSpanId") and isinstance(v, str) and v:
                    o[k] = base64.b64decode(v).hex()
                else:
                    fix(v)
        elif isinstance(o, list):
            for x in o:
                fix(x)
    fix(d)
    return d


class OtlpJsonWriter:
    """Appends OTLP/JSON lines to ``path`` (thread-safe; a line per request)."""

    def __init__(self, path: str):
        self.path = path
        self._lock = threading.Lock()
        self._f = open(path, "a", encoding="utf-8")

    def write_request(self, req) -> None:
        line = json.dumps(request_to_json(req), separators=(",", ":"))
        with self._lock:
            if self._f is not None:
                self._f.write(line + "\n")
                self._f.flush()

    def write_spans(self, spans: Sequence) -> None:
        """SDK ReadableSpans (e.g. processor.exporter.root_cause_span(verdict))."""
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
        if spans:
            self.write_request(encode_spans(spans))

    def close(self) -> None:
        with self._lock:
            if self._f is not None:
                self._f.close()
                self._f = None


class OtlpJsonFileExporter:
    """An OpenTelemetry SpanExporter writing OTLP/JSON lines (``RootCauseExporter(OtlpJsonFileExporter(p))``)."""

    def __init__(self, path: str):
        self._w = OtlpJsonWriter(path)

    def export(self, spans: Iterable):
        from opentelemetry.sdk.trace.export import SpanExportResult
        self._w.write_spans(list(spans))
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self._w.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
