"""The driver's event rows (native/include/mycroft/driver_event.h) and NCCL's numbers, as numpy sees them.

The simulator builds its rows here without importing the native module, so the event
streams can be built and checked anywhere; ``_native.EVENT_DTYPE`` must equal
:data:`EVENT_DTYPE` (a test checks it when the module is built). Event-type bits and
state values are those of the newest profiler ABI (v7; nccl_profiler_abi.h).
"""

from __future__ import annotations

import numpy as np

# driver::Event, 96 bytes, explicit offsets (u64 seq is 8-aligned after the i32 block).
EVENT_DTYPE = np.dtype({
    "names": ["t_ns", "ctx", "slot", "parent_slot", "type", "state", "op", "func", "datatype", "algo", "proto",
              "n_channels", "channel", "is_send", "rank", "root_or_peer", "pid", "n_steps", "chunk_size", "step",
              "seq", "count", "size", "ptimer"],
    "formats": ["<u8", "<u4", "<u4", "<u4", "<u4", "<u4", "u1", "u1", "u1", "u1", "u1", "u1", "u1", "u1",
                "<i4", "<i4", "<i4", "<i4", "<i4", "<i4", "<u8", "<u8", "<u8", "<u8"],
    "offsets": [0, 8, 12, 16, 20, 24, 28, 29, 30, 31, 32, 33, 34, 35, 36, 40, 44, 48, 52, 56, 64, 72, 80, 88],
    "itemsize": 96,
}, align=True)  # an aligned struct: numpy's field reads/writes take its fast paths (4x vs unaligned)

NO_SLOT = 0xFFFFFFFF

OP_START, OP_STOP, OP_RECORD = 1, 2, 3

# ncclProfile* event-type bits (v7 numbering).
GROUP, COLL, P2P, PROXY_OP, PROXY_STEP, PROXY_CTRL, KERNEL_CH, NET_PLUGIN = (1 << i for i in range(8))
GROUP_API, COLL_API, P2P_API, KERNEL_LAUNCH = (1 << i for i in range(8, 12))
KERNEL_PHASE = 1 << 15  # v7: sub-event of KernelCh; the row's `step` is the phaseId, `ptimer` its GPU time

# ncclProfiler* state values (v7 numbering).
S_SEND_GPU_WAIT = 8
S_SEND_WAIT = 9
S_RECV_WAIT = 10
S_RECV_FLUSH_WAIT = 11
S_RECV_GPU_WAIT = 12
S_PROXY_OP_IN_PROGRESS = 19
S_SEND_PEER_WAIT = 20
S_KERNEL_CH_STOP = 22
S_GROUP_START_API_STOP = 23
S_GROUP_END_API_START = 24
S_KERNEL_PHASE_STOP = 31  # v7; stop time in `ptimer`

#: v7 KernelPhase ids (kernelPhase.phaseId): the GPU's wait for its peers, the data movement, the closing barrier.
PHASE_INITIAL_SYNC, PHASE_COMPUTE, PHASE_FINAL_SYNC = 0, 1, 2

# Name tables (shm_layout.h): indexes the rows carry.
FUNC_NAMES = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce", "SendRecv", "Send", "Recv",
              "AlltoAll", "Gather", "Scatter", "PutSignal", "Signal", "WaitSignal")
FUNC = {name: i for i, name in enumerate(FUNC_NAMES)}
DATATYPE_NAMES = ("ncclInt8", "ncclUint8", "ncclInt32", "ncclUint32", "ncclInt64", "ncclUint64", "ncclFloat16",
                  "ncclFloat32", "ncclFloat64", "ncclBfloat16", "ncclFloat8e4m3", "ncclFloat8e5m2")
DATATYPE_SIZES = (1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1)
DATATYPE = {name: i for i, name in enumerate(DATATYPE_NAMES)}
# NCCL's own spellings (upper-case); the simulator's model says "Ring"/"Tree"/"Simple": both map.
ALGO_NAMES = ("TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT")
ALGO = {**{name: i for i, name in enumerate(ALGO_NAMES)}, "Tree": 0, "Ring": 1}
PROTO_NAMES = ("LL", "LL128", "SIMPLE")
PROTO = {**{name: i for i, name in enumerate(PROTO_NAMES)}, "Simple": 2}

#: NCCL_STEPS: slots of a connection's FIFO, i.e. steps in flight per ProxyOp and the credit window.
NCCL_STEPS = 8

#: The ProxyStep states of one send step and one recv step, in the order NCCL records them (design §3).
SEND_STATE_ORDER = (S_SEND_GPU_WAIT, S_SEND_PEER_WAIT, S_SEND_WAIT)
RECV_STATE_ORDER = (S_RECV_WAIT, S_RECV_FLUSH_WAIT, S_RECV_GPU_WAIT)

#: Activation mask a plugin asks for; the simulator emits every event type and lets the driver filter.
ALL_EVENTS = GROUP | COLL | P2P | PROXY_OP | PROXY_STEP | KERNEL_CH | GROUP_API | COLL_API | P2P_API | KERNEL_LAUNCH


def native_dtype_matches() -> bool | None:
    """True/False when the native module is importable (its EVENT_DTYPE equals ours), None when it is not built."""
    try:
        from mycroft_otel import _native  # type: ignore[attr-defined]
    except ImportError:
        return None
    nd = np.dtype(_native.EVENT_DTYPE)
    return nd.itemsize == EVENT_DTYPE.itemsize and all(
        nd.fields[n][1] == EVENT_DTYPE.fields[n][1] for n in EVENT_DTYPE.names)
