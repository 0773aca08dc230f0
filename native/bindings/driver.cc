// Driver: loads a profiler plugin .so and calls its ABI exactly as NCCL does.
//
// NCCL's side of the contract, reproduced here (read from NCCL's src/plugin/profiler.cc and the
// per-version adapters in src/plugin/profiler/profiler_v*.cc; see nccl_profiler_abi.h):
//   * dlopen(RTLD_NOW | RTLD_LOCAL), then dlsym "ncclProfiler_v7", "_v6", "_v5", "_v4": the first found
//     wins (or the version the caller asks for).
//   * init() gets ONE activation-mask int per process (here: per Driver) shared by all contexts, and
//     NCCL's logger. v4 takes (mask, name, hash); v5+ take the commId (NCCL passes the comm hash)
//     before the mask. If the plugin asks for KernelPhase, NCCL turns KernelCh on (v7).
//   * An event is emitted only if the mask enables it or one of its descendants (asking for ProxyStep
//     brings GroupApi, CollApi, Group, Coll and ProxyOp); events and states a version does not know
//     are not delivered (the adapters drop them); v4 sees the Group handle as the Coll/P2p parent.
//   * stop/record are never called with a NULL handle; a START that is not delivered leaves a NULL
//     handle, so its STOP/RECORD rows and its children's parent are NULL like in NCCL.
// Strings are NCCL's own spellings (shm_layout.h's tables; ncclUint8 prints as "Unknown" like NCCL).
// `raw=True` turns all filtering off (mask, version, NULL handles) so tests can be hostile.
//
// Rows (driver_event.h) name handles by slot; the handle table is `slots` atomics initialised to
// "empty". A row that needs an empty slot (filled by another replaying thread) waits for it with a
// bound (slot_timeout_ms, default 2 s) and is then skipped and counted, never deadlocks.
// Coll/P2p START rows carry their Group's slot in `size` as slot + 1 (0 = no group): the v5+
// `parentGroup`, and the v4 parent. Coll/P2p/CollApi/P2pApi START rows carry the v7 userTag in
// `ptimer` (driver_event.h); older versions have no such member and never see it.
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <iterator>
#include <string>
#include <vector>

#include <pybind11/stl.h>

#include "bindings.h"
#include "mycroft/driver_event.h"
#include "mycroft/nccl_profiler_abi.h"
#include "mycroft/shm_layout.h"
#include "mycroft/virtual_clock.h"

