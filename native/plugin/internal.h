// Internals of libnccl-profiler-mycroft: one version-independent core that the
// per-version ABI adapters (abi.cc) call with a normalised descriptor.
//
// Files: config.cc (MYCROFT_* knobs), context.cc (init/finalize, the shared-memory
// file, the context registry), core.cc (events: live table, flows, ring), abi.cc
// (ncclProfiler_v4..v7 tables). docs/native.md explains the design.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <sys/types.h>

#include "mycroft/nccl_profiler_abi.h"
#include "mycroft/shm_layout.h"

namespace mycroft::plugin {

namespace abi = mycroft::nccl_abi;
using abi::Result;

inline constexpr const char* kPluginName = "mycroft-otel";
inline constexpr const char* kPluginVersion = "0.1.0";

// ---- relaxed/acquire/release access to plain shared-memory fields ------------------
// The shm structs are plain PODs (shared with numpy); every concurrent access goes
// through these so the compiler emits single loads/stores and TSan sees atomics.
template <class T> inline T Ld(const T& f) { return __atomic_load_n(&f, __ATOMIC_RELAXED); }
template <class T> inline T LdAcq(const T& f) { return __atomic_load_n(&f, __ATOMIC_ACQUIRE); }
template <class T> inline void St(T& f, T v) { __atomic_store_n(&f, v, __ATOMIC_RELAXED); }
template <class T> inline void StRel(T& f, T v) { __atomic_store_n(&f, v, __ATOMIC_RELEASE); }
template <class T> inline T Add(T& f, T v) { return __atomic_fetch_add(&f, v, __ATOMIC_RELAXED); }

// CLOCK_MONOTONIC (vDSO, no syscall). Besides stamping events, it times the quarantine of
// finalized contexts (context.cc): memory safety must never follow a clock a caller can set.
inline uint64_t MonoNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

// ---- virtual time (clock.cc) ----------------------------------------------------------
// A simulator driving the plugin through the ABI (never NCCL, which does not know the entry
// point) can hand the plugin a clock of its own with mycroftProfilerSetClock: every timestamp
// the plugin writes (events, heartbeat, header clock pair, finalize) then reads that clock, so
// an accelerated run leaves its exact simulated times in the rings. In production the pointer
// stays null and the branch below is never taken.
//
// Relaxed is enough for both loads: the pointer is the only thing published through
// g_virtual_mono (no other data hangs off it), and whoever sets the clock writes its value on
// the thread that then calls into the plugin, so program order already makes each call see the
// time set before it. A callback on another thread may read a value one update old, which is
// what a real clock read racing with that thread would give too.
extern std::atomic<const uint64_t*> g_virtual_mono;
// CLOCK_REALTIME - CLOCK_MONOTONIC while the virtual clock is set (the run's fixed epoch).
extern std::atomic<int64_t> g_virtual_real_offset;

// The one clock read of the hot path. The vDSO clock is read first and the virtual clock's
// pointer (null in production: one relaxed load, a plain mov on x86, and a never-taken branch)
// is tested after it, so the load completes in the shadow of the clock read instead of in
// front of it; a virtual run pays a clock read it discards, which costs a simulation nothing.
inline uint64_t NowNs() {
  const uint64_t t = MonoNs();
  const uint64_t* v = g_virtual_mono.load(std::memory_order_relaxed);
  if (__builtin_expect(v != nullptr, 0)) return __atomic_load_n(v, __ATOMIC_RELAXED);
  return t;
}

// CLOCK_REALTIME, or the virtual clock's realtime (its monotonic value + the run's offset).
uint64_t RealtimeNs();

// ---- configuration (config.cc) ------------------------------------------------------
struct Config {
  bool enable = true;
  uint32_t live_slots = shm::kDefaultLiveSlots;
  uint32_t ring_records = shm::kDefaultRingCapacity;
  char ring_dir[512] = "";  // MYCROFT_RING_DIR, else /dev/shm/mycroft-otel-<euid> (LoadConfig)
  char job_id[shm::kNameLen] = "";
};
// Reads MYCROFT_* from the environment. On a bad value returns false and writes a
// message naming the variable into `err`.
bool LoadConfig(Config* cfg, char* err, size_t err_len);
// Parses a decimal integer (optional sign, surrounding blanks) in [lo, hi].
bool ParseInt(const char* s, long long lo, long long hi, long long* out);

// ---- normalised descriptor (v7 numbering for types and states) ------------------------
enum EventBit : uint32_t {
  kEvGroup = 1u << 0, kEvColl = 1u << 1, kEvP2p = 1u << 2, kEvProxyOp = 1u << 3,
  kEvProxyStep = 1u << 4, kEvProxyCtrl = 1u << 5, kEvKernelCh = 1u << 6, kEvNetPlugin = 1u << 7,
  kEvGroupApi = 1u << 8, kEvCollApi = 1u << 9, kEvP2pApi = 1u << 10, kEvKernelLaunch = 1u << 11,
  kEvCeColl = 1u << 12, kEvCeSync = 1u << 13, kEvCeBatch = 1u << 14, kEvKernelPhase = 1u << 15,
};

struct Descr {
  uint64_t type = 0;
  void* parent = nullptr;
  int rank = -1;
  // Coll / P2p
  uint64_t seq_number = 0;
  const char* func = nullptr;
  const char* datatype = nullptr;
  const char* algo = nullptr;
  const char* proto = nullptr;
  uint64_t count = 0;
  int root = -1;
  int peer = -1;
  uint8_t n_channels = 0;
  void* parent_group = nullptr;  // v5+ coll/p2p.parentGroup (v4: parentObj is the Group)
  // ProxyOp
  pid_t pid = 0;
  uint8_t channel = 0;
  int n_steps = 0;
  int chunk_size = 0;
  int is_send = 0;
  // ProxyStep
  int step = 0;
  // KernelCh / KernelPhase
  uint64_t ptimer = 0;
  uint8_t phase = 0;      // v7 kernelPhase.phaseId
  // v7 Coll/P2p userTag (0 = untagged or an older ABI)
  uint64_t user_tag = 0;
};

// State values as v7 numbers them (v4..v6 use the same numbers for the states they have).
enum StateId : int {
  kStProxyStepSendGPUWait = 8, kStProxyStepSendWait = 9, kStProxyStepRecvWait = 10,
  kStProxyStepRecvFlushWait = 11, kStProxyStepRecvGPUWait = 12, kStProxyOpInProgress = 19,
  kStProxyStepSendPeerWait = 20, kStKernelChStop = 22, kStKernelPhaseStop = 31,
};

// ---- core entry points (core.cc / context.cc); `abi_version` is 4..7 -------------------
Result CoreInit(int abi_version, void** context, int* mask, const char* comm_name, uint64_t comm_hash,
                uint64_t comm_id, int n_nodes, int nranks, int rank, abi::DebugLogger logfn);
Result CoreStart(void* context, void** handle, const Descr& d);
Result CoreStop(void* handle);
Result CoreRecord(void* handle, int state, uint64_t arg_size, uint64_t arg_ptimer, bool has_args,
                  int max_state);
Result CoreFinalize(void* context);
// The activation mask asked of NCCL for an ABI version and NCCL release (mask.cc); false
// with a message naming MYCROFT_KERNEL_EVENTS when that variable holds a bad value.
bool RequestedMask(int abi_version, int nccl_version, int* mask, char* err, size_t err_len);
int NcclVersion();  // ncclGetVersion() of the NCCL that loaded us, 0 if unknown

// Process-wide count of callbacks with a NULL handle (no context to charge them to).
extern std::atomic<uint64_t> g_null_handles;
// PXN ProxyOps whose (foreign) context names none of ours.
extern std::atomic<uint64_t> g_foreign_ops;
// getpid() of this process, set at init (NCCL compares proxyOp.pid with its own).
extern std::atomic<int> g_pid;

}  // namespace mycroft::plugin
