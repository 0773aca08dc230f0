// Header-only C++ reader of one plugin context's shared-memory file (shm_layout.h).
//
//   mycroft::shm::Reader r;
//   std::string err;
//   if (!r.Open(path, &err)) ...;                 // read-only mmap + validation, err names the problem
//   ShmHeader h = r.Header();                      // counters read atomically
//   std::vector<LiveSnapshot> live; r.Live(&live); // consistent copies of the ACTIVE slots
//   std::vector<RingRecord> recs;
//   ReadResult rr = r.Read(cursor, 64, &recs);     // records [cursor, ...), rr.next_cursor, rr.overwritten
//
// The reader never writes the file, so it works while the writer runs, after it froze
// (SIGSTOP) and after it died. Every wait is bounded: a writer frozen in the middle of
// an update yields a copy marked torn (LiveSnapshot::torn, or an odd Flow::version),
// never a spinning reader.
//
// Consistency protocol (the writer side is native/plugin/core.cc):
//  * live slot: `generation` odd while the slot header is (re)written; copied when the
//    generation is even, the state ACTIVE and both unchanged across the copy;
//  * flow: seqlock `version` (odd during an update): v1 = load-acquire, copy, acquire
//    fence, v2 = load; good iff v1 == v2 and even;
//  * ring: record i (counted since the ring began) lives at ring[i % capacity] and is
//    published when its seq == i + 1 (store-release after the payload); while a writer
//    fills it seq == (i + 1) | kWriting (bit 63), and seq never decreases. seq (without
//    the bit) > i + 1: a later lap owns it (counted in `overwritten`); < i + 1 or marked
//    writing: not yet published, the read stops there (`pending`) unless
//    skip_unpublished is set (use it once the writer is known dead or frozen).
// All shared loads are relaxed/acquire atomics (8-byte words for bulk copies), so the
// reader is clean under ThreadSanitizer next to a live writer.
// Hostile files: the file may be written by anyone who can write the ring directory,
// and may be changed, truncated or replaced after Open. So Open refuses symlinks
// (O_NOFOLLOW), FIFOs and devices (O_NONBLOCK + S_ISREG), validates the header from a
// pread() copy, bounds the geometry by the plugin's own limits (kMaxLiveSlots,
// kMaxRingRecords) and maps exactly that geometry read-only; every later access uses
// the geometry validated then, never the (writable) header. Before each access the
// file's size is checked with fstat(); a file that shrank below the mapping is closed
// and reported (broken()). A truncation racing that check would make the next load
// fault with SIGBUS (tmpfs pages past EOF): accesses run under a SIGBUS guard that
// turns such a fault in the mapping into the same "broken" result, and forwards every
// other SIGBUS to the disposition it replaced. In instrument() mode this reader runs
// inside the training process, where an escaped SIGBUS would kill the job.
#pragma once

#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "mycroft/shm_layout.h"