namespace mycroft::bindings {
namespace {

namespace abi = mycroft::nccl_abi;
using mycroft::driver::Event;
using mycroft::driver::kNoSlot;
using mycroft::driver::Op;

constexpr uintptr_t kEmpty = ~uintptr_t{0};
constexpr uint32_t kMaxContexts = 1u << 17;
constexpr uint64_t kSpinNs = 50'000;  // pacing: sleep until ~50 us before the due time, then spin
constexpr const char kUnknownName[] = "Unknown";  // what NCCL's *ToString functions return out of range
constexpr const char* kPhaseNames[] = {"initial_sync", "compute", "final_sync"};

// Descriptor strings: shm_layout.h's tables hold NCCL's own spellings ("RING", "SIMPLE", "AlltoAll"), except
// that NCCL's ncclDatatypeToString prints ncclUint8 as "Unknown" (2.27..2.32): the driver does the same.
constexpr const char* kNcclDatatypeNames[] = {"ncclInt8", "Unknown", "ncclInt32", "ncclUint32", "ncclInt64",
                                              "ncclUint64", "ncclFloat16", "ncclFloat32", "ncclFloat64",
                                              "ncclBfloat16", "ncclFloat8e4m3", "ncclFloat8e5m2"};
static_assert(std::size(kNcclDatatypeNames) == std::size(mycroft::shm::kDatatypeNames));

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// ------------------------------------------------------------------------------------------------
// NCCL's logger, as handed to init(). Messages are kept (bounded) for tests and printed to stderr
// in NCCL's format when NCCL_DEBUG asks for their level.
// ------------------------------------------------------------------------------------------------
struct LogEntry {
  int level;
  unsigned long subsys;
  std::string file;
  int line;
  std::string msg;
};
std::mutex g_log_mu;
std::vector<LogEntry> g_log;
uint64_t g_log_dropped = 0;
constexpr size_t kMaxLog = 10000;

const char* LevelName(int level) {
  switch (level) {
    case 1: return "VERSION";
    case 2: return "WARN";
    case 3: return "INFO";
    case 4: return "ABORT";
    case 5: return "TRACE";
    case 6: return "ATTN";
    default: return "LOG";
  }
}

int DebugLevelFromEnv() {
  const char* e = getenv("NCCL_DEBUG");
  if (!e) return 0;
  if (!strcasecmp(e, "VERSION")) return 1;
  if (!strcasecmp(e, "WARN")) return 2;
  if (!strcasecmp(e, "INFO")) return 3;
  if (!strcasecmp(e, "ABORT")) return 4;
  if (!strcasecmp(e, "TRACE")) return 5;
  return 0;
}

// NCCL_DEBUG, read when a Driver is created (never from the logger: another thread may be inside setenv).
std::atomic<int> g_debug_level{0};

void DriverLogger(abi::LogLevel level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt ? fmt : "(null)", ap);
  va_end(ap);
  int lv = int(level);
  int want = g_debug_level.load(std::memory_order_relaxed);
  if (lv == int(abi::LogLevel::Warn) || lv == int(abi::LogLevel::Attn) ? want >= 2 : (want && lv <= want)) {
    char host[64] = "?";
    gethostname(host, sizeof host - 1);
    fprintf(stderr, "%s:%d:%ld [driver] NCCL %s %s\n", host, int(getpid()), long(syscall(SYS_gettid)),
            LevelName(lv), buf);
  }
  std::lock_guard<std::mutex> g(g_log_mu);
  if (g_log.size() >= kMaxLog) {
    ++g_log_dropped;
    return;
  }
  g_log.push_back(LogEntry{lv, flags, file ? file : "", line, buf});
}

py::list LogMessages(bool clear) {
  std::lock_guard<std::mutex> g(g_log_mu);
  py::list out;
  for (const auto& e : g_log) {
    py::dict d;
    d["level"] = e.level;
    d["level_name"] = LevelName(e.level);
    d["subsys"] = e.subsys;
    d["file"] = e.file;
    d["line"] = e.line;
    d["msg"] = e.msg;
    out.append(d);
  }
  if (clear) g_log.clear();
  return out;
}

// ------------------------------------------------------------------------------------------------
// Per-version facts
// ------------------------------------------------------------------------------------------------
template <int V> struct Abi;
template <> struct Abi<4> { using D = abi::v4::EventDescr; using T = abi::v4::Profiler; using S = abi::v4::State; };
template <> struct Abi<5> { using D = abi::v5::EventDescr; using T = abi::v5::Profiler; using S = abi::v5::State; };
template <> struct Abi<6> { using D = abi::v6::EventDescr; using T = abi::v6::Profiler; using S = abi::v6::State; };
template <> struct Abi<7> { using D = abi::v7::EventDescr; using T = abi::v7::Profiler; using S = abi::v7::State; };

namespace t7 = abi::v7;

constexpr uint32_t KnownTypes(int v) {
  return v == 4 ? 0xffu : v == 5 ? 0xfffu : v == 6 ? 0x7fffu : 0xffffu;
}
constexpr uint32_t MaxState(int v) { return v == 4 ? 22 : v == 5 ? 24 : v == 6 ? 30 : 31; }

// The mask bits that make NCCL emit an event of `type` (the event itself or any descendant).
constexpr uint32_t EnableSet(uint32_t type) {
  constexpr uint32_t kBelowProxyOp = t7::kProxyOp | t7::kProxyStep | t7::kNetPlugin;
  constexpr uint32_t kBelowTask = kBelowProxyOp | t7::kKernelCh;
  constexpr uint32_t kCe = t7::kCeColl | t7::kCeSync | t7::kCeBatch;
  switch (type) {
    case t7::kGroupApi:
      return t7::kGroupApi | t7::kCollApi | t7::kP2pApi | t7::kKernelLaunch | t7::kGroup | t7::kColl | t7::kP2p |
             kBelowTask | kCe;
    case t7::kCollApi: return t7::kCollApi | t7::kColl | kBelowTask | kCe;
    case t7::kP2pApi: return t7::kP2pApi | t7::kP2p | kBelowTask;
    case t7::kKernelLaunch: return t7::kKernelLaunch;
    case t7::kGroup: return t7::kGroup | t7::kColl | t7::kP2p | kBelowTask;
    case t7::kColl: return t7::kColl | kBelowTask;
    case t7::kP2p: return t7::kP2p | kBelowTask;
    case t7::kProxyOp: return kBelowProxyOp;
    case t7::kProxyStep: return t7::kProxyStep | t7::kNetPlugin;
    case t7::kCeColl: return kCe;
    default: return type;  // ProxyCtrl, KernelCh, NetPlugin, CeSync, CeBatch, KernelPhase: only themselves
  }
}

template <size_t N>
const char* NameOf(const char* const (&table)[N], uint8_t i) {
  return i < N ? table[i] : kUnknownName;
}

template <int V>
void FillDescr(typename Abi<V>::D& d, const Event& e, void* parent, void* group, bool has_group, pid_t self) {
  std::memset(static_cast<void*>(&d), 0, sizeof d);
  d.type = static_cast<decltype(d.type)>(e.type);
  d.parentObj = parent;
  d.rank = e.rank;
  const char* func = NameOf(mycroft::shm::kFuncNames, e.func);
  const char* dtype = NameOf(kNcclDatatypeNames, e.datatype);
  switch (e.type) {
    case t7::kColl: {
      auto& c = d.coll;
      c.seqNumber = e.seq;
      c.func = func;
      c.count = e.count;
      c.root = e.root_or_peer;
      c.datatype = dtype;
      c.nChannels = e.n_channels;
      c.nWarps = 16;
      c.algo = NameOf(mycroft::shm::kAlgoNames, e.algo);
      c.proto = NameOf(mycroft::shm::kProtoNames, e.proto);
      if constexpr (V == 7) c.userTag = e.ptimer;
      if constexpr (V == 4) {
        if (has_group) d.parentObj = group;
      } else {
        c.parentGroup = group;
      }
      break;
    }
    case t7::kP2p: {
      auto& p = d.p2p;
      p.func = func;
      p.datatype = dtype;
      p.count = e.count;
      p.peer = e.root_or_peer;
      p.nChannels = e.n_channels;
      if constexpr (V == 7) p.userTag = e.ptimer;
      if constexpr (V == 4) {
        if (has_group) d.parentObj = group;
      } else {
        p.parentGroup = group;
      }
      break;
    }
    case t7::kProxyOp:
      d.proxyOp.pid = e.pid ? pid_t(e.pid) : self;
      d.proxyOp.channelId = e.channel;
      d.proxyOp.peer = e.root_or_peer;
      d.proxyOp.nSteps = e.n_steps;
      d.proxyOp.chunkSize = e.chunk_size;
      d.proxyOp.isSend = e.is_send;
      break;
    case t7::kProxyStep: d.proxyStep.step = e.step; break;
    case t7::kKernelCh:
      d.kernelCh.channelId = e.channel;
      d.kernelCh.pTimer = e.ptimer;
      break;
    case t7::kNetPlugin:
      d.netPlugin.id = int64_t(e.seq);
      d.netPlugin.data = nullptr;
      break;
    default: break;
  }
  if constexpr (V >= 5) {
    switch (e.type) {
      case t7::kGroupApi:
        d.groupApi.graphCaptured = false;
        d.groupApi.groupDepth = e.step > 0 ? e.step : 1;
        break;
      case t7::kCollApi:
        d.collApi.func = func;
        d.collApi.count = e.count;
        d.collApi.datatype = dtype;
        d.collApi.root = e.root_or_peer;
        if constexpr (V == 7) d.collApi.userTag = e.ptimer;
        break;
      case t7::kP2pApi:
        d.p2pApi.func = func;
        d.p2pApi.count = e.count;
        d.p2pApi.datatype = dtype;
        if constexpr (V == 7) d.p2pApi.userTag = e.ptimer;
        break;
      default: break;
    }
  }
  if constexpr (V >= 6) {
    switch (e.type) {
      case t7::kCeColl:
        d.ceColl.seqNumber = e.seq;
        d.ceColl.func = func;
        d.ceColl.count = e.count;
        d.ceColl.root = e.root_or_peer;
        d.ceColl.datatype = dtype;
        break;
      case t7::kCeSync: d.ceCollSync.nRanks = e.n_steps; break;
      case t7::kCeBatch:
        d.ceCollBatch.numOps = e.n_steps;
        d.ceCollBatch.totalBytes = e.size;
        break;
      default: break;
    }
  }
  if constexpr (V == 7) {
    if (e.type == t7::kKernelPhase) {
      d.kernelPhase.channelId = e.channel;
      d.kernelPhase.phaseId = uint8_t(e.step);
      d.kernelPhase.phaseName = e.step >= 0 && e.step < 3 ? kPhaseNames[e.step] : kUnknownName;
      d.kernelPhase.pTimer = e.ptimer;
    }
  }
}

bool IsProxyStepState(uint32_t s) {
  using S = t7::State;
  return s == uint32_t(S::ProxyStepSendGPUWait) || s == uint32_t(S::ProxyStepSendPeerWait) ||
         s == uint32_t(S::ProxyStepSendWait) || s == uint32_t(S::ProxyStepRecvWait) ||
         s == uint32_t(S::ProxyStepRecvFlushWait) || s == uint32_t(S::ProxyStepRecvGPUWait);
}

// The Driver whose clock the plugin reads (mycroftProfilerSetClock is process-wide, like the clocks it
// stands in for): at most one per process.
std::atomic<const void*> g_clock_owner{nullptr};

struct Stats {
  uint64_t rows = 0, delivered = 0, filtered = 0, null_handle = 0, missing_slot = 0, bad_rows = 0, errors = 0;
  uint64_t max_late_ns = 0;
};

// ------------------------------------------------------------------------------------------------
class Driver {
 public:
  Driver(const std::string& path, std::optional<int> version, uint64_t slots) : path_(path), nslots_(slots) {
    if (slots == 0 || slots > (uint64_t{1} << 31)) throw py::value_error("slots must be in 1..2^31");
    lib_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib_) {
      const char* err = dlerror();
      throw py::value_error(path + ": dlopen failed: " + (err ? err : "?"));
    }
    int candidates[] = {7, 6, 5, 4};
    for (int v : candidates) {
      if (version && *version != v) continue;
      std::string sym = "ncclProfiler_v" + std::to_string(v);
      void* t = dlsym(lib_, sym.c_str());
      if (t) {
        version_ = v;
        table_ = t;
        break;
      }
    }
    if (!table_) {
      if (version && (*version < 4 || *version > 7))
        throw py::value_error("unsupported profiler ABI version " + std::to_string(*version) + " (4..7)");
      throw py::value_error(path + ": exports no " +
                            (version ? "ncclProfiler_v" + std::to_string(*version) : std::string("ncclProfiler_v7..v4")));
    }
    // All four tables share the layout of the name/function pointers (asserted in nccl_profiler_abi.h).
    const char* name = static_cast<const abi::v7::Profiler*>(table_)->name;
    name_ = name ? name : "";
    handles_.reset(new std::atomic<uintptr_t>[nslots_]);
    for (uint64_t i = 0; i < nslots_; ++i) handles_[i].store(kEmpty, std::memory_order_relaxed);
    ctxs_.reset(new std::atomic<void*>[kMaxContexts]);
    finalized_.reset(new std::atomic<bool>[kMaxContexts]);
    self_ = getpid();
    g_debug_level.store(DebugLevelFromEnv(), std::memory_order_relaxed);
    set_clock_ = reinterpret_cast<mycroft::vclock::SetClockFn>(dlsym(lib_, mycroft::vclock::kSetClockSymbol));
  }

