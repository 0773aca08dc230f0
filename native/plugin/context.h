// One plugin context (process x communicator x rank): its shared-memory file, the
// private pools behind the handles we give NCCL, and the handle encoding.
//
// Handles are never pointers. A handle is a 64-bit tagged value
//
//   63..60 0xC   (never a user-space address: a garbage pointer cannot decode)
//   59..56 kind  (HandleKind)
//   55..40 context index in the process-wide registry
//   39..32 context incarnation (registry entries are reused only after quarantine)
//   31..0  kind-specific payload, always carrying a generation
//
// so a callback decodes it with arithmetic and bounds checks alone, and a stale,
// foreign or late handle is recognised (generation mismatch, dead context) and
// counted instead of dereferenced.
#pragma once

#include <atomic>
#include <cstdint>

#include "internal.h"

namespace mycroft::plugin {

inline constexpr uint32_t kMaxContexts = 1u << 16;
inline constexpr uint32_t kSteps = 8;              // NCCL_STEPS: outstanding steps per ProxyOp
static_assert(kSteps <= 8, "ProxyEntry::in_gpu / in_net hold one bit per step slot");
inline constexpr uint32_t kMaxProxyEntries = 1u << 14;
inline constexpr uint32_t kApiEntries = 256;       // GroupApi/CollApi/P2pApi start times
inline constexpr uint64_t kQuarantineNs = 10ull * 1000000000ull;

enum HandleKind : uint32_t {
  kHCtx = 1,        // the context pointer NCCL passes back to startEvent/finalize
  kHOp = 2,         // Coll / P2p:        payload = slot(12) | slot generation(20)
  kHKernelCh = 3,   // KernelCh:          payload = slot(12) | channel(8) | slot generation(12)
  kHProxyOp = 4,    // ProxyOp:           payload = entry(14) | entry generation(18)
  kHProxyStep = 5,  // ProxyStep:         payload = entry(14) | step slot(3) | entry generation(15)
  kHApi = 6,        // GroupApi/CollApi/P2pApi: payload = api cursor + 1 (32 bits)
  kHGroup = 9,      // Group: payload = per-context group number (launch order)
  kHIgnored = 7,    // KernelLaunch, ProxyCtrl, NetPlugin, Ce*: nothing to track
  kHForeign = 8,    // ProxyOp/ProxyStep of another process (PXN): ignored
  kHKernelPhase = 10,  // v7 KernelPhase: payload = slot(12) | channel(8) | phase(2) | slot generation(10)
};

inline void* MakeHandle(uint32_t kind, uint32_t ctx, uint32_t inc, uint32_t payload) {
  uint64_t h = (0xCull << 60) | (uint64_t(kind & 0xf) << 56) | (uint64_t(ctx & 0xffff) << 40) |
               (uint64_t(inc & 0xff) << 32) | payload;
  return reinterpret_cast<void*>(h);
}
struct Decoded {
  uint32_t kind = 0, ctx = 0, inc = 0, payload = 0;
};
inline bool DecodeHandle(const void* p, Decoded* d) {
  uint64_t h = reinterpret_cast<uint64_t>(p);
  if ((h >> 60) != 0xC) return false;
  d->kind = uint32_t(h >> 56) & 0xf;
  d->ctx = uint32_t(h >> 40) & 0xffff;
  d->inc = uint32_t(h >> 32) & 0xff;
  d->payload = uint32_t(h);
  return true;
}

// One outstanding ProxyStep of a ProxyOp (slot = step % kSteps). Written by the
// proxy thread that owns the ProxyOp; relaxed atomics keep concurrent inspection
// (and TSan) honest.
struct StepRec {
  std::atomic<uint32_t> step{0};
  std::atomic<uint8_t> active{0};
  std::atomic<uint8_t> level{0};   // 0 posted, 1 ready/received, 2 transmitted/flushed, 3 done/consumed
  std::atomic<uint8_t> state{0};   // shm::WaitState being waited in
  std::atomic<uint64_t> since{0};  // when it entered `state`
  std::atomic<uint64_t> bytes{0};  // largest transSize reported for the step
};

// Cache-line aligned: entries of different proxy threads must not share a line.
struct alignas(64) ProxyEntry {
  std::atomic<uint32_t> busy{0};  // 0 free, 1 in use
  std::atomic<uint32_t> gen{0};   // bumped at every claim
  std::atomic<uint32_t> slot{0};
  std::atomic<uint32_t> slot_gen{0};
  std::atomic<int32_t> flow{-1};  // index into the op's flows, -1 = not recorded (truncated)
  std::atomic<uint8_t> is_send{0};
  std::atomic<uint32_t> oldest{UINT32_MAX};  // oldest unfinished step (UINT32_MAX: none)
  // Step slots (bit k: steps[k]) now waiting on the GPU / the network, and since when
  // the first of them has: the flow's busy times (shm::Flow::gpu_busy_ns, net_busy_ns,
  // peer_busy_ns: waiting for credit).
  std::atomic<uint8_t> in_gpu{0};
  std::atomic<uint8_t> in_net{0};
  std::atomic<uint8_t> in_peer{0};
  std::atomic<uint64_t> gpu_since{0};
  std::atomic<uint64_t> net_since{0};
  std::atomic<uint64_t> peer_since{0};
  StepRec steps[kSteps];
};

// Private per-live-slot control words (not in shm), one cache line set per slot.
struct alignas(64) SlotCtl {
  // Completion: 1 (launch: Coll/P2p stop) + n_channels (KernelCh stops) + 1 per
  // started ProxyOp; the thread that brings it to 0 completes the op.
  std::atomic<int64_t> outstanding{0};
  std::atomic<uint32_t> launched{0};
  // KernelCh references still held, with the channels open (ops.h KrefWord); the slot
  // generation in the top half makes a release aimed at a reused slot fail its CAS.
  std::atomic<uint64_t> kref{0};
  std::atomic<uint64_t> superseded_ns{0};  // when a later launch's kernel started (0: not yet)
  std::atomic<uint32_t> group{0};  // per-context Group number of the launch (0 = unknown)
  std::atomic<uint32_t> n_flows{0};  // flows claimed (may exceed kMaxFlows: truncated)
  std::atomic<uint64_t> kch_started_bits[4];
  std::atomic<uint64_t> kch_stopped_bits[4];
};

struct ApiEntry {
  std::atomic<uint64_t> tag{0};  // cursor + 1 once written
  std::atomic<uint64_t> start_ns{0};
};

struct Context {
  uint32_t index = 0;
  uint32_t inc = 0;
  std::atomic<uint32_t> alive{0};
  int abi_version = 0;
  int rank = 0;
  int nranks = 0;
  pid_t pid = 0;
  abi::DebugLogger logfn = nullptr;