namespace mycroft::shm {

// The plugin's own bounds (MYCROFT_LIVE_SLOTS <= 4096, MYCROFT_RING_RECORDS <= 65536,
// native/plugin/config.cc): a header claiming more was not written by the plugin.
inline constexpr uint32_t kMaxLiveSlots = 4096;
inline constexpr uint32_t kMaxRingRecords = 65536;

struct LiveSnapshot {
  LiveOp slot;
  uint32_t index = 0;  // live-table slot
  bool torn = false;   // the slot never held still within the retry budget
};

struct ReadResult {
  uint64_t next_cursor = 0;  // resume here
  uint64_t overwritten = 0;  // records lost to ring wrap-around (or skipped unpublished)
  bool pending = false;      // stopped at a claimed but unpublished record
};

namespace bus_guard {

// One armed region per reading thread: a fault at an address in [lo, hi) on thread
// `tid` jumps back to `jb`. A fixed table (no TLS: the handler must not allocate).
struct Slot {
  std::atomic<long> tid{0};
  const volatile uint8_t* lo = nullptr;
  const volatile uint8_t* hi = nullptr;
  sigjmp_buf* jb = nullptr;
};
inline constexpr int kSlots = 32;
inline Slot g_slots[kSlots];
inline struct sigaction g_prev;
inline std::atomic<int> g_installed{0};

inline long Tid() { return long(syscall(SYS_gettid)); }

inline void Handler(int sig, siginfo_t* si, void* uc) {
  const long tid = Tid();
  const volatile uint8_t* a = static_cast<const volatile uint8_t*>(si->si_addr);
  for (Slot& s : g_slots) {
    if (s.tid.load(std::memory_order_acquire) == tid && a >= s.lo && a < s.hi) siglongjmp(*s.jb, 1);
  }
  // Not a fault in a guarded mapping: behave as the replaced disposition would.
  if ((g_prev.sa_flags & SA_SIGINFO) && g_prev.sa_sigaction != nullptr) {
    g_prev.sa_sigaction(sig, si, uc);
    return;
  }
  if (!(g_prev.sa_flags & SA_SIGINFO) && g_prev.sa_handler != SIG_DFL && g_prev.sa_handler != SIG_IGN) {
    g_prev.sa_handler(sig);
    return;
  }
  signal(sig, SIG_DFL);  // returning re-executes the faulting access, which now takes the default action
  if (si->si_code <= 0) raise(sig);  // sent by kill(): nothing re-executes
}

inline void Install() {
  if (g_installed.exchange(1, std::memory_order_acq_rel) != 0) return;
  struct sigaction sa {};
  sa.sa_sigaction = Handler;
  sa.sa_flags = SA_SIGINFO;  // sigsetjmp(jb, 1) restores the mask on the way out
  sigemptyset(&sa.sa_mask);
  sigaction(SIGBUS, &sa, &g_prev);
}

// Claims a slot for this thread; nullptr when all are taken (the access then runs
// with the fstat check alone).
inline Slot* Arm(const void* lo, size_t len, sigjmp_buf* jb) {
  const long tid = Tid();
  for (Slot& s : g_slots) {
    long expected = 0;
    // Claimed as -tid first (matches no thread), filled, then armed as tid: another
    // thread claiming at the same time cannot overwrite a slot it did not win.
    if (s.tid.load(std::memory_order_relaxed) == 0 &&
        s.tid.compare_exchange_strong(expected, -tid, std::memory_order_acquire)) {
      s.lo = static_cast<const volatile uint8_t*>(lo);
      s.hi = static_cast<const volatile uint8_t*>(lo) + len;
      s.jb = jb;
      std::atomic_signal_fence(std::memory_order_seq_cst);  // the fields before the tid, for our own handler
      s.tid.store(tid, std::memory_order_release);
      return &s;
    }
  }
  return nullptr;
}
inline void Disarm(Slot* s) {
  if (s != nullptr) s->tid.store(0, std::memory_order_release);
}

}  // namespace bus_guard

class Reader {
 public:
  static constexpr uint64_t kWriting = 1ull << 63;  // RingRecord::seq marker while a writer fills it
  static constexpr int kSlotRetries = 64;
  static constexpr int kFlowRetries = 64;

  Reader() = default;
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;
  ~Reader() { Close(); }

  bool Open(const std::string& path, std::string* err) {
    Close();
    broken_.clear();
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) {
      int e = errno;
      if (e == ELOOP) return Fail(err, path + ": is a symbolic link (refused: rings are regular files)");
      return Fail(err, path + ": cannot open: " + strerror(e));
    }
    struct stat st {};
    if (fstat(fd, &st) != 0) {
      int e = errno;
      ::close(fd);
      return Fail(err, path + ": cannot stat: " + strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      return Fail(err, path + ": not a regular file (refused)");
    }
    uint64_t size = uint64_t(st.st_size);
    if (size < sizeof(ShmHeader)) {
      ::close(fd);
      return Fail(err, path + ": truncated: " + std::to_string(size) + " bytes, less than a header (" +
                           std::to_string(sizeof(ShmHeader)) + ")");
    }
    ShmHeader h;
    ssize_t got = pread(fd, &h, sizeof(h), 0);
    if (got != ssize_t(sizeof(h))) {
      ::close(fd);
      return Fail(err, path + ": cannot read the header");
    }
    std::string problem = Validate(h, size);
    if (!problem.empty()) {
      ::close(fd);
      return Fail(err, path + ": " + problem);
    }
    const uint64_t want = FileSize(h.live_slots, h.ring_capacity);
    void* m = mmap(nullptr, want, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      return Fail(err, path + ": mmap: " + strerror(e));
    }
    bus_guard::Install();
    fd_ = fd;
    base_ = static_cast<const uint8_t*>(m);
    size_ = want;
    live_slots_ = h.live_slots;
    ring_cap_ = h.ring_capacity;
    live_off_ = LiveOffset();
    ring_off_ = RingOffset(h.live_slots);
    return true;
  }

  void Close() {
    if (base_ != nullptr) munmap(const_cast<uint8_t*>(base_), size_);
    if (fd_ >= 0) ::close(fd_);
    base_ = nullptr;
    fd_ = -1;
    size_ = 0;
  }
  bool is_open() const { return base_ != nullptr; }
  // Why the reader closed itself (the file shrank, stopped being a regular file, or an
  // access faulted); empty while it is usable.
  const std::string& broken() const { return broken_; }
  uint32_t live_slots() const { return live_slots_; }
  uint32_t ring_capacity() const { return ring_cap_; }

