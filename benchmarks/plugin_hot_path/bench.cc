// Hot-path benchmark of libnccl-profiler-mycroft (issue 2, item 6).
//
// Drives a plugin through its exported ncclProfiler_v7 table with the event mix of a
// network collective: per operation Coll start/stop, ProxyOp start, 8 ProxySteps x
// (start + 3 states + stop), ProxyOp stop = 44 callbacks. Measures, in the same run:
//   (a) the real plugin, (b) a do-nothing plugin driven identically, (c) one
//   clock_gettime(CLOCK_MONOTONIC) call;
// for 1 and 3 threads (all on one communicator context, like NCCL's user, proxy and
// profiler threads), and prints ns per callback and (plugin - do-nothing) / clock read.
// Times are per-thread CPU time (see CpuNow), medians over repeats and threads.
//
//   bench <plugin.so> <noop.so> [ops_per_thread] [repeats]
#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

#include "mycroft/nccl_profiler_abi.h"
#include "mycroft/shm_layout.h"

namespace abi = mycroft::nccl_abi;
using P = abi::v7::Profiler;
using D = abi::v7::EventDescr;

static uint64_t Now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

// CPU time of the calling thread: on a machine with fewer cores than benchmark threads,
// wall time would count the time a thread sits descheduled; CPU time counts the work
// (including cache-line contention), which is what the hot path costs NCCL's threads.
static uint64_t CpuNow() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

static P* Load(const char* path) {
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
    exit(2);
  }
  P* p = static_cast<P*>(dlsym(h, "ncclProfiler_v7"));
  if (!p) {
    fprintf(stderr, "%s: no ncclProfiler_v7\n", path);
    exit(2);
  }
  return p;
}

constexpr int kSteps = 8;
constexpr int kCallbacksPerOp = 2 + 1 + kSteps * 5 + 1;

static bool g_wall = false;  // measure wall time instead of thread CPU time
static uint64_t Clock() { return g_wall ? Now() : CpuNow(); }

// One thread's op stream; returns ns per callback.
static double Drive(P* p, void* ctx, int ops, int peer) {
  D coll{}, pop{}, pst{};
  coll.type = abi::v7::kColl;
  coll.coll.func = "AllReduce";
  coll.coll.datatype = "ncclFloat32";
  coll.coll.algo = "RING";
  coll.coll.proto = "SIMPLE";
  coll.coll.count = 1 << 20;
  coll.coll.nChannels = 0;  // completion through the ProxyOp alone (no KernelCh in this mix)
  pop.type = abi::v7::kProxyOp;
  pop.proxyOp.pid = getpid();
  pop.proxyOp.peer = peer;
  pop.proxyOp.nSteps = kSteps;
  pop.proxyOp.chunkSize = 1 << 19;
  pop.proxyOp.isSend = 1;
  pst.type = abi::v7::kProxyStep;
  abi::v7::StateArgs args{};
  args.proxyStep.transSize = 1 << 19;
  uint64_t t0 = Clock();
  for (int i = 0; i < ops; ++i) {
    void* ch = nullptr;
    coll.coll.seqNumber = uint64_t(i);
    p->startEvent(ctx, &ch, &coll);
    p->stopEvent(ch);
    void* oh = nullptr;
    pop.parentObj = ch;
    p->startEvent(ctx, &oh, &pop);
    pst.parentObj = oh;
    for (int s = 0; s < kSteps; ++s) {
      void* sh = nullptr;
      pst.proxyStep.step = s;
      p->startEvent(ctx, &sh, &pst);
      p->recordEventState(sh, abi::v7::State::ProxyStepSendGPUWait, &args);
      p->recordEventState(sh, abi::v7::State::ProxyStepSendPeerWait, &args);
      p->recordEventState(sh, abi::v7::State::ProxyStepSendWait, &args);
      p->stopEvent(sh);
    }
    p->stopEvent(oh);
  }
  return double(Clock() - t0) / (double(ops) * kCallbacksPerOp);
}

