"""Fair shares of one poll: what one ring, and all rings of one file owner, may cost the agent.

The poll loop is one thread for every ring on the node, so a ring that is broken or hostile (4,096
live slots stalled at once, a live table read of 40 MB) must not take the time of the others. Work
that grows with what a ring holds is budgeted per ring and per owner (the uid owning the file):

* in-flight snapshots (building a span per stalled slot is the agent's most expensive work): at
  most SNAPSHOTS_PER_RING per ring and SNAPSHOTS_PER_OWNER per owner each poll, the slots least
  recently snapshotted first, so every slot is reached in turn;
* completion records read: at most RECORDS_PER_OWNER a poll for all rings of one owner (and, as
  before, 8 x 4,096 per ring); what is left waits in the ring (and is counted if it is overwritten);
* live-table bytes copied: each ring earns LIVE_BYTES_PER_POLL of credit a poll (kept up to that
  much) and pays what a read actually copied, so a huge live table is read every few polls instead of
  every poll; an owner's rings together read at most LIVE_BYTES_PER_OWNER a poll.

The poll visits rings in an order that rotates every poll, so the owner's share does not always go
to the same first ring.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SNAPSHOTS_PER_RING = 8
SNAPSHOTS_PER_OWNER = 32
LIVE_BYTES_PER_POLL = 4 << 20    # a default ring (64 slots) copies at most 0.6 MiB: always read
LIVE_BYTES_PER_OWNER = 16 << 20
RECORDS_PER_OWNER = 16384        # 164k completions a second per user at the default 100 ms poll


@dataclass
class RingCredit:
    """A ring's carried-over live-table credit (negative after an expensive read: it waits its turn)."""
    live_bytes: int = LIVE_BYTES_PER_POLL

    def refill(self) -> None:
        self.live_bytes = min(LIVE_BYTES_PER_POLL, self.live_bytes + LIVE_BYTES_PER_POLL)


@dataclass
class PollBudget:
    """One poll's allowance per owner uid."""
    snapshots: dict[int, int] = field(default_factory=dict)
    live_bytes: dict[int, int] = field(default_factory=dict)
    records: dict[int, int] = field(default_factory=dict)
    deferred_live: int = 0      # live-table reads put off this poll (a probe for tests and metrics)
    deferred_snapshots: int = 0  # snapshots due but put off to a later poll

    def may_read_live(self, owner: int, credit: RingCredit) -> bool:
        if credit.live_bytes < 0 or self.live_bytes.get(owner, 0) >= LIVE_BYTES_PER_OWNER:
            self.deferred_live += 1
            return False
        return True

    def paid_live(self, owner: int, credit: RingCredit, nbytes: int) -> None:
        credit.live_bytes -= nbytes
        self.live_bytes[owner] = self.live_bytes.get(owner, 0) + nbytes

    def records_allowance(self, owner: int, ring_max: int) -> int:
        return max(0, min(ring_max, RECORDS_PER_OWNER - self.records.get(owner, 0)))

    def took_records(self, owner: int, n: int) -> None:
        self.records[owner] = self.records.get(owner, 0) + n

    def snapshot_allowance(self, owner: int) -> int:
        return max(0, min(SNAPSHOTS_PER_RING, SNAPSHOTS_PER_OWNER - self.snapshots.get(owner, 0)))

    def took_snapshots(self, owner: int, n: int, due: int) -> None:
        self.snapshots[owner] = self.snapshots.get(owner, 0) + n
        self.deferred_snapshots += max(0, due - n)