  // Header copy; the writer-updated counters are read atomically. Zeroed if broken.
  ShmHeader Header() const {
    ShmHeader h{};
    ShmHeader* hp = &h;
    if (!Guarded([&] { CopyWords(hp, Hdr(), sizeof(ShmHeader)); })) *hp = ShmHeader{};
    return h;
  }
  uint64_t ring_head() const {
    uint64_t v = 0;
    uint64_t* vp = &v;
    Guarded([&] { *vp = __atomic_load_n(&Hdr()->ring_head, __ATOMIC_ACQUIRE); });
    return v;
  }

  // Appends consistent copies of the ACTIVE live slots; returns how many.
  size_t Live(std::vector<LiveSnapshot>* out) const {
    size_t n0 = out->size();
    const LiveOp* live = reinterpret_cast<const LiveOp*>(base_ + live_off_);
    const uint32_t n = live_slots_;
    if (!Guarded([&] {
          LiveSnapshot snap;
          for (uint32_t i = 0; i < n; ++i) {
            if (CopySlot(&live[i], &snap.slot, &snap.torn)) {
              snap.index = i;
              out->push_back(snap);
            }
          }
        }))
      out->resize(n0);
    return out->size() - n0;
  }

  // Appends up to max_records records starting at `cursor`.
  ReadResult Read(uint64_t cursor, size_t max_records, std::vector<RingRecord>* out,
                  bool skip_unpublished = false) const {
    ReadResult rr;
    ReadResult* rp = &rr;
    size_t n0 = out->size();
    if (!Guarded([&] { *rp = ReadRing(cursor, max_records, out, skip_unpublished); })) {
      out->resize(n0);
      rr = ReadResult{};
      rr.next_cursor = cursor;
    }
    return rr;
  }

 private:
  static bool Fail(std::string* err, const std::string& msg) {
    if (err != nullptr) *err = msg;
    return false;
  }

  const ShmHeader* Hdr() const { return reinterpret_cast<const ShmHeader*>(base_); }

  // Runs `access` on the mapping if the file still backs all of it, under the SIGBUS
  // guard. False (and the reader closed, broken() saying why) otherwise.
  template <class F>
  bool Guarded(F&& access) const {
    if (base_ == nullptr) return false;
    struct stat st {};
    if (fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) return Break("the file is no longer a regular file");
    if (uint64_t(st.st_size) < size_)
      return Break("the file shrank to " + std::to_string(st.st_size) + " bytes under the reader (" +
                   std::to_string(size_) + " mapped)");
    sigjmp_buf jb;
    bus_guard::Slot* const slot = bus_guard::Arm(base_, size_, &jb);
    if (sigsetjmp(jb, 1) != 0) {
      bus_guard::Disarm(slot);
      return Break("SIGBUS reading the mapping (the file was truncated under the reader)");
    }
    access();
    bus_guard::Disarm(slot);
    return true;
  }
  bool Break(const std::string& why) const {
    broken_ = why;
    const_cast<Reader*>(this)->Close();
    return false;
  }

  ReadResult ReadRing(uint64_t cursor, size_t max_records, std::vector<RingRecord>* out,
                      bool skip_unpublished) const {
    const uint64_t cap = ring_cap_;
    const RingRecord* ring = reinterpret_cast<const RingRecord*>(base_ + ring_off_);
    const uint64_t head = __atomic_load_n(&Hdr()->ring_head, __ATOMIC_ACQUIRE);
    ReadResult rr;
    if (cursor > head) cursor = head;
    if (head > cap && cursor < head - cap) {
      rr.overwritten += (head - cap) - cursor;
      cursor = head - cap;
    }
    uint64_t end = head;
    if (end - cursor > max_records) end = cursor + max_records;
    uint64_t i = cursor;
    RingRecord rec;
    for (; i < end; ++i) {
      const RingRecord* r = &ring[i % cap];
      uint64_t s1 = __atomic_load_n(&r->seq, __ATOMIC_ACQUIRE);
      uint64_t t1 = s1 & ~kWriting;
      if (t1 > i + 1) {  // a later lap owns the record (published or being written)
        ++rr.overwritten;
        continue;
      }
      if (t1 < i + 1 || (s1 & kWriting)) {  // not yet published (or its writer died filling it)
        if (skip_unpublished) {
          ++rr.overwritten;
          continue;
        }
        rr.pending = true;
        break;
      }
      CopyWords(&rec, r, sizeof(RingRecord));
      std::atomic_thread_fence(std::memory_order_acquire);
      if (__atomic_load_n(&r->seq, __ATOMIC_RELAXED) != s1) {
        ++rr.overwritten;
        continue;
      }
      rec.seq = s1;
      out->push_back(rec);
    }
    rr.next_cursor = i;
    return rr;
  }

