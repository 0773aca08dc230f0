// Shared-memory layout of one plugin context: the single description of the bytes
// that the NCCL profiler plugin writes and that every reader (pybind11 bindings,
// node agent, tests) maps read-only.
//
// One file per plugin context, i.e. per (process, communicator, rank), in
// MYCROFT_RING_DIR. The file is
//
//   [ ShmHeader | LiveOp live[header.live_slots] | RingRecord ring[header.ring_capacity] ]
//
// with every section aligned to 64 bytes. All structs are fixed-size PODs with
// explicit padding so that C++ and numpy (via PYBIND11_NUMPY_DTYPE on these very
// structs) agree on every offset. Bump kLayoutVersion on any change.
//
// Concurrency model (readers never write to the file):
//  * Flow counters: exactly one writer thread per flow at a time (the proxy thread
//    that progresses that channel). Guarded by a per-flow seqlock (`version`, odd
//    while the writer is inside an update).
//  * LiveOp header: written by the thread that starts the operation while the
//    slot's `generation` is odd; afterwards only atomic counters change.
//  * Ring: many writers claim an index with fetch_add on `ring_head`, mark the
//    record busy (`seq = (index + 1) | 1 << 63`), fill it, then publish it by
//    storing `seq = index + 1` with release order. `seq` never decreases, so a
//    slow writer cannot hide a newer record; a record whose writer died while
//    filling it stays busy and readers skip it once the writer is gone.
//    The ring overwrites its oldest records; a reader that falls behind by more
//    than the capacity sees a `seq` newer than the one it expected and counts the
//    records in between as overwritten.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mycroft::shm {

inline constexpr uint64_t kMagic = 0x315446524359434dULL;  // "MCYCRFT1" little-endian
inline constexpr uint32_t kLayoutVersion = 4;  // 2: user tag, per-channel kernel times/phases, bad handles by kind;
                                               // 3: per-flow busy times; 4: per-flow credit (SendPeerWait) busy time

inline constexpr uint32_t kMaxFlows = 64;          // (channel, direction) pairs per operation
inline constexpr uint32_t kDefaultLiveSlots = 64;  // operations in flight at once per context
inline constexpr uint32_t kDefaultRingCapacity = 512;
inline constexpr uint32_t kNameLen = 64;
inline constexpr uint32_t kMaxKernelChannels = 32;  // per-channel kernel times kept for channels 0..31
inline constexpr uint32_t kKernelPhases = 3;        // v7 KernelPhase: initial sync, compute, final sync

enum class OpKind : uint8_t { kNone = 0, kColl = 1, kP2pSend = 2, kP2pRecv = 3 };

// Collective functions, numbered like NCCL's ncclFunc_t for the ones NCCL exposes.
enum class Func : uint8_t {
  kBroadcast = 0, kReduce = 1, kAllGather = 2, kReduceScatter = 3, kAllReduce = 4,
  kSendRecv = 5, kSend = 6, kRecv = 7, kAlltoAll = 8, kGather = 9, kScatter = 10,
  kPutSignal = 11, kSignal = 12, kWaitSignal = 13,
  kUnknown = 255
};

enum class Dir : uint8_t { kSend = 0, kRecv = 1 };

// The ProxyStep state a flow is currently waiting in (design §3). The names say
// what the step waits for; kNone means no step of the flow is waiting.
enum class WaitState : uint8_t {
  kNone = 0,
  kSendGpuWait = 1,    // send: waiting for the GPU to produce the chunk
  kSendPeerWait = 2,   // send: chunk ready, waiting for the receiver's credit
  kSendWait = 3,       // send: posted to the network, waiting for completion
  kRecvWait = 4,       // recv: posted, waiting for data from the network
  kRecvFlushWait = 5,  // recv: data arrived, waiting for the flush (GDR)
  kRecvGpuWait = 6,    // recv: data flushed, waiting for the GPU to consume it
};

