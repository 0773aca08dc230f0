// RingReader: a read-only view of one plugin context's shared-memory file (shm_layout.h).
//
// The file is mapped PROT_READ / MAP_SHARED: the reader never writes, so it is safe against a
// running, frozen (SIGSTOP) or dead (SIGKILL) writer alike. Consistency follows the writer's
// protocol described in shm_layout.h:
//   * live slots: `generation` is odd while a slot is (re)initialised; a slot is copied only when
//     its generation is even and unchanged across the copy and its state is ACTIVE;
//   * flows: per-flow seqlock `version`; a flow that stays odd or keeps changing after a bounded
//     number of retries (its writer froze or died inside an update) is returned as copied, with
//     its odd `version` marking it torn, never waited on;
//   * ring: record i (counting since the ring began) lives at ring[i % capacity] and is published
//     when its `seq` reads i + 1; a higher seq means it was overwritten by a later lap.
// One memcpy per slot/record; the GIL is released while copying.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "bindings.h"
#include "mycroft/shm_layout.h"

namespace mycroft::bindings {
namespace {

using namespace mycroft::shm;

constexpr int kSlotRetries = 64;
constexpr int kFlowRetries = 64;

template <typename T>
T LoadAcquire(const T* p) {
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

std::string CString(const char* s, size_t n) {
  size_t len = strnlen(s, n);
  return std::string(s, len);
}

py::str Decode(const char* s, size_t n) {
  std::string raw = CString(s, n);
  PyObject* o = PyUnicode_DecodeUTF8(raw.data(), Py_ssize_t(raw.size()), "replace");
  if (!o) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(o);
}

class RingReader {
 public:
  explicit RingReader(const std::string& path) : path_(path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw py::value_error(path + ": cannot open: " + strerror(errno));
    struct stat st {};
    if (fstat(fd, &st) != 0) {
      int e = errno;
      ::close(fd);
      throw py::value_error(path + ": cannot stat: " + strerror(e));
    }
    size_t size = size_t(st.st_size);
    if (size < sizeof(ShmHeader)) {
      ::close(fd);
      throw py::value_error(path + ": truncated: " + std::to_string(size) + " bytes, smaller than the " +
                            std::to_string(sizeof(ShmHeader)) + "-byte mycroft header");
    }
    void* base = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    int e = errno;
    ::close(fd);
    if (base == MAP_FAILED) throw py::value_error(path + ": mmap failed: " + strerror(e));
    base_ = static_cast<const uint8_t*>(base);
    size_ = size;
    std::string problem = Validate();
    if (!problem.empty()) {
      munmap(const_cast<uint8_t*>(base_), size_);
      base_ = nullptr;
      throw py::value_error(path + ": " + problem);
    }
  }

  ~RingReader() { Close(); }

  void Close() {
    if (base_) munmap(const_cast<uint8_t*>(base_), size_);
    base_ = nullptr;
  }

  const std::string& path() const { return path_; }

  py::dict Header() const {
    const ShmHeader* h = Hdr();
    ShmHeader c;
    std::memcpy(&c, h, sizeof c);
    // Writer-updated counters: read them atomically.
    c.ring_head = LoadAcquire(&h->ring_head);
    c.heartbeat_ns = LoadAcquire(&h->heartbeat_ns);
    c.finalized_ns = LoadAcquire(&h->finalized_ns);
    py::dict d;
    d["magic"] = c.magic;
    d["layout_version"] = c.layout_version;
    d["header_size"] = c.header_size;
    d["live_slots"] = c.live_slots;
    d["ring_capacity"] = c.ring_capacity;
    d["live_offset"] = c.live_offset;
    d["ring_offset"] = c.ring_offset;
    d["file_size"] = c.file_size;
    d["job_id"] = Decode(c.job_id, sizeof c.job_id);
    d["comm_name"] = Decode(c.comm_name, sizeof c.comm_name);
    d["host"] = Decode(c.host, sizeof c.host);
    d["plugin_version"] = Decode(c.plugin_version, sizeof c.plugin_version);
    d["comm_hash"] = c.comm_hash;
    d["comm_id"] = c.comm_id;
    d["rank"] = c.rank;
    d["nranks"] = c.nranks;
    d["nnodes"] = c.nnodes;
    d["global_rank"] = c.global_rank;
    d["local_rank"] = c.local_rank;
    d["cuda_device"] = c.cuda_device;
    d["pid"] = c.pid;
    d["abi_version"] = c.abi_version;
    d["activation_mask"] = c.activation_mask;
    d["start_realtime_ns"] = c.start_realtime_ns;
    d["start_mono_ns"] = c.start_mono_ns;
    d["ring_head"] = c.ring_head;
    d["heartbeat_ns"] = c.heartbeat_ns;
    d["finalized_ns"] = c.finalized_ns;
    d["ops_started"] = LoadAcquire(&h->ops_started);
    d["ops_completed"] = LoadAcquire(&h->ops_completed);
    d["dropped_live_full"] = LoadAcquire(&h->dropped_live_full);
    d["dropped_bad_handle"] = LoadAcquire(&h->dropped_bad_handle);
    d["dropped_bad_descr"] = LoadAcquire(&h->dropped_bad_descr);
    d["dropped_flows"] = LoadAcquire(&h->dropped_flows);
    d["pxn_foreign_ops"] = LoadAcquire(&h->pxn_foreign_ops);
    d["p2p_send_count_total"] = LoadAcquire(&h->p2p_send_count_total);
    d["p2p_recv_count_total"] = LoadAcquire(&h->p2p_recv_count_total);
    return d;
  }

  py::array HeaderRaw() const {
    const ShmHeader* h = Hdr();
    py::array_t<ShmHeader> out(1);
    std::memcpy(out.mutable_data(), h, sizeof(ShmHeader));
    return std::move(out);
  }

  // Consistent snapshot of the ACTIVE live slots.
  py::array Live() const {
    const ShmHeader* h = Hdr();
    const uint32_t n = h->live_slots;
    const LiveOp* live = reinterpret_cast<const LiveOp*>(base_ + h->live_offset);
    std::vector<LiveOp> out;
    {
      py::gil_scoped_release nogil;
      LiveOp tmp;
      for (uint32_t i = 0; i < n; ++i) {
        if (CopySlot(&live[i], &tmp)) out.push_back(tmp);
      }
    }
    py::array_t<LiveOp> arr{py::ssize_t(out.size())};
    if (!out.empty()) std::memcpy(arr.mutable_data(), out.data(), out.size() * sizeof(LiveOp));
    return std::move(arr);
  }

  // Records [cursor, cursor + max_records) of the ring -> (records, next_cursor, overwritten).
  py::tuple Read(uint64_t cursor, int64_t max_records, bool skip_unpublished) const {
    const ShmHeader* h = Hdr();
    const uint64_t cap = h->ring_capacity;
    const RingRecord* ring = reinterpret_cast<const RingRecord*>(base_ + h->ring_offset);
    const uint64_t head = LoadAcquire(&h->ring_head);
    uint64_t overwritten = 0;
    if (cursor > head) cursor = head;  // a cursor from the future: resume at the head
    if (head > cap && cursor < head - cap) {
      overwritten += (head - cap) - cursor;
      cursor = head - cap;
    }
    uint64_t want = head - cursor;
    if (max_records >= 0 && uint64_t(max_records) < want) want = uint64_t(max_records);
    py::array_t<RingRecord> arr{py::ssize_t(want)};
    RingRecord* dst = want ? arr.mutable_data() : nullptr;
    uint64_t got = 0;
    {
      py::gil_scoped_release nogil;
      uint64_t i = cursor;
      for (; i < cursor + want; ++i) {
        const RingRecord* r = &ring[i % cap];
        uint64_t s1 = LoadAcquire(&r->seq);
        if (s1 < i + 1) {  // claimed but not published yet (or its writer died while filling it)
          if (skip_unpublished) {
            ++overwritten;
            continue;
          }
          break;
        }
        if (s1 > i + 1) {  // a later lap already replaced it
          ++overwritten;
          continue;
        }
        std::memcpy(&dst[got], r, sizeof(RingRecord));
        std::atomic_thread_fence(std::memory_order_acquire);
        if (LoadAcquire(&r->seq) != s1) {  // overwritten while we copied
          ++overwritten;
          continue;
        }
        dst[got].seq = s1;
        ++got;
      }
      cursor = i;
    }
    if (got != want) arr.resize({py::ssize_t(got)}, false);
    return py::make_tuple(std::move(arr), cursor, overwritten);
  }

  uint64_t RingHead() const { return LoadAcquire(&Hdr()->ring_head); }

 private:
  const ShmHeader* Hdr() const {
    if (!base_) throw py::value_error(path_ + ": reader is closed");
    return reinterpret_cast<const ShmHeader*>(base_);
  }

  std::string Validate() const {
    const ShmHeader* h = reinterpret_cast<const ShmHeader*>(base_);
    if (h->magic == 0) return "not a mycroft ring yet (magic is zero: the writer has not initialised it)";
    if (h->magic != kMagic) return "foreign file: bad magic (not a mycroft-otel shared-memory ring)";
    if (h->layout_version != kLayoutVersion)
      return "layout version " + std::to_string(h->layout_version) + ", this reader understands " +
             std::to_string(kLayoutVersion);
    if (h->header_size != sizeof(ShmHeader))
      return "header_size " + std::to_string(h->header_size) + " != " + std::to_string(sizeof(ShmHeader));
    if (h->live_slots == 0 || h->ring_capacity == 0) return "zero live slots or ring capacity";
    if (h->live_offset != LiveOffset() || h->ring_offset != RingOffset(h->live_slots))
      return "section offsets do not match the layout";
    uint64_t want = FileSize(h->live_slots, h->ring_capacity);
    if (h->file_size != want) return "header file_size does not match its geometry";
    if (size_ < want)
      return "truncated: " + std::to_string(size_) + " bytes, the header says " + std::to_string(want);
    return {};
  }

  static bool CopySlot(const LiveOp* src, LiveOp* dst) {
    for (int attempt = 0; attempt < kSlotRetries; ++attempt) {
      uint32_t g1 = LoadAcquire(&src->generation);
      if (LoadAcquire(&src->state) != uint32_t(SlotState::kActive)) return false;
      if (g1 & 1u) continue;  // being (re)initialised
      std::memcpy(dst, src, sizeof(LiveOp));
      std::atomic_thread_fence(std::memory_order_acquire);
      if (LoadAcquire(&src->generation) != g1) continue;
      if (dst->state != uint32_t(SlotState::kActive)) return false;
      FixFlows(src, dst);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (LoadAcquire(&src->generation) != g1) continue;  // freed/reused while we fixed flows
      return true;
    }
    return false;  // never stable: a frozen writer inside slot init, or churning too fast
  }

  // Per-flow seqlock read of the valid flows; bounded so a frozen writer cannot stall us.
  static void FixFlows(const LiveOp* src, LiveOp* dst) {
    uint32_t n = dst->op.n_flows;
    if (n > kMaxFlows) n = kMaxFlows;
    for (uint32_t f = 0; f < n; ++f) {
      const Flow* s = &src->flows[f];
      Flow* d = &dst->flows[f];
      for (int attempt = 0; attempt < kFlowRetries; ++attempt) {
        uint32_t v1 = LoadAcquire(&s->version);
        std::memcpy(d, s, sizeof(Flow));
        std::atomic_thread_fence(std::memory_order_acquire);
        uint32_t v2 = LoadAcquire(&s->version);
        d->version = v1 == v2 ? v1 : (v2 | 1u);  // odd = torn (kept only if retries run out)
        if (v1 == v2 && !(v1 & 1u)) break;
      }
    }
  }

  std::string path_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
};

}  // namespace

void RegisterReader(py::module_& m) {
  py::class_<RingReader>(m, "RingReader",
                         "Read-only view of one plugin context's shared-memory file (never writes to it).")
      .def(py::init<const std::string&>(), py::arg("path"),
           "Open and validate PATH; ValueError naming the problem for a bad, foreign or truncated file.")
      .def("header", &RingReader::Header, "The ShmHeader as a dict (strings decoded, counters read atomically).")
      .def("header_raw", &RingReader::HeaderRaw, "The ShmHeader bytes as a 1-element HEADER_DTYPE array.")
      .def("live", &RingReader::Live,
           "Consistent snapshot of the ACTIVE live slots (LIVE_OP_DTYPE). A flow whose `version` is odd was "
           "caught mid-update by a writer that stopped (frozen or dead) and is returned as found.")
      .def("read", &RingReader::Read, py::arg("cursor"), py::arg("max_records") = -1,
           py::arg("skip_unpublished") = false,
           "Completed records from CURSOR (records since the ring began; start at 0) -> (records, next_cursor, "
           "overwritten). overwritten counts records lost because the ring wrapped past the cursor. A record "
           "claimed but not yet published stops the read there (resume later) unless skip_unpublished, which "
           "counts it as lost: use that once the writer is known dead.")
      .def_property_readonly("ring_head", &RingReader::RingHead, "Records ever claimed in the ring.")
      .def_property_readonly("path", &RingReader::path)
      .def("close", &RingReader::Close, "Unmap the file (idempotent).")
      .def("__enter__", [](RingReader& r) -> RingReader& { return r; }, py::return_value_policy::reference)
      .def("__exit__", [](RingReader& r, py::args) { r.Close(); });
}

}  // namespace mycroft::bindings
