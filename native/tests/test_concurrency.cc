// NCCL's threads at once on one context: the user thread launching collectives, the
// proxy progress thread running ProxyOps/ProxySteps, the profiler thread (2.31+) stopping
// KernelCh events, and a reader snapshotting the shared memory. Run under TSan too.
#include <atomic>
#include <deque>
#include <thread>

#include "harness.h"

using namespace mt;

namespace {

template <class T>
struct Queue {
  std::mutex mu;
  std::deque<T> q;
  void Push(T v) {
    std::lock_guard<std::mutex> lk(mu);
    q.push_back(v);
  }
  bool Pop(T* v) {
    std::lock_guard<std::mutex> lk(mu);
    if (q.empty()) return false;
    *v = q.front();
    q.pop_front();
    return true;
  }
};

}  // namespace

TEST(Concurrency, UserProxyProfilerThreadsAndAReader) {
  ClearKnobs();
  TempDir dir;
  setenv("MYCROFT_RING_RECORDS", "64", 1);
  Prof p(7);
  void* ctx = nullptr;
  ASSERT_EQ(p.Init(&ctx, "conc", 0x6666, 4, 2), nabi::Result::Success);
  ClearKnobs();
  const int kOps = 300;
  const uint8_t kCh = 2;
  Queue<void*> to_proxy, to_kernel;
  std::atomic<int> proxied{0}, kerneled{0}, launched{0};
  std::atomic<bool> stop_reader{false};

  // NCCL's constraint, kept here: a channel's kernel work cannot finish before the proxy
  // thread has started the ProxyOps it depends on (a receive needs its posted buffers).
  // ProxyOp stops and KernelCh stops then race freely, so either thread may complete an op.
  std::thread user([&] {
    for (int i = 0; i < kOps; ++i) {
      while (launched.load() - std::min(proxied.load(), kerneled.load()) > 24) std::this_thread::yield();
      void* c = p.CollLaunch(ctx, i % 2 ? "AllGather" : "AllReduce", uint64_t(i), kCh, 4096);
      launched++;
      to_proxy.Push(c);
    }
  });
  std::thread proxy([&] {
    for (int done = 0; done < kOps;) {
      void* c;
      if (!to_proxy.Pop(&c)) {
        std::this_thread::yield();
        continue;
      }
      void* ops[2 * kCh];
      for (uint8_t ch = 0; ch < kCh; ++ch) {
        for (int dir = 0; dir < 2; ++dir) {
          Prof::E o;
          o.type = kProxyOp;
          o.parent = c;
          o.channel = ch;
          o.peer = dir ? 3 : 1;
          o.is_send = dir;
          o.n_steps = 3;
          o.chunk_size = 512;
          ops[ch * 2 + dir] = p.Start(ctx, o);
        }
      }
      to_kernel.Push(c);
      for (int k = 0; k < 2 * kCh; ++k) {
        for (int s = 0; s < 3; ++s) {
          Prof::E st;
          st.type = kProxyStep;
          st.parent = ops[k];
          st.step = s;
          void* h = p.Start(ctx, st);
          if (k % 2) {
            p.Record(h, kSendGPUWait, 0);
            p.Record(h, kSendWait, 512);
          } else {
            p.Record(h, kRecvWait, 0);
            p.Record(h, kRecvFlushWait, 512);
            p.Record(h, kRecvGPUWait, 0);
          }
          p.Stop(h);
        }
        p.Stop(ops[k]);
      }
      ++done;
      proxied++;
    }
  });
  std::thread kernel([&] {
    for (int done = 0; done < kOps;) {
      void* c;
      if (!to_kernel.Pop(&c)) {
        std::this_thread::yield();
        continue;
      }
      for (uint8_t ch = 0; ch < kCh; ++ch) p.KernelCh(ctx, c, ch, 10 + ch, 20 + ch);
      ++done;
      kerneled++;
    }
  });
  std::string path = dir.Files().at(0);
  std::thread reader([&] {
    View v(path);
    uint64_t cursor = 0, got = 0, lost = 0;
    while (!stop_reader.load()) {
      auto live = v.Live();
      for (auto& s : live) {
        EXPECT_FALSE(s.torn);
        for (uint32_t f = 0; f < s.slot.op.n_flows && f < shm::kMaxFlows; ++f) {
          const shm::Flow& fl = s.slot.flows[f];
          if (fl.version & 1) continue;  // torn flows are flagged, never half-read silently
          EXPECT_LE(fl.done, fl.transmitted);
          EXPECT_LE(fl.transmitted, fl.ready);
          EXPECT_LE(fl.ready, fl.posted);
        }
      }
      std::vector<shm::RingRecord> recs;
      shm::ReadResult rr = v.r.Read(cursor, 32, &recs);
      cursor = rr.next_cursor;
      got += recs.size();
      lost += rr.overwritten;
      for (auto& r : recs) EXPECT_EQ(r.op.proxy_ops_stopped, uint32_t(2 * kCh));
    }
    EXPECT_LE(got + lost, uint64_t(kOps));
  });
  user.join();
  proxy.join();
  kernel.join();
  stop_reader = true;
  reader.join();

  View v(path);
  auto h = v.H();
  EXPECT_EQ(h.ops_started, uint64_t(kOps));
  EXPECT_EQ(h.ops_completed, uint64_t(kOps));
  EXPECT_EQ(h.dropped_bad_handle, 0u);
  EXPECT_EQ(h.dropped_live_full, 0u);
  EXPECT_EQ(v.Live().size(), 0u);
  std::vector<shm::RingRecord> recs;
  v.r.Read(0, 1000, &recs);
  ASSERT_EQ(recs.size(), 64u);
  for (auto& r : recs) {
    EXPECT_EQ(r.op.n_flows, 2 * kCh);
    EXPECT_EQ(r.op.kernel_ch_stopped, kCh);
    for (int f = 0; f < 2 * kCh; ++f) {
      EXPECT_EQ(r.flows[f].done, 3u);
      EXPECT_EQ(r.flows[f].bytes, 3u * 512);
    }
  }
  p.Finalize(ctx);
}

