"""Which root-cause spans this processor already published, kept across restarts (``--state-dir``).

A verdict's root-cause span id is a function of its trace id, so "published" is a set of trace ids.
In memory that set lives as long as the process; a restarted processor that is sent the same
collective's evidence again (an agent still reporting a hung collective, a gateway replaying its queue)
would publish the same verdict a second time: a second alert for one incident. With a state
directory, each published trace id is appended to a file there (16 bytes; not fsync'd: a crash
may lose the last few, which are then published again) and read back at start.

Bounded: the latest :data:`KEPT` ids (the verdicts a processor remembers, ``incidents.MAX_VERDICTS``);
the file is rewritten to them (temporary file + rename) when it holds twice as many. The directory is
trusted only if it is a real directory of this user that no one else can write (the file is opened
``O_NOFOLLOW`` relative to it), as the agent's state directory is.
"""

from __future__ import annotations

import logging
import os
import stat
from collections import OrderedDict

from mycroft_otel.config import ConfigError

log = logging.getLogger("mycroft_otel.processor")

KEPT = 4096
FILE = "published-verdicts"
_ID = 16  # bytes of a trace id


class PublishedVerdicts:
    """``first(trace_id)``: True the first time a trace's verdict is published, across restarts."""

    def __init__(self, state_dir: str):
        self.dir_fd = open_private_dir(state_dir)
        self.ids: OrderedDict[bytes, None] = OrderedDict()
        self.in_file = 0
        try:
            fd = os.open(FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.dir_fd)
        except FileNotFoundError:
            fd = -1
        if fd >= 0:
            with os.fdopen(fd, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                f.seek(max(0, size - size % _ID - KEPT * _ID))  # the latest KEPT; a torn last id is skipped
                data = f.read(KEPT * _ID)
            for i in range(0, len(data) - len(data) % _ID, _ID):
                self._remember(data[i:i + _ID])
            self.in_file = size // _ID
        self.fd = os.open(FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                          dir_fd=self.dir_fd)

    def _remember(self, trace_id: bytes) -> None:
        self.ids[trace_id] = None
        self.ids.move_to_end(trace_id)
        while len(self.ids) > KEPT:
            self.ids.popitem(last=False)

    def first(self, trace_id: bytes) -> bool:
        """Record the trace's verdict as published; False when it already was (before a restart too). The
        state directory failing (full, gone) costs the record, never the verdict: logged, True."""
        if trace_id in self.ids:
            log.warning("root cause of trace %s was published before a restart: not published again",
                        trace_id.hex())
            return False
        self._remember(trace_id)
        try:
            os.write(self.fd, trace_id)
            self.in_file += 1
            if self.in_file >= 2 * KEPT:
                self._compact()
        except OSError as exc:
            log.error("cannot record a published verdict in the state directory: %s", exc.strerror or exc)
        return True

    def _compact(self) -> None:
        tmp = f"{FILE}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=self.dir_fd)
        with os.fdopen(fd, "wb") as f:
            f.write(b"".join(self.ids))
        os.rename(tmp, FILE, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        os.close(self.fd)
        self.fd = os.open(FILE, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.dir_fd)
        self.in_file = len(self.ids)

    def close(self) -> None:
        for fd in (self.fd, self.dir_fd):
            if fd >= 0:
                os.close(fd)
        self.fd = self.dir_fd = -1


def open_private_dir(path: str) -> int:
    """The directory's descriptor (created 0700 when missing); ConfigError naming ``--state-dir`` when it is a
    symlink, not a directory, another user's, or writable by group or others."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"--state-dir {path}: {exc.strerror or exc} (a symlink is refused)") from None
    st = os.fstat(fd)
    why = ("not a directory" if not stat.S_ISDIR(st.st_mode) else
           f"owned by uid {st.st_uid}, not this user ({os.geteuid()})" if st.st_uid != os.geteuid() else
           f"writable by group or others (mode {stat.S_IMODE(st.st_mode):o})" if st.st_mode & 0o022 else "")
    if why:
        os.close(fd)
        raise ConfigError(f"--state-dir {path}: {why}")
    return fd