// Names stored as small indexes in OpInfo (func, datatype, algo, proto). The
// spellings are the strings NCCL passes in its event descriptors (docs/nccl-abi.md:
// algorithms and protocols are upper case, NCCL prints ncclUint8 as "Unknown"); the
// plugin maps a string to its index (kUnknownIndex when absent) and readers map it back.
inline constexpr uint8_t kUnknownIndex = 255;
inline constexpr const char* kFuncNames[] = {
    "Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce", "SendRecv",
    "Send", "Recv", "AlltoAll", "Gather", "Scatter", "PutSignal", "Signal", "WaitSignal"};
inline constexpr const char* kDatatypeNames[] = {
    "ncclInt8", "ncclUint8", "ncclInt32", "ncclUint32", "ncclInt64", "ncclUint64",
    "ncclFloat16", "ncclFloat32", "ncclFloat64", "ncclBfloat16", "ncclFloat8e4m3",
    "ncclFloat8e5m2"};
inline constexpr uint8_t kDatatypeSizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
inline constexpr const char* kAlgoNames[] = {
    "TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT"};
inline constexpr const char* kProtoNames[] = {"LL", "LL128", "SIMPLE"};

// Slot states of the live table.
enum class SlotState : uint32_t { kFree = 0, kActive = 1 };

// Bits of LiveOp::flags / RingRecord::op.flags.
enum OpFlags : uint32_t {
  kFlagFlowsTruncated = 1u << 0,  // more flows than kMaxFlows: extra ones not recorded
  kFlagKernelTimes = 1u << 1,     // kernel_start_ns/kernel_end_ns come from GPU timers
  kFlagAborted = 1u << 2,         // context finalized while the op was in flight
  kFlagKernelPhases = 1u << 3,    // at least one channel reported a v7 KernelPhase
};

// Callbacks that carried a handle we could not use, by the callback they came in
// (ShmHeader::bad_handle_by_kind; the total stays in dropped_bad_handle). The usual
// cause is lateness: the event's operation already completed (its slot moved on) or
// its communicator was finalized.
enum class BadHandleKind : uint32_t {
  kStartAfterFinalize = 0,  // startEvent on a finalized context
  kKernelChStart = 1,       // KernelCh start whose parent Coll/P2p is gone
  kKernelChStop = 2,        // KernelCh stopEvent of a completed op, or a second stop of one channel
  kKernelChState = 3,       // KernelChStop state of a completed op
  kKernelPhase = 4,         // KernelPhase start/state/stop whose KernelCh's op is gone
  kProxyOpStart = 5,        // ProxyOp start whose parent Coll/P2p is gone
  kProxyOpEnd = 6,          // ProxyOp state/stop of a finished ProxyOp
  kProxyStepStart = 7,      // ProxyStep start whose ProxyOp is gone
  kProxyStepEnd = 8,        // ProxyStep state/stop of a finished step
  kOpEnd = 9,               // Coll/P2p state/stop of a completed op
  kOther = 10,              // API/Group/untracked handles after finalize, unknown handle kinds
  kCount = 11,
};
inline constexpr uint32_t kBadHandleKinds = uint32_t(BadHandleKind::kCount);
inline constexpr const char* kBadHandleKindNames[kBadHandleKinds] = {
    "start_after_finalize", "kernel_ch_start", "kernel_ch_stop", "kernel_ch_state", "kernel_phase",
    "proxy_op_start", "proxy_op_end", "proxy_step_start", "proxy_step_end", "op_end", "other"};

