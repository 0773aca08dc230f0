// shm_reader.h: validation errors, and recovering the full in-flight state of a writer
// that froze (SIGSTOP) or died (SIGKILL) in another process.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>

#include "harness.h"

using namespace mt;

namespace {

void WriteFile(const std::string& path, const void* data, size_t n) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, data, n), ssize_t(n));
  close(fd);
}

}  // namespace

TEST(Reader, RejectsBadFilesWithAReason) {
  TempDir dir;
  mkdir(dir.path.c_str(), 0700);
  shm::Reader r;
  std::string err;
  EXPECT_FALSE(r.Open(dir.path + "/missing", &err));
  EXPECT_NE(err.find("cannot open"), std::string::npos) << err;

  std::vector<char> small(100, 0);
  WriteFile(dir.path + "/small", small.data(), small.size());
  EXPECT_FALSE(r.Open(dir.path + "/small", &err));
  EXPECT_NE(err.find("truncated"), std::string::npos) << err;

  std::vector<char> buf(sizeof(shm::ShmHeader), 0);
  WriteFile(dir.path + "/zero", buf.data(), buf.size());
  EXPECT_FALSE(r.Open(dir.path + "/zero", &err));
  EXPECT_NE(err.find("magic"), std::string::npos) << err;

  shm::ShmHeader h{};
  h.magic = 0x1234;
  WriteFile(dir.path + "/foreign", &h, sizeof(h));
  EXPECT_FALSE(r.Open(dir.path + "/foreign", &err));
  EXPECT_NE(err.find("foreign"), std::string::npos) << err;

  h.magic = shm::kMagic;
  h.layout_version = 99;
  WriteFile(dir.path + "/version", &h, sizeof(h));
  EXPECT_FALSE(r.Open(dir.path + "/version", &err));
  EXPECT_NE(err.find("layout version"), std::string::npos) << err;

  // A real header whose file was cut short.
  h.layout_version = shm::kLayoutVersion;
  h.header_size = sizeof(shm::ShmHeader);
  h.live_slots = 4;
  h.ring_capacity = 16;
  h.live_offset = uint32_t(shm::LiveOffset());
  h.ring_offset = uint32_t(shm::RingOffset(4));
  h.file_size = shm::FileSize(4, 16);
  WriteFile(dir.path + "/cut", &h, sizeof(h));
  EXPECT_FALSE(r.Open(dir.path + "/cut", &err));
  EXPECT_NE(err.find("truncated"), std::string::npos) << err;
  EXPECT_FALSE(r.is_open());
}

// A child process runs the plugin up to the middle of a ring all-reduce and stops; the
// parent then freezes it, reads, kills it, reads again: the in-flight state is whole.
TEST(Reader, FrozenAndKilledWriter) {
  ClearKnobs();
  TempDir dir;
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(pipefd[0]);
    Prof p(6);
    void* ctx = nullptr;
    if (p.Init(&ctx, "victim", 0x8888, 4, 2) != nabi::Result::Success) _exit(3);
    void* coll = p.CollLaunch(ctx, "ReduceScatter", 5, 2);
    p.ProxyOp(ctx, coll, 0, 3, true, 4);  // channel 0 send: complete
    Prof::E o;
    o.type = kProxyOp;
    o.parent = coll;
    o.channel = 1;
    o.peer = 1;
    o.is_send = 0;
    o.n_steps = 4;
    void* op = p.Start(ctx, o);
    for (int s = 0; s < 3; ++s) {  // channel 1 recv: 3 posted, 2 received, 1 consumed
      Prof::E st;
      st.type = kProxyStep;
      st.parent = op;
      st.step = s;
      void* h = p.Start(ctx, st);
      p.Record(h, kRecvWait, 0);
      if (s < 2) p.Record(h, kRecvGPUWait, 1000);
      if (s < 1) p.Stop(h);
    }
    char c = 'x';
    if (write(pipefd[1], &c, 1) != 1) _exit(4);
    for (;;) pause();
  }
  close(pipefd[1]);
  char c;
  ASSERT_EQ(read(pipefd[0], &c, 1), 1);
  close(pipefd[0]);

  auto check = [&](const char* when) {
    auto files = dir.Files();
    ASSERT_EQ(files.size(), 1u) << when;
    View v(files[0]);
    auto h = v.H();
    EXPECT_EQ(h.pid, child) << when;
    EXPECT_EQ(h.finalized_ns, 0u) << when;
    auto live = v.Live();
    ASSERT_EQ(live.size(), 1u) << when;
    EXPECT_FALSE(live[0].torn);
    const auto& op = live[0].slot.op;
    EXPECT_EQ(op.func, uint8_t(shm::Func::kReduceScatter)) << when;
    EXPECT_EQ(op.nccl_seq, 5u);
    EXPECT_EQ(op.end_ns, 0u);
    ASSERT_EQ(op.n_flows, 2) << when;
    const shm::Flow& send = live[0].slot.flows[0];
    const shm::Flow& recv = live[0].slot.flows[1];
    EXPECT_EQ(send.done, 4u);
    EXPECT_EQ(recv.channel, 1);
    EXPECT_EQ(recv.peer, 1);
    EXPECT_EQ(recv.posted, 3u) << when;
    EXPECT_EQ(recv.ready, 2u) << when;
    EXPECT_EQ(recv.transmitted, 2u) << when;
    EXPECT_EQ(recv.done, 1u) << when;
    EXPECT_EQ(recv.wait_step, 1u) << when;
    EXPECT_EQ(recv.wait_state, uint8_t(shm::WaitState::kRecvGpuWait)) << when;
    EXPECT_EQ(recv.version % 2, 0u);
  };
  ASSERT_EQ(kill(child, SIGSTOP), 0);
  check("frozen");
  ASSERT_EQ(kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  check("killed");
}
