// The event table the driver replays through a plugin, shared by the C++ driver
// (native/bindings) and the Python simulator (numpy dtype derived from this struct
// via PYBIND11_NUMPY_DTYPE).
//
// A row is one call NCCL would make on the profiler ABI. Rows carry NCCL's own
// numbers for event types (the ncclProfile* bit) and states (the ncclProfiler*
// state values) as the newest ABI defines them; the driver translates them for
// older ABI versions the way NCCL's version adapters do (events a version lacks
// are not delivered; v4 sees the Group handle as the Coll parent), and it only
// delivers event types enabled in the activation mask the plugin set at init.
//
// Handles never leave C++: START stores the handle it got into the driver's handle
// table at `slot`; STOP/RECORD and children (`parent_slot`) read it from there. A
// replay that needs a slot another thread has not filled yet waits for it (bounded).
#pragma once

#include <cstdint>

namespace mycroft::driver {

inline constexpr uint32_t kNoSlot = 0xffffffffu;

enum class Op : uint8_t {
  kStart = 1,    // startEvent(ctx, &handle[slot], descr)
  kStop = 2,     // stopEvent(handle[slot])
  kRecord = 3,   // recordEventState(handle[slot], state, args)
};

struct alignas(8) Event {
  uint64_t t_ns;         // delivery time relative to the replay epoch; 0 = at once
  uint32_t ctx;          // plugin context index (order of Driver.init calls)
  uint32_t slot;         // handle-table slot written by kStart, read by kStop/kRecord
  uint32_t parent_slot;  // kStart: slot of the parent handle, kNoSlot = NULL parent
  uint32_t type;         // kStart: NCCL event type bit (ncclProfileColl = 1<<1, ...)
  uint32_t state;        // kRecord: NCCL state value (ncclProfilerProxyStepSendGPUWait, ...)
  uint8_t op;            // Op
  uint8_t func;          // index into shm::kFuncNames
  uint8_t datatype;      // index into shm::kDatatypeNames
  uint8_t algo;          // index into shm::kAlgoNames
  uint8_t proto;         // index into shm::kProtoNames
  uint8_t n_channels;
  uint8_t channel;       // ProxyOp / KernelCh channel id
  uint8_t is_send;       // ProxyOp direction
  int32_t rank;          // descr.rank
  int32_t root_or_peer;  // coll root, p2p / ProxyOp peer
  int32_t pid;           // ProxyOp pid; 0 = the driver's own pid
  int32_t n_steps;       // ProxyOp nSteps
  int32_t chunk_size;    // ProxyOp chunkSize
  int32_t step;          // ProxyStep step
  uint64_t seq;          // coll seqNumber
  uint64_t count;        // elements
  uint64_t size;         // state arg: ProxyStep transSize / ProxyCtrl appended ops;
                         // Coll/P2p start: slot of its Group + 1 (0 = none), which v5+
                         // descriptors carry as parentGroup
  uint64_t ptimer;       // KernelCh/KernelPhase pTimer (descr at start, state arg at KernelChStop /
                         // KernelPhaseStop); Coll/P2p/CollApi/P2pApi start: the v7 userTag
                         // (0 = untagged). KernelPhase start: phaseId rides in `step`.
};
static_assert(sizeof(Event) == 96, "driver Event layout changed");

}  // namespace mycroft::driver