// Median ns per callback over `repeats` runs with `threads` threads on one context.
static double Measure(P* p, void* ctx, int threads, int ops, int repeats) {
  std::vector<double> samples;
  for (int r = 0; r < repeats; ++r) {
    std::vector<double> per(threads);
    std::vector<std::thread> ts;
    std::atomic<int> ready{0};
    for (int t = 0; t < threads; ++t)
      ts.emplace_back([&, t] {
        ready++;
        while (ready.load() < threads) {
        }
        per[t] = Drive(p, ctx, ops, 1 + t);
      });
    for (auto& th : ts) th.join();
    for (double v : per) samples.push_back(v);
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

static double ClockNs(int repeats) {
  std::vector<double> samples;
  const int n = 2000000;
  for (int r = 0; r < repeats; ++r) {
    uint64_t sink = 0;
    uint64_t t0 = Clock();
    for (int i = 0; i < n; ++i) sink += Now();
    uint64_t t1 = Clock();
    if (sink == 42) printf(" ");
    samples.push_back(double(t1 - t0) / n);
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s <plugin.so> <noop.so> [ops_per_thread] [repeats]\n", argv[0]);
    return 2;
  }
  int ops = argc > 3 ? atoi(argv[3]) : 20000;
  int repeats = argc > 4 ? atoi(argv[4]) : 7;
  char dir[] = "/tmp/mycroft-bench-XXXXXX";
  if (!mkdtemp(dir)) return 2;
  setenv("MYCROFT_RING_DIR", dir, 1);

  P* real = Load(argv[1]);
  P* noop = Load(argv[2]);
  int mask = 0;
  void *rctx = nullptr, *nctx = nullptr;
  if (real->init(&rctx, 0xbe7c4, &mask, "bench", 1, 4, 0, nullptr) != abi::Result::Success) {
    fprintf(stderr, "plugin init failed\n");
    return 2;
  }
  noop->init(&nctx, 0xbe7c4, &mask, "bench", 1, 4, 0, nullptr);

  // Warm-up (page cache, branch predictors, frequency).
  Drive(real, rctx, ops / 4 + 1, 1);
  Drive(noop, nctx, ops / 4 + 1, 1);

  double clk = ClockNs(repeats);
  printf("plugin hot path: %d callbacks/op (Coll start/stop, ProxyOp start/stop, %d x ProxyStep start+3 states+stop)\n",
         kCallbacksPerOp, kSteps);
  printf("clock_gettime(CLOCK_MONOTONIC): %.1f ns\n", clk);
  double ratio1 = 0;
  for (int threads : {1, 3}) {
    double r = Measure(real, rctx, threads, ops, repeats);
    double n = Measure(noop, nctx, threads, ops, repeats);
    double ratio = (r - n) / clk;
    if (threads == 1) ratio1 = ratio;
    printf("threads=%d  plugin %.1f ns/cb (%.2f M cb/s/thread)  do-nothing %.1f ns/cb  "
           "(plugin - do-nothing) / clock read = %.2f\n",
           threads, r, 1e3 / r, n, ratio);
    if (threads == 3)
      printf("3-thread / 1-thread ratio: %.2f (target <= 2)\n", ratio1 > 0 ? ratio / ratio1 : 0.0);
  }
  printf("single-thread target: <= 3 clock reads -> %s\n", ratio1 <= 3.0 ? "MET" : "NOT MET");
  {
    g_wall = true;  // the same single-thread comparison in wall time (noisy when the machine is busy)
    double wc = ClockNs(repeats);
    double wr = Measure(real, rctx, 1, ops, repeats);
    double wn = Measure(noop, nctx, 1, ops, repeats);
    printf("wall time, 1 thread: clock %.1f ns, plugin %.1f ns/cb, do-nothing %.1f ns/cb, ratio %.2f\n", wc, wr, wn,
           (wr - wn) / wc);
    g_wall = false;
  }
  namespace shm = mycroft::shm;
  printf("shared memory per rank (per communicator): %llu bytes with the defaults (%u live slots x %zu B + %u ring "
         "records x %zu B + %zu B header)\n",
         (unsigned long long)shm::FileSize(shm::kDefaultLiveSlots, shm::kDefaultRingCapacity),
         shm::kDefaultLiveSlots, sizeof(shm::LiveOp), shm::kDefaultRingCapacity, sizeof(shm::RingRecord),
         sizeof(shm::ShmHeader));
  real->finalize(rctx);
  std::string cmd = std::string("rm -rf ") + dir;
  if (system(cmd.c_str()) != 0) return 1;
  return 0;
}
