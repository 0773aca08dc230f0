// Fuzzed callback streams from three threads at once: random event types, parents that
// are live, completed or garbage, out-of-range enums, channel ids 0..255, huge counts,
// foreign pids, double stops. NCCL's own guarantees are kept only where the plugin relies
// on them (a ProxyOp and its steps stay on the thread that started it; threads use
// disjoint channels, so a flow has one writer). Afterwards the shared memory must be
// consistent: counters ordered, generations even, nothing torn, header sums right.
#include <random>
#include <thread>

#include "harness.h"

using namespace mt;

namespace {

const char* kFuncs[] = {"AllReduce", "AllGather", "Broadcast", "Send", "Recv", "Bogus", nullptr, ""};
const char* kTypes[] = {"ncclFloat32", "ncclBfloat16", "Unknown", nullptr};
const char* kAlgos[] = {"RING", "TREE", "NVLS", "Unknown", nullptr};

struct Shared {
  std::mutex mu;
  std::vector<void*> ops;  // Coll/P2p handles, live or long completed
  void Add(void* h) {
    std::lock_guard<std::mutex> lk(mu);
    if (ops.size() < 4096) ops.push_back(h);
  }
  void* Pick(std::mt19937_64& rng) {
    std::lock_guard<std::mutex> lk(mu);
    return ops.empty() ? nullptr : ops[rng() % ops.size()];
  }
};

void Stream(Prof& p, void* ctx, Shared& shared, int t, uint64_t seed, int iters) {
  std::mt19937_64 rng(seed);
  std::vector<void*> proxies, steps;
  auto pick = [&](std::vector<void*>& v) -> void* { return v.empty() ? nullptr : v[rng() % v.size()]; };
  for (int i = 0; i < iters; ++i) {
    switch (rng() % 10) {
      case 0:
      case 1: {  // a launch
        Prof::E g;
        g.type = kGroup;
        void* group = p.Start(ctx, g);
        Prof::E c;
        c.type = (rng() % 4) ? kColl : kP2p;
        c.func = kFuncs[rng() % 8];
        c.datatype = kTypes[rng() % 4];
        c.algo = kAlgos[rng() % 5];
        c.count = (rng() % 8) ? rng() % 100000 : ~size_t{0} - rng() % 3;
        c.n_channels = uint8_t(rng() % 4);
        c.peer = int(rng() % 6) - 1;
        c.parent = group;
        c.parent_group = group;
        void* h = p.Start(ctx, c);
        p.Stop(h);
        p.Stop(group);
        shared.Add(h);
        break;
      }
      case 2: {  // ProxyOp on some op, own channels
        Prof::E o;
        o.type = kProxyOp;
        o.parent = shared.Pick(rng);
        o.channel = uint8_t(t * 16 + rng() % 16);
        o.peer = int(rng() % 7) - 1;
        o.n_steps = int(rng() % 12) - 1;
        o.chunk_size = int(rng() % 5000) - 10;
        o.is_send = int(rng() % 2);
        if (rng() % 10 == 0) o.pid = getpid() + 1 + int(rng() % 1000);
        void* h = p.Start(ctx, o);
        if (h) proxies.push_back(h);
        break;
      }
      case 3:
      case 4: {
        Prof::E s;
        s.type = kProxyStep;
        s.parent = pick(proxies);
        s.step = int(rng() % 20) - 1;
        void* h = p.Start(ctx, s);
        if (h) steps.push_back(h);
        break;
      }
      case 5:
      case 6:
        p.Record(pick(steps), int(rng() % 40) - 3, rng() % 100000, rng() % 8 != 0);
        break;
      case 7:
        if (rng() % 2) p.Stop(pick(steps));
        else p.Stop(pick(proxies));
        break;
      case 8: {  // KernelCh of some op, any channel id
        Prof::E k;
        k.type = kKernelCh;
        k.parent = shared.Pick(rng);
        k.channel = uint8_t(rng());
        k.ptimer = rng() % 1000000;
        void* h = p.Start(ctx, k);
        p.Record(h, kKernelChStop, rng() % 2000000);
        p.Stop(h);
        if (rng() % 4 == 0) p.Stop(h);
        break;
      }
      default: {  // garbage
        void* h = reinterpret_cast<void*>((rng() % 2 ? (0xCull << 60) : 0) | (rng() >> 8));
        p.Stop(h);
        p.Record(h, int(rng() % 40), rng());
        Prof::E e;
        e.type = 1ull << (rng() % 16);
        e.parent = h;
        p.Start(ctx, e);
        break;
      }
    }
    if (proxies.size() > 256) proxies.erase(proxies.begin(), proxies.begin() + 128);
    if (steps.size() > 512) steps.erase(steps.begin(), steps.begin() + 256);
  }
}

void CheckFlows(const shm::Flow* flows, uint32_t n, const char* where) {
  for (uint32_t f = 0; f < n && f < shm::kMaxFlows; ++f) {
    const shm::Flow& fl = flows[f];
    EXPECT_EQ(fl.version % 2, 0u) << where;
    EXPECT_LE(fl.done, fl.transmitted) << where;
    EXPECT_LE(fl.transmitted, fl.ready) << where;
    EXPECT_LE(fl.ready, fl.posted) << where;
    EXPECT_LE(fl.dir, 1) << where;
  }
}

}  // namespace

