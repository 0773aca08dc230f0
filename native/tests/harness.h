// Test harness: loads the built plugin with dlopen and calls it through its exported
// ncclProfiler_vN tables exactly as NCCL does (the real ABI, our declarations of it).
#pragma once

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "mycroft/nccl_profiler_abi.h"
#include "mycroft/shm_layout.h"
#include "mycroft/shm_reader.h"

#ifndef MYCROFT_PLUGIN_PATH
#error "MYCROFT_PLUGIN_PATH must name the plugin .so under test"
#endif

namespace mt {

namespace nabi = mycroft::nccl_abi;
namespace shm = mycroft::shm;

// Everything NCCL's logger receives, for assertions.
inline std::mutex g_log_mu;
inline std::vector<std::string> g_log;
inline void Logger(nabi::LogLevel level, unsigned long, const char*, int, const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  std::lock_guard<std::mutex> lk(g_log_mu);
  g_log.push_back(std::to_string(int(level)) + " " + buf);
}
inline std::string AllLogs() {
  std::lock_guard<std::mutex> lk(g_log_mu);
  std::string s;
  for (auto& l : g_log) s += l + "\n";
  return s;
}

inline void* Lib() {
  static void* h = dlopen(MYCROFT_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL);
  return h;
}
template <class T>
T* Table(const char* sym) {
  void* lib = Lib();
  return lib ? static_cast<T*>(dlsym(lib, sym)) : nullptr;
}

// A fresh ring directory per test (removed at the end).
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/mycroft-gtest-XXXXXX";
    path = mkdtemp(tmpl);
    path += "/rings";  // let the plugin create it (0700)
    setenv("MYCROFT_RING_DIR", path.c_str(), 1);
  }
  ~TempDir() {
    std::string cmd = "rm -rf '" + path.substr(0, path.size() - 6) + "'";
    if (system(cmd.c_str()) != 0) {
    }
  }
  std::vector<std::string> Files() const {
    std::vector<std::string> out;
    std::string cmd = "ls -1 '" + path + "' 2>/dev/null";
    FILE* p = popen(cmd.c_str(), "r");
    char line[1024];
    while (p && fgets(line, sizeof(line), p)) {
      std::string s(line);
      while (!s.empty() && s.back() == '\n') s.pop_back();
      out.push_back(path + "/" + s);
    }
    if (p) pclose(p);
    return out;
  }
};

// Clears the MYCROFT_* knobs a test may have set.
inline void ClearKnobs() {
  for (const char* v : {"MYCROFT_ENABLE", "MYCROFT_LIVE_SLOTS", "MYCROFT_RING_RECORDS", "MYCROFT_JOB_ID",
                        "MYCROFT_KERNEL_EVENTS"})
    unsetenv(v);
}

enum Ver { V4 = 4, V5 = 5, V6 = 6, V7 = 7 };

// Version-generic caller. Descriptors are built in the version's own layout.
template <int V>
struct Types;
template <> struct Types<4> { using P = nabi::v4::Profiler; using D = nabi::v4::EventDescr; using S = nabi::v4::State; using A = nabi::v4::StateArgs; static constexpr const char* sym = "ncclProfiler_v4"; };
template <> struct Types<5> { using P = nabi::v5::Profiler; using D = nabi::v5::EventDescr; using S = nabi::v5::State; using A = nabi::v5::StateArgs; static constexpr const char* sym = "ncclProfiler_v5"; };
template <> struct Types<6> { using P = nabi::v6::Profiler; using D = nabi::v6::EventDescr; using S = nabi::v6::State; using A = nabi::v6::StateArgs; static constexpr const char* sym = "ncclProfiler_v6"; };
template <> struct Types<7> { using P = nabi::v7::Profiler; using D = nabi::v7::EventDescr; using S = nabi::v7::State; using A = nabi::v7::StateArgs; static constexpr const char* sym = "ncclProfiler_v7"; };

// NCCL's event bits / state numbers (identical values in every version that has them).
enum : uint64_t {
  kGroup = 1 << 0, kColl = 1 << 1, kP2p = 1 << 2, kProxyOp = 1 << 3, kProxyStep = 1 << 4, kProxyCtrl = 1 << 5,
  kKernelCh = 1 << 6, kNetPlugin = 1 << 7, kGroupApi = 1 << 8, kCollApi = 1 << 9, kP2pApi = 1 << 10,
  kKernelLaunch = 1 << 11, kKernelPhase = 1 << 15,
};
enum : int {
  kSendGPUWait = 8, kSendWait = 9, kRecvWait = 10, kRecvFlushWait = 11, kRecvGPUWait = 12, kProxyOpInProgress = 19,
  kSendPeerWait = 20, kKernelChStop = 22, kGroupStartApiStop = 23, kGroupEndApiStart = 24, kKernelPhaseStop = 31,
};

