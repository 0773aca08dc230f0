// Virtual time: with a clock set through mycroftProfilerSetClock (what the simulator's ABI driver does),
// every timestamp the plugin writes is that clock's value at the callback, exactly; without one, the
// plugin is on CLOCK_MONOTONIC / CLOCK_REALTIME as under NCCL.
#include <time.h>

#include "harness.h"
#include "mycroft/virtual_clock.h"

using namespace mt;

namespace {

mycroft::vclock::SetClockFn Setter() {
  return reinterpret_cast<mycroft::vclock::SetClockFn>(dlsym(Lib(), mycroft::vclock::kSetClockSymbol));
}

uint64_t Clock(clockid_t id) {
  timespec ts;
  clock_gettime(id, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

// The clock a driver owns: stored with relaxed atomics, as the plugin reads it.
struct TestClock {
  uint64_t ns = 0;
  void Set(uint64_t v) { __atomic_store_n(&ns, v, __ATOMIC_RELAXED); }
};

}  // namespace

TEST(VirtualClock, EveryTimestampIsTheDriversTime) {
  ClearKnobs();
  auto set_clock = Setter();
  ASSERT_NE(set_clock, nullptr) << "the plugin exports " << mycroft::vclock::kSetClockSymbol;
  TempDir dir;
  TestClock clk;
  const int64_t offset = 1767225600000000000ll - 1000000000000ll;  // realtime 2026-01-01 at virtual 1000 s
  clk.Set(1000000000000ull);
  set_clock(&clk.ns, offset);

  Prof p(7);
  void* ctx = nullptr;
  ASSERT_EQ(p.Init(&ctx, "vt", 0x7777, 2, 0), nabi::Result::Success);
  View v(dir.Files().at(0));
  auto h = v.H();
  EXPECT_EQ(h.start_mono_ns, 1000000000000ull);
  EXPECT_EQ(h.start_realtime_ns, 1767225600000000000ull);
  EXPECT_EQ(h.heartbeat_ns, 1000000000000ull);

  const uint64_t t0 = 1000000000000ull;
  clk.Set(t0 + 100);
  void* coll = p.CollLaunch(ctx, "AllReduce", 0, 1, 1 << 20);  // api, start and launch at +100
  auto live = v.Live();
  ASSERT_EQ(live.size(), 1u);
  EXPECT_EQ(live[0].slot.op.api_ns, t0 + 100);
  EXPECT_EQ(live[0].slot.op.start_ns, t0 + 100);
  EXPECT_EQ(live[0].slot.op.launch_ns, t0 + 100);

  // One send step, each state at its own time.
  Prof::E o;
  o.type = kProxyOp;
  o.parent = coll;
  o.channel = 0;
  o.peer = 1;
  o.is_send = 1;
  o.n_steps = 1;
  o.chunk_size = 4096;
  clk.Set(t0 + 200);
  void* op = p.Start(ctx, o);
  p.Record(op, kProxyOpInProgress, 0, false);
  Prof::E s;
  s.type = kProxyStep;
  s.parent = op;
  s.step = 0;
  clk.Set(t0 + 300);
  void* st = p.Start(ctx, s);  // posted
  clk.Set(t0 + 400);
  p.Record(st, kSendGPUWait, 0);
  clk.Set(t0 + 450);
  p.Record(st, kSendPeerWait, 0);  // GPU ready after 50 ns
  clk.Set(t0 + 500);
  p.Record(st, kSendWait, 4096);
  clk.Set(t0 + 800);
  p.Stop(st);  // on the wire for 300 ns
  p.Stop(op);
  clk.Set(t0 + 900);
  p.KernelCh(ctx, coll, 0, 11, 22);  // completes the collective at +900

  auto recs = v.Ring();
  ASSERT_EQ(recs.size(), 1u);
  const shm::RingRecord& r = recs[0];
  EXPECT_EQ(r.op.api_ns, t0 + 100);
  EXPECT_EQ(r.op.start_ns, t0 + 100);
  EXPECT_EQ(r.op.launch_ns, t0 + 100);
  EXPECT_EQ(r.op.end_ns, t0 + 900);
  EXPECT_EQ(r.op.last_progress_ns, t0 + 900);
  EXPECT_EQ(r.op.kernel_start_ns, 11u) << "GPU timers are the caller's, never the clock's";
  EXPECT_EQ(r.op.kernel_end_ns, 22u);
  ASSERT_EQ(r.op.n_flows, 1);
  const shm::Flow& f = r.flows[0];
  EXPECT_EQ(f.first_ns, t0 + 300);
  EXPECT_EQ(f.end_ns, t0 + 800);
  EXPECT_EQ(f.last_progress_ns, t0 + 800);
  EXPECT_EQ(f.gpu_wait_ns, 50u);
  EXPECT_EQ(f.net_wait_ns, 300u);
  EXPECT_EQ(f.gpu_busy_ns, 50u) << "one step: its union is its sum";
  EXPECT_EQ(f.net_busy_ns, 300u);
  EXPECT_EQ(v.H().heartbeat_ns, t0 + 100) << "the first callback beats; the next ones within the throttle do not";
  clk.Set(t0 + 2000000000ull);  // 2 s later (virtual): past the heartbeat throttle
  void* c2 = p.CollLaunch(ctx, "AllGather", 1, 1);
  EXPECT_EQ(v.H().heartbeat_ns, t0 + 2000000000ull);
  p.KernelCh(ctx, c2, 0);

  clk.Set(t0 + 5000);
  ASSERT_EQ(p.Finalize(ctx), nabi::Result::Success);
  EXPECT_EQ(v.H().finalized_ns, t0 + 5000);

  // Back on the real clocks: a new context reads CLOCK_MONOTONIC / CLOCK_REALTIME again.
  set_clock(nullptr, 0);
  const uint64_t mono0 = Clock(CLOCK_MONOTONIC), real0 = Clock(CLOCK_REALTIME);
  void* ctx2 = nullptr;
  ASSERT_EQ(p.Init(&ctx2, "real", 0x8888, 2, 0), nabi::Result::Success);
  const uint64_t mono1 = Clock(CLOCK_MONOTONIC), real1 = Clock(CLOCK_REALTIME);
  std::string f2;
  for (auto& name : dir.Files())
    if (name.find("8888") != std::string::npos) f2 = name;
  ASSERT_FALSE(f2.empty());
  View v2(f2);
  EXPECT_GE(v2.H().start_mono_ns, mono0);
  EXPECT_LE(v2.H().start_mono_ns, mono1);
  EXPECT_GE(v2.H().start_realtime_ns, real0);
  EXPECT_LE(v2.H().start_realtime_ns, real1);
  EXPECT_EQ(p.Finalize(ctx2), nabi::Result::Success);
}

// Steps in flight together: the sums count each step's wait, the busy times the union of the waits
// (the time at least one step waited), so steps queued on one link read that link's time once.
TEST(VirtualClock, BusyTimesAreTheUnionOfTheStepsWaits) {
  ClearKnobs();
  auto set_clock = Setter();
  ASSERT_NE(set_clock, nullptr);
  TempDir dir;
  TestClock clk;
  const uint64_t t0 = 1000000000000ull;
  clk.Set(t0);
  set_clock(&clk.ns, 0);
  Prof p(7);
  void* ctx = nullptr;
  ASSERT_EQ(p.Init(&ctx, "busy", 0x7778, 2, 0), nabi::Result::Success);
  View v(dir.Files().at(0));
  void* coll = p.CollLaunch(ctx, "AllReduce", 0, 1, 1 << 20);
  Prof::E o;
  o.type = kProxyOp;
  o.parent = coll;
  o.peer = 1;
  o.is_send = 1;
  o.n_steps = 3;
  void* op = p.Start(ctx, o);
  void* st[3];
  for (int s = 0; s < 3; ++s) {
    Prof::E e;
    e.type = kProxyStep;
    e.parent = op;
    e.step = s;
    st[s] = p.Start(ctx, e);
    p.Record(st[s], kSendGPUWait, 0);  // all three wait for the GPU from +0
  }
  // the GPU hands them over at +100, +200, +300; each is on the wire from then on
  const uint64_t ready[3] = {100, 200, 300};
  for (int s = 0; s < 3; ++s) {
    clk.Set(t0 + ready[s]);
    p.Record(st[s], kSendWait, 4096);
  }
  // the link drains them one after another: done at +1100, +2100, +3100
  for (int s = 0; s < 3; ++s) {
    clk.Set(t0 + 1100 + 1000 * s);
    p.Stop(st[s]);
  }
  // a fourth step after a gap: its waits open a new interval
  Prof::E e;
  e.type = kProxyStep;
  e.parent = op;
  e.step = 3;
  clk.Set(t0 + 5000);
  void* s4 = p.Start(ctx, e);
  p.Record(s4, kSendGPUWait, 0);
  clk.Set(t0 + 5010);
  p.Record(s4, kSendPeerWait, 0);  // ready, but the receiver has no buffer free yet (credit)
  clk.Set(t0 + 5100);
  p.Record(s4, kSendPeerWait, 0);  // NCCL records it again on every refused isend: one interval
  clk.Set(t0 + 5210);
  p.Record(s4, kSendWait, 4096);
  clk.Set(t0 + 5710);
  p.Stop(s4);
  p.Stop(op);
  clk.Set(t0 + 6000);
  p.KernelCh(ctx, coll, 0, 1, 2);
  auto recs = v.Ring();
  ASSERT_EQ(recs.size(), 1u);
  const shm::Flow& f = recs[0].flows[0];
  EXPECT_EQ(f.gpu_wait_ns, 100u + 200u + 300u + 10u);
  EXPECT_EQ(f.gpu_busy_ns, 300u + 10u);
  EXPECT_EQ(f.net_wait_ns, 1000u + 1900u + 2800u + 500u);
  EXPECT_EQ(f.net_busy_ns, (3100u - 100u) + 500u);
  EXPECT_EQ(f.peer_busy_ns, 200u);  // the credit wait on its own, apart from the GPU and network waits
  EXPECT_EQ(p.Finalize(ctx), nabi::Result::Success);
  set_clock(nullptr, 0);  // the clock dies with this test
}
