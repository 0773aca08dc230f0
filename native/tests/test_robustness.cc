// Every bad callback NCCL (or a buggy caller) can hand us must be survived, ignored and
// counted: NULL handles, stop/record after stop, callbacks after finalize, PXN ProxyOps
// of another process, out-of-range enums and ids, huge counts, bad MYCROFT_* values,
// a full ring and a full live table. A crash fails the whole binary; a hang trips the
// ctest timeout.
#include <random>

#include "harness.h"

using namespace mt;

namespace {

struct Fixture : ::testing::Test {
  TempDir dir;
  Prof p{5};
  void* ctx = nullptr;
  void SetUp() override {
    ClearKnobs();
    ASSERT_EQ(p.Init(&ctx, "robust", 0x5555, 4, 0), nabi::Result::Success);
  }
  void TearDown() override {
    if (ctx) p.Finalize(ctx);
    ClearKnobs();
  }
  shm::ShmHeader H() {
    View v(dir.Files().at(0));
    return v.H();
  }
};

}  // namespace

TEST_F(Fixture, NullHandlesAndDescriptors) {
  EXPECT_EQ(p.Stop(nullptr), nabi::Result::Success);
  EXPECT_EQ(p.Record(nullptr, kSendWait, 10), nabi::Result::Success);
  Prof::E e;
  e.type = kColl;
  EXPECT_EQ(p.StartRaw(ctx, nullptr, e), nabi::Result::Success);  // NULL eHandle pointer
  void* h = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(p.StartRaw(ctx, &h, e, /*null_descr=*/true), nabi::Result::Success);
  EXPECT_EQ(h, nullptr);
  EXPECT_EQ(p.StartRaw(nullptr, &h, e), nabi::Result::Success);  // NULL context
  EXPECT_EQ(h, nullptr);
  // Children of a NULL parent (NCCL does this when we returned NULL for the parent).
  Prof::E o;
  o.type = kProxyOp;
  o.peer = 1;
  o.n_steps = 4;
  EXPECT_EQ(p.Start(ctx, o), nullptr);
  Prof::E s;
  s.type = kProxyStep;
  EXPECT_EQ(p.Start(ctx, s), nullptr);
  Prof::E k;
  k.type = kKernelCh;
  EXPECT_EQ(p.Start(ctx, k), nullptr);
  EXPECT_EQ(H().dropped_bad_handle, 3u);
  EXPECT_EQ(p.Finalize(nullptr), nabi::Result::Success);
}

TEST_F(Fixture, GarbageHandleValues) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 20000; ++i) {
    uint64_t v = rng();
    if (i % 3 == 0) v = (0xCull << 60) | (v >> 4);  // looks like ours: must still be checked
    void* h = reinterpret_cast<void*>(v);
    p.Stop(h);
    p.Record(h, int(rng() % 40) - 4, rng());
    Prof::E e;
    e.type = 1ull << (rng() % 12);
    e.parent = h;
    e.peer = int(rng() % 8) - 2;
    e.n_steps = int(rng() % 20) - 2;
    e.channel = uint8_t(rng());
    void* out = p.Start(ctx, e);
    (void)out;
  }
  SUCCEED();
}

TEST_F(Fixture, StopAndRecordAfterStop) {
  void* coll = p.CollLaunch(ctx, "AllReduce", 0, 1);
  Prof::E o;
  o.type = kProxyOp;
  o.parent = coll;
  o.peer = 1;
  o.is_send = 1;
  o.n_steps = 1;
  void* op = p.Start(ctx, o);
  Prof::E s;
  s.type = kProxyStep;
  s.parent = op;
  void* st = p.Start(ctx, s);
  p.Record(st, kSendWait, 64);
  p.Stop(st);
  p.Stop(st);                    // step stopped twice
  p.Record(st, kSendWait, 64);   // record after stop
  p.Stop(op);
  p.Stop(op);                    // ProxyOp stopped twice
  p.Stop(coll);                  // Coll stopped twice (CollLaunch stopped it): ignored
  Prof::E k;
  k.type = kKernelCh;
  k.parent = coll;
  void* kh = p.Start(ctx, k);
  p.Stop(kh);  // completes the op
  p.Stop(kh);  // late
  p.Record(kh, kKernelChStop, 1);
  p.Stop(coll);  // stale: slot freed
  View v(dir.Files().at(0));
  auto recs = v.Ring();
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(recs[0].flows[0].done, 1u);
  EXPECT_EQ(recs[0].flows[0].transmitted, 1u);
  auto h = v.H();
  EXPECT_EQ(h.ops_completed, 1u);
  EXPECT_GE(h.dropped_bad_handle, 5u);
}