// One (channel, direction) of an operation: Mycroft's chunk counters.
// Send: posted -> ready (GPU produced the chunk) -> transmitted (posted to the
// network) -> done (send completed). Recv: posted -> ready = received (data
// arrived) -> transmitted = flushed -> done = consumed by the GPU.
struct alignas(8) Flow {
  uint32_t version;        // seqlock: odd while the writer updates this flow
  int32_t peer;            // peer rank in the communicator (-1 unknown)
  uint8_t channel;
  uint8_t dir;             // Dir
  uint8_t wait_state;      // WaitState of the oldest unfinished step
  uint8_t n_proxy_ops;     // ProxyOps that fed this flow
  uint32_t n_steps;        // steps NCCL announced (sum of ProxyOp nSteps)
  uint32_t posted;
  uint32_t ready;
  uint32_t transmitted;
  uint32_t done;
  uint32_t wait_step;      // step number of the oldest unfinished step
  uint32_t chunk_size;
  uint64_t bytes;          // sum of transSize reported by ProxyStep states
  uint64_t first_ns;       // first step posted (CLOCK_MONOTONIC)
  uint64_t last_progress_ns;  // last counter change
  uint64_t wait_since_ns;  // when the oldest unfinished step entered wait_state
  uint64_t end_ns;         // last step done (0 while running)
  uint64_t gpu_wait_ns;    // total step time spent in Send/RecvGpuWait
  uint64_t net_wait_ns;    // total step time spent in SendWait/RecvWait
  // The same waits as a union over the flow's steps: the time at least one step was in
  // Send/RecvGpuWait (gpu) or SendWait/RecvWait (net). Up to NCCL_STEPS steps are in
  // flight at once, so when chunks are produced faster than the link drains them the
  // sum above counts each step's queueing behind the earlier ones again; per step, the
  // union is the link's (the GPU's) own time, whatever the burst.
  uint64_t gpu_busy_ns;
  uint64_t net_busy_ns;
  // The time at least one send step waited for credit (SendPeerWait: the chunk ready, the
  // receiver's buffer not yet free, or the proxy not yet posting it). Measured on its own, not
  // as what the GPU and network busy times leave of the flow's span: those two overlap while
  // steps are in flight together, by more than a short stall of the proxy lasts.
  uint64_t peer_busy_ns;
};
static_assert(sizeof(Flow) == 120, "Flow layout changed: bump kLayoutVersion");

// The operation part shared by the live table and the completion ring.
struct alignas(8) OpInfo {
  uint64_t op_id;          // unique per context, never reused (1-based)
  uint64_t seq;            // per-communicator collective number (0-based), or p2p transfer n
  uint64_t nccl_seq;       // NCCL's own coll.seqNumber (raw)
  uint64_t count;          // elements
  uint64_t bytes;          // count * sizeof(datatype)
  uint8_t kind;            // OpKind
  uint8_t func;            // Func
  uint8_t datatype;        // index into the datatype names (mycroft_otel.native_layout)
  uint8_t algo;            // index into algorithm names
  uint8_t proto;           // index into protocol names
  uint8_t n_channels;
  uint8_t n_flows;         // valid entries in flows[]
  uint8_t abi_version;     // profiler ABI version that delivered the op
  int32_t root_or_peer;    // root of rooted collectives, peer of p2p, else -1
  uint32_t flags;          // OpFlags
  uint64_t api_ns;         // CollApi/P2pApi start (v5+), else 0
  uint64_t start_ns;       // Coll/P2p event start (enqueue)
  uint64_t launch_ns;      // Coll/P2p event stop (kernel launched)
  uint64_t end_ns;         // completion: last ProxyOp / KernelCh stop (0 while running)
  uint64_t kernel_start_ns;
  uint64_t kernel_end_ns;
  uint32_t proxy_ops_started;
  uint32_t proxy_ops_stopped;
  uint32_t kernel_ch_started;
  uint32_t kernel_ch_stopped;
  uint64_t last_progress_ns;  // max over flows and kernel channels
  uint64_t user_tag;       // v7 coll/p2p userTag (ncclCollConfig_t.userProfilerTag), 0 = untagged / older ABI
  uint32_t kch_valid;      // bit c: kch[c] describes channel c of this op (KernelCh seen)
  uint32_t reserved;
};
static_assert(sizeof(OpInfo) == 144, "OpInfo layout changed: bump kLayoutVersion");

// One channel of an operation's kernel, GPU-timed (%globaltimer ns, not CLOCK_MONOTONIC).
// KernelCh gives start/end; v7 KernelPhase splits it into initial sync (waiting for the
// peers' flags before any data moves), compute and final sync. 0 = not reported. Valid
// only where OpInfo::kch_valid has the channel's bit: entries are not cleared between ops.
struct alignas(8) KernelChannel {
  uint64_t start_ns;                      // KernelCh start pTimer
  uint64_t end_ns;                        // KernelChStop pTimer
  uint64_t phase_start_ns[kKernelPhases];  // KernelPhase start pTimer, by phaseId
  uint64_t phase_end_ns[kKernelPhases];    // KernelPhaseStop pTimer, by phaseId
};
static_assert(sizeof(KernelChannel) == 64, "KernelChannel layout changed: bump kLayoutVersion");

