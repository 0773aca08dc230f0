// Event sequences NCCL produces (ring and tree all-reduce, p2p) through every ABI
// version, and what the shared memory then holds.
#include <sys/stat.h>

#include "harness.h"

using namespace mt;

namespace {

std::string FileFor(const TempDir& d, const std::string& rank_tag) {
  for (auto& f : d.Files())
    if (f.find(rank_tag) != std::string::npos) return f;
  return {};
}

class Versions : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { ClearKnobs(); }
};

}  // namespace

TEST(Exports, FourTablesWithAllCallbacks) {
  ASSERT_NE(Lib(), nullptr) << dlerror();
  for (const char* sym : nabi::kProfilerSymbols) {
    auto* t = Table<nabi::v7::Profiler>(sym);
    ASSERT_NE(t, nullptr) << sym;
    EXPECT_STREQ(t->name, "mycroft-otel");
    EXPECT_NE(t->init, nullptr);
    EXPECT_NE(t->startEvent, nullptr);
    EXPECT_NE(t->stopEvent, nullptr);
    EXPECT_NE(t->recordEventState, nullptr);
    EXPECT_NE(t->finalize, nullptr);
  }
  EXPECT_EQ(dlsym(Lib(), "_ZN7mycroft6plugin8CoreInitEiPPvPiPKcmmiiiNS_8nccl_abi12DebugLoggerE"), nullptr)
      << "internals must stay hidden";
}