TEST_F(Fixture, CallbacksAfterFinalize) {
  void* coll = p.CollLaunch(ctx, "AllReduce", 0, 1);
  Prof::E o;
  o.type = kProxyOp;
  o.parent = coll;
  o.peer = 1;
  o.n_steps = 2;
  void* op = p.Start(ctx, o);
  Prof::E s;
  s.type = kProxyStep;
  s.parent = op;
  void* st = p.Start(ctx, s);
  std::string path = dir.Files().at(0);
  ASSERT_EQ(p.Finalize(ctx), nabi::Result::Success);
  EXPECT_EQ(p.Finalize(ctx), nabi::Result::Success);  // twice
  void* dead = ctx;
  ctx = nullptr;
  p.Record(st, kRecvWait, 1);
  p.Stop(st);
  p.Stop(op);
  p.Stop(coll);
  Prof::E e;
  e.type = kColl;
  void* h = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(p.StartRaw(dead, &h, e), nabi::Result::Success);
  EXPECT_EQ(h, nullptr);
  View v(path);
  EXPECT_GT(v.H().finalized_ns, 0u);
  EXPECT_GE(v.H().dropped_bad_handle, 4u);
  auto recs = v.Ring();
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_TRUE(recs[0].op.flags & shm::kFlagAborted);
}

TEST_F(Fixture, ForeignPxnProxyOps) {
  void* coll = p.CollLaunch(ctx, "AllReduce", 0, 0);
  Prof::E o;
  o.type = kProxyOp;
  o.pid = getpid() + 100000;  // another process posted it
  o.parent = reinterpret_cast<void*>(0x7f00dead0000ull);  // its pointer: must never be touched
  o.peer = 1;
  o.n_steps = 3;
  void* op = p.Start(ctx, o);
  ASSERT_NE(op, nullptr);
  for (int i = 0; i < 3; ++i) {
    Prof::E s;
    s.type = kProxyStep;
    s.parent = op;
    s.step = i;
    void* st = p.Start(ctx, s);
    p.Record(st, kSendGPUWait, 0);
    p.Record(st, kSendWait, 10);
    p.Stop(st);
  }
  p.Stop(op);
  // A foreign ProxyOp whose parent looks exactly like one of our handles is still foreign.
  o.parent = coll;
  void* op2 = p.Start(ctx, o);
  p.Stop(op2);
  // Under PXN the context argument is the other process's too: never resolved as ours.
  void* foreign_ctx = reinterpret_cast<void*>(0x00007f1234567000ull);
  o.parent = reinterpret_cast<void*>(0x00007f00beef0000ull);
  void* op3 = p.Start(foreign_ctx, o);
  ASSERT_NE(op3, nullptr);
  Prof::E s3;
  s3.type = kProxyStep;
  s3.parent = op3;
  void* st3 = p.Start(foreign_ctx, s3);
  ASSERT_NE(st3, nullptr);
  p.Record(st3, kSendWait, 10);
  p.Stop(st3);
  p.Stop(op3);
  auto h = H();
  EXPECT_EQ(h.pxn_foreign_ops, 2u);
  EXPECT_EQ(h.dropped_bad_handle, 0u);
  View v(dir.Files().at(0));
  auto live = v.Live();
  ASSERT_EQ(live.size(), 0u) << "n_channels 0 and no own ProxyOps: completed at launch";
  auto recs = v.Ring();
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(recs[0].op.n_flows, 0);
  EXPECT_EQ(recs[0].op.proxy_ops_started, 0u);
}

