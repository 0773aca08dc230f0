"""Rings appear and disappear: scan MYCROFT_RING_DIR for shared-memory files, remove finished ones.

Every regular, non-hidden file is a candidate; whether it is a ring is the
reader's call (``RingReader`` raises ValueError for a foreign, truncated or
half-initialised file, a symlink, a FIFO), after a file with holes is refused here.
A directory full of junk costs O(1) per poll once seen (:class:`Discovery`).

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

import heapq
import logging
import os
import stat
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from mycroft_otel.config import RING_DIR_PREFIX

log = logging.getLogger("mycroft_otel.agent")

MAX_REJECTED = 65536       # refused files remembered (about 150 bytes each); the oldest are forgotten beyond
OPENS_PER_OWNER = 1024     # new candidates one file owner may have opened per poll (the rest wait their turn)
RESCAN_S = 10.0            # a listing is reused while the directory is unchanged, but never longer than this
YOUNG_S = 60.0             # a refused file younger than this may still be a ring being initialised: retried
RETRY_S = 1.0              # ... first after this long, then doubling
LOG_BURST, LOG_WINDOW_S = 10, 10.0  # refused files named in the log: at most LOG_BURST lines per window


@dataclass(frozen=True)
class Candidate:
    """A regular file that may be a ring: its path, identity and owner (the uid its spans will speak for)."""
    path: str
    ident: tuple[int, int]  # (st_dev, st_ino)
    uid: int
    version: tuple[int, int]  # (st_mtime_ns, st_size): a refused file is looked at again only once it changes


@dataclass
class Scan:
    appeared: list[Candidate] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)


@dataclass
class _Refused:
    version: tuple[int, int]
    retry_at: float | None  # monotonic time of the next attempt; None: not until the file changes
    backoff_s: float


@dataclass
class _Listing:
    """One directory's last listing, reused while the directory's own stat is unchanged (O(1) per poll)."""
    stamp: tuple[int, int, int, int]  # (st_dev, st_ino, st_mtime_ns, st_ctime_ns) of the directory
    at: float                         # monotonic time of the listing
    full_at: float                    # ... of the last one that looked at every file again (refused ones too)
    settled: bool                     # the listing was taken well after the directory's last change
    entries: dict[str, tuple[int, int, int, tuple[int, int]]]  # path -> (dev, ino, uid, (mtime, size))


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


def _stamp(path: Path) -> tuple[int, int, int, int] | None:
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)


def sparse_problem(st: os.stat_result) -> str:
    """'' unless the file has holes: the plugin reserves every byte of a ring (posix_fallocate, st_blocks
    checked), so a sparse file is not one of its rings, and reading it would make tmpfs allocate the holes."""
    blocks = getattr(st, "st_blocks", None)
    if blocks is None or st.st_size <= 0:
        return ""
    if blocks * 512 < st.st_size:
        return (f"sparse: {blocks * 512} of {st.st_size} bytes allocated (the plugin reserves every byte of a "
                "ring)")
    return ""


class _RefusalLog:
    """Names refused files at INFO, at most LOG_BURST a window, then says how many went unnamed."""

    def __init__(self) -> None:
        self._window = -1e9
        self._lines = 0
        self._quiet = 0

    def __call__(self, path: str, why: str) -> None:
        now = time.monotonic()
        if now - self._window >= LOG_WINDOW_S:
            if self._quiet:
                log.info("%d more files in the ring directory refused (not named, to keep the log readable)",
                         self._quiet)
            self._window, self._lines, self._quiet = now, 0, 0
        if self._lines < LOG_BURST:
            self._lines += 1
            log.info("not a ring: %s", why if path in why else f"{path}: {why}")
        else:
            self._quiet += 1


class Discovery:
    """Scans `ring_dir`; with ``all_users`` (a root agent left at the per-user default) every user's default
    ring directory as well.

    Cost per poll is O(1) in the number of junk files: a directory's listing is reused while its stat is
    unchanged (re-listed at least every RESCAN_S), a refused file is remembered by (dev, ino) with its
    (mtime, size) and looked at again only when it changes (or, while younger than YOUNG_S, after a
    back-off), and each file owner may have at most OPENS_PER_OWNER new candidates opened per poll.
    """

    def __init__(self, ring_dir: Path, retry_s: float = RETRY_S, all_users: bool = False,
                 prefix: str = RING_DIR_PREFIX):
        self.ring_dir = Path(ring_dir)
        self.retry_s = retry_s
        self.all_users = all_users
        self.prefix = prefix
        self.known: dict[str, tuple[int, int]] = {}     # followed (or finished) path -> file identity
        self._refused: "OrderedDict[tuple[int, int], _Refused]" = OrderedDict()
        self._dir_problem: dict[Path, str] = {}         # last problem logged per ring directory
        self._listings: dict[Path, _Listing] = {}
        self._quiet: dict[Path, dict] = {}  # dir -> its listing, while nothing in it waits to be looked at
        self._retries: dict[Path, list[tuple[float, str, tuple[int, int]]]] = {}  # dir -> heap of retries due
        self._user_dirs: tuple[tuple[int, int, int, int], float, list[Path]] | None = None
        self.log_refusal = _RefusalLog()
        self.removed = 0                                 # rings deleted after export
        self.listed = 0                                  # directory entries listed (all scans): a cost probe

    def dirs(self) -> list[Path]:
        if not self.all_users:
            return [self.ring_dir]
        parent = Path(os.path.split(self.prefix)[0])
        stamp = _stamp(parent)
        now = time.monotonic()
        cached = self._user_dirs
        if cached is None or stamp is None or cached[0] != stamp or now - cached[1] > RESCAN_S:
            cached = self._user_dirs = (stamp or (0, 0, 0, 0), now, user_ring_dirs(self.prefix))
        return sorted({self.ring_dir, *cached[2]})

    def _listing(self, ring_dir: Path, now: float) -> dict[str, tuple[int, int, int, tuple[int, int]]]:
        problem = ring_dir_problem(ring_dir)
        if problem != self._dir_problem.get(ring_dir, ""):
            if problem:
                log.error("%s", problem)
            self._dir_problem[ring_dir] = problem
        if problem:
            self._listings.pop(ring_dir, None)
            return {}
        stamp = _stamp(ring_dir)
        old = self._listings.get(ring_dir)
        if stamp is not None and old is not None and old.stamp == stamp and old.settled and now - old.at < RESCAN_S:
            return old.entries
        entries: dict[str, tuple[int, int, int, tuple[int, int]]] = {}
        # refused files are stat'ed again (to see whether they changed) only every RESCAN_S, not on every
        # change of the directory: a user churning files in it must not cost a stat per junk file per poll
        full = old is None or now - old.full_at >= RESCAN_S
        try:
            with os.scandir(ring_dir) as it:
                for e in it:
                    self.listed += 1
                    if e.name.startswith("."):
                        continue
                    prev = old.entries.get(e.path) if old is not None else None
                    if (not full and prev is not None and prev[1] == e.inode()
                            and (prev[0], prev[1]) in self._refused):
                        entries[e.path] = prev  # a refused file seen before: no stat until it changes
                        continue
                    try:
                        st = e.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if stat.S_ISREG(st.st_mode):
                        entries[e.path] = (st.st_dev, st.st_ino, st.st_uid, (st.st_mtime_ns, st.st_size))
        except (FileNotFoundError, NotADirectoryError):
            return {}
        except OSError as exc:
            log.debug("cannot scan %s: %s", ring_dir, exc)
            return old.entries if old is not None else {}
        if stamp is not None:
            # a change in the same timestamp tick as the listing would leave the stamp unchanged: reuse a
            # listing only once it was taken a while after the directory last changed
            settled = time.time_ns() - stamp[2] > 1_000_000_000
            self._listings[ring_dir] = _Listing(stamp, now, now if full else old.full_at, settled, entries)
        return entries

    def scan(self) -> Scan:
        out = Scan()
        now = time.monotonic()
        listings: dict[str, dict] = {}
        opens: dict[int, int] = {}
        for d in self.dirs():
            entries = self._listing(d, now)
            listings[str(d)] = entries
            if self._quiet.get(d) is entries:
                # same listing and nothing offered or waiting last time: only the retries that are due
                self._due_retries(d, entries, now, opens, out)
                continue
            offered_before = len(out.appeared)
            deferred = False
            for path, (dev, ino, uid, version) in entries.items():
                ident = (dev, ino)
                if self.known.get(path) == ident:
                    continue
                if path in self.known:  # same path, new file: the old one is gone
                    out.gone.append(path)
                    self.known.pop(path)
                r = self._refused.get(ident)
                if r is not None:
                    due = r.retry_at is not None and r.retry_at <= now
                    if not due and r.version == version:
                        continue
                if opens.get(uid, 0) >= OPENS_PER_OWNER:
                    deferred = True  # this owner's turn is over for this poll; the next poll goes on
                    continue
                opens[uid] = opens.get(uid, 0) + 1
                out.appeared.append(Candidate(path, ident, uid, version))
            if deferred or len(out.appeared) > offered_before:
                self._quiet.pop(d, None)  # candidates offered or waiting: look again next poll
            else:
                self._quiet[d] = entries
        for path, ident in list(self.known.items()):
            e = listings.get(os.path.dirname(path), {}).get(path)
            if (e is None or (e[0], e[1]) != ident) and path not in out.gone:
                out.gone.append(path)
        for path in out.gone:
            self.known.pop(path, None)
        return out

    def _due_retries(self, d: Path, entries: dict, now: float, opens: dict[int, int], out: Scan) -> None:
        heap = self._retries.get(d)
        while heap and heap[0][0] <= now:
            _, path, ident = heapq.heappop(heap)
            e = entries.get(path)
            r = self._refused.get(ident)
            if e is None or (e[0], e[1]) != ident or r is None or r.retry_at is None or r.retry_at > now:
                continue  # gone, replaced, accepted or rescheduled meanwhile
            if opens.get(e[2], 0) >= OPENS_PER_OWNER:
                heapq.heappush(heap, (now + self.retry_s, path, ident))  # its owner's turn is over: later
                break
            opens[e[2]] = opens.get(e[2], 0) + 1
            out.appeared.append(Candidate(path, ident, e[2], e[3]))

    def accepted(self, path: str, ident: tuple[int, int]) -> None:
        self.known[path] = ident
        self._refused.pop(ident, None)

    def refuse(self, cand: Candidate, why: str, transient: bool = False) -> bool:
        """Remember a refused candidate; True (and the refusal logged, rate-limited) the first time.

        ``transient``: refused for what a ring has while the plugin initialises it (no magic yet, not yet
        its full size). Such a file younger than YOUNG_S is tried again after a back-off; any other refused
        file is tried again only once its (mtime, size) changes.
        """
        first = cand.ident not in self._refused
        r = self._refused.pop(cand.ident, None)
        backoff = self.retry_s if r is None else min(r.backoff_s * 2, YOUNG_S)
        young = False
        if transient:
            try:
                young = time.time() - os.stat(cand.path, follow_symlinks=False).st_ctime < YOUNG_S
            except OSError:
                pass
        retry_at = time.monotonic() + backoff if young else None
        self._refused[cand.ident] = _Refused(cand.version, retry_at, backoff)
        if retry_at is not None:
            heap = self._retries.setdefault(Path(os.path.dirname(cand.path)), [])
            heapq.heappush(heap, (retry_at, cand.path, cand.ident))
            if len(heap) > MAX_REJECTED:
                self._retries[Path(os.path.dirname(cand.path))] = heapq.nsmallest(MAX_REJECTED, heap)
        while len(self._refused) > MAX_REJECTED:
            self._refused.popitem(last=False)
        if first:
            self.log_refusal(cand.path, why)
        return first

    def rejected(self, ident: tuple[int, int]) -> bool:
        """Remember a failed candidate known only by identity (retried after ``retry_s``); True the first time."""
        first = ident not in self._refused
        self._refused[ident] = _Refused((-1, -1), time.monotonic() + self.retry_s, self.retry_s)
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