  ~Driver() { ReleaseClock(); }

  // Virtual time: from now on the plugin stamps everything with this Driver's clock, which starts at
  // `now_ns` and which each replayed row with t_ns > 0 sets to epoch_ns + t_ns just before it is
  // delivered (no pacing). realtime_offset_ns is what CLOCK_REALTIME - CLOCK_MONOTONIC reads then.
  void UseVirtualClock(uint64_t now_ns, int64_t realtime_offset_ns) {
    if (!set_clock_)
      throw py::value_error(path_ + ": exports no " + std::string(mycroft::vclock::kSetClockSymbol) +
                            " (virtual time needs the mycroft-otel plugin)");
    const void* expected = nullptr;
    if (!g_clock_owner.compare_exchange_strong(expected, this) && expected != this)
      throw std::runtime_error("another Driver in this process already sets the plugin's clock");
    clock_ns_.store(now_ns, std::memory_order_relaxed);
    set_clock_(reinterpret_cast<const uint64_t*>(&clock_ns_), realtime_offset_ns);
    virtual_ = true;
  }

  // Back to the real clocks (idempotent; also when the Driver goes away: the plugin must never read a
  // clock that no longer exists).
  void ReleaseClock() {
    if (!virtual_) return;
    set_clock_(nullptr, 0);
    virtual_ = false;
    g_clock_owner.store(nullptr);
  }

