// Safe to install on a production node: fork() while another thread is inside init or
// finalize, and the reader (shm_reader.h) against files that are hostile or change under
// it: symlinks, FIFOs, geometry beyond the plugin's bounds, a header rewritten after
// open, a file truncated under the mapping (the SIGBUS a tmpfs raises past EOF).
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "harness.h"

using namespace mt;

namespace {

nabi::v5::Profiler* Table5() { return Table<nabi::v5::Profiler>("ncclProfiler_v5"); }

// Waits for `pid` up to `seconds`; kills it if it is still running. Returns the wait status, or -1 on a hang.
int WaitOrKill(pid_t pid, int seconds) {
  int status = 0;
  for (int i = 0; i < seconds * 100; ++i) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    usleep(10000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return -1;
}

// A ring file written by the real plugin; returns its path.
std::string MakeRing(const TempDir& dir, void** ctx) {
  Prof p(5);
  EXPECT_EQ(p.Init(ctx, "safety", 0x5AFE, 2, 0), nabi::Result::Success);
  void* coll = p.CollLaunch(*ctx, "AllReduce", 0, 2);
  p.ProxyOp(*ctx, coll, 0, 1, true, 4);
  auto files = dir.Files();
  EXPECT_EQ(files.size(), 1u);
  return files.empty() ? std::string() : files[0];
}

}  // namespace

// A thread is inside finalize (holding the plugin's registry lock while it publishes 4096
// in-flight ops) when another thread forks; the child's first init must not hang on a
// lock copied in the taken state.
TEST(Safety, ForkWhileAnotherThreadHoldsThePluginLock) {
  ClearKnobs();
  TempDir dir;
  setenv("MYCROFT_LIVE_SLOTS", "4096", 1);
  setenv("MYCROFT_RING_RECORDS", "16", 1);
  std::atomic<bool> stop{false};
  std::atomic<int> rounds{0};
  std::atomic<bool> finalizing{false};
  std::thread holder([&] {
    Prof p(5);
    while (!stop.load()) {
      void* ctx = nullptr;
      int mask = 0;
      if (Table5()->init(&ctx, 0x1234 + rounds.load(), &mask, "holder", 1, 2, 0, nullptr) != nabi::Result::Success)
        break;
      for (int i = 0; i < 4096; ++i) p.CollLaunch(ctx, "AllReduce", uint64_t(i), 1);  // in flight: no KernelCh
      rounds.fetch_add(1);
      finalizing.store(true);
      Table5()->finalize(ctx);  // publishes every op as aborted, under the lock (milliseconds)
      finalizing.store(false);
    }
  });
  while (rounds.load() == 0) usleep(1000);
  int hung = 0;
  for (int i = 0; i < 24; ++i) {
    for (int w = 0; w < 20000 && !finalizing.load(); ++w) usleep(50);  // fork while the lock is most likely held
    usleep(100);
    pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      void* ctx = nullptr;
      int mask = 0;
      nabi::Result r = Table5()->init(&ctx, 0xC41D + i, &mask, "child", 1, 2, 0, nullptr);
      if (r == nabi::Result::Success) Table5()->finalize(ctx);
      _exit(r == nabi::Result::Success ? 0 : 3);
    }
    int status = WaitOrKill(child, 10);
    if (status == -1) {
      ++hung;
      break;  // one is proof enough
    }
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  }
  stop.store(true);
  holder.join();
  EXPECT_EQ(hung, 0) << "children deadlocked in init after fork";
  ClearKnobs();
}

TEST(Safety, ReaderRefusesSymlinksFifosAndOversizedGeometry) {
  TempDir dir;
  mkdir(dir.path.c_str(), 0700);
  shm::Reader r;
  std::string err;

  std::string fifo = dir.path + "/fifo.mycroft";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(r.Open(fifo, &err));  // O_NONBLOCK: a FIFO nobody writes does not block the open
  EXPECT_NE(err.find("not a regular file"), std::string::npos) << err;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));

  std::string target = dir.path + "/target";
  int fd = open(target.c_str(), O_WRONLY | O_CREAT, 0600);
  ASSERT_GE(fd, 0);
  close(fd);
  std::string link = dir.path + "/link.mycroft";
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
  EXPECT_FALSE(r.Open(link, &err));
  EXPECT_NE(err.find("symbolic link"), std::string::npos) << err;

  // A sparse file whose header claims 600,000 live slots: consistent, but not the plugin's.
  shm::ShmHeader h{};
  h.magic = shm::kMagic;
  h.layout_version = shm::kLayoutVersion;
  h.header_size = sizeof(shm::ShmHeader);
  h.live_slots = 600000;
  h.ring_capacity = 16;
  h.live_offset = uint32_t(shm::LiveOffset());
  h.ring_offset = uint32_t(shm::RingOffset(600000));
  h.file_size = shm::FileSize(600000, 16);
  std::string huge = dir.path + "/huge.mycroft";
  fd = open(huge.c_str(), O_RDWR | O_CREAT, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, off_t(h.file_size)), 0);
  ASSERT_EQ(pwrite(fd, &h, sizeof(h), 0), ssize_t(sizeof(h)));
  close(fd);
  EXPECT_FALSE(r.Open(huge, &err));
  EXPECT_NE(err.find("out of the plugin's bounds"), std::string::npos) << err;
  EXPECT_FALSE(r.is_open());
}

