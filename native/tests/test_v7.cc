// v7's signals (userTag, KernelPhase), the activation mask per version, KernelCh stops
// that arrive after the op's other work finished, and bad handles by callback kind.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "harness.h"

namespace mt {
namespace {

uint32_t Bad(const shm::ShmHeader& h, shm::BadHandleKind k) { return uint32_t(h.bad_handle_by_kind[uint32_t(k)]); }

// One KernelCh with its three phases, GPU times from `t0` (v7 order: phases inside the channel).
void KernelChWithPhases(Prof& p, void* ctx, void* coll, uint8_t ch, uint64_t t0) {
  Prof::E k;
  k.type = kKernelCh;
  k.parent = coll;
  k.channel = ch;
  k.ptimer = t0;
  void* kh = p.Start(ctx, k);
  const uint64_t len[3] = {700, 200, 100};  // initial sync, compute, final sync
  uint64_t t = t0;
  for (uint8_t ph = 0; ph < 3; ++ph) {
    Prof::E e;
    e.type = kKernelPhase;
    e.parent = kh;
    e.channel = ch;
    e.phase = ph;
    e.ptimer = t;
    void* h = p.Start(ctx, e);
    EXPECT_NE(h, nullptr);
    t += len[ph];
    p.Record(h, kKernelPhaseStop, t);
    p.Stop(h);
  }
  p.Record(kh, kKernelChStop, t);
  p.Stop(kh);
}

TEST(V7, UserTagAndKernelPhasesAreRecordedPerChannel) {
  ClearKnobs();
  setenv("MYCROFT_KERNEL_EVENTS", "phase", 1);
  TempDir dir;
  Prof p(7);
  void* ctx = nullptr;
  ASSERT_EQ(p.Init(&ctx, "v7", 0x7777, 2, 0), nabi::Result::Success);
  View v(dir.Files().at(0));
  EXPECT_EQ(v.H().activation_mask & int(kKernelPhase), int(kKernelPhase));
  EXPECT_EQ(v.H().activation_mask & int(kKernelCh), int(kKernelCh));
  Prof::E g;
  g.type = kGroup;
  void* group = p.Start(ctx, g);
  Prof::E c;
  c.type = kColl;
  c.n_channels = 2;
  c.parent_group = group;
  c.user_tag = 0x5354455000000042ull;  // a framework's step number in the tag
  void* coll = p.Start(ctx, c);
  p.Stop(coll);
  p.Stop(group);
  KernelChWithPhases(p, ctx, coll, 0, 10000);
  KernelChWithPhases(p, ctx, coll, 1, 20000);
  auto recs = v.Ring();
  ASSERT_EQ(recs.size(), 1u);
  const auto& r = recs[0];
  EXPECT_EQ(r.op.user_tag, 0x5354455000000042ull);
  EXPECT_EQ(r.op.kch_valid, 3u);
  EXPECT_TRUE(r.op.flags & shm::kFlagKernelPhases);
  for (int ch = 0; ch < 2; ++ch) {
    const shm::KernelChannel& k = r.kch[ch];
    uint64_t t0 = ch == 0 ? 10000 : 20000;
    EXPECT_EQ(k.start_ns, t0);
    EXPECT_EQ(k.end_ns, t0 + 1000);
    EXPECT_EQ(k.phase_start_ns[0], t0);
    EXPECT_EQ(k.phase_end_ns[0] - k.phase_start_ns[0], 700u);  // initial sync
    EXPECT_EQ(k.phase_end_ns[1] - k.phase_start_ns[1], 200u);
    EXPECT_EQ(k.phase_end_ns[2] - k.phase_start_ns[2], 100u);
  }
  EXPECT_EQ(v.H().dropped_bad_handle, 0u);
  EXPECT_EQ(v.H().dropped_bad_descr, 0u);
  // A phase after its op completed is a late KernelPhase, counted under its own kind.
  Prof::E late;
  late.type = kKernelPhase;
  late.parent = nullptr;
  void* lh = p.Start(ctx, late);
  EXPECT_EQ(lh, nullptr);
  EXPECT_EQ(Bad(v.H(), shm::BadHandleKind::kKernelPhase), 1u);
  p.Finalize(ctx);
  ClearKnobs();
}

// The same calls in v4..v6 carry no tag and no phases: nothing recorded, nothing counted.
TEST(V7, OlderVersionsRecordNoTagNoPhases) {
  for (int ver : {4, 5, 6}) {
    ClearKnobs();
    setenv("MYCROFT_KERNEL_EVENTS", "phase", 1);  // "phase" means KernelCh alone before v7
    TempDir dir;
    Prof p(ver);
    void* ctx = nullptr;
    ASSERT_EQ(p.Init(&ctx, "old", 0x4444, 2, 0), nabi::Result::Success);
    View v(dir.Files().at(0));
    EXPECT_EQ(v.H().activation_mask & (1 << 15), 0) << ver;
    void* coll = p.CollLaunch(ctx, "AllReduce", 0, 1);
    p.KernelCh(ctx, coll, 0, 100, 900);
    auto recs = v.Ring();
    ASSERT_EQ(recs.size(), 1u) << ver;
    EXPECT_EQ(recs[0].op.user_tag, 0u);
    EXPECT_FALSE(recs[0].op.flags & shm::kFlagKernelPhases);
    EXPECT_EQ(recs[0].op.kch_valid, 1u);
    EXPECT_EQ(recs[0].kch[0].start_ns, 100u);
    EXPECT_EQ(recs[0].kch[0].end_ns, 900u);
    EXPECT_EQ(recs[0].kch[0].phase_start_ns[0], 0u);
    EXPECT_EQ(v.H().dropped_bad_handle, 0u);
    p.Finalize(ctx);
  }
  ClearKnobs();
}

TEST(Mask, DefaultPerVersionAndTheKnob) {
  struct Case {
    const char* knob;  // nullptr: unset
    int ver;
    bool kernel_ch, kernel_phase;
  };
  // No ncclGetVersion in this process (NCCL version unknown): "auto" asks for KernelCh only.
  const Case cases[] = {
      {nullptr, 4, true, false}, {nullptr, 5, true, false}, {nullptr, 6, true, false},
      {nullptr, 7, true, false}, {"auto", 7, true, false},  {"channel", 7, true, false},
      {" phase ", 7, true, true}, {"phase", 6, true, false},
  };
  for (const Case& k : cases) {
    ClearKnobs();
    if (k.knob) setenv("MYCROFT_KERNEL_EVENTS", k.knob, 1);
    else unsetenv("MYCROFT_KERNEL_EVENTS");
    TempDir dir;
    Prof p(k.ver);
    void* ctx = nullptr;
    ASSERT_EQ(p.Init(&ctx, "mask", 0x1111, 2, 0), nabi::Result::Success);
    std::string what = std::string(k.knob ? k.knob : "(unset)") + " v" + std::to_string(k.ver);
    EXPECT_EQ((p.mask & int(kKernelCh)) != 0, k.kernel_ch) << what;
    EXPECT_EQ((p.mask & int(kKernelPhase)) != 0, k.kernel_phase) << what;
    EXPECT_EQ(p.mask & int(kProxyStep), int(kProxyStep)) << what;
    View v(dir.Files().at(0));
    EXPECT_EQ(v.H().activation_mask, p.mask);
    EXPECT_EQ(v.H().nccl_version, 0u);
    p.Finalize(ctx);
  }
  // A bad value disables the plugin for the communicator, naming the variable.
  ClearKnobs();
  setenv("MYCROFT_KERNEL_EVENTS", "sometimes", 1);
  TempDir dir;
  Prof p(7);
  void* ctx = reinterpret_cast<void*>(1);
  EXPECT_NE(p.Init(&ctx, "mask", 0x1111, 2, 0), nabi::Result::Success);
  EXPECT_EQ(ctx, nullptr);
  EXPECT_TRUE(dir.Files().empty());
  ClearKnobs();
}

// NCCL 2.27-2.30 report KernelCh from the proxy thread's polling: channel 1's stop of op A
// can come after the next launch's first channel started and after A's last ProxyOp
// stopped (the order gpu_check saw on an H200 with 2.28.9). The op waits for it.
TEST(LateKernelStop, AStopAfterTheNextLaunchStartedIsKept) {
  for (int ver : {4, 5, 6, 7}) {
    ClearKnobs();
    TempDir dir;
    Prof p(ver);
    void* ctx = nullptr;
    ASSERT_EQ(p.Init(&ctx, "late", 0x2222, 2, 0), nabi::Result::Success);
    View v(dir.Files().at(0));
    void* a = p.CollLaunch(ctx, "AllReduce", 0, 2);
    p.ProxyOp(ctx, a, 0, 1, true, 2);
    p.ProxyOp(ctx, a, 1, 1, true, 2);
    p.KernelCh(ctx, a, 0, 100, 200);
    Prof::E k;
    k.type = kKernelCh;
    k.parent = a;
    k.channel = 1;
    k.ptimer = 110;
    void* a1 = p.Start(ctx, k);
    void* b = p.CollLaunch(ctx, "AllReduce", 1, 2);
    Prof::E kb;
    kb.type = kKernelCh;
    kb.parent = b;
    kb.channel = 0;
    kb.ptimer = 300;
    void* b0 = p.Start(ctx, kb);  // supersedes a; a's channel 1 is still open
    EXPECT_EQ(v.Live().size(), 2u) << ver;
    p.Record(a1, kKernelChStop, 250);
    p.Stop(a1);
    auto recs = v.Ring();
    ASSERT_EQ(recs.size(), 1u) << ver;
    EXPECT_EQ(recs[0].op.kernel_ch_started, 2u);
    EXPECT_EQ(recs[0].op.kernel_ch_stopped, 2u);
    EXPECT_EQ(recs[0].op.kernel_end_ns, 250u);  // channel 1's end is kept
    EXPECT_EQ(recs[0].kch[1].end_ns, 250u);
    EXPECT_EQ(v.H().late_kernel_stops, 1u);
    p.Record(b0, kKernelChStop, 400);
    p.Stop(b0);
    p.KernelCh(ctx, b, 1, 310, 410);
    EXPECT_EQ(v.H().ops_completed, 2u);
    EXPECT_EQ(v.H().dropped_bad_handle, 0u) << ver;
    p.Finalize(ctx);
  }
  ClearKnobs();
}

// A channel that started and never stops keeps its op open only for kLateKernelStopNs
// after a later launch began; the next launch after that deadline completes it, and the
// stop, if it still comes, is a late KernelCh stop counted under its kinds.
TEST(LateKernelStop, TheWaitIsBoundedAndTheLeftoverIsCountedByKind) {
  ClearKnobs();
  TempDir dir;
  Prof p(5);
  void* ctx = nullptr;
  ASSERT_EQ(p.Init(&ctx, "bound", 0x3333, 2, 0), nabi::Result::Success);
  View v(dir.Files().at(0));
  void* a = p.CollLaunch(ctx, "AllReduce", 0, 1);
  Prof::E k;
  k.type = kKernelCh;
  k.parent = a;
  void* a0 = p.Start(ctx, k);
  void* b = p.CollLaunch(ctx, "AllReduce", 1, 1);
  p.KernelCh(ctx, b, 0);  // supersedes a (a stays open for its channel 0)
  EXPECT_EQ(v.Live().size(), 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(250));  // > kLateKernelStopNs (200 ms)
  void* c = p.CollLaunch(ctx, "AllReduce", 2, 1);
  p.KernelCh(ctx, c, 0);
  EXPECT_EQ(v.Live().size(), 0u);
  EXPECT_EQ(v.H().ops_completed, 3u);
  p.Record(a0, kKernelChStop, 5);
  p.Stop(a0);
  auto h = v.H();
  EXPECT_EQ(h.dropped_bad_handle, 2u);
  EXPECT_EQ(Bad(h, shm::BadHandleKind::kKernelChState), 1u);
  EXPECT_EQ(Bad(h, shm::BadHandleKind::kKernelChStop), 1u);
  uint64_t sum = 0;
  for (uint32_t i = 0; i < shm::kBadHandleKinds; ++i) sum += h.bad_handle_by_kind[i];
  EXPECT_EQ(sum, h.dropped_bad_handle);
  p.Finalize(ctx);
  // After finalize: a start is counted as such.
  Prof::E e;
  e.type = kColl;
  p.Start(ctx, e);
  EXPECT_EQ(Bad(v.H(), shm::BadHandleKind::kStartAfterFinalize), 1u);
  ClearKnobs();
}

}  // namespace
}  // namespace mt
