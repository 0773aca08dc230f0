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
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "mycroft/shm_layout.h"

namespace mycroft::shm {

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
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Fail(err, path + ": cannot open: " + strerror(errno));
    struct stat st {};
    if (fstat(fd, &st) != 0) {
      int e = errno;
      ::close(fd);
      return Fail(err, path + ": cannot stat: " + strerror(e));
    }
    size_t size = size_t(st.st_size);
    if (size < sizeof(ShmHeader)) {
      ::close(fd);
      return Fail(err, path + ": truncated: " + std::to_string(size) + " bytes, less than a header (" +
                           std::to_string(sizeof(ShmHeader)) + ")");
    }
    void* m = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    int e = errno;
    ::close(fd);
    if (m == MAP_FAILED) return Fail(err, path + ": mmap: " + strerror(e));
    base_ = static_cast<const uint8_t*>(m);
    size_ = size;
    std::string problem = Validate();
    if (!problem.empty()) {
      Close();
      return Fail(err, path + ": " + problem);
    }
    return true;
  }

  void Close() {
    if (base_ != nullptr) munmap(const_cast<uint8_t*>(base_), size_);
    base_ = nullptr;
    size_ = 0;
  }
  bool is_open() const { return base_ != nullptr; }

  // Header copy; the writer-updated counters are read atomically.
  ShmHeader Header() const {
    ShmHeader h;
    CopyWords(&h, Hdr(), sizeof(ShmHeader));
    return h;
  }
  const ShmHeader* raw_header() const { return Hdr(); }
  uint64_t ring_head() const { return __atomic_load_n(&Hdr()->ring_head, __ATOMIC_ACQUIRE); }

  // Appends consistent copies of the ACTIVE live slots; returns how many.
  size_t Live(std::vector<LiveSnapshot>* out) const {
    const ShmHeader* h = Hdr();
    const LiveOp* live = reinterpret_cast<const LiveOp*>(base_ + h->live_offset);
    size_t n0 = out->size();
    LiveSnapshot snap;
    for (uint32_t i = 0; i < h->live_slots; ++i) {
      if (CopySlot(&live[i], &snap.slot, &snap.torn)) {
        snap.index = i;
        out->push_back(snap);
      }
    }
    return out->size() - n0;
  }

  // Appends up to max_records records starting at `cursor`.
  ReadResult Read(uint64_t cursor, size_t max_records, std::vector<RingRecord>* out,
                  bool skip_unpublished = false) const {
    const ShmHeader* h = Hdr();
    const uint64_t cap = h->ring_capacity;
    const RingRecord* ring = reinterpret_cast<const RingRecord*>(base_ + h->ring_offset);
    const uint64_t head = ring_head();
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

 private:
  static bool Fail(std::string* err, const std::string& msg) {
    if (err != nullptr) *err = msg;
    return false;
  }

  const ShmHeader* Hdr() const { return reinterpret_cast<const ShmHeader*>(base_); }

  static void CopyWords(void* dst, const void* src, size_t bytes) {
    auto* d = static_cast<uint64_t*>(dst);
    auto* s = static_cast<const uint64_t*>(src);
    for (size_t k = 0; k < bytes / 8; ++k) d[k] = __atomic_load_n(s + k, __ATOMIC_RELAXED);
  }

  std::string Validate() const {
    const ShmHeader* h = Hdr();
    uint64_t magic = __atomic_load_n(&h->magic, __ATOMIC_ACQUIRE);
    if (magic == 0) return "not initialised yet (magic is zero)";
    if (magic != kMagic) return "foreign file: bad magic, not a mycroft-otel shared-memory file";
    if (h->layout_version != kLayoutVersion)
      return "layout version " + std::to_string(h->layout_version) + ", this reader understands " +
             std::to_string(kLayoutVersion);
    if (h->header_size != sizeof(ShmHeader))
      return "header_size " + std::to_string(h->header_size) + " != " + std::to_string(sizeof(ShmHeader));
    if (h->live_slots == 0 || h->ring_capacity == 0) return "zero live slots or ring capacity";
    if (h->live_offset != LiveOffset() || h->ring_offset != RingOffset(h->live_slots))
      return "section offsets do not match the layout";
    uint64_t want = FileSize(h->live_slots, h->ring_capacity);
    if (h->file_size != want) return "file_size in the header does not match its geometry";
    if (size_ < want) return "truncated: " + std::to_string(size_) + " bytes, header says " + std::to_string(want);
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
  size_t size_ = 0;
};

}  // namespace mycroft::shm