struct Prof {
  int ver = 5;
  void* p = nullptr;  // table
  int mask = 0;
  pid_t pid = getpid();

  explicit Prof(int v) : ver(v) {
    switch (v) {
      case 4: p = Table<nabi::v4::Profiler>("ncclProfiler_v4"); break;
      case 5: p = Table<nabi::v5::Profiler>("ncclProfiler_v5"); break;
      case 6: p = Table<nabi::v6::Profiler>("ncclProfiler_v6"); break;
      default: p = Table<nabi::v7::Profiler>("ncclProfiler_v7"); break;
    }
  }

  template <int V>
  typename Types<V>::P* T() const { return static_cast<typename Types<V>::P*>(p); }

  nabi::Result Init(void** ctx, const char* name, uint64_t hash, int nranks, int rank, int n_nodes = 1) {
    switch (ver) {
      case 4: return T<4>()->init(ctx, &mask, name, hash, n_nodes, nranks, rank, Logger);
      case 5: return T<5>()->init(ctx, hash, &mask, name, n_nodes, nranks, rank, Logger);
      case 6: return T<6>()->init(ctx, hash, &mask, name, n_nodes, nranks, rank, Logger);
      default: return T<7>()->init(ctx, hash, &mask, name, n_nodes, nranks, rank, Logger);
    }
  }
  nabi::Result Finalize(void* ctx) {
    switch (ver) {
      case 4: return T<4>()->finalize(ctx);
      case 5: return T<5>()->finalize(ctx);
      case 6: return T<6>()->finalize(ctx);
      default: return T<7>()->finalize(ctx);
    }
  }
  nabi::Result Stop(void* h) {
    switch (ver) {
      case 4: return T<4>()->stopEvent(h);
      case 5: return T<5>()->stopEvent(h);
      case 6: return T<6>()->stopEvent(h);
      default: return T<7>()->stopEvent(h);
    }
  }
  // state args: `word` goes to offset 0 (transSize / pTimer); args=false passes NULL.
  nabi::Result Record(void* h, int state, uint64_t word = 0, bool args = true) {
    nabi::v4::StateArgs a;
    memset(&a, 0, sizeof(a));
    a.proxyStep.transSize = word;
    auto* ap = args ? &a : nullptr;
    switch (ver) {
      case 4: return T<4>()->recordEventState(h, nabi::v4::State(state), ap);
      case 5: return T<5>()->recordEventState(h, nabi::v5::State(state), ap);
      case 6: return T<6>()->recordEventState(h, nabi::v6::State(state), ap);
      default: return T<7>()->recordEventState(h, nabi::v7::State(state), ap);
    }
  }

  // Generic start: fill a version-neutral description, converted per version.
  struct E {
    uint64_t type = 0;
    void* parent = nullptr;
    void* parent_group = nullptr;  // v5+ coll/p2p.parentGroup
    int rank = 0;
    uint64_t seq = 0;
    const char* func = "AllReduce";
    const char* datatype = "ncclFloat32";
    const char* algo = "RING";
    const char* proto = "SIMPLE";
    size_t count = 1024;
    int root = 0;
    int peer = 0;
    uint8_t n_channels = 0;
    pid_t pid = 0;  // 0 = ours
    uint8_t channel = 0;
    int n_steps = 0;
    int chunk_size = 0;
    int is_send = 0;
    int step = 0;
    uint64_t ptimer = 0;
    uint64_t user_tag = 0;  // v7 coll/p2p/collApi/p2pApi.userTag
    uint8_t phase = 0;      // v7 kernelPhase.phaseId
  };