// Two proxy threads on one context (NCCL may progress one communicator's ProxyOps from
// more than one thread, e.g. a shared proxy state), each op with more flows than its band
// of the ProxyEntry pool holds, so entries freed by one thread are claimed by the other.
// Every op must complete exactly once with all its flows: a ProxyOp stop that released
// the op of the entry's next owner (it read the entry after freeing it) completed that
// op early and left the owner's own stop rejected as a bad handle.
TEST(Concurrency, TwoProxyThreadsShareTheProxyEntries) {
  ClearKnobs();
  TempDir dir;
  setenv("MYCROFT_LIVE_SLOTS", "8", 1);
  setenv("MYCROFT_RING_RECORDS", "64", 1);
  Prof p(7);
  void* ctx = nullptr;
  ASSERT_EQ(p.Init(&ctx, "proxies", 0x7777, 4, 2), nabi::Result::Success);
  ClearKnobs();
  const int kOps = 1000;
  const uint8_t kCh = 12;  // 24 ProxyOps per op: past its band of 16 entries
  Queue<int> to_proxy;
  std::vector<void*> colls(kOps);
  std::vector<std::atomic<int>> started(kOps);
  std::atomic<int> launched{0}, kerneled{0};
  std::thread user([&] {
    for (int i = 0; i < kOps; ++i) {
      while (launched.load() - kerneled.load() > 4) std::this_thread::yield();  // live slots: 8
      colls[i] = p.CollLaunch(ctx, "AllReduce", uint64_t(i), 1);
      launched++;
      to_proxy.Push(i);
    }
  });
  // Kernels run in launch order, each once its ProxyOps are posted (NCCL's constraint).
  std::thread kernel([&] {
    for (int i = 0; i < kOps; ++i) {
      while (!started[i].load()) std::this_thread::yield();
      p.KernelCh(ctx, colls[i], 0);
      kerneled++;
    }
  });
  std::atomic<int> taken{0};
  auto proxy = [&] {
    while (taken.load() < kOps) {
      int i;
      if (!to_proxy.Pop(&i)) {
        std::this_thread::yield();
        continue;
      }
      taken++;
      void* c = colls[i];
      // Start them all first, as the proxy thread does with the ops of one launch.
      void* ops[2 * kCh];
      for (int k = 0; k < 2 * kCh; ++k) {
        Prof::E o;
        o.type = kProxyOp;
        o.parent = c;
        o.channel = uint8_t(k / 2);
        o.peer = k % 2 ? 1 : 3;
        o.is_send = k % 2;
        o.n_steps = 1;
        o.chunk_size = 64;
        ops[k] = p.Start(ctx, o);
      }
      started[i] = 1;
      for (int k = 0; k < 2 * kCh; ++k) {
        Prof::E st;
        st.type = kProxyStep;
        st.parent = ops[k];
        void* h = p.Start(ctx, st);
        p.Record(h, k % 2 ? kSendWait : kRecvFlushWait, 64);
        p.Stop(h);
        p.Stop(ops[k]);
      }
    }
  };
  std::thread proxy_a(proxy), proxy_b(proxy);
  user.join();
  kernel.join();
  proxy_a.join();
  proxy_b.join();

  View v(dir.Files().at(0));
  auto h = v.H();
  EXPECT_EQ(h.ops_started, uint64_t(kOps));
  EXPECT_EQ(h.ops_completed, uint64_t(kOps));
  EXPECT_EQ(h.dropped_bad_handle, 0u);
  EXPECT_EQ(h.dropped_flows, 0u);
  EXPECT_EQ(v.Live().size(), 0u);
  std::vector<shm::RingRecord> recs;
  v.r.Read(0, 1000, &recs);
  ASSERT_EQ(recs.size(), 64u);
  for (auto& r : recs) {
    EXPECT_EQ(r.op.proxy_ops_stopped, uint32_t(2 * kCh));
    EXPECT_EQ(r.op.n_flows, 2 * kCh);
  }
  p.Finalize(ctx);
}

// Several communicators (contexts) driven from several threads at once, with
// inits and finalizes racing the traffic of the others.
TEST(Concurrency, ManyContextsInitFinalizeUnderTraffic) {
  ClearKnobs();
  TempDir dir;
  setenv("MYCROFT_LIVE_SLOTS", "8", 1);
  setenv("MYCROFT_RING_RECORDS", "16", 1);
  std::vector<std::thread> ts;
  std::atomic<int> failures{0};
  for (int t = 0; t < 3; ++t) {
    ts.emplace_back([&, t] {
      Prof p(4 + t);
      for (int round = 0; round < 10; ++round) {
        void* ctx = nullptr;
        if (p.Init(&ctx, "multi", 0x7000 + uint64_t(t * 100 + round), 2, t % 2) != nabi::Result::Success) {
          failures++;
          continue;
        }
        for (int i = 0; i < 20; ++i) {
          void* c = p.CollLaunch(ctx, "AllReduce", uint64_t(i), 1, 64);
          p.ProxyOp(ctx, c, 0, (t + 1) % 2, true, 2, 32);
          p.KernelCh(ctx, c, 0);
        }
        p.Finalize(ctx);
      }
    });
  }
  for (auto& th : ts) th.join();
  ClearKnobs();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(dir.Files().size(), 30u);
}
