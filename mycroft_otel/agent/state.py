"""Restart safety: per-ring cursors persisted after successful export.

``<state dir>/cursors.json`` maps a ring's identity (pid, comm hash, rank, start
time: a file re-created at the same path is a new ring) to the committed cursor
(records up to which everything was exported or deliberately skipped) and what
the status rule needs to resume (last completed collective, its end). Written
with one write() (see :meth:`CursorStore.save`), at most once per poll and only when changed; a
restart duplicates at most what was exported during the last poll period.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger("mycroft_otel.agent")


class CursorStore:
    def __init__(self, state_dir: Path):
        self.dir = Path(state_dir)
        self.path = self.dir / "cursors.json"
        self.data: dict[str, dict[str, Any]] = {}
        self._dirty = False
        self._fd: int | None = None
        self._len = 0
        try:
            with open(self.path) as f:
                raw = json.load(f)
            if isinstance(raw, dict):
                self.data = {k: v for k, v in raw.items() if isinstance(v, dict) and isinstance(v.get("cursor"), int)}
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable agent state %s: %s", self.path, exc)

    def get(self, key: str) -> dict[str, Any] | None:
        return self.data.get(key)

    def update(self, key: str, **values: Any) -> None:
        cur = self.data.setdefault(key, {"cursor": 0})
        for k, v in values.items():
            if cur.get(k) != v:
                cur[k] = v
                self._dirty = True

    def forget(self, key: str) -> None:
        if self.data.pop(key, None) is not None:
            self._dirty = True

    def save(self) -> None:
        """Persist if changed: one pwrite of the JSON, space-padded to the previous length.

        A single write() completes or not when the agent is killed, and JSON ignores the
        trailing spaces, so no temp file and rename per poll (which cost ~1 ms each here).
        """
        if not self._dirty:
            return
        try:
            if self._fd is None:
                self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
                self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
                self._len = os.fstat(self._fd).st_size
            data = json.dumps(self.data, separators=(",", ":")).encode()
            pad = max(0, self._len - len(data))
            os.pwrite(self._fd, data + b" " * pad, 0)
            self._len = max(self._len, len(data))
            self._dirty = False
        except OSError as exc:
            log.warning("cannot persist agent state to %s: %s", self.path, exc)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