  template <int V>
  nabi::Result StartV(void* ctx, void** h, const E& e, bool null_descr) {
    using D = typename Types<V>::D;
    D d;
    memset(&d, 0, sizeof(d));
    d.type = decltype(d.type)(e.type);
    d.parentObj = e.parent;
    d.rank = e.rank;
    if (e.type == kColl) {
      d.coll.seqNumber = e.seq; d.coll.func = e.func; d.coll.count = e.count; d.coll.root = e.root;
      d.coll.datatype = e.datatype; d.coll.nChannels = e.n_channels; d.coll.algo = e.algo; d.coll.proto = e.proto;
      if constexpr (V >= 5) d.coll.parentGroup = e.parent_group;
      if constexpr (V == 7) d.coll.userTag = e.user_tag;
    } else if (e.type == kP2p) {
      d.p2p.func = e.func; d.p2p.datatype = e.datatype; d.p2p.count = e.count; d.p2p.peer = e.peer;
      d.p2p.nChannels = e.n_channels;
      if constexpr (V >= 5) d.p2p.parentGroup = e.parent_group;
      if constexpr (V == 7) d.p2p.userTag = e.user_tag;
    } else if (e.type == kProxyOp) {
      d.proxyOp.pid = e.pid ? e.pid : pid; d.proxyOp.channelId = e.channel; d.proxyOp.peer = e.peer;
      d.proxyOp.nSteps = e.n_steps; d.proxyOp.chunkSize = e.chunk_size; d.proxyOp.isSend = e.is_send;
    } else if (e.type == kProxyStep) {
      d.proxyStep.step = e.step;
    } else if (e.type == kKernelCh) {
      d.kernelCh.channelId = e.channel; d.kernelCh.pTimer = e.ptimer;
    }
    if constexpr (V == 7) {
      if (e.type == kKernelPhase) {
        d.kernelPhase.channelId = e.channel; d.kernelPhase.phaseId = e.phase; d.kernelPhase.pTimer = e.ptimer;
      }
    }
    return static_cast<typename Types<V>::P*>(p)->startEvent(ctx, h, null_descr ? nullptr : &d);
  }
  void* Start(void* ctx, const E& e) {
    void* h = reinterpret_cast<void*>(0xdeadbeef);
    nabi::Result r = StartRaw(ctx, &h, e);
    EXPECT_EQ(r, nabi::Result::Success);
    return h;
  }
  nabi::Result StartRaw(void* ctx, void** h, const E& e, bool null_descr = false) {
    switch (ver) {
      case 4: return StartV<4>(ctx, h, e, null_descr);
      case 5: return StartV<5>(ctx, h, e, null_descr);
      case 6: return StartV<6>(ctx, h, e, null_descr);
      default: return StartV<7>(ctx, h, e, null_descr);
    }
  }

  // --- event sequences --------------------------------------------------------------
  // The user-thread part of one collective in NCCL's order (design §3): returns the Coll handle.
  void* CollLaunch(void* ctx, const char* func, uint64_t nccl_seq, uint8_t n_channels, size_t count = 1 << 20,
                   const char* algo = "RING") {
    E e;
    void* gapi = nullptr;
    void* capi = nullptr;
    if (ver >= 5) {
      e.type = kGroupApi;
      gapi = Start(ctx, e);
      Record(gapi, kGroupStartApiStop, 0, false);
      E c;
      c.type = kCollApi;
      c.parent = gapi;
      capi = Start(ctx, c);
      Stop(capi);
      Record(gapi, kGroupEndApiStart, 0, false);
    }
    E g;
    g.type = kGroup;
    void* group = Start(ctx, g);
    E c;
    c.type = kColl;
    c.func = func;
    c.seq = nccl_seq;
    c.n_channels = n_channels;
    c.count = count;
    c.algo = algo;
    c.parent = ver >= 5 ? capi : group;
    c.parent_group = group;
    void* coll = Start(ctx, c);
    Stop(coll);
    Stop(group);
    if (gapi) Stop(gapi);
    return coll;
  }

  // One ProxyOp with n_steps steps going through the full state machine.
  void ProxyOp(void* ctx, void* coll, uint8_t channel, int peer, bool send, int n_steps, size_t step_bytes = 4096) {
    E o;
    o.type = kProxyOp;
    o.parent = coll;
    o.channel = channel;
    o.peer = peer;
    o.is_send = send;
    o.n_steps = n_steps;
    o.chunk_size = int(step_bytes);
    void* op = Start(ctx, o);
    Record(op, kProxyOpInProgress, 0, false);
    for (int s = 0; s < n_steps; ++s) {
      E st;
      st.type = kProxyStep;
      st.parent = op;
      st.step = s;
      void* h = Start(ctx, st);
      if (send) {
        Record(h, kSendGPUWait, 0);
        Record(h, kSendPeerWait, 0);
        Record(h, kSendWait, step_bytes);
      } else {
        Record(h, kRecvWait, 0);
        Record(h, kRecvFlushWait, step_bytes);
        Record(h, kRecvGPUWait, step_bytes);
      }
      Stop(h);
    }
    Stop(op);
  }

  void KernelCh(void* ctx, void* coll, uint8_t channel, uint64_t t0 = 1000, uint64_t t1 = 2000) {
    E k;
    k.type = kKernelCh;
    k.parent = coll;
    k.channel = channel;
    k.ptimer = t0;
    void* h = Start(ctx, k);
    Record(h, kKernelChStop, t1);
    Stop(h);
  }
};

// Reads one context file.
struct View {
  shm::Reader r;
  explicit View(const std::string& path) {
    std::string err;
    EXPECT_TRUE(r.Open(path, &err)) << err;
  }
  shm::ShmHeader H() const { return r.Header(); }
  std::vector<shm::LiveSnapshot> Live() const {
    std::vector<shm::LiveSnapshot> v;
    r.Live(&v);
    return v;
  }
  std::vector<shm::RingRecord> Ring(uint64_t* overwritten = nullptr) const {
    std::vector<shm::RingRecord> v;
    shm::ReadResult rr = r.Read(0, 1 << 20, &v);
    if (overwritten) *overwritten = rr.overwritten;
    return v;
  }
};

}  // namespace mt
