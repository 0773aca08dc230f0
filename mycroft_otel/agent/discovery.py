"""Rings appear and disappear: scan MYCROFT_RING_DIR for shared-memory files.

Every regular, non-hidden file is a candidate; whether it is a ring is the
reader's call (``RingReader`` raises ValueError for a foreign, truncated or
half-initialised file). Failed candidates are retried after a while (a plugin may
still be initialising the file) without logging every time.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Scan:
    appeared: list[tuple[str, tuple[int, int]]] = field(default_factory=list)  # (path, (dev, ino))
    gone: list[str] = field(default_factory=list)


class Discovery:
    def __init__(self, ring_dir: Path, retry_s: float = 1.0):
        self.ring_dir = Path(ring_dir)
        self.retry_s = retry_s
        self.known: dict[str, tuple[int, int]] = {}     # followed (or finished) path -> file identity
        self._failed: dict[tuple[int, int], float] = {}  # identity -> retry time

    def scan(self) -> Scan:
        out = Scan()
        present: dict[str, tuple[int, int]] = {}
        try:
            entries = list(os.scandir(self.ring_dir))
        except FileNotFoundError:
            entries = []
        now = time.monotonic()
        for e in entries:
            if e.name.startswith("."):
                continue
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            ident = (st.st_dev, st.st_ino)
            present[e.path] = ident
            if self.known.get(e.path) == ident:
                continue
            if e.path in self.known:  # same path, new file: the old one is gone
                out.gone.append(e.path)
            if self._failed.get(ident, 0.0) > now:
                continue
            out.appeared.append((e.path, ident))
        for path, ident in list(self.known.items()):
            if present.get(path) != ident and path not in out.gone:
                out.gone.append(path)
        for path in out.gone:
            self.known.pop(path, None)
        if len(self._failed) > 10000:
            self._failed.clear()
        return out

    def accepted(self, path: str, ident: tuple[int, int]) -> None:
        self.known[path] = ident
        self._failed.pop(ident, None)

    def rejected(self, ident: tuple[int, int]) -> bool:
        """Remember a failed candidate; True the first time (log it then)."""
        first = ident not in self._failed
        self._failed[ident] = time.monotonic() + self.retry_s
        return first