TEST_F(Fixture, OutOfRangeDescriptors) {
  // Unknown event type bits, multiple bits, zero.
  for (uint64_t t : {uint64_t{0}, uint64_t{1} << 20, uint64_t{3}, uint64_t{1} << 63}) {
    Prof::E e;
    e.type = t;
    EXPECT_EQ(p.Start(ctx, e), nullptr);
  }
  // Unknown strings, huge counts, odd channel counts: tracked, names unknown.
  Prof::E c;
  c.type = kColl;
  c.func = "NoSuchCollective";
  c.datatype = nullptr;
  c.algo = "???";
  c.proto = nullptr;
  c.count = ~size_t{0};
  c.n_channels = 255;
  void* coll = p.Start(ctx, c);
  ASSERT_NE(coll, nullptr);
  p.Stop(coll);
  // Huge step counts, channel 255, negative values.
  Prof::E o;
  o.type = kProxyOp;
  o.parent = coll;
  o.channel = 255;
  o.peer = 1;
  o.n_steps = 0x7fffffff;
  o.chunk_size = -5;
  void* op = p.Start(ctx, o);
  ASSERT_NE(op, nullptr);
  o.n_steps = -1;
  EXPECT_EQ(p.Start(ctx, o), nullptr);  // negative nSteps
  o.n_steps = 1;
  o.peer = 4;
  EXPECT_EQ(p.Start(ctx, o), nullptr);  // peer outside the communicator
  o.peer = -3;
  EXPECT_EQ(p.Start(ctx, o), nullptr);
  Prof::E s;
  s.type = kProxyStep;
  s.parent = op;
  s.step = -1;
  EXPECT_EQ(p.Start(ctx, s), nullptr);
  s.step = 0x7ffffff0;
  void* st = p.Start(ctx, s);
  ASSERT_NE(st, nullptr);
  for (int state : {-1, 0, 7, 13, 18, 21, 23, 31, 32, 1000, 0x7fffffff}) p.Record(st, state, ~uint64_t{0});
  p.Record(st, kSendWait, ~uint64_t{0});
  p.Record(st, kSendWait, 0, /*args=*/false);
  p.Stop(st);
  p.Stop(op);
  // P2p with a peer outside the communicator / a func that is neither Send nor Recv.
  Prof::E q;
  q.type = kP2p;
  q.func = "Send";
  q.peer = 99;
  EXPECT_EQ(p.Start(ctx, q), nullptr);
  q.peer = 1;
  q.func = "AllReduce";
  EXPECT_EQ(p.Start(ctx, q), nullptr);
  View v(dir.Files().at(0));
  auto live = v.Live();
  ASSERT_EQ(live.size(), 1u);  // waiting for 255 KernelCh stops
  EXPECT_EQ(live[0].slot.op.func, shm::kUnknownIndex);
  EXPECT_EQ(live[0].slot.op.datatype, shm::kUnknownIndex);
  EXPECT_EQ(live[0].slot.op.bytes, 0u);
  EXPECT_EQ(live[0].slot.flows[0].channel, 255);
  EXPECT_EQ(live[0].slot.flows[0].n_steps, 0x7fffffffu);
  EXPECT_GE(v.H().dropped_bad_descr, 10u);
}

TEST_F(Fixture, LiveTableFullDropsAndCounts) {
  p.Finalize(ctx);
  ctx = nullptr;
  setenv("MYCROFT_LIVE_SLOTS", "2", 1);
  void* c2 = nullptr;
  ASSERT_EQ(p.Init(&c2, "small", 0x5556, 4, 0), nabi::Result::Success);
  std::string path;
  for (auto& f : dir.Files())
    if (f.find("0000000000005556") != std::string::npos) path = f;
  View v(path);
  void* a = p.CollLaunch(c2, "AllReduce", 0, 1);
  void* b = p.CollLaunch(c2, "AllReduce", 1, 1);
  void* c = p.CollLaunch(c2, "AllReduce", 2, 1);  // no slot left
  EXPECT_EQ(c, nullptr);
  EXPECT_EQ(v.H().dropped_live_full, 1u);
  p.KernelCh(c2, a, 0);
  void* d = p.CollLaunch(c2, "AllReduce", 3, 1);  // a slot is free again
  EXPECT_NE(d, nullptr);
  p.KernelCh(c2, b, 0);
  p.KernelCh(c2, d, 0);
  auto recs = v.Ring();
  ASSERT_EQ(recs.size(), 3u);
  // Sequence numbers still count the dropped op, so ranks stay in agreement.
  EXPECT_EQ(recs[0].op.seq, 0u);
  EXPECT_EQ(recs[1].op.seq, 1u);
  EXPECT_EQ(recs[2].op.seq, 3u);
  p.Finalize(c2);
}

TEST_F(Fixture, RingOverflowOverwritesOldest) {
  p.Finalize(ctx);
  ctx = nullptr;
  setenv("MYCROFT_RING_RECORDS", "16", 1);
  void* c2 = nullptr;
  ASSERT_EQ(p.Init(&c2, "ring16", 0x5557, 4, 0), nabi::Result::Success);
  std::string path;
  for (auto& f : dir.Files())
    if (f.find("0000000000005557") != std::string::npos) path = f;
  View v(path);
  for (int i = 0; i < 40; ++i) {
    void* c = p.CollLaunch(c2, "AllReduce", uint64_t(i), 1);
    p.KernelCh(c2, c, 0);
  }
  EXPECT_EQ(v.r.ring_head(), 40u);
  std::vector<shm::RingRecord> recs;
  shm::ReadResult rr = v.r.Read(0, 100, &recs);
  EXPECT_EQ(rr.overwritten, 24u);
  EXPECT_EQ(rr.next_cursor, 40u);
  ASSERT_EQ(recs.size(), 16u);
  EXPECT_EQ(recs.front().op.seq, 24u);
  EXPECT_EQ(recs.back().op.seq, 39u);
  // Resuming from the cursor yields nothing new.
  recs.clear();
  rr = v.r.Read(40, 100, &recs);
  EXPECT_EQ(recs.size(), 0u);
  EXPECT_EQ(rr.overwritten, 0u);
  p.Finalize(c2);
}

