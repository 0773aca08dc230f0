"""Whom a ring speaks for: its file's owner, checked against the process it names.

A ring file is written by whoever owns it, and everything in its header (job id, host, pid,
communicator) is that user's claim. A root agent follows every user's ring directory, so one
user could otherwise publish spans as another job or another host, or put evidence into another
job's traces (the communicator hash of someone else's job is readable in their file names). The
rules, applied once when the agent opens a ring:

* every span carries the owner's uid (``mycroft.ring.owner.uid``) and the pid the ring names
  (``process.pid``);
* trace ids of a ring owned by another user than the agent's are salted with the owner
  (:attr:`Provenance.trace_job`): such a ring can never produce the trace ids of a job of the agent's
  user or of any other user, whatever it claims. A node agent runs as root on every node and all ranks
  of a job run as one user, so every node still derives the same ids (an agent running as the job's own
  user, in-process or per user, salts nothing: its rings are its own);
* for a ring owned by another user than the agent's: on Linux the named pid must exist and
  belong to the owner (``/proc/<pid>/status`` Uid); where ``/proc/<pid>/environ`` is readable,
  the job id the spans carry is the one the process's own environment gives (MYCROFT_JOB_ID,
  else the launcher's, as the plugin derives it), and a claimed host is kept only if it is the
  agent's own host or the process's NCCL_HOSTID; otherwise the host is the agent's. What cannot
  be checked is marked ``mycroft.ring.verified = false``; a replaced claim is kept beside it
  (``mycroft.ring.claimed.*``).

A ring the agent's own user owns is taken as it is: that user could configure the agent itself.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any

from mycroft_otel import config
from mycroft_otel import semconv as sc

MAX_ENVIRON_BYTES = 1 << 20  # a process environment beyond this is not read (ARG_MAX is usually 2 MiB)

PID_OWNED, PID_FOREIGN, PID_GONE, PID_UNKNOWN = "owned", "foreign", "gone", "unknown"


@dataclass(frozen=True)
class Provenance:
    """What a ring's spans say about where they come from (resource attributes, trace-id salt)."""

    owner_uid: int
    pid: int
    pid_state: str        # PID_* : the named process belongs to the owner, to someone else, is gone, unknown
    job_id: str           # the job id the spans carry
    host: str             # the host the spans carry
    verified: bool        # job id and host are the agent's own user's, or backed by the owner's process
    claimed_job_id: str   # the header's claim, when it was not used
    claimed_host: str     # the header's claim, when it was not used
    salted: bool = False  # another user's ring: trace ids carry the owner

    @property
    def trace_job(self) -> str:
        """The job key trace ids are hashed with: the job id, salted with the owner for another user's ring."""
        return f"{self.job_id}\x1fuid={self.owner_uid}" if self.salted else self.job_id

    def attributes(self) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = [(sc.RING_OWNER_UID, self.owner_uid), (sc.RING_VERIFIED, self.verified)]
        if self.claimed_job_id:
            out.append((sc.RING_CLAIMED_JOB_ID, self.claimed_job_id))
        if self.claimed_host:
            out.append((sc.RING_CLAIMED_HOST, self.claimed_host))
        return out


def pid_owner_state(pid: int, uid: int) -> str:
    """Whether /proc/<pid> exists and its real or effective uid is ``uid``."""
    if pid <= 0:
        return PID_GONE
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            status = f.read(16384)
    except FileNotFoundError:
        return PID_GONE
    except OSError:
        return PID_UNKNOWN
    for line in status.splitlines():
        if line.startswith(b"Uid:"):
            ids = line.split()[1:3]
            try:
                return PID_OWNED if uid in {int(x) for x in ids} else PID_FOREIGN
            except ValueError:
                return PID_UNKNOWN
    return PID_UNKNOWN


def process_environ(pid: int) -> dict[str, str] | None:
    """The environment ``pid`` was started with, or None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read(MAX_ENVIRON_BYTES + 1)
    except OSError:
        return None
    if len(raw) > MAX_ENVIRON_BYTES:
        return None
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            env[k.decode(errors="replace")] = v.decode(errors="replace")
    return env


def agent_host() -> str:
    return socket.gethostname()


def check(owner_uid: int, pid: int, claimed_job: str, claimed_host: str, *, agent_uid: int | None = None,
          host: str | None = None) -> Provenance:
    """The provenance of a ring owned by ``owner_uid`` whose header names ``pid``, job and host."""
    agent_uid = os.geteuid() if agent_uid is None else agent_uid
    host = agent_host() if host is None else host
    if owner_uid == agent_uid:
        return Provenance(owner_uid, pid, PID_OWNED, claimed_job, claimed_host or host, True, "", "")
    state = pid_owner_state(pid, owner_uid)
    env = process_environ(pid) if state == PID_OWNED else None
    if env is not None:
        job = config.job_id(env)
        verified = True
    elif state == PID_FOREIGN:
        job, verified = "", False  # the ring names someone else's process: nothing it says about a job holds
    else:
        job, verified = claimed_job, False  # gone or unreadable: kept, marked unverified (and owner-salted)
    backed_host = claimed_host == host or (env is not None and claimed_host
                                           and env.get("NCCL_HOSTID", "") == claimed_host)
    out_host = claimed_host if backed_host else host
    return Provenance(owner_uid, pid, state, job, out_host, verified,
                      claimed_job if job != claimed_job else "", claimed_host if out_host != claimed_host else "",
                      salted=True)
