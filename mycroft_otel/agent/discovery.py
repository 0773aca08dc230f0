"""Rings appear and disappear: scan MYCROFT_RING_DIR for shared-memory files, remove finished ones.

Every regular, non-hidden file is a candidate; whether it is a ring is the
reader's call (``RingReader`` raises ValueError for a foreign, truncated or
half-initialised file, a symlink, a FIFO). Failed candidates are retried after a
while (a plugin may still be initialising the file) without logging every time.

The ring directory belongs to the training user and is read as hostile: a ring
directory that is a symlink or that group/others can write is refused (logged,
nothing followed). The ring directory defaults to one per user
(``/dev/shm/mycroft-otel-<uid>``); an agent running as root with that default also
follows every other user's (``user_ring_dirs``). :meth:`Discovery.remove` deletes a ring once the agent has
exported its evidence (see docs/agent.md, "Ring lifecycle"): through a descriptor of
the directory, only the very file that was followed (same device and inode), so a
file swapped in under the same name is left alone.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from mycroft_otel.config import RING_DIR_PREFIX

log = logging.getLogger("mycroft_otel.agent")

MAX_FAILED = 10000  # remembered rejected candidates (identity -> retry time)


@dataclass
class Scan:
    appeared: list[tuple[str, tuple[int, int]]] = field(default_factory=list)  # (path, (dev, ino))
    gone: list[str] = field(default_factory=list)


def ring_dir_problem(ring_dir: Path) -> str:
    """'' if the directory may be followed, else why not (missing is fine: no rings yet)."""
    try:
        st = os.lstat(ring_dir)
    except FileNotFoundError:
        return ""
    except OSError as exc:
        return f"ring directory {ring_dir}: {exc.strerror}"
    if stat.S_ISLNK(st.st_mode):
        return f"ring directory {ring_dir} (MYCROFT_RING_DIR) is a symbolic link; refusing to follow it"
    if not stat.S_ISDIR(st.st_mode):
        return f"ring directory {ring_dir} (MYCROFT_RING_DIR) is not a directory"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (f"ring directory {ring_dir} (MYCROFT_RING_DIR) is writable by group or others "
                f"(mode {stat.S_IMODE(st.st_mode):03o}); refusing it")
    return ""


def user_ring_dirs(prefix: str = RING_DIR_PREFIX) -> list[Path]:
    """Every user's default ring directory (``<prefix><uid>``, owned by that uid), for an agent running as root."""
    parent, stem = os.path.split(prefix)
    out = []
    try:
        names = os.listdir(parent)
    except OSError:
        return out
    for name in sorted(names):
        if not name.startswith(stem) or not name[len(stem):].isdigit():
            continue
        path = Path(parent) / name
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == int(name[len(stem):]):
            out.append(path)
    return out


class Discovery:
    """Scans `ring_dir`; with ``all_users`` (a root agent left at the per-user default) every user's default
    ring directory as well."""

    def __init__(self, ring_dir: Path, retry_s: float = 1.0, all_users: bool = False,
                 prefix: str = RING_DIR_PREFIX):
        self.ring_dir = Path(ring_dir)
        self.retry_s = retry_s
        self.all_users = all_users
        self.prefix = prefix
        self.known: dict[str, tuple[int, int]] = {}     # followed (or finished) path -> file identity
        self._failed: dict[tuple[int, int], float] = {}  # identity -> retry time
        self._refused: dict[Path, str] = {}              # last problem logged per ring directory
        self.removed = 0                                 # rings deleted after export

    def dirs(self) -> list[Path]:
        if not self.all_users:
            return [self.ring_dir]
        return sorted({self.ring_dir, *user_ring_dirs(self.prefix)})

    def _entries(self, ring_dir: Path) -> list[os.DirEntry]:
        problem = ring_dir_problem(ring_dir)
        if problem != self._refused.get(ring_dir, ""):
            if problem:
                log.error("%s", problem)
            self._refused[ring_dir] = problem
        if problem:
            return []
        try:
            return list(os.scandir(ring_dir))
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            log.debug("cannot scan %s: %s", ring_dir, exc)
            return []

    def scan(self) -> Scan:
        out = Scan()
        present: dict[str, tuple[int, int]] = {}
        entries = [e for d in self.dirs() for e in self._entries(d)]
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
        if len(self._failed) > MAX_FAILED:
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

    def remove(self, path: str) -> bool:
        """Delete a followed ring whose evidence is exported; True if this call removed it.

        Only the file that was followed (its (dev, ino) as accepted), only a regular file,
        and only by name inside the ring directory as opened now (no symlink in between).
        The next scan reports the path gone, which releases the agent's state for it.
        """
        ident = self.known.get(path)
        p = Path(path)
        if ident is None or p.parent not in self.dirs() or ring_dir_problem(p.parent):
            return False
        try:
            dfd = os.open(p.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            st = os.stat(p.name, dir_fd=dfd, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != ident:
                return False
            os.unlink(p.name, dir_fd=dfd)
        except OSError as exc:
            log.debug("cannot remove %s: %s", path, exc)
            return False
        finally:
            os.close(dfd)
        self.removed += 1
        return True