  bool IsVirtual() const { return virtual_; }
  uint64_t ClockNs() const { return clock_ns_.load(std::memory_order_relaxed); }
  void SetClockNs(uint64_t ns) {
    if (!virtual_) throw std::runtime_error("set_time: the Driver is not on virtual time (use_virtual_clock)");
    clock_ns_.store(ns, std::memory_order_relaxed);
  }

  int version() const { return version_; }
  const std::string& name() const { return name_; }
  const std::string& path() const { return path_; }
  uint64_t slots() const { return nslots_; }
  uint32_t num_contexts() const { return nctx_.load(std::memory_order_acquire); }

  int Init(std::optional<std::string> comm_name, uint64_t comm_hash, int n_nodes, int nranks, int rank,
           uint64_t comm_id, std::optional<py::dict> env) {
    uint32_t idx = nctx_.load(std::memory_order_relaxed);
    if (idx >= kMaxContexts) throw std::runtime_error("too many plugin contexts in one Driver");
    // Apply env around the call only (the GIL is held throughout, so no Python thread sees it).
    std::vector<std::pair<std::string, std::optional<std::string>>> saved;
    if (env) {
      for (auto item : *env) {
        std::string k = py::str(item.first);
        const char* old = getenv(k.c_str());
        saved.emplace_back(k, old ? std::optional<std::string>(old) : std::nullopt);
        if (item.second.is_none()) unsetenv(k.c_str());
        else setenv(k.c_str(), std::string(py::str(item.second)).c_str(), 1);
      }
    }
    size_t log_before;
    {
      std::lock_guard<std::mutex> g(g_log_mu);
      log_before = g_log.size();
    }
    void* ctx = nullptr;
    const char* name = comm_name ? comm_name->c_str() : nullptr;
    int r;
    if (version_ == 4) {
      auto* t = static_cast<const abi::v4::Profiler*>(table_);
      r = int(t->init(&ctx, &mask_, name, comm_hash, n_nodes, nranks, rank, &DriverLogger));
    } else {
      // v5..v7 share the init signature; NCCL passes its comm hash as commId.
      auto* t = static_cast<const abi::v5::Profiler*>(table_);
      r = int(t->init(&ctx, comm_id ? comm_id : comm_hash, &mask_, name, n_nodes, nranks, rank, &DriverLogger));
    }
    for (auto it = saved.rbegin(); it != saved.rend(); ++it) {
      if (it->second) setenv(it->first.c_str(), it->second->c_str(), 1);
      else unsetenv(it->first.c_str());
    }
    if (r != 0) {
      std::string msg = name_ + " (ncclProfiler_v" + std::to_string(version_) + ") init failed with ncclResult_t " +
                        std::to_string(r);
      std::lock_guard<std::mutex> g(g_log_mu);
      for (size_t i = log_before; i < g_log.size(); ++i) msg += "\n  " + std::string(LevelName(g_log[i].level)) + ": " + g_log[i].msg;
      throw std::runtime_error(msg);
    }
    if (version_ == 7) {
      int m = __atomic_load_n(&mask_, __ATOMIC_RELAXED);
      if ((m & t7::kKernelPhase) && !(m & t7::kKernelCh)) __atomic_store_n(&mask_, m | t7::kKernelCh, __ATOMIC_RELAXED);
    }
    ctxs_[idx].store(ctx, std::memory_order_relaxed);
    finalized_[idx].store(false, std::memory_order_relaxed);
    nctx_.store(idx + 1, std::memory_order_release);
    return int(idx);
  }

