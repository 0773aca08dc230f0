// A profiler plugin that records every call NCCL (here: the Driver) makes, one text line per call,
// so tests can check what each ABI version receives. Not the product plugin: built by
// tests/native/conftest.py. Export set chosen at compile time with -DREC_VERSIONS=mask
// (bit N = export ncclProfiler_vN; default all of v4..v7). REC_MASK (env) sets the activation mask
// init writes (default: every event type of the version); REC_INIT_FAIL=1 makes init fail.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "mycroft/nccl_profiler_abi.h"

namespace abi = mycroft::nccl_abi;

#ifndef REC_VERSIONS
#define REC_VERSIONS 0xF0
#endif

namespace {
std::mutex mu;
std::string log_text;
std::atomic<uintptr_t> next_handle{0x1000};
int ctxs[1024];
std::atomic<int> nctx{0};

void Add(const std::string& s) {
  std::lock_guard<std::mutex> g(mu);
  log_text += s;
  log_text += '\n';
}
std::string P(const void* p) {
  char b[32];
  snprintf(b, sizeof b, "%#lx", (unsigned long)(uintptr_t)p);
  return b;
}
std::string S(const char* s) { return s ? s : "NULL"; }
std::string N(long long v) { return std::to_string(v); }
std::string U(unsigned long long v) { return std::to_string(v); }

template <int V> struct A;
template <> struct A<4> { using D = abi::v4::EventDescr; using St = abi::v4::State; using Ar = abi::v4::StateArgs; };
template <> struct A<5> { using D = abi::v5::EventDescr; using St = abi::v5::State; using Ar = abi::v5::StateArgs; };
template <> struct A<6> { using D = abi::v6::EventDescr; using St = abi::v6::State; using Ar = abi::v6::StateArgs; };
template <> struct A<7> { using D = abi::v7::EventDescr; using St = abi::v7::State; using Ar = abi::v7::StateArgs; };

int MaskFor(int v) {
  const char* e = getenv("REC_MASK");
  if (e) return int(strtol(e, nullptr, 0));
  return v == 4 ? 0xff : v == 5 ? 0xfff : v == 6 ? 0x7fff : 0xffff;
}

abi::Result InitCommon(int v, void** context, int* mask, const char* name, uint64_t hash, int nNodes, int nranks,
                       int rank, abi::DebugLogger logfn) {
  if (getenv("REC_INIT_FAIL")) {
    if (logfn) logfn(abi::LogLevel::Warn, abi::kLogProfile, __FILE__, __LINE__, "recorder: REC_INIT_FAIL=%s", getenv("REC_INIT_FAIL"));
    return abi::Result::InvalidArgument;
  }
  int i = nctx.fetch_add(1);
  ctxs[i % 1024] = i;
  *context = &ctxs[i % 1024];
  *mask = MaskFor(v);
  const char* env_probe = getenv("REC_PROBE");
  Add("I v=" + N(v) + " ctx=" + N(i) + " name=" + S(name) + " hash=" + U(hash) + " nnodes=" + N(nNodes) +
      " nranks=" + N(nranks) + " rank=" + N(rank) + " probe=" + S(env_probe));
  if (logfn) logfn(abi::LogLevel::Info, abi::kLogInit, __FILE__, __LINE__, "recorder init v%d ctx %d", v, i);
  return abi::Result::Success;
}

template <int V>
abi::Result Start(void* context, void** eHandle, typename A<V>::D* d) {
  uintptr_t h = next_handle.fetch_add(16);
  std::string s = "S v=" + N(V) + " ctx=" + N(context ? *static_cast<int*>(context) : -1) + " type=" + N(d->type) +
                  " parent=" + P(d->parentObj) + " rank=" + N(d->rank) + " h=" + P((void*)h);
  switch (int(d->type)) {
    case 1 << 1:
      s += " seq=" + U(d->coll.seqNumber) + " func=" + S(d->coll.func) + " count=" + U(d->coll.count) +
           " root=" + N(d->coll.root) + " dtype=" + S(d->coll.datatype) + " nch=" + N(d->coll.nChannels) +
           " algo=" + S(d->coll.algo) + " proto=" + S(d->coll.proto);
      if constexpr (V >= 5) s += " group=" + P(d->coll.parentGroup);
      break;
    case 1 << 2:
      s += " func=" + S(d->p2p.func) + " count=" + U(d->p2p.count) + " peer=" + N(d->p2p.peer) +
           " dtype=" + S(d->p2p.datatype) + " nch=" + N(d->p2p.nChannels);
      if constexpr (V >= 5) s += " group=" + P(d->p2p.parentGroup);
      break;
    case 1 << 3:
      s += " pid=" + N(d->proxyOp.pid) + " ch=" + N(d->proxyOp.channelId) + " peer=" + N(d->proxyOp.peer) +
           " nsteps=" + N(d->proxyOp.nSteps) + " chunk=" + N(d->proxyOp.chunkSize) + " send=" + N(d->proxyOp.isSend);
      break;
    case 1 << 4: s += " step=" + N(d->proxyStep.step); break;
    case 1 << 6: s += " ch=" + N(d->kernelCh.channelId) + " ptimer=" + U(d->kernelCh.pTimer); break;
    default: break;
  }
  if constexpr (V >= 5) {
    switch (int(d->type)) {
      case 1 << 8: s += " depth=" + N(d->groupApi.groupDepth); break;
      case 1 << 9:
        s += " func=" + S(d->collApi.func) + " count=" + U(d->collApi.count) + " dtype=" + S(d->collApi.datatype) +
             " root=" + N(d->collApi.root);
        break;
      case 1 << 10:
        s += " func=" + S(d->p2pApi.func) + " count=" + U(d->p2pApi.count) + " dtype=" + S(d->p2pApi.datatype);
        break;
      default: break;
    }
  }
  Add(s);
  *eHandle = (void*)h;
  return abi::Result::Success;
}

abi::Result Stop(void* h) {
  Add("E h=" + P(h));
  return abi::Result::Success;
}

template <int V>
abi::Result Record(void* h, typename A<V>::St st, typename A<V>::Ar* a) {
  std::string s = "R v=" + N(V) + " h=" + P(h) + " state=" + N(int(st));
  if (!a) s += " args=NULL";
  else s += " trans=" + U(a->proxyStep.transSize) + " ptimer=" + U(a->kernelCh.pTimer) + " appended=" + N(a->proxyCtrl.appendedProxyOps);
  Add(s);
  return abi::Result::Success;
}

abi::Result Finalize(void* context) {
  Add("F ctx=" + N(context ? *static_cast<int*>(context) : -1));
  return abi::Result::Success;
}

abi::Result Init4(void** c, int* m, const char* n, uint64_t h, int nn, int nr, int r, abi::DebugLogger l) {
  return InitCommon(4, c, m, n, h, nn, nr, r, l);
}
template <int V>
abi::Result Init5(void** c, uint64_t id, int* m, const char* n, int nn, int nr, int r, abi::DebugLogger l) {
  return InitCommon(V, c, m, n, id, nn, nr, r, l);
}
}  // namespace

