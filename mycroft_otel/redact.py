"""Secrets stay out of messages: URLs shown without their credentials, header lists checked without echo.

``OTEL_EXPORTER_OTLP_HEADERS`` usually carries a bearer token or an API key, and a URL
may carry ``user:password@``; the agent, the processor and ``grafana provision`` name a
bad value by its variable, its entry number and its key, never by its text.
"""

from __future__ import annotations

import re
from typing import Iterable
from urllib.parse import urlsplit, urlunsplit

from mycroft_otel.config import ConfigError

HIDDEN = "***"

# the OTLP exporter specification's header list: comma separated key=value, keys are HTTP token characters,
# values URL-encoded (spaces tolerated, as the Python SDK does when it parses them liberally)
_KEY = r"[\x21\x23-\x27\x2a\x2b\x2d\x2e\x30-\x39\x41-\x5a\x5e-\x7a\x7c\x7e]+"
_VALUE = r"[\x20\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]*"
_ENTRY = re.compile(rf"[ \t]*({_KEY})[ \t]*=[ \t]*{_VALUE}[ \t]*")
_KEY_ONLY = re.compile(rf"[ \t]*({_KEY})[ \t]*=")


def safe_url(url: str) -> str:
    """``url`` with any ``user:password@`` replaced by ``***@`` (and the query, which may hold a key, hidden)."""
    try:
        p = urlsplit(url)
    except ValueError:
        return HIDDEN
    netloc = p.netloc
    if "@" in netloc:
        netloc = HIDDEN + "@" + netloc.rsplit("@", 1)[1]
    return urlunsplit((p.scheme, netloc, p.path, HIDDEN if p.query else "", ""))


def check_headers(var: str, value: str) -> dict[str, int]:
    """Check an OTEL_EXPORTER_OTLP_*HEADERS list; returns key -> entry number. A bad entry raises a
    ConfigError naming the variable, the entry and (when it has one) its key, never the value."""
    keys: dict[str, int] = {}
    entries = value.split(",")
    for i, item in enumerate(entries, 1):
        if not item.strip():
            continue
        if _ENTRY.fullmatch(item):
            keys[_ENTRY.fullmatch(item).group(1).lower()] = i
            continue
        key = _KEY_ONLY.match(item)
        where = f"entry {i} of {len(entries)}" + (f" (key {key.group(1)!r})" if key else "")
        why = ("its value has characters that must be URL-encoded (%XX)" if key
               else "it is not key=value with a key of letters, digits and -._~ and the like")
        raise ConfigError(f"{var}: {where}: {why} (the value is not shown: header values carry credentials)")
    return keys


def scrub(text: str, secrets: Iterable[str | None]) -> str:
    """``text`` with every occurrence of the given secrets (those of 4 characters or more) hidden."""
    for s in secrets:
        if s and len(s) >= 4:
            text = text.replace(s, HIDDEN)
    return text