TEST(Init, HeaderFileAndPermissions) {
  ClearKnobs();
  TempDir dir;
  setenv("MYCROFT_JOB_ID", "job-42", 1);
  setenv("NCCL_HOSTID", "simhost-3", 1);
  setenv("RANK", "17", 1);
  setenv("LOCAL_RANK", "1", 1);
  setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7", 1);
  Prof p(5);
  void* ctx = nullptr;
  ASSERT_EQ(p.Init(&ctx, "dp-group", 0xabcdef0123456789ull, 8, 3, 2), nabi::Result::Success);
  unsetenv("NCCL_HOSTID");
  unsetenv("RANK");
  unsetenv("LOCAL_RANK");
  unsetenv("CUDA_VISIBLE_DEVICES");
  ASSERT_NE(ctx, nullptr);
  EXPECT_EQ(p.mask, int(kColl | kP2p | kProxyOp | kProxyStep | kKernelCh | kGroupApi | kCollApi | kP2pApi));
  auto files = dir.Files();
  ASSERT_EQ(files.size(), 1u);
  std::string expect_name = "simhost-3-" + std::to_string(getpid()) + "-abcdef0123456789-r3.mycroft";
  EXPECT_NE(files[0].find(expect_name), std::string::npos) << files[0];
  struct stat st;
  ASSERT_EQ(stat(files[0].c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(stat(dir.path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);

  View v(files[0]);
  auto h = v.H();
  EXPECT_EQ(h.magic, shm::kMagic);
  EXPECT_STREQ(h.job_id, "job-42");
  EXPECT_STREQ(h.comm_name, "dp-group");
  EXPECT_STREQ(h.host, "simhost-3");
  EXPECT_EQ(h.comm_hash, 0xabcdef0123456789ull);
  EXPECT_EQ(h.comm_id, 0xabcdef0123456789ull);
  EXPECT_EQ(h.rank, 3);
  EXPECT_EQ(h.nranks, 8);
  EXPECT_EQ(h.nnodes, 2);
  EXPECT_EQ(h.global_rank, 17);
  EXPECT_EQ(h.local_rank, 1);
  EXPECT_EQ(h.cuda_device, 5);
  EXPECT_EQ(h.pid, getpid());
  EXPECT_EQ(h.abi_version, 5u);
  EXPECT_EQ(h.live_slots, shm::kDefaultLiveSlots);
  EXPECT_EQ(h.ring_capacity, shm::kDefaultRingCapacity);
  EXPECT_EQ(h.file_size, shm::FileSize(h.live_slots, h.ring_capacity));
  EXPECT_GT(h.start_realtime_ns, 0u);
  EXPECT_GT(h.start_mono_ns, 0u);
  EXPECT_EQ(h.finalized_ns, 0u);
  EXPECT_EQ(p.Finalize(ctx), nabi::Result::Success);
  EXPECT_GT(v.H().finalized_ns, 0u);
}

TEST(Init, JobIdFromLauncherAndNullCommName) {
  ClearKnobs();
  TempDir dir;
  setenv("SLURM_JOB_ID", "slurm-7", 1);
  Prof p(7);
  void* ctx = nullptr;
  ASSERT_EQ(p.Init(&ctx, nullptr, 1, 2, 0), nabi::Result::Success);
  unsetenv("SLURM_JOB_ID");
  View v(dir.Files().at(0));
  EXPECT_STREQ(v.H().job_id, "slurm-7");
  EXPECT_STREQ(v.H().comm_name, "");
  EXPECT_EQ(v.H().abi_version, 7u);
  p.Finalize(ctx);
}

// Ring all-reduce on 2 channels, 4 ranks: per channel one send ProxyOp to the next rank
// and one recv ProxyOp from the previous rank, NCCL's 2.28 order (design §3).
TEST_P(Versions, RingAllReduce) {
  TempDir dir;
  Prof p(GetParam());
  void* ctx = nullptr;
  ASSERT_EQ(p.Init(&ctx, "ring", 0x1111, 4, 1), nabi::Result::Success);
  View v(dir.Files().at(0));

  void* coll = p.CollLaunch(ctx, "AllReduce", 0, 2, 1 << 20);
  // Launched, not complete: the op is live.
  auto live = v.Live();
  ASSERT_EQ(live.size(), 1u);
  const shm::OpInfo& op = live[0].slot.op;
  EXPECT_EQ(op.kind, uint8_t(shm::OpKind::kColl));
  EXPECT_EQ(op.func, uint8_t(shm::Func::kAllReduce));
  EXPECT_EQ(op.datatype, 7);  // ncclFloat32
  EXPECT_EQ(op.algo, 1);      // Ring
  EXPECT_EQ(op.proto, 2);     // Simple
  EXPECT_EQ(op.count, 1u << 20);
  EXPECT_EQ(op.bytes, 4u << 20);
  EXPECT_EQ(op.n_channels, 2);
  EXPECT_EQ(op.root_or_peer, -1);
  EXPECT_EQ(op.abi_version, GetParam());
  EXPECT_GT(op.start_ns, 0u);
  EXPECT_GE(op.launch_ns, op.start_ns);
  EXPECT_EQ(op.end_ns, 0u);
  if (GetParam() >= 5) {
    EXPECT_GT(op.api_ns, 0u);
    EXPECT_LE(op.api_ns, op.start_ns);
  } else {
    EXPECT_EQ(op.api_ns, 0u);
  }

  for (uint8_t ch = 0; ch < 2; ++ch) {
    p.ProxyOp(ctx, coll, ch, 2, true, 6);
    p.ProxyOp(ctx, coll, ch, 0, false, 6);
  }
  ASSERT_EQ(v.Live().size(), 1u) << "kernels still running";
  p.KernelCh(ctx, coll, 0, 5000, 9000);
  ASSERT_EQ(v.Live().size(), 1u);
  p.KernelCh(ctx, coll, 1, 4000, 9500);
  EXPECT_EQ(v.Live().size(), 0u) << "last child stopped: completed";

  auto recs = v.Ring();
  ASSERT_EQ(recs.size(), 1u);
  const shm::RingRecord& r = recs[0];
  EXPECT_EQ(r.seq, 1u);
  EXPECT_EQ(r.op.seq, 0u);
  EXPECT_GT(r.op.end_ns, 0u);
  EXPECT_GE(r.op.end_ns, r.op.launch_ns);
  EXPECT_EQ(r.op.proxy_ops_started, 4u);
  EXPECT_EQ(r.op.proxy_ops_stopped, 4u);
  EXPECT_EQ(r.op.kernel_ch_started, 2u);
  EXPECT_EQ(r.op.kernel_ch_stopped, 2u);
  EXPECT_EQ(r.op.kernel_start_ns, 4000u);
  EXPECT_EQ(r.op.kernel_end_ns, 9500u);
  EXPECT_TRUE(r.op.flags & shm::kFlagKernelTimes);
  ASSERT_EQ(r.op.n_flows, 4);
  for (int i = 0; i < 4; ++i) {
    const shm::Flow& f = r.flows[i];
    EXPECT_EQ(f.version % 2, 0u);
    EXPECT_EQ(f.n_steps, 6u);
    EXPECT_EQ(f.posted, 6u);
    EXPECT_EQ(f.ready, 6u);
    EXPECT_EQ(f.transmitted, 6u);
    EXPECT_EQ(f.done, 6u);
    EXPECT_EQ(f.bytes, 6u * 4096);
    EXPECT_EQ(f.chunk_size, 4096u);
    EXPECT_EQ(f.n_proxy_ops, 1);
    EXPECT_EQ(f.wait_state, uint8_t(shm::WaitState::kNone));
    EXPECT_GT(f.end_ns, 0u);
    EXPECT_GE(f.end_ns, f.first_ns);
    EXPECT_EQ(f.peer, f.dir == uint8_t(shm::Dir::kSend) ? 2 : 0);
  }
  EXPECT_EQ(r.flows[4].n_steps, 0u) << "unused flows are zero";
  auto h = v.H();
  EXPECT_EQ(h.ops_started, 1u);
  EXPECT_EQ(h.ops_completed, 1u);
  EXPECT_EQ(h.dropped_bad_handle, 0u);
  EXPECT_EQ(h.dropped_bad_descr, 0u);

  // A second collective gets seq 1 whatever NCCL's own counter says.
  void* c2 = p.CollLaunch(ctx, "AllGather", 77, 1);
  p.KernelCh(ctx, c2, 0);
  recs = v.Ring();
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[1].op.seq, 1u);
  EXPECT_EQ(recs[1].op.nccl_seq, 77u);
  EXPECT_EQ(recs[1].op.func, uint8_t(shm::Func::kAllGather));
  EXPECT_EQ(recs[1].op.n_flows, 0) << "intra-node: no ProxyOps, completes with its kernel";
  EXPECT_EQ(p.Finalize(ctx), nabi::Result::Success);
}

// Tree all-reduce: on each channel this rank receives from two children and sends to its
// parent (reduce), then receives from the parent and sends to both children (broadcast).
TEST_P(Versions, TreeAllReduce) {
  TempDir dir;
  Prof p(GetParam());
  void* ctx = nullptr;
  ASSERT_EQ(p.Init(&ctx, "tree", 0x2222, 8, 1), nabi::Result::Success);
  View v(dir.Files().at(0));
  void* coll = p.CollLaunch(ctx, "AllReduce", 0, 2, 1 << 16, "TREE");
  for (uint8_t ch = 0; ch < 2; ++ch) {
    p.ProxyOp(ctx, coll, ch, 3, false, 4);  // up: recv child 3
    p.ProxyOp(ctx, coll, ch, 4, false, 4);  // up: recv child 4
    p.ProxyOp(ctx, coll, ch, 0, true, 4);   // up: send parent 0
    p.ProxyOp(ctx, coll, ch, 0, false, 4);  // down: recv parent 0
    p.ProxyOp(ctx, coll, ch, 3, true, 4);   // down: send child 3
    p.ProxyOp(ctx, coll, ch, 4, true, 4);   // down: send child 4
    p.KernelCh(ctx, coll, ch);
  }
  auto recs = v.Ring();
  ASSERT_EQ(recs.size(), 1u);
  const auto& r = recs[0];
  EXPECT_EQ(r.op.algo, 0);  // Tree
  EXPECT_EQ(r.op.proxy_ops_started, 12u);
  ASSERT_EQ(r.op.n_flows, 12) << "flows are keyed by (channel, direction, peer)";
  for (int i = 0; i < 12; ++i) EXPECT_EQ(r.flows[i].done, 4u);
  p.Finalize(ctx);
}

// Point-to-point: both sides number the n-th transfer between a pair identically.
TEST_P(Versions, SendRecvTransferNumbers) {
  TempDir dir;
  Prof p(GetParam());
  void *c0 = nullptr, *c1 = nullptr;
  ASSERT_EQ(p.Init(&c0, "pp", 0x3333, 2, 0), nabi::Result::Success);
  ASSERT_EQ(p.Init(&c1, "pp", 0x3333, 2, 1), nabi::Result::Success);
  View v0(FileFor(dir, "-r0.mycroft"));
  View v1(FileFor(dir, "-r1.mycroft"));
  for (int n = 0; n < 3; ++n) {
    for (int side = 0; side < 2; ++side) {
      void* ctx = side == 0 ? c0 : c1;
      Prof::E g;
      g.type = kGroup;
      void* group = p.Start(ctx, g);
      void* api = nullptr;
      Prof::E e;
      e.type = kP2p;
      e.func = side == 0 ? "Send" : "Recv";
      e.peer = side == 0 ? 1 : 0;
      e.count = 256;
      e.datatype = "ncclBfloat16";
      e.n_channels = 1;
      if (GetParam() >= 5) {
        Prof::E a;
        a.type = kP2pApi;
        api = p.Start(ctx, a);
        p.Stop(api);
      }
      e.parent = GetParam() >= 5 ? api : group;
      e.parent_group = group;
      void* h = p.Start(ctx, e);
      p.Stop(h);
      p.Stop(group);
      p.ProxyOp(ctx, h, 0, e.peer, side == 0, 2, 256);
      p.KernelCh(ctx, h, 0);
    }
  }
  auto r0 = v0.Ring();
  auto r1 = v1.Ring();
  ASSERT_EQ(r0.size(), 3u);
  ASSERT_EQ(r1.size(), 3u);
  for (int n = 0; n < 3; ++n) {
    EXPECT_EQ(r0[n].op.kind, uint8_t(shm::OpKind::kP2pSend));
    EXPECT_EQ(r1[n].op.kind, uint8_t(shm::OpKind::kP2pRecv));
    EXPECT_EQ(r0[n].op.seq, uint64_t(n));
    EXPECT_EQ(r1[n].op.seq, uint64_t(n));
    EXPECT_EQ(r0[n].op.root_or_peer, 1);
    EXPECT_EQ(r1[n].op.root_or_peer, 0);
    EXPECT_EQ(r0[n].op.bytes, 512u);
    EXPECT_EQ(r0[n].flows[0].done, 2u);
  }
  EXPECT_EQ(v0.H().p2p_send_count_total, 3u);
  EXPECT_EQ(v1.H().p2p_recv_count_total, 3u);
  p.Finalize(c0);
  p.Finalize(c1);
}

// Chunk counters while in flight (Mycroft's GPU-ready / transmitted / done) and the
// oldest unfinished step's wait state.
TEST_P(Versions, InFlightChunkCounters) {
  TempDir dir;
  Prof p(GetParam());
  void* ctx = nullptr;
  ASSERT_EQ(p.Init(&ctx, "ring", 0x4444, 2, 0), nabi::Result::Success);
  View v(dir.Files().at(0));
  void* coll = p.CollLaunch(ctx, "AllReduce", 0, 1);
  Prof::E o;
  o.type = kProxyOp;
  o.parent = coll;
  o.peer = 1;
  o.is_send = 1;
  o.n_steps = 8;
  void* op = p.Start(ctx, o);
  void* steps[4];
  for (int s = 0; s < 4; ++s) {
    Prof::E st;
    st.type = kProxyStep;
    st.parent = op;
    st.step = s;
    steps[s] = p.Start(ctx, st);
    p.Record(steps[s], kSendGPUWait, 0);
  }
  p.Record(steps[0], kSendWait, 100);  // 0: transmitted (skipping PeerWait counts ready too)
  p.Stop(steps[0]);                    // 0: done
  p.Record(steps[1], kSendPeerWait, 0);  // 1: ready, waiting for credit
  auto live = v.Live();
  ASSERT_EQ(live.size(), 1u);
  ASSERT_FALSE(live[0].torn);
  const shm::Flow& f = live[0].slot.flows[0];
  EXPECT_EQ(f.posted, 4u);
  EXPECT_EQ(f.ready, 2u);
  EXPECT_EQ(f.transmitted, 1u);
  EXPECT_EQ(f.done, 1u);
  EXPECT_EQ(f.bytes, 100u);
  EXPECT_EQ(f.wait_step, 1u);
  EXPECT_EQ(f.wait_state, uint8_t(shm::WaitState::kSendPeerWait));
  EXPECT_GT(f.wait_since_ns, 0u);
  EXPECT_EQ(f.end_ns, 0u);
  EXPECT_EQ(live[0].slot.op.proxy_ops_started, 1u);
  p.Finalize(ctx);
  // Finalize publishes what was in flight, flagged aborted.
  auto recs = v.Ring();
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_TRUE(recs[0].op.flags & shm::kFlagAborted);
  EXPECT_EQ(recs[0].op.end_ns, 0u);
  EXPECT_EQ(recs[0].flows[0].posted, 4u);
}

INSTANTIATE_TEST_SUITE_P(Abi, Versions, ::testing::Values(4, 5, 6, 7),
                         [](const ::testing::TestParamInfo<int>& i) { return "v" + std::to_string(i.param); });

// NCCL restarts a recv step while irecv is refused and re-records SendPeerWait on every
// isend retry; transSize is stale outside SendWait/RecvFlushWait.
TEST(StepQuirks, RestartsRepeatsAndStaleSizes) {
  ClearKnobs();
  TempDir dir;
  Prof p(6);
  void* ctx = nullptr;
  ASSERT_EQ(p.Init(&ctx, "quirks", 0x9999, 2, 0), nabi::Result::Success);
  View v(dir.Files().at(0));
  void* coll = p.CollLaunch(ctx, "AllReduce", 0, 1);
  Prof::E o;
  o.type = kProxyOp;
  o.parent = coll;
  o.peer = 1;
  o.n_steps = 1;
  void* recv = p.Start(ctx, o);
  o.is_send = 1;
  void* send = p.Start(ctx, o);
  Prof::E st;
  st.type = kProxyStep;
  st.parent = recv;
  void* r1 = p.Start(ctx, st);
  void* r2 = p.Start(ctx, st);  // irecv refused: started again, r1 never stopped
  void* r3 = p.Start(ctx, st);
  (void)r1;
  (void)r2;
  p.Record(r3, kRecvWait, 999999);  // stale size
  p.Record(r3, kRecvFlushWait, 4096);
  p.Record(r3, kRecvGPUWait, 777777);  // stale size
  st.parent = send;
  void* s1 = p.Start(ctx, st);
  p.Record(s1, kSendGPUWait, 555555);
  p.Record(s1, kSendPeerWait, 0);
  auto first = v.Live().at(0).slot.flows[1];
  for (int i = 0; i < 5; ++i) p.Record(s1, kSendPeerWait, 0);  // retries
  auto live = v.Live();
  ASSERT_EQ(live.size(), 1u);
  const shm::Flow& fr = live[0].slot.flows[0];
  const shm::Flow& fs = live[0].slot.flows[1];
  EXPECT_EQ(fr.posted, 1u) << "restarts of an unprogressed step are not new steps";
  EXPECT_EQ(fr.ready, 1u);
  EXPECT_EQ(fr.transmitted, 1u);
  EXPECT_EQ(fr.bytes, 4096u) << "only RecvFlushWait carries the received size";
  EXPECT_EQ(fs.ready, 1u);
  EXPECT_EQ(fs.transmitted, 0u);
  EXPECT_EQ(fs.bytes, 0u);
  EXPECT_EQ(fs.wait_state, uint8_t(shm::WaitState::kSendPeerWait));
  EXPECT_EQ(fs.wait_since_ns, first.wait_since_ns) << "a repeated state keeps its start time";
  p.Record(s1, kSendWait, 2048);
  p.Stop(s1);
  p.Stop(r3);
  p.Stop(send);
  p.Stop(recv);
  p.KernelCh(ctx, coll, 0);
  auto recs = v.Ring();
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(recs[0].flows[1].bytes, 2048u);
  EXPECT_EQ(recs[0].flows[0].done, 1u);
  p.Finalize(ctx);
}

// Fewer KernelCh events than nChannels announced: the op still completes once a kernel of
// a later launch starts (kernels of one communicator run in order); ops of the same launch
// (one Group) never release each other.
TEST(Completion, LaterLaunchReleasesMissingKernelChannels) {
  ClearKnobs();
  TempDir dir;
  Prof p(5);
  void* ctx = nullptr;
  ASSERT_EQ(p.Init(&ctx, "kch", 0xaaaa, 2, 0), nabi::Result::Success);
  View v(dir.Files().at(0));
  // One launch (Group) with two collectives announcing 4 channels each.
  Prof::E g;
  g.type = kGroup;
  void* group = p.Start(ctx, g);
  Prof::E c;
  c.type = kColl;
  c.n_channels = 4;
  c.parent_group = group;
  void* a = p.Start(ctx, c);
  void* b = p.Start(ctx, c);
  p.Stop(a);
  p.Stop(b);
  p.Stop(group);
  p.KernelCh(ctx, a, 0);
  p.KernelCh(ctx, a, 1);
  p.KernelCh(ctx, b, 0);  // b's first KernelCh start must not release a (same launch)
  EXPECT_EQ(v.Live().size(), 2u);
  // Next launch: its first KernelCh start releases a and b.
  void* d = p.CollLaunch(ctx, "AllReduce", 1, 1);
  EXPECT_EQ(v.Live().size(), 3u);
  Prof::E k;
  k.type = kKernelCh;
  k.parent = d;
  void* kh = p.Start(ctx, k);
  EXPECT_EQ(v.Live().size(), 1u);
  p.Record(kh, kKernelChStop, 5);
  p.Stop(kh);
  auto recs = v.Ring();
  ASSERT_EQ(recs.size(), 3u);
  EXPECT_EQ(recs[0].op.kernel_ch_stopped + recs[1].op.kernel_ch_stopped, 3u);
  EXPECT_EQ(recs[2].op.kernel_ch_stopped, 1u);
  // More KernelCh stops than announced are ignored, not double-released.
  void* e = p.CollLaunch(ctx, "AllReduce", 2, 1);
  p.KernelCh(ctx, e, 0);
  EXPECT_EQ(v.Live().size(), 0u);
  EXPECT_EQ(v.H().ops_completed, 4u);
  p.Finalize(ctx);
}