  // Shared memory.
  void* map = nullptr;
  uint64_t map_size = 0;
  shm::ShmHeader* hdr = nullptr;
  shm::LiveOp* live = nullptr;
  shm::RingRecord* ring = nullptr;
  uint32_t live_slots = 0;
  uint32_t ring_cap = 0;
  char path[768] = "";

  // Private pools, sized at init.
  SlotCtl* slots = nullptr;
  ProxyEntry* proxy = nullptr;
  uint32_t n_proxy = 0;
  ApiEntry* api = nullptr;
  std::atomic<uint64_t>* p2p_counts = nullptr;  // [peer * 2 + dir]

  // Written per operation: kept off the lines the per-step path reads. Each is a
  // counter NCCL's ordering needs; nothing else shared is written per op here (slot
  // and ProxyEntry scans start from values the caller owns, op ids come from the
  // header's ops_started), because every such word bounces between NCCL's threads.
  alignas(64) std::atomic<uint64_t> api_cursor{0};
  std::atomic<uint64_t> coll_seq{0};
  std::atomic<uint32_t> group_seq{0};

  // Last heartbeat written to the header; private so the per-callback check reads a line
  // that changes once per millisecond, not the header line the per-op counters share.
  alignas(64) std::atomic<uint64_t> last_beat{0};

  alignas(64) uint64_t finalized_at = 0;  // CLOCK_MONOTONIC of finalize (quarantine clock)
  Context* next_retired = nullptr;
};

// Registry (context.cc). Lookup is lock-free; entries are written under a mutex at
// init/finalize only.
Context* LookupContext(uint32_t index, uint32_t inc);
// Context of a handle if it is ours, alive and of the given kind; else nullptr.
Context* ContextOf(const void* handle, uint32_t kind, Decoded* d);

// Core helpers used by context.cc.
void PublishOp(Context* c, uint32_t slot, uint32_t extra_flags, uint64_t end_ns);
void FreeSlot(Context* c, uint32_t slot);

}  // namespace mycroft::plugin
