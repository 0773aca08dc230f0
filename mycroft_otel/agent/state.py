"""Restart safety: per-ring cursors persisted after successful export.

``<state dir>/cursors.json`` maps a ring's identity (pid, comm hash, rank, start
time: a file re-created at the same path is a new ring) to the committed cursor
(records up to which everything was exported or deliberately skipped) and what
the status rule needs to resume (last completed collective, its end). Saved at most
once per poll and only when changed; a restart duplicates at most what was exported
during the last poll period.

The state directory is the agent's own (MYCROFT_STATE_DIR, default
``$XDG_STATE_HOME/mycroft-otel``): it must be a real directory owned by the agent's
user and writable by nobody else, or the agent refuses to start. Every file in it is
opened relative to that directory with O_NOFOLLOW, and saves write a fresh temporary
file and rename it over ``cursors.json``, so a planted symlink is never followed and a
killed agent leaves the old or the new file, never a mix. The file is read as hostile:
an entry that does not have the expected shape is skipped (and logged), the others
are used.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path
from typing import Any

from mycroft_otel.config import ConfigError

log = logging.getLogger("mycroft_otel.agent")

STATE_FILE = "cursors.json"
MAX_STATE_BYTES = 64 << 20  # far beyond any real node (about 100 bytes per ring)
_INT_FIELDS = ("cursor", "last_seq", "last_end")


def _valid_entry(key: Any, value: Any) -> bool:
    if not isinstance(key, str) or not isinstance(value, dict):
        return False
    for name in _INT_FIELDS:
        v = value.get(name)
        if name == "cursor" and v is None:
            return False
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not -1 <= v < 1 << 64):
            return False
    return value["cursor"] >= 0


def open_state_dir(path: Path) -> int:
    """Create (0700) and open the state directory; ConfigError unless it is the agent's own."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        path.mkdir(exist_ok=True, mode=0o700)
    except OSError as exc:
        raise ConfigError(f"MYCROFT_STATE_DIR {path}: cannot create it: {exc.strerror}") from None
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise ConfigError(f"MYCROFT_STATE_DIR {path} is a symbolic link; the agent keeps its state only in a "
                          "directory of its own")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"MYCROFT_STATE_DIR {path}: cannot open it as a directory: {exc.strerror}") from None
    st = os.fstat(fd)
    problem = ""
    if st.st_uid != os.geteuid():
        problem = f"is owned by uid {st.st_uid}, not by the agent's uid {os.geteuid()}"
    elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        problem = f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):03o}; chmod go-w it)"
    if problem:
        os.close(fd)
        raise ConfigError(f"MYCROFT_STATE_DIR {path} {problem}")
    return fd


class CursorStore:
    def __init__(self, state_dir: Path):
        self.dir = Path(state_dir)
        self.path = self.dir / STATE_FILE
        self.data: dict[str, dict[str, Any]] = {}
        self.skipped = 0  # entries of the loaded file that were malformed
        self._dirty = False
        self._dfd: int | None = open_state_dir(self.dir)
        self._load()

    def _load(self) -> None:
        try:
            fd = os.open(STATE_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=self._dfd)
        except FileNotFoundError:
            return
        except OSError as exc:
            log.warning("ignoring agent state %s: %s", self.path, exc.strerror)
            return
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                log.warning("ignoring agent state %s: not a regular file", self.path)
                return
            raw_bytes = os.read(fd, MAX_STATE_BYTES + 1)
        finally:
            os.close(fd)
        try:
            raw = json.loads(raw_bytes) if len(raw_bytes) <= MAX_STATE_BYTES else None
        except ValueError as exc:
            log.warning("ignoring unreadable agent state %s: %s", self.path, exc)
            return
        if not isinstance(raw, dict):
            log.warning("ignoring agent state %s: not a JSON object", self.path)
            return
        for key, value in raw.items():
            if _valid_entry(key, value):
                self.data[key] = {k: value[k] for k in _INT_FIELDS if k in value}
            else:
                self.skipped += 1
        if self.skipped:
            log.warning("agent state %s: skipped %d malformed entr%s, kept %d", self.path, self.skipped,
                        "y" if self.skipped == 1 else "ies", len(self.data))

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
        """Persist if changed: write ``cursors.json.tmp`` (O_EXCL, O_NOFOLLOW), then rename it over the file."""
        if not self._dirty or self._dfd is None:
            return
        tmp = f"{STATE_FILE}.{os.getpid()}.tmp"  # per process: two agents sharing a state dir never collide
        data = json.dumps(self.data, separators=(",", ":")).encode()
        try:
            try:
                os.unlink(tmp, dir_fd=self._dfd)  # a leftover of a killed agent (or anything planted)
            except FileNotFoundError:
                pass
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=self._dfd)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
            os.replace(tmp, STATE_FILE, src_dir_fd=self._dfd, dst_dir_fd=self._dfd)
            self._dirty = False
        except OSError as exc:
            log.warning("cannot persist agent state to %s: %s", self.path, exc)

    def close(self) -> None:
        if self._dfd is not None:
            os.close(self._dfd)
            self._dfd = None
