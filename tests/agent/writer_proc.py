"""A training process stand-in: writes one ring (agent_shm), leaves an op in flight, then sleeps.

usage: python writer_proc.py PATH RANK NRANKS N_COMPLETED INFLIGHT(0|1)
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from agent_shm import FakeRing  # noqa: E402

path, rank, nranks, n_done, inflight = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), \
    sys.argv[5] == "1"
ring = FakeRing(path, rank=rank, nranks=nranks)
for _ in range(n_done):
    ring.op_done(dur_ns=1_000_000)
if inflight:
    ring.begin(ring.make_op(done=3, wait_state=(1, 6)))  # send: SendGpuWait, recv: RecvGpuWait
print("ready", flush=True)
while True:
    time.sleep(0.05)
    ring.h["heartbeat_ns"] = time.monotonic_ns()