  static void CopyWords(void* dst, const void* src, size_t bytes) {
    auto* d = static_cast<uint64_t*>(dst);
    auto* s = static_cast<const uint64_t*>(src);
    for (size_t k = 0; k < bytes / 8; ++k) d[k] = __atomic_load_n(s + k, __ATOMIC_RELAXED);
  }

  // Checks a header copy (not the mapping: the writer could change it between the check
  // and the use) against the layout, the plugin's bounds and the file's real size.
  static std::string Validate(const ShmHeader& h, uint64_t file_size) {
    if (h.magic == 0) return "not initialised yet (magic is zero)";
    if (h.magic != kMagic) return "foreign file: bad magic, not a mycroft-otel shared-memory file";
    if (h.layout_version != kLayoutVersion)
      return "layout version " + std::to_string(h.layout_version) + ", this reader understands " +
             std::to_string(kLayoutVersion);
    if (h.header_size != sizeof(ShmHeader))
      return "header_size " + std::to_string(h.header_size) + " != " + std::to_string(sizeof(ShmHeader));
    if (h.live_slots == 0 || h.ring_capacity == 0) return "zero live slots or ring capacity";
    if (h.live_slots > kMaxLiveSlots || h.ring_capacity > kMaxRingRecords)
      return "geometry out of the plugin's bounds: " + std::to_string(h.live_slots) + " live slots (at most " +
             std::to_string(kMaxLiveSlots) + "), " + std::to_string(h.ring_capacity) + " ring records (at most " +
             std::to_string(kMaxRingRecords) + ")";
    if (h.live_offset != LiveOffset() || h.ring_offset != RingOffset(h.live_slots))
      return "section offsets do not match the layout";
    uint64_t want = FileSize(h.live_slots, h.ring_capacity);
    if (h.file_size != want) return "file_size in the header does not match its geometry";
    if (file_size < want)
      return "truncated: " + std::to_string(file_size) + " bytes, header says " + std::to_string(want);
    return {};
  }

  static bool CopySlot(const LiveOp* src, LiveOp* dst, bool* torn) {
    *torn = false;
    for (int attempt = 0; attempt < kSlotRetries; ++attempt) {
      uint32_t g1 = __atomic_load_n(&src->generation, __ATOMIC_ACQUIRE);
      if (__atomic_load_n(&src->state, __ATOMIC_ACQUIRE) != uint32_t(SlotState::kActive)) return false;
      if (g1 & 1u) continue;
      CopyWords(dst, src, sizeof(LiveOp));
      std::atomic_thread_fence(std::memory_order_acquire);
      if (__atomic_load_n(&src->generation, __ATOMIC_RELAXED) != g1) continue;
      if (dst->state != uint32_t(SlotState::kActive)) return false;
      CopyFlows(src, dst);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (__atomic_load_n(&src->generation, __ATOMIC_RELAXED) != g1) continue;
      return true;
    }
    // Never held still (recycled under us on every attempt): last copy, marked torn.
    CopyWords(dst, src, sizeof(LiveOp));
    if (dst->state != uint32_t(SlotState::kActive)) return false;
    *torn = true;
    return true;
  }

  static void CopyFlows(const LiveOp* src, LiveOp* dst) {
    uint32_t n = dst->op.n_flows;
    if (n > kMaxFlows) n = kMaxFlows;
    for (uint32_t f = 0; f < n; ++f) {
      const Flow* s = &src->flows[f];
      Flow* d = &dst->flows[f];
      for (int attempt = 0; attempt < kFlowRetries; ++attempt) {
        uint32_t v1 = __atomic_load_n(&s->version, __ATOMIC_ACQUIRE);
        CopyWords(d, s, sizeof(Flow));
        std::atomic_thread_fence(std::memory_order_acquire);
        uint32_t v2 = __atomic_load_n(&s->version, __ATOMIC_RELAXED);
        d->version = (v1 == v2) ? v1 : (v2 | 1u);  // odd = torn, kept if retries run out
        if (v1 == v2 && (v1 & 1u) == 0) break;
      }
    }
  }

  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;  // bytes mapped: FileSize of the geometry validated at Open
  int fd_ = -1;        // kept for the per-access fstat
  uint32_t live_slots_ = 0;
  uint32_t ring_cap_ = 0;
  uint64_t live_off_ = 0;
  uint64_t ring_off_ = 0;
  mutable std::string broken_;
};

}  // namespace mycroft::shm