extern "C" {
#if REC_VERSIONS & (1 << 4)
__attribute__((visibility("default"))) abi::v4::Profiler ncclProfiler_v4 = {"recorder", Init4, Start<4>, Stop, Record<4>, Finalize};
#endif
#if REC_VERSIONS & (1 << 5)
__attribute__((visibility("default"))) abi::v5::Profiler ncclProfiler_v5 = {"recorder", Init5<5>, Start<5>, Stop, Record<5>, Finalize};
#endif
#if REC_VERSIONS & (1 << 6)
__attribute__((visibility("default"))) abi::v6::Profiler ncclProfiler_v6 = {"recorder", Init5<6>, Start<6>, Stop, Record<6>, Finalize};
#endif
#if REC_VERSIONS & (1 << 7)
__attribute__((visibility("default"))) abi::v7::Profiler ncclProfiler_v7 = {"recorder", Init5<7>, Start<7>, Stop, Record<7>, Finalize};
#endif

// Test access: the log so far (and clear it).
__attribute__((visibility("default"))) size_t recorder_take(char* buf, size_t cap) {
  std::lock_guard<std::mutex> g(mu);
  size_t n = log_text.size() < cap ? log_text.size() : cap;
  memcpy(buf, log_text.data(), n);
  log_text.erase(0, n);
  return n;
}
}
