"""A training-process stand-in for the native tests: drives the real plugin through the Driver.

usage: writer.py PLUGIN RING_DIR MODE [RANK]
  inflight  one completed ring all-reduce, then one stalled mid-flight (channel 0's send stuck in SendWait
            at step 2, kernels running); prints READY and waits to be stopped or killed.
  churn     replays all-reduces forever (for SIGSTOP at a random instant); prints READY once started.
"""

from __future__ import annotations

import sys
import time

from events import Seq, ring_allreduce
from mycroft_otel.native import Driver


def main() -> int:
    plugin, ring_dir, mode = sys.argv[1:4]
    rank = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    d = Driver(plugin)
    ctx = d.init("writer", 0xC0FFEE, 1, 4, rank, env={"MYCROFT_RING_DIR": ring_dir, "MYCROFT_RING_RECORDS": "16"})
    if mode == "inflight":
        q = Seq()
        ring_allreduce(q, ctx, rank, 4, 0, n_channels=2, steps=6)
        ring_allreduce(q, ctx, rank, 4, 1, n_channels=2, steps=6, stall_send_at=2)
        st = d.replay(q.array())
        assert st["errors"] == 0 and st["missing_slot"] == 0, st
        print("READY", flush=True)
        while True:
            time.sleep(1)
    if mode == "churn":
        print("READY", flush=True)
        q = Seq()
        for i in range(8):
            ring_allreduce(q, ctx, rank, 4, i, n_channels=4, steps=6)
        rows = q.array()
        while True:
            d.reset_slots(0, len(rows))
            d.replay(rows)
    return 2


if __name__ == "__main__":
    sys.exit(main())