// The writer (or anyone) rewrites the header after Open: the reader keeps the geometry it
// validated and reads within its mapping.
TEST(Safety, ReaderKeepsTheGeometryValidatedAtOpen) {
  ClearKnobs();
  TempDir dir;
  void* ctx = nullptr;
  std::string path = MakeRing(dir, &ctx);
  shm::Reader r;
  std::string err;
  ASSERT_TRUE(r.Open(path, &err)) << err;
  const uint32_t slots = r.live_slots(), cap = r.ring_capacity();
  int fd = open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  void* m = mmap(nullptr, sizeof(shm::ShmHeader), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(m, MAP_FAILED);
  auto* h = static_cast<shm::ShmHeader*>(m);
  h->live_slots = 600000;
  h->ring_capacity = 1u << 30;
  h->live_offset = 1u << 31;
  h->ring_offset = 0xffffffffu;
  h->ring_head = ~0ull >> 1;
  std::vector<shm::LiveSnapshot> live;
  r.Live(&live);
  EXPECT_EQ(live.size(), 1u);
  std::vector<shm::RingRecord> recs;
  shm::ReadResult rr = r.Read(0, 1000, &recs);
  EXPECT_LE(recs.size(), size_t(cap));
  EXPECT_GT(rr.overwritten, 0u);
  EXPECT_EQ(r.live_slots(), slots);
  EXPECT_TRUE(r.broken().empty());
  munmap(m, sizeof(shm::ShmHeader));
  close(fd);
  Prof(5).Finalize(ctx);
}

// The file shrinks under an open reader: every access reports it (broken()), none faults.
TEST(Safety, ReaderSurvivesAFileTruncatedUnderIt) {
  ClearKnobs();
  TempDir dir;
  void* ctx = nullptr;
  std::string path = MakeRing(dir, &ctx);
  shm::Reader r;
  std::string err;
  ASSERT_TRUE(r.Open(path, &err)) << err;
  ASSERT_EQ(truncate(path.c_str(), 4096), 0);
  std::vector<shm::LiveSnapshot> live;
  EXPECT_EQ(r.Live(&live), 0u);
  EXPECT_NE(r.broken().find("shrank"), std::string::npos) << r.broken();
  EXPECT_FALSE(r.is_open());
  std::vector<shm::RingRecord> recs;
  EXPECT_EQ(r.Read(0, 100, &recs).next_cursor, 0u);
  EXPECT_TRUE(recs.empty());
  EXPECT_EQ(r.Header().magic, 0u);
  // No finalize: the plugin's own mapping of the cut file would fault on its first store
  // past the new end (the training user truncating its own ring hurts only itself).
}

// Truncation racing the size check: the fault it causes in the mapping is caught by the
// guard; a file that shrinks and grows back under many readers never kills the process.
TEST(Safety, TruncationRacingTheReaderNeverRaisesSigbus) {
  ClearKnobs();
  TempDir dir;
  void* ctx = nullptr;
  std::string path = MakeRing(dir, &ctx);
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  std::atomic<bool> stop{false};
  std::thread cutter([&] {
    while (!stop.load()) {
      if (truncate(path.c_str(), 4096) != 0) break;  // keeps the header page: opens still validate
      if (truncate(path.c_str(), st.st_size) != 0) break;
    }
  });
  int opened = 0, broken = 0, faulted = 0;
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
  while (std::chrono::steady_clock::now() < end) {
    shm::Reader r;
    std::string err;
    if (!r.Open(path, &err)) continue;
    ++opened;
    for (int i = 0; i < 20 && r.is_open(); ++i) {
      std::vector<shm::LiveSnapshot> live;
      r.Live(&live);
      std::vector<shm::RingRecord> recs;
      r.Read(0, 64, &recs);
      (void)r.Header();
    }
    if (!r.broken().empty()) ++broken;
    if (r.broken().find("SIGBUS") != std::string::npos) ++faulted;  // the race the size check cannot close
  }
  stop.store(true);
  cutter.join();
  EXPECT_GT(broken, 0) << "opened " << opened;
  RecordProperty("faults_caught", faulted);
  printf("opened %d readers, %d broke, %d by a caught SIGBUS\n", opened, broken, faulted);
}

// The guard itself: a fault inside an armed region jumps back; the same fault outside
// one still takes the default action (the guard must not swallow the process's own faults).
TEST(Safety, SigbusGuardCatchesOnlyGuardedAccesses) {
  TempDir dir;
  mkdir(dir.path.c_str(), 0700);
  std::string path = dir.path + "/pages";
  int fd = open(path.c_str(), O_RDWR | O_CREAT, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 8192), 0);
  void* m = mmap(nullptr, 8192, PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(m, MAP_FAILED);
  ASSERT_EQ(ftruncate(fd, 0), 0);
  shm::bus_guard::Install();
  sigjmp_buf jb;
  shm::bus_guard::Slot* slot = shm::bus_guard::Arm(m, 8192, &jb);
  ASSERT_NE(slot, nullptr);
  volatile bool jumped = false;
  if (sigsetjmp(jb, 1) == 0) {
    volatile uint8_t v = static_cast<const volatile uint8_t*>(m)[4096];
    (void)v;
  } else {
    jumped = true;
  }
  shm::bus_guard::Disarm(slot);
  EXPECT_TRUE(jumped);
  EXPECT_EXIT(
      {
        volatile uint8_t v = static_cast<const volatile uint8_t*>(m)[4096];
        (void)v;
        _exit(0);
      },
#if defined(__SANITIZE_THREAD__)
      ::testing::ExitedWithCode(66), "BUS");  // the replaced disposition is TSan's own reporter
#else
      ::testing::KilledBySignal(SIGBUS), "");
#endif
  munmap(m, 8192);
  close(fd);
}