TEST(Knobs, BadValuesFailInitWithAMessage) {
  TempDir dir;
  struct Case {
    const char* var;
    const char* value;
  } cases[] = {{"MYCROFT_LIVE_SLOTS", "0"},      {"MYCROFT_LIVE_SLOTS", "lots"},  {"MYCROFT_LIVE_SLOTS", "5000"},
               {"MYCROFT_RING_RECORDS", "8"},    {"MYCROFT_RING_RECORDS", "1e9"}, {"MYCROFT_ENABLE", "maybe"},
               {"MYCROFT_RING_DIR", "relative"}, {"MYCROFT_LIVE_SLOTS", ""}};
  for (const Case& c : cases) {
    ClearKnobs();
    setenv(c.var, c.value, 1);
    {
      std::lock_guard<std::mutex> lk(g_log_mu);
      g_log.clear();
    }
    Prof p(5);
    void* ctx = reinterpret_cast<void*>(0x1);
    int mask = 0;
    nabi::Result r = p.T<5>()->init(&ctx, 1, &mask, "x", 1, 2, 0, Logger);
    EXPECT_NE(r, nabi::Result::Success) << c.var << "=" << c.value;
    EXPECT_EQ(ctx, nullptr);
    std::string logs = AllLogs();
    EXPECT_NE(logs.find(c.var), std::string::npos) << logs;
    // A NULL logger must not crash either.
    EXPECT_NE(p.T<5>()->init(&ctx, 1, &mask, "x", 1, 2, 0, nullptr), nabi::Result::Success);
  }
  ClearKnobs();
  setenv("MYCROFT_ENABLE", "0", 1);
  Prof p(5);
  void* ctx = nullptr;
  EXPECT_NE(p.Init(&ctx, "x", 1, 2, 0), nabi::Result::Success);
  ClearKnobs();
  setenv("MYCROFT_RING_DIR", "/proc/definitely/not/writable", 1);
  EXPECT_NE(p.Init(&ctx, "x", 1, 2, 0), nabi::Result::Success);
  unsetenv("MYCROFT_RING_DIR");
  setenv("MYCROFT_RING_DIR", dir.path.c_str(), 1);
  // Bad init arguments.
  EXPECT_NE(p.Init(&ctx, "x", 1, 0, 0), nabi::Result::Success);
  EXPECT_NE(p.Init(&ctx, "x", 1, 2, 5), nabi::Result::Success);
  EXPECT_NE(p.T<5>()->init(nullptr, 1, nullptr, "x", 1, 2, 0, Logger), nabi::Result::Success);
  // Good values with blanks and signs are accepted, like config.py.
  setenv("MYCROFT_LIVE_SLOTS", " +8 ", 1);
  setenv("MYCROFT_ENABLE", "TRUE", 1);
  EXPECT_EQ(p.Init(&ctx, "x", 1, 2, 0), nabi::Result::Success);
  p.Finalize(ctx);
  ClearKnobs();
}

// Events we do not track (ProxyCtrl, NetPlugin, KernelLaunch, v6 CE collectives) get a
// handle that stop/record accept silently; nothing is counted. (v7 KernelPhase is
// tracked under its KernelCh: test_v7.cc.)
TEST(Untracked, EventsAreAcceptedAndIgnored) {
  ClearKnobs();
  TempDir dir;
  Prof p(7);
  void* ctx = nullptr;
  ASSERT_EQ(p.Init(&ctx, "untracked", 0xbbbb, 2, 0), nabi::Result::Success);
  for (uint64_t type : {uint64_t{kProxyCtrl}, uint64_t{kNetPlugin}, uint64_t{kKernelLaunch}, uint64_t{1} << 12,
                        uint64_t{1} << 13, uint64_t{1} << 14}) {
    Prof::E e;
    e.type = type;
    void* h = p.Start(ctx, e);
    EXPECT_NE(h, nullptr) << type;
    for (int state : {13, 14, 15, 16, 17, 18, 21, 25, 26, 27, 28, 29, 30}) p.Record(h, state, 1);
    p.Stop(h);
  }
  View v(dir.Files().at(0));
  auto h = v.H();
  EXPECT_EQ(h.ops_started, 0u);
  EXPECT_EQ(h.dropped_bad_handle, 0u);
  EXPECT_EQ(h.dropped_bad_descr, 0u);
  // The same types are out of range for v4 (bits >= 8) and counted there.
  Prof p4(4);
  void* c4 = nullptr;
  ASSERT_EQ(p4.Init(&c4, "untracked4", 0xbbbc, 2, 0), nabi::Result::Success);
  Prof::E e;
  e.type = 1 << 8;
  EXPECT_EQ(p4.Start(c4, e), nullptr);
  p.Finalize(ctx);
  p4.Finalize(c4);
}