TEST(Fuzz, ThreeThreadsOfHostileCallbacks) {
  for (int ver : {4, 5, 7}) {
    ClearKnobs();
    TempDir dir;
    setenv("MYCROFT_LIVE_SLOTS", "32", 1);
    setenv("MYCROFT_RING_RECORDS", "64", 1);
    Prof p(ver);
    void* ctx = nullptr;
    ASSERT_EQ(p.Init(&ctx, "fuzz", 0xf000 + uint64_t(ver), 4, 0), nabi::Result::Success);
    ClearKnobs();
    Shared shared;
    std::vector<std::thread> ts;
    for (int t = 0; t < 3; ++t)
      ts.emplace_back([&, t] { Stream(p, ctx, shared, t, 1000 * uint64_t(ver) + uint64_t(t), 4000); });
    std::string path = dir.Files().at(0);
    View v(path);
    for (int i = 0; i < 50; ++i) {  // concurrent reads while the streams run
      for (auto& s : v.Live()) EXPECT_FALSE(s.torn);
      std::vector<shm::RingRecord> recs;
      v.r.Read(0, 64, &recs);
    }
    for (auto& th : ts) th.join();

    auto h = v.H();
    EXPECT_LE(h.ops_completed, h.ops_started);
    auto live = v.Live();
    EXPECT_EQ(h.ops_started - h.ops_completed, live.size());
    for (auto& s : live) {
      EXPECT_FALSE(s.torn);
      EXPECT_EQ(s.slot.generation % 4, 2u);
      CheckFlows(s.slot.flows, s.slot.op.n_flows, "live");
    }
    std::vector<shm::RingRecord> recs;
    shm::ReadResult rr = v.r.Read(0, 1 << 20, &recs);
    uint64_t overwritten = rr.overwritten;
    EXPECT_FALSE(rr.pending) << "next_cursor " << rr.next_cursor << " head " << h.ring_head;
    EXPECT_EQ(recs.size() + overwritten, h.ring_head);
    for (auto& r : recs) {
      CheckFlows(r.flows, r.op.n_flows, "ring");
      EXPECT_LE(r.op.proxy_ops_stopped, r.op.proxy_ops_started);
      EXPECT_GE(r.op.end_ns, r.op.start_ns);
    }
    EXPECT_GT(h.dropped_bad_handle + h.dropped_bad_descr, 0u);
    ASSERT_EQ(p.Finalize(ctx), nabi::Result::Success);
    EXPECT_EQ(v.Live().size(), 0u);
    EXPECT_EQ(v.H().ring_head, h.ring_head + live.size()) << "finalize publishes what was in flight";
  }
}