  int ActivationMask() const { return __atomic_load_n(&mask_, __ATOMIC_RELAXED); }
  void SetActivationMask(int m) { __atomic_store_n(&mask_, m, __ATOMIC_RELAXED); }

  int Finalize(uint32_t ctx, bool force) {
    CheckCtx(ctx);
    if (finalized_[ctx].exchange(true) && !force) throw std::runtime_error("context " + std::to_string(ctx) + " already finalized");
    void* c = ctxs_[ctx].load(std::memory_order_acquire);
    if (!c && !force) return 0;  // NCCL skips finalize for a NULL context
    py::gil_scoped_release nogil;
    return int(static_cast<const abi::v7::Profiler*>(table_)->finalize(c));
  }

  uintptr_t ContextPointer(uint32_t ctx) const {
    CheckCtx(ctx);
    return uintptr_t(ctxs_[ctx].load(std::memory_order_acquire));
  }

  py::object Handle(uint64_t slot) const {
    CheckSlot(slot);
    uintptr_t v = handles_[slot].load(std::memory_order_acquire);
    if (v == kEmpty) return py::none();
    return py::int_(v);
  }
  void SetHandle(uint64_t slot, uintptr_t value) {
    CheckSlot(slot);
    handles_[slot].store(value, std::memory_order_release);
  }
  void ResetSlots(uint64_t start, std::optional<uint64_t> count) {
    if (start > nslots_) throw py::index_error("slot out of range");
    uint64_t end = count ? std::min(nslots_, start + *count) : nslots_;
    for (uint64_t i = start; i < end; ++i) handles_[i].store(kEmpty, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
  }

  py::dict Replay(py::array_t<Event, py::array::c_style> events, uint64_t epoch_ns, bool raw) {
    if (events.ndim() != 1) throw py::value_error("events must be a 1-d EVENT_DTYPE array");
    const Event* rows = events.data();
    size_t n = size_t(events.size());
    Stats st;
    uint64_t t0 = MonotonicNs();
    {
      py::gil_scoped_release nogil;
      switch (version_) {
        case 4: Run<4>(rows, n, epoch_ns, raw, &st); break;
        case 5: Run<5>(rows, n, epoch_ns, raw, &st); break;
        case 6: Run<6>(rows, n, epoch_ns, raw, &st); break;
        default: Run<7>(rows, n, epoch_ns, raw, &st); break;
      }
    }
    py::dict d;
    d["rows"] = st.rows;
    d["delivered"] = st.delivered;
    d["filtered"] = st.filtered;
    d["null_handle"] = st.null_handle;
    d["missing_slot"] = st.missing_slot;
    d["bad_rows"] = st.bad_rows;
    d["errors"] = st.errors;
    d["max_late_ns"] = st.max_late_ns;
    d["wall_ns"] = MonotonicNs() - t0;
    return d;
  }

  uint64_t slot_timeout_ms = 2000;

 private:
  void CheckCtx(uint32_t ctx) const {
    if (ctx >= num_contexts()) throw py::index_error("no plugin context " + std::to_string(ctx));
  }
  void CheckSlot(uint64_t slot) const {
    if (slot >= nslots_) throw py::index_error("slot " + std::to_string(slot) + " out of range");
  }

  // Handle stored at `slot`; waits (bounded) while another thread has not filled it yet.
  bool Lookup(uint32_t slot, void** out, Stats* st) const {
    uintptr_t v = handles_[slot].load(std::memory_order_acquire);
    if (v != kEmpty) {
      *out = reinterpret_cast<void*>(v);
      return true;
    }
    const uint64_t deadline = MonotonicNs() + slot_timeout_ms * 1'000'000ull;
    for (uint64_t i = 1;; ++i) {
      if (i < 64) {
        CpuRelax();
      } else if (i < 256) {
        sched_yield();
      } else {
        timespec ts{0, 20'000};
        nanosleep(&ts, nullptr);
      }
      v = handles_[slot].load(std::memory_order_acquire);
      if (v != kEmpty) {
        *out = reinterpret_cast<void*>(v);
        return true;
      }
      if ((i & 15) == 0 && MonotonicNs() > deadline) {
        ++st->missing_slot;
        return false;
      }
    }
  }

  static void Pace(uint64_t due, Stats* st) {
    uint64_t now = MonotonicNs();
    if (now < due) {
      if (due - now > kSpinNs) {
        uint64_t wake = due - kSpinNs;
        timespec ts{time_t(wake / 1'000'000'000ull), long(wake % 1'000'000'000ull)};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
        }
      }
      while ((now = MonotonicNs()) < due) CpuRelax();
    }
    if (now - due > st->max_late_ns) st->max_late_ns = now - due;
  }

  template <int V>
  void Run(const Event* rows, size_t n, uint64_t epoch_ns, bool raw, Stats* st) {
    using D = typename Abi<V>::D;
    using S = typename Abi<V>::S;
    auto* table = static_cast<const typename Abi<V>::T*>(table_);
    uint32_t nctx = num_contexts();
    for (size_t i = 0; i < n; ++i) {
      const Event& e = rows[i];
      ++st->rows;
      if (e.t_ns) {
        // virtual time: the row happens at its time (relaxed: the plugin reads it on this thread)
        if (virtual_) clock_ns_.store(epoch_ns + e.t_ns, std::memory_order_relaxed);
        else Pace(epoch_ns + e.t_ns, st);
      }
      if (e.slot >= nslots_) {
        ++st->bad_rows;
        continue;
      }
      switch (Op(e.op)) {
        case Op::kStart: {
          if (e.ctx >= nctx) nctx = num_contexts();  // inited by another thread since this replay began
          if (e.ctx >= nctx || (!raw && finalized_[e.ctx].load(std::memory_order_relaxed))) {
            ++st->bad_rows;
            handles_[e.slot].store(0, std::memory_order_release);
            continue;
          }
          const int mask = __atomic_load_n(&mask_, __ATOMIC_RELAXED);
          const bool single_bit = e.type && !(e.type & (e.type - 1));
          if (!raw && (!single_bit || !(e.type & KnownTypes(V)) || !(uint32_t(mask) & EnableSet(e.type)))) {
            ++st->filtered;
            handles_[e.slot].store(0, std::memory_order_release);  // NCCL keeps a NULL handle
            continue;
          }
          void* parent = nullptr;
          void* group = nullptr;
          bool has_group = false;
          if (e.parent_slot != kNoSlot) {
            if (e.parent_slot >= nslots_) {
              ++st->bad_rows;
              handles_[e.slot].store(0, std::memory_order_release);
              continue;
            }
            if (!Lookup(e.parent_slot, &parent, st)) {
              handles_[e.slot].store(0, std::memory_order_release);
              continue;
            }
          }
          if ((e.type == t7::kColl || e.type == t7::kP2p) && e.size) {
            uint64_t gs = e.size - 1;
            if (gs >= nslots_) {
              ++st->bad_rows;
              handles_[e.slot].store(0, std::memory_order_release);
              continue;
            }
            if (!Lookup(uint32_t(gs), &group, st)) {
              handles_[e.slot].store(0, std::memory_order_release);
              continue;
            }
            has_group = true;
          }
          D d;
          FillDescr<V>(d, e, parent, group, has_group, self_);
          void* h = nullptr;
          int r = int(table->startEvent(ctxs_[e.ctx].load(std::memory_order_relaxed), &h, &d));
          if (r) ++st->errors;
          handles_[e.slot].store(reinterpret_cast<uintptr_t>(h), std::memory_order_release);
          ++st->delivered;
          break;
        }
        case Op::kStop: {
          void* h;
          if (!Lookup(e.slot, &h, st)) continue;
          if (!h && !raw) {
            ++st->null_handle;
            continue;
          }
          if (int(table->stopEvent(h)) != 0) ++st->errors;
          ++st->delivered;
          break;
        }
        case Op::kRecord: {
          if (!raw && (e.state > MaxState(V) || (V == 4 && e.state < uint32_t(S::ProxyStepSendGPUWait)))) {
            ++st->filtered;
            continue;
          }
          void* h;
          if (!Lookup(e.slot, &h, st)) continue;
          if (!h && !raw) {
            ++st->null_handle;
            continue;
          }
          abi::v4::StateArgs args;
          std::memset(&args, 0, sizeof args);
          abi::v4::StateArgs* ap = &args;
          using SS = t7::State;
          if (IsProxyStepState(e.state)) {
            args.proxyStep.transSize = size_t(e.size);
          } else if (e.state >= uint32_t(SS::ProxyCtrlIdle) && e.state <= uint32_t(SS::ProxyCtrlAppendEnd)) {
            args.proxyCtrl.appendedProxyOps = int(e.size);
          } else if (e.state == uint32_t(SS::KernelChStop) || e.state == uint32_t(SS::KernelPhaseStop)) {
            args.kernelCh.pTimer = e.ptimer;
          } else if (e.state == uint32_t(SS::GroupStartApiStop) || e.state == uint32_t(SS::GroupEndApiStart)) {
            ap = nullptr;  // NCCL records the group API states without arguments
          }
          if (int(table->recordEventState(h, S(e.state), ap)) != 0) ++st->errors;
          ++st->delivered;
          break;
        }
        default:
          ++st->bad_rows;
          break;
      }
    }
  }

  std::string path_;
  std::string name_;
  void* lib_ = nullptr;
  const void* table_ = nullptr;
  int version_ = 0;
  int mask_ = 0;  // NCCL's process-wide activation mask (one per Driver here)
  uint64_t nslots_;
  std::unique_ptr<std::atomic<uintptr_t>[]> handles_;
  std::unique_ptr<std::atomic<void*>[]> ctxs_;
  std::unique_ptr<std::atomic<bool>[]> finalized_;
  std::atomic<uint32_t> nctx_{0};
  pid_t self_;
  mycroft::vclock::SetClockFn set_clock_ = nullptr;  // the plugin's clock setter (absent in other plugins)
  std::atomic<uint64_t> clock_ns_{0};  // virtual time; std::atomic<uint64_t> is a plain uint64_t in memory
  bool virtual_ = false;
};
static_assert(sizeof(std::atomic<uint64_t>) == sizeof(uint64_t) && std::atomic<uint64_t>::is_always_lock_free);

}  // namespace

