// RingReader: a read-only view of one plugin context's shared-memory file (shm_layout.h), the
// Python face of the plugin's own C++ reader (mycroft/shm_reader.h, whose comment states the
// consistency protocol). The file is mapped PROT_READ / MAP_SHARED and never written, so reading is
// safe against a running, frozen (SIGSTOP) or dead (SIGKILL) writer. Marks visible from Python:
//   * a flow whose `version` is odd was caught mid-update by a writer that stopped inside it;
//   * a slot whose `generation` is odd never held still within the retry budget (recycled under
//     the reader on every attempt): its contents are the last copy, possibly torn.
// The GIL is released while the reader copies out of the mapping; then one memcpy into numpy.
// A file that shrinks or stops being a regular file under the reader closes it: the call raises
// ValueError naming the reason (never SIGBUS), and so does every later call.
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "bindings.h"
#include "mycroft/shm_layout.h"
#include "mycroft/shm_reader.h"

namespace mycroft::bindings {
namespace {

using namespace mycroft::shm;

py::str Decode(const char* s, size_t n) {
  size_t len = strnlen(s, n);
  PyObject* o = PyUnicode_DecodeUTF8(s, Py_ssize_t(len), "replace");
  if (!o) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(o);
}

class RingReader {
 public:
  explicit RingReader(const std::string& path) : path_(path) {
    std::string err;
    if (!reader_.Open(path, &err)) throw py::value_error(err);
  }

  // Close waits for a read in progress: reads run without the GIL, so another thread can close the reader
  // (munmap) while one is copying (seen: a SIGSEGV in Live on a reader the agent had just closed).
  void Close() {
    py::gil_scoped_release nogil;  // the reading thread holds mu_ without the GIL: wait for it without the GIL
    std::lock_guard<std::mutex> lock(mu_);
    reader_.Close();
  }
  const std::string& path() const { return path_; }

  py::dict Header() const {
    const ShmHeader c = CopyHeader();
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
    d["ops_started"] = c.ops_started;
    d["ops_completed"] = c.ops_completed;
    d["dropped_live_full"] = c.dropped_live_full;
    d["dropped_bad_handle"] = c.dropped_bad_handle;
    d["dropped_bad_descr"] = c.dropped_bad_descr;
    d["dropped_flows"] = c.dropped_flows;
    d["pxn_foreign_ops"] = c.pxn_foreign_ops;
    d["p2p_send_count_total"] = c.p2p_send_count_total;
    d["p2p_recv_count_total"] = c.p2p_recv_count_total;
    py::dict bad;  // dropped_bad_handle by the callback it came in (shm::BadHandleKind)
    for (uint32_t k = 0; k < mycroft::shm::kBadHandleKinds; ++k)
      bad[mycroft::shm::kBadHandleKindNames[k]] = c.bad_handle_by_kind[k];
    d["bad_handle_by_kind"] = bad;
    d["late_kernel_stops"] = c.late_kernel_stops;
    d["nccl_version"] = c.nccl_version;
    return d;
  }

  py::array HeaderRaw() const {
    const ShmHeader c = CopyHeader();
    py::array_t<ShmHeader> out{py::ssize_t(1)};
    *out.mutable_data() = c;
    return std::move(out);
  }

  py::array Live() const {
    std::vector<mycroft::shm::LiveSnapshot> snaps;
    WithoutGil([&] { reader_.Live(&snaps); });
    ThrowIfBroken();
    py::array_t<LiveOp> arr{py::ssize_t(snaps.size())};
    LiveOp* dst = arr.mutable_data();
    for (size_t i = 0; i < snaps.size(); ++i) {
      std::memcpy(&dst[i], &snaps[i].slot, sizeof(LiveOp));
      if (snaps[i].torn) dst[i].generation |= 1u;
    }
    return std::move(arr);
  }

  py::tuple Read(uint64_t cursor, int64_t max_records, bool skip_unpublished) const {
    std::vector<RingRecord> recs;
    mycroft::shm::ReadResult rr;
    size_t max = max_records < 0 ? SIZE_MAX : size_t(max_records);
    WithoutGil([&] { rr = reader_.Read(cursor, max, &recs, skip_unpublished); });
    ThrowIfBroken();
    py::array_t<RingRecord> arr{py::ssize_t(recs.size())};
    if (!recs.empty()) std::memcpy(arr.mutable_data(), recs.data(), recs.size() * sizeof(RingRecord));
    return py::make_tuple(std::move(arr), rr.next_cursor, rr.overwritten);
  }

  uint64_t RingHead() const {
    std::lock_guard<std::mutex> lock(mu_);  // (with the GIL: no lock holder ever waits for the GIL)
    if (!reader_.is_open()) Closed();
    uint64_t head = reader_.ring_head();
    if (!reader_.is_open()) Closed();
    return head;
  }

 private:
  // Runs `copy` on the open mapping without the GIL, under mu_ (Close waits for it); raises when closed.
  template <typename F>
  void WithoutGil(F&& copy) const {
    bool open;
    {
      py::gil_scoped_release nogil;
      std::lock_guard<std::mutex> lock(mu_);
      open = reader_.is_open();
      if (open) copy();
    }
    if (!open) Closed();
  }

  ShmHeader CopyHeader() const {
    std::lock_guard<std::mutex> lock(mu_);
    if (!reader_.is_open()) Closed();
    ShmHeader h = reader_.Header();
    if (!reader_.is_open()) Closed();
    return h;
  }
  // The reader closes itself when the file shrinks or faults under it (shm_reader.h); say why.
  void ThrowIfBroken() const {
    if (!reader_.broken().empty()) Closed();
  }
  [[noreturn]] void Closed() const {
    const std::string& why = reader_.broken();
    throw py::value_error(path_ + (why.empty() ? ": reader is closed" : ": " + why));
  }

  std::string path_;
  mycroft::shm::Reader reader_;
  mutable std::mutex mu_;  // held by every access to the mapping and by Close
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