// A live-table slot: one operation in flight.
struct alignas(64) LiveOp {
  uint32_t generation;     // odd while the slot is being (re)initialised
  uint32_t state;          // SlotState
  uint64_t reserved;
  OpInfo op;
  Flow flows[kMaxFlows];
  KernelChannel kch[kMaxKernelChannels];  // indexed by channel id
};

// A completed operation, published in the ring.
struct alignas(64) RingRecord {
  uint64_t seq;            // ring index + 1 once published; top bit set while being written; 0 = never
  uint64_t reserved;
  OpInfo op;
  Flow flows[kMaxFlows];
  KernelChannel kch[kMaxKernelChannels];  // indexed by channel id; valid where op.kch_valid says
};

struct alignas(64) ShmHeader {
  uint64_t magic;
  uint32_t layout_version;
  uint32_t header_size;    // sizeof(ShmHeader)
  uint32_t live_slots;
  uint32_t ring_capacity;
  uint32_t live_offset;    // byte offset of live[0]
  uint32_t ring_offset;    // byte offset of ring[0]
  uint64_t file_size;
  char job_id[kNameLen];
  char comm_name[kNameLen];
  char host[kNameLen];
  char plugin_version[16];
  uint64_t comm_hash;
  uint64_t comm_id;        // v5+ init commId, else 0
  int32_t rank;            // rank in the communicator
  int32_t nranks;
  int32_t nnodes;
  int32_t global_rank;     // launcher's RANK, -1 if unknown
  int32_t local_rank;      // launcher's LOCAL_RANK, -1 if unknown
  int32_t cuda_device;     // first entry of CUDA_VISIBLE_DEVICES / LOCAL_RANK, -1 if unknown
  int32_t pid;
  uint32_t abi_version;    // ncclProfiler_vN that NCCL picked
  int32_t activation_mask; // mask the plugin asked for
  uint32_t reserved0;
  uint64_t start_realtime_ns;  // CLOCK_REALTIME at init ...
  uint64_t start_mono_ns;      // ... and CLOCK_MONOTONIC at the same instant
  // Writer-side state, updated with atomics.
  uint64_t ring_head;          // records ever claimed (next index)
  uint64_t heartbeat_ns;       // last callback seen (CLOCK_MONOTONIC)
  uint64_t finalized_ns;       // finalize time, 0 while the communicator lives
  uint64_t ops_started;
  uint64_t ops_completed;
  uint64_t dropped_live_full;  // ops not tracked: no free live slot
  uint64_t dropped_bad_handle; // callbacks with NULL/stale/foreign handles ignored
  uint64_t dropped_bad_descr;  // descriptors with out-of-range values ignored
  uint64_t dropped_flows;      // flows beyond kMaxFlows
  uint64_t pxn_foreign_ops;    // ProxyOps posted by another process (PXN), not attributed
  uint64_t p2p_send_count_total;
  uint64_t p2p_recv_count_total;
  uint64_t bad_handle_by_kind[kBadHandleKinds];  // dropped_bad_handle split by BadHandleKind
  uint64_t late_kernel_stops;  // KernelCh stops that arrived after a later launch started (kept, not dropped)
  uint32_t nccl_version;       // ncclGetVersion() at init (X*10000 + Y*100 + Z), 0 = unknown
  uint32_t reserved1;
  uint64_t reserved[3];
};

// Byte offsets of the sections for a given geometry.
inline constexpr uint64_t AlignUp(uint64_t v) { return (v + 63) & ~uint64_t{63}; }
inline constexpr uint64_t LiveOffset() { return AlignUp(sizeof(ShmHeader)); }
inline constexpr uint64_t RingOffset(uint32_t live_slots) {
  return AlignUp(LiveOffset() + uint64_t{live_slots} * sizeof(LiveOp));
}
inline constexpr uint64_t FileSize(uint32_t live_slots, uint32_t ring_capacity) {
  return AlignUp(RingOffset(live_slots) + uint64_t{ring_capacity} * sizeof(RingRecord));
}

}  // namespace mycroft::shm