void RegisterDriver(py::module_& m) {
  m.def("log_messages", &LogMessages, py::arg("clear") = false,
        "Messages plugins logged through the NCCL logger the Driver passed to init (list of dicts: level, "
        "level_name, subsys, file, line, msg). Printed to stderr NCCL-style when NCCL_DEBUG asks for them.");
  py::class_<Driver>(m, "Driver",
                     "Loads a profiler plugin .so and calls its ABI exactly as NCCL does (any of v4..v7).")
      .def(py::init<const std::string&, std::optional<int>, uint64_t>(), py::arg("plugin_path"),
           py::arg("version") = py::none(), py::arg("slots") = uint64_t{1} << 20,
           "dlopen PLUGIN_PATH and pick ncclProfiler_vN: the newest of v7..v4 (as NCCL does) or VERSION. "
           "SLOTS sizes the handle table rows refer to.")
      .def_property_readonly("version", &Driver::version)
      .def_property_readonly("name", &Driver::name, "The plugin's name field.")
      .def_property_readonly("path", &Driver::path)
      .def_property_readonly("slots", &Driver::slots)
      .def_property_readonly("num_contexts", &Driver::num_contexts)
      .def_readwrite("slot_timeout_ms", &Driver::slot_timeout_ms,
                     "How long a row waits for a handle slot another thread has not filled (then counted "
                     "in missing_slot and skipped).")
      .def("init", &Driver::Init, py::arg("comm_name"), py::arg("comm_hash"), py::arg("n_nodes"), py::arg("nranks"),
           py::arg("rank"), py::arg("comm_id") = 0, py::arg("env") = py::none(),
           "Call the plugin's init like ncclCommInitRank; returns the context index rows use. ENV "
           "(name -> value, None unsets) is applied to the process environment around the call only. "
           "RuntimeError with the ncclResult_t and the plugin's log lines if init fails.")
      .def("activation_mask", [](const Driver& d, py::object) { return d.ActivationMask(); },
           py::arg("ctx") = py::none(), "The activation mask (one int shared by all contexts, as in NCCL).")
      .def("set_activation_mask", &Driver::SetActivationMask, py::arg("mask"),
           "Overwrite the shared mask (what a plugin writing through the pointer later would do).")
      .def("replay", &Driver::Replay, py::arg("events"), py::arg("epoch_ns") = 0, py::arg("raw") = false,
           "Deliver EVENT_DTYPE rows in order with the GIL released. A row with t_ns > 0 waits until "
           "CLOCK_MONOTONIC epoch_ns + t_ns (on virtual time: sets the clock to it instead). raw=True delivers every row as is (no mask/version filter, NULL "
           "handles passed). Returns stats: rows, delivered, filtered, null_handle, missing_slot, bad_rows, "
           "errors (non-success results), max_late_ns, wall_ns.")
      .def("use_virtual_clock", &Driver::UseVirtualClock, py::arg("now_ns"), py::arg("realtime_offset_ns"),
           "Put the plugin on this Driver's clock (virtual time): it starts at NOW_NS and every replayed row "
           "with t_ns > 0 sets it to epoch_ns + t_ns before delivery, without pacing. REALTIME_OFFSET_NS is "
           "CLOCK_REALTIME - CLOCK_MONOTONIC in that time. One Driver per process; replay from one thread.")
      .def("release_clock", &Driver::ReleaseClock, "Back to the real clocks (also done when the Driver is freed).")
      .def_property_readonly("virtual", &Driver::IsVirtual)
      .def_property("time_ns", &Driver::ClockNs, &Driver::SetClockNs,
                    "The virtual clock (ns); settable between replays, e.g. to the time of an agent poll.")
      .def("finalize", &Driver::Finalize, py::arg("ctx"), py::arg("force") = false,
           "Call finalize on context CTX (once; force=True calls it again, for hostile tests). Returns the "
           "ncclResult_t.")
      .def("context_pointer", &Driver::ContextPointer, py::arg("ctx"))
      .def("handle", &Driver::Handle, py::arg("slot"), "Handle stored at SLOT (int), or None while empty.")
      .def("set_handle", &Driver::SetHandle, py::arg("slot"), py::arg("value"),
           "Store any pointer value at SLOT (hostile tests: NULL, garbage, stale or foreign handles).")
      .def("reset_slots", &Driver::ResetSlots, py::arg("start") = 0, py::arg("count") = py::none(),
           "Mark slots empty again (before reusing slot numbers).")
      .def("log", [](const Driver&, bool clear) { return LogMessages(clear); }, py::arg("clear") = false);
}

}  // namespace mycroft::bindings
