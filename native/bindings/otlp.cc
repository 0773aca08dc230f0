// OTLP trace payloads (ExportTraceServiceRequest, protobuf wire format) -> what the
// processor's ingest reads, without building a protobuf object tree.
//
// The processor needs a handful of scalar attributes per span at ingest and the flow
// arrays later, when a trace is analysed. Going through protobuf objects costs a Python
// call per field read. Here SpanDecoder walks the wire format once, checks each span's
// shape and builds its SpanRef with the key attributes; the rest stays where it is: each
// SpanRef keeps its byte range in the payload, so FlowDecoder (the flow arrays, as one
// int64 table for numpy) and AttrDecoder (a few other attributes) read it later.
//
// Messages and field numbers (opentelemetry-proto, trace/v1 and common/v1):
//   ExportTraceServiceRequest { 1: repeated ResourceSpans }
//   ResourceSpans { 1: Resource, 2: repeated ScopeSpans }     Resource { 1: repeated KeyValue }
//   ScopeSpans { 2: repeated Span }
//   Span { 1: trace_id, 2: span_id, 5: name, 7: start (fixed64), 8: end (fixed64), 9: repeated KeyValue }
//   KeyValue { 1: key, 2: AnyValue }
//   AnyValue { 1: string, 2: bool, 3: int64, 4: double, 5: ArrayValue, 6: KeyValueList, 7: bytes }
//   ArrayValue { 1: repeated AnyValue }
// Unknown fields are skipped, as protobuf does; a field whose wire type does not match its
// declaration is treated as unknown (protobuf's rule too). Anything truncated, an invalid
// wire type or varint, or a string we decode that is not UTF-8 raises ValueError.
#include <algorithm>
#include <cstring>
#include <deque>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "bindings.h"

namespace mycroft::bindings {
namespace {

constexpr size_t kMaxArray = 4096;  // longer attribute arrays are truncated (hostile input)

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLen = 2, kStartGroup = 3, kEndGroup = 4, kFixed32 = 5 };

[[noreturn]] void Malformed(const char* what) { throw py::value_error(std::string("malformed OTLP payload: ") + what); }

// A bounds-checked cursor over one message's bytes.
struct Wire {
  const uint8_t* p;
  const uint8_t* end;

  bool More() const { return p < end; }
  uint64_t Varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p >= end) Malformed("truncated varint");
      uint8_t b = *p++;
      v |= uint64_t(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return v;
    }
    Malformed("varint longer than 10 bytes");
  }
  uint64_t Fixed64() {
    if (end - p < 8) Malformed("truncated fixed64");
    uint64_t v;
    memcpy(&v, p, 8);
    p += 8;
    return v;
  }
  Wire Sub() {  // a length-delimited field's bytes
    uint64_t n = Varint();
    if (n > uint64_t(end - p)) Malformed("length past the end of its message");
    Wire w{p, p + n};
    p += n;
    return w;
  }
  void Tag(uint32_t* field, uint32_t* wt) {
    uint64_t t = Varint();
    *field = uint32_t(t >> 3);
    *wt = uint32_t(t & 7);
    if (*field == 0 || t >> 32) Malformed("invalid field number");
  }
  void Skip(uint32_t wt, int depth = 0) {
    switch (wt) {
      case kVarint: Varint(); return;
      case kFixed64: Fixed64(); return;
      case kLen: Sub(); return;
      case kFixed32:
        if (end - p < 4) Malformed("truncated fixed32");
        p += 4;
        return;
      case kStartGroup: {  // a deprecated group among unknown fields: skip to its end tag
        if (depth > 32) Malformed("groups nested too deep");
        for (;;) {
          uint32_t f, w;
          Tag(&f, &w);
          if (w == kEndGroup) return;
          Skip(w, depth + 1);
        }
      }
      default: Malformed("invalid wire type");
    }
  }
  // Advances to the next length-delimited field `field`, skipping everything else;
  // false at the end of the message.
  bool Next(uint32_t field, Wire* out) {
    while (More()) {
      uint32_t f, wt;
      Tag(&f, &wt);
      if (f == field && wt == kLen) {
        *out = Sub();
        return true;
      }
      Skip(wt);
    }
    return false;
  }
  std::string_view View() const { return {reinterpret_cast<const char*>(p), size_t(end - p)}; }
};

py::str Utf8(const Wire& w) {
  PyObject* s = PyUnicode_DecodeUTF8(reinterpret_cast<const char*>(w.p), Py_ssize_t(w.end - w.p), "strict");
  if (s == nullptr) {
    PyErr_Clear();
    Malformed("string field is not UTF-8");
  }
  return py::reinterpret_steal<py::str>(s);
}

// Longest string ingest keeps, in bytes (the Collector's attribute value length limit, applied by us): a
// host name is at most 253 bytes (DNS), a communicator hash, function or job id far less. A longer string
// is cut (at a character boundary) so that what a span refers to besides its own accounted bytes -- its
// Resource, shared and cached across requests -- stays small whatever a client sends.
constexpr size_t kMaxStringBytes = 256;

// The string, cut to kMaxStringBytes at a UTF-8 character boundary; only the kept bytes are decoded
// (and so checked), the rest is never read.
py::str Utf8Capped(const Wire& w) {
  if (size_t(w.end - w.p) <= kMaxStringBytes) return Utf8(w);
  const uint8_t* cut = w.p + kMaxStringBytes;
  for (int back = 0; back < 3 && cut > w.p && (*cut & 0xC0) == 0x80; ++back) --cut;  // not inside a character
  return Utf8(Wire{w.p, cut});
}

// The bytes object's own buffer (no copy; it lives as long as the caller's reference).
std::string_view BytesView(const py::bytes& b) {
  char* p = nullptr;
  Py_ssize_t n = 0;
  if (PyBytes_AsStringAndSize(b.ptr(), &p, &n) != 0) throw py::error_already_set();
  return {p, size_t(n)};
}

py::bytes Bytes(const Wire& w) { return py::bytes(reinterpret_cast<const char*>(w.p), size_t(w.end - w.p)); }

// One AnyValue, not yet a Python object: its last value field (protobuf's oneof rule: the last one on
// the wire wins). Every reader of attribute values here starts from this.
struct RawValue {
  enum Type : uint8_t { kNone, kStr, kBool, kInt, kDouble, kArray, kKvList, kBytes } type = kNone;
  int64_t i = 0;              // bool, int
  double d = 0;               // double
  Wire w{nullptr, nullptr};   // string, array, kvlist, bytes: the field's bytes
};

RawValue ReadValue(Wire v) {
  RawValue out;
  while (v.More()) {
    uint32_t f, wt;
    v.Tag(&f, &wt);
    if ((f == 1 || (f >= 5 && f <= 7)) && wt == kLen) {
      out.type = f == 1 ? RawValue::kStr : RawValue::Type(RawValue::kArray + (f - 5));
      out.w = v.Sub();
    } else if ((f == 2 || f == 3) && wt == kVarint) {
      out.type = f == 2 ? RawValue::kBool : RawValue::kInt;
      out.i = int64_t(v.Varint());
    } else if (f == 4 && wt == kFixed64) {
      uint64_t bits = v.Fixed64();
      memcpy(&out.d, &bits, 8);
      out.type = RawValue::kDouble;
    } else {
      v.Skip(wt);
    }
  }
  return out;
}

// A scalar as Python (str, bool, int, float); None for anything else.
py::object Scalar(const RawValue& r) {
  switch (r.type) {
    case RawValue::kStr: return Utf8(r.w);
    case RawValue::kBool: return py::bool_(r.i != 0);
    case RawValue::kInt: return py::int_(r.i);
    case RawValue::kDouble: return py::float_(r.d);
    default: return py::none();
  }
}

// An AnyValue as Python: scalars as themselves; an array as a list of its elements' scalars (None for
// anything else); a kvlist as {key: None}; bytes as bytes.
py::object Value(Wire v) {
  RawValue r = ReadValue(v);
  if (r.type == RawValue::kArray) {
    py::list items;
    for (Wire arr = r.w, el; arr.Next(1, &el);) {
      if (size_t(py::len(items)) < kMaxArray) items.append(Scalar(ReadValue(el)));
    }
    return items;
  }
  if (r.type == RawValue::kKvList) {
    py::dict d;
    for (Wire kvl = r.w, kv; kvl.Next(1, &kv);)
      for (Wire key; kv.Next(1, &key);) d[Utf8(key)] = py::none();
    return d;
  }
  if (r.type == RawValue::kBytes) return Bytes(r.w);
  return Scalar(r);
}

// Key bytes -> position in the caller's key list, built once per decoder so a lookup needs no
// Python object. Keys are bucketed by length: a lookup compares the few keys of the same length
// (cheaper than hashing a 30-byte key, for the dozens of attributes of every span).
class KeyTable {
 public:
  explicit KeyTable(const py::handle& keys) {
    if (keys.is_none()) return;
    for (auto k : keys) {
      std::string key = k.cast<std::string>();
      if (key.size() >= by_len_.size()) by_len_.resize(key.size() + 1);
      by_len_[key.size()].emplace_back(key, size_++);
    }
  }
  size_t size() const { return size_; }
  // Position of `key`, or size() when it is not in the table.
  size_t Find(std::string_view key) const {
    if (key.size() >= by_len_.size()) return size_;
    for (const auto& [k, i] : by_len_[key.size()])
      if (memcmp(k.data(), key.data(), key.size()) == 0) return i;
    return size_;
  }

 private:
  size_t size_ = 0;
  std::vector<std::vector<std::pair<std::string, size_t>>> by_len_;
};

// KeyValue -> (key bytes, value bytes); false when it has no key.
bool SplitKeyValue(Wire kv, Wire* key, Wire* value) {
  bool has_key = false;
  *value = Wire{kv.p, kv.p};  // an absent value reads as an empty AnyValue
  while (kv.More()) {
    uint32_t f, wt;
    kv.Tag(&f, &wt);
    if (f == 1 && wt == kLen) {
      *key = kv.Sub();
      has_key = true;
    } else if (f == 2 && wt == kLen) {
      *value = kv.Sub();
    } else {
      kv.Skip(wt);
    }
  }
  return has_key;
}

// Python str objects for the strings that repeat in every span (names, communicators, functions, ...):
// one object each instead of one per span. Bounded: emptied when full (4,096 strings of at most 64 bytes,
// ~0.7 MiB with their objects); longer strings are not cached and are capped (Utf8Capped).
class StrCache {
 public:
  py::object Get(const Wire& w) {
    std::string_view v = w.View();
    if (v.size() > kMaxLen) return Utf8Capped(w);
    auto it = map_.find(v);
    if (it != map_.end()) return it->second;
    py::object s = Utf8(w);  // validates before caching
    if (map_.size() >= kMaxEntries) {
      map_.clear();
      owned_.clear();
    }
    owned_.emplace_back(v);
    map_.emplace(owned_.back(), s);
    return s;
  }

 private:
  static constexpr size_t kMaxLen = 64, kMaxEntries = 4096;
  std::deque<std::string> owned_;  // the keys' bytes (a deque: growing it moves no string)
  std::unordered_map<std::string_view, py::object> map_;
};

// SpanDecoder: an ExportTraceServiceRequest's wire bytes -> SpanRefs (mycroft_otel.processor.spans),
// the span's shape checked on the way. SpanRef is a NamedTuple whose fields are `kFieldNames` in this
// order (spans.py checks); each is built as a tuple of that type without a Python call.
//
// Shape (anything else is rejected and counted): a known span name (the op prefix, or the in-flight,
// status or summary span); a 16-byte trace id and an 8-byte span id; comm a string or absent; for all
// but summaries 0 <= rank < nranks <= 2^20; a status span's kind one of status_kinds. Root-cause spans
// (our own, written back) are counted as ignored. An op span whose op.state says in_flight is an in-flight
// snapshot. Attribute values of the wrong type read as absent.
//
// step: the span's place in its communicator's training step (step_key, an attribute of the span itself, not
// of its resource), read from all of its attributes -- after the flows too: the last one wins, as in a dict of
// them (AttrDecoder). Its value refuses nothing: 0 <= v < step_max is the place; kStepNone where no value is
// an int (bool is not), kStepBeyond for an int outside the range, kStepUnread where the span's attributes hold
// what only a full decode can judge (a string, array or list value under the key; a malformed attribute
// after the flows, which ingest does not read otherwise): the analysis reads that span's bytes itself.
class SpanDecoder {
 public:
  enum Field : int {
    kKind, kTraceId, kSpanId, kName, kStart, kEnd, kRank, kNranks, kComm, kSeq, kFunc, kSnapshot, kStatus,
    kAnomaly, kBaseline, kGlobalRank, kBytes, kLastProgress, kResource, kStopped, kFlowAt, kCount, kDatatype,
    kRecent, kStep, kRaw, kFields
  };
  static constexpr int64_t kStepNone = -1, kStepBeyond = -2, kStepUnread = -3;
  static constexpr const char* kFieldNames[kFields] = {
      "kind", "trace_id", "span_id", "name", "start_ns", "end_ns", "rank", "nranks", "comm", "seq", "func",
      "snapshot", "status", "anomaly", "baseline_ns", "global_rank", "nbytes", "last_progress_ns", "resource",
      "stopped", "flow_at", "count", "datatype", "recent", "step", "raw"};
  // The span attributes read here, in the order of the `attr_keys` tuple.
  enum Attr : int {
    aRank, aNranks, aComm, aSeq, aFunc, aState, aSnapshot, aStatus, aAnomaly, aBaseline, aGlobalRank, aBytes,
    aLastProgress, aStopped, aCount, aDatatype, aRecent, kAttrs
  };
  // The resource attributes read at ingest: host, pid, job and the job's shard (spans.py _RES_KEYS).
  static constexpr size_t kResourceKeys = 4;
  // The span kinds, in the order of the `kinds` and `names` tuples (names: the op span's prefix, then
  // the other spans' names; root cause last, it has no kind).
  enum Kind : int { kOp, kInflight, kStatusSpan, kSummary, kRootCause, kUnknown };

  SpanDecoder(py::object span_ref, py::object resource, const py::tuple& attr_keys, const py::tuple& resource_keys,
              const py::tuple& kinds, const py::tuple& names, const py::tuple& status_kinds, py::str in_flight,
              std::string flow_prefix, int64_t recent_max, std::string step_key, int64_t step_max)
      : span_ref_(std::move(span_ref)), resource_(std::move(resource)), attr_keys_(attr_keys),
        resource_keys_(resource_keys), in_flight_(in_flight.cast<std::string>()),
        flow_prefix_(std::move(flow_prefix)), step_key_(std::move(step_key)), recent_max_(recent_max),
        step_max_(step_max) {
    if (attr_keys_.size() != kAttrs || resource_keys_.size() != kResourceKeys || kinds.size() != kRootCause ||
        names.size() != kUnknown)
      throw py::value_error("SpanDecoder: wrong number of attribute keys, resource keys, kinds or names");
    if (!PyType_Check(span_ref_.ptr()) || !PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(span_ref_.ptr()),
                                                            &PyTuple_Type))
      throw py::type_error("SpanDecoder: span_ref must be a tuple type");
    for (size_t i = 0; i < kinds.size(); ++i) kinds_.push_back(kinds[i]);
    for (size_t i = 0; i < names.size(); ++i) names_.push_back(names[i].cast<std::string>());
    for (auto k : status_kinds) status_kinds_.push_back(k.cast<std::string>());
  }

  static py::tuple Fields() {
    py::tuple t(size_t{kFields});
    for (int i = 0; i < kFields; ++i) t[i] = py::str(kFieldNames[i]);
    return t;
  }

  // -> (spans seen, SpanRefs, ignored, rejected)
  py::tuple Decode(py::bytes data) const {
    std::string_view buf = BytesView(data);
    const uint8_t* base = reinterpret_cast<const uint8_t*>(buf.data());
    py::list refs;
    size_t seen = 0, ignored = 0, rejected = 0;
    Wire last_tid{nullptr, nullptr};
    py::object last_tid_obj;
    Wire req{base, base + buf.size()};
    for (Wire rs; req.Next(1, &rs);) {
      // The resource may come after the spans on the wire: read it first. Its attributes among the span
      // attributes read here are every span's values where the span has none (the agent sends what a rank's
      // spans share -- communicator, rank -- on the resource only).
      RawValue rvals[kResourceKeys], shared[kAttrs];
      for (Wire scan = rs, res; scan.Next(1, &res);) {
        for (Wire kv; res.Next(1, &kv);) {
          Wire key{nullptr, nullptr}, value{nullptr, nullptr};
          if (!SplitKeyValue(kv, &key, &value)) continue;
          size_t i = resource_keys_.Find(key.View());
          if (i < kResourceKeys) rvals[i] = ReadValue(value);
          size_t j = attr_keys_.Find(key.View());
          if (j < kAttrs) shared[j] = ReadValue(value);
        }
      }
      py::object resource = Resource(rvals);
      for (Wire ss; rs.Next(2, &ss);) {
        for (Wire sp; ss.Next(2, &sp);) {
          ++seen;
          Kind kind = Span(sp, base, data, resource, shared, &refs, &last_tid, &last_tid_obj);
          ignored += kind == kRootCause;
          rejected += kind == kUnknown;
        }
      }
    }
    return py::make_tuple(seen, refs, ignored, rejected);
  }

 private:
  // One Resource object per process (each batch repeats it), from a bounded cache. (host, pid, job, shard):
  // a value of the wrong type reads as absent, as for span attributes. Bytes: at most 4,096 entries of
  // two strings capped at kMaxStringBytes (Str), ~1 KiB each with their objects: ~4 MiB, outside the
  // trace byte budget by this statement (docs/reliability.md).
  py::object Resource(const RawValue (&vals)[kResourceKeys]) const {
    py::tuple key = py::make_tuple(Str(vals[0]), Int(vals[1]), Str(vals[2]), Int(vals[3]));
    PyObject* cached = PyDict_GetItem(resources_.ptr(), key.ptr());  // borrowed; str/int keys cannot raise
    if (cached != nullptr) return py::reinterpret_borrow<py::object>(cached);
    if (py::len(resources_) >= 4096) resources_.clear();
    py::object r = resource_(*key);
    resources_[key] = r;
    return r;
  }

  static py::int_ Int(const RawValue& v) { return py::int_(v.type == RawValue::kInt ? v.i : -1); }
  py::object Str(const RawValue& v) const { return v.type == RawValue::kStr ? strings_.Get(v.w) : py::object(empty_); }

  // The step attribute's values met so far in a span (see the class comment).
  struct Step {
    RawValue last;
    bool unread = false;

    // One KeyValue's value under the step key. A malformed value is the analysis's to refuse, as before
    // ingest read it: the span is marked unread instead.
    void Read(Wire value) {
      try {
        last = ReadValue(value);
        unread = unread || last.type == RawValue::kStr || last.type == RawValue::kArray ||
                 last.type == RawValue::kKvList;
      } catch (const py::value_error&) {
        unread = true;
      }
    }
    int64_t Place(int64_t max) const {
      if (unread) return kStepUnread;
      if (last.type != RawValue::kInt) return kStepNone;
      return last.i >= 0 && last.i < max ? last.i : kStepBeyond;
    }
  };

  // An attribute after the flows: only the step key is looked for (a malformed one marks the step unread;
  // the flows' own reader refuses it when the trace is analysed, as before).
  void StepAfterFlows(Wire kv, Step* step) const {
    if (step->unread) return;
    try {
      Wire key{nullptr, nullptr}, value{nullptr, nullptr};
      if (SplitKeyValue(kv, &key, &value) && key.View() == step_key_) step->Read(value);
    } catch (const py::value_error&) {
      step->unread = true;
    }
  }

  Kind Classify(std::string_view name) const {
    if (name.substr(0, names_[kOp].size()) == names_[kOp]) return kOp;
    for (int k = kInflight; k <= kRootCause; ++k)
      if (name == names_[k]) return Kind(k);
    return kUnknown;
  }

  // Adds the span's SpanRef to refs when it has our shape; returns its kind (kRootCause: ignored,
  // kUnknown: rejected).
  Kind Span(Wire sp, const uint8_t* base, const py::bytes& data, const py::object& resource,
            const RawValue (&shared)[kAttrs], py::list* refs, Wire* last_tid, py::object* last_tid_obj) const {
    const uint8_t* span_start = sp.p;
    size_t span_len = size_t(sp.end - sp.p);
    Wire tid{nullptr, nullptr}, sid{nullptr, nullptr}, name_w{nullptr, nullptr};
    uint64_t start = 0, end = 0;
    RawValue vals[kAttrs];
    std::copy(std::begin(shared), std::end(shared), std::begin(vals));
    int64_t flows_at = -1;
    Step step;
    while (sp.More()) {
      const uint8_t* field_start = sp.p;
      uint32_t f, wt;
      sp.Tag(&f, &wt);
      if (f == 1 && wt == kLen) {
        tid = sp.Sub();
      } else if (f == 2 && wt == kLen) {
        sid = sp.Sub();
      } else if (f == 5 && wt == kLen) {
        name_w = sp.Sub();
      } else if (f == 7 && wt == kFixed64) {
        start = sp.Fixed64();
      } else if (f == 8 && wt == kFixed64) {
        end = sp.Fixed64();
      } else if (f == 9 && wt == kLen && flows_at < 0) {
        // One KeyValue per field 9. Stop picking at the first flow attribute (the agent writes them
        // last); they are decoded when the trace is analysed (FlowDecoder).
        Wire key{nullptr, nullptr}, value{nullptr, nullptr};
        if (!SplitKeyValue(sp.Sub(), &key, &value)) continue;
        size_t i = attr_keys_.Find(key.View());
        if (i < kAttrs) vals[i] = ReadValue(value);
        if (key.View() == step_key_) step.Read(value);
        if (key.View().substr(0, flow_prefix_.size()) == flow_prefix_) flows_at = field_start - span_start;
      } else if (f == 9 && wt == kLen) {
        StepAfterFlows(sp.Sub(), &step);
      } else {
        sp.Skip(wt);
      }
    }
    // Every string we read is decoded (and so checked as UTF-8), as protobuf would, before any is judged.
    py::object strs[kAttrs];  // "" where the value is not a string
    for (int i = 0; i < kAttrs; ++i) strs[i] = Str(vals[i]);
    py::object name = name_w.p ? strings_.Get(name_w) : py::object(empty_);
    Kind kind = Classify(name_w.p ? name_w.View() : std::string_view());
    if (kind == kRootCause || kind == kUnknown) return kind;
    if (tid.end - tid.p != 16 || sid.end - sid.p != 8) return kUnknown;
    auto is_int = [&](int a) { return vals[a].type == RawValue::kInt; };
    auto int_or = [&](int a, int64_t otherwise) { return py::int_(is_int(a) ? vals[a].i : otherwise); };
    int64_t r = is_int(aRank) ? vals[aRank].i : -1, n = is_int(aNranks) ? vals[aNranks].i : -1;
    RawValue::Type comm = vals[aComm].type;  // a string, or absent (an array, kvlist or bytes reads as absent)
    if (comm == RawValue::kBool || comm == RawValue::kInt || comm == RawValue::kDouble) return kUnknown;
    if (kind != kSummary && (r < 0 || n <= 0 || r >= n || n > (int64_t(1) << 20))) return kUnknown;
    if (kind == kOp && vals[aState].type == RawValue::kStr && vals[aState].w.View() == in_flight_) kind = kInflight;
    if (kind == kStatusSpan) {
      std::string_view st = vals[aStatus].type == RawValue::kStr ? vals[aStatus].w.View() : std::string_view();
      bool known = false;
      for (const auto& k : status_kinds_) known |= st == k;
      if (!known) return kUnknown;
    }
    py::object func = strs[aFunc];
    if (kind == kOp && PyUnicode_GET_LENGTH(func.ptr()) == 0)
      func = py::str(name_w.View().substr(names_[kOp].size()));
    int64_t recent = is_int(aRecent) ? std::clamp(vals[aRecent].i, int64_t(0), recent_max_) : 0;
    // the spans of one trace come together in a payload: one trace id object for them (per call: a
    // decoder's members are shared by the receiver's threads, which may switch inside a call)
    if (!last_tid->p || tid.View() != last_tid->View()) {
      *last_tid = tid;
      *last_tid_obj = Bytes(tid);
    }

    PyTypeObject* type = reinterpret_cast<PyTypeObject*>(span_ref_.ptr());
    PyObject* ref = type->tp_alloc(type, kFields);
    if (ref == nullptr) throw py::error_already_set();
    py::object out = py::reinterpret_steal<py::object>(ref);
    auto set = [ref](int i, py::object v) { PyTuple_SET_ITEM(ref, i, v.release().ptr()); };
    set(kKind, kinds_[kind]);
    set(kTraceId, *last_tid_obj);
    set(kSpanId, Bytes(sid));
    set(kName, name);
    set(kStart, py::int_(start));
    set(kEnd, py::int_(end));
    set(kRank, py::int_(r));
    set(kNranks, py::int_(n));
    set(kComm, strs[aComm]);
    set(kSeq, int_or(aSeq, -1));
    set(kFunc, func);
    set(kSnapshot, int_or(aSnapshot, -1));
    set(kStatus, strs[aStatus]);
    set(kAnomaly, strs[aAnomaly]);
    set(kBaseline, int_or(aBaseline, 0));
    set(kGlobalRank, int_or(aGlobalRank, -1));
    set(kBytes, int_or(aBytes, 0));
    // an op span (completed or in flight) whose last progress is its end leaves it out (the agent's spans.py)
    bool op = kind == kOp || kind == kInflight;
    set(kLastProgress, is_int(aLastProgress) ? py::int_(vals[aLastProgress].i) : op ? py::int_(end) : py::int_(0));
    set(kResource, resource);
    set(kStopped, py::bool_(vals[aStopped].type == RawValue::kBool && vals[aStopped].i != 0));
    set(kFlowAt, py::int_(flows_at));
    set(kCount, int_or(aCount, -1));
    set(kDatatype, strs[aDatatype]);
    set(kRecent, py::int_(recent));
    set(kStep, py::int_(step.Place(step_max_)));
    set(kRaw, py::make_tuple(data, py::int_(span_start - base), py::int_(span_len)));
    // A SpanRef holds strings, numbers, bytes and its Resource: it can be in no reference cycle, so
    // the cyclic GC need not walk the store's hundreds of thousands of them on every full collection.
    PyObject_GC_UnTrack(ref);
    refs->append(out);
    return kind;
  }

  py::object span_ref_, resource_;
  KeyTable attr_keys_, resource_keys_;
  // Caches across payloads, shared by the receiver's threads: the GIL may pass to another thread inside a
  // call (Resource() runs Python code), so each is only touched by steps that run no Python code.
  mutable StrCache strings_;
  mutable py::dict resources_;
  py::str empty_{""};
  std::vector<py::object> kinds_;
  std::vector<std::string> names_, status_kinds_;
  std::string in_flight_, flow_prefix_, step_key_;
  int64_t recent_max_, step_max_;
};

// Decodes chosen attributes of spans that a SpanDecoder walked, on demand. Built once per key set:
// selection happens on the key bytes, so attributes not asked for cost no Python object, and the keys
// handed back are the caller's own str objects. keys None: every attribute.
class AttrDecoder {
 public:
  explicit AttrDecoder(const py::object& keys) : all_(keys.is_none()), keys_(keys) {
    if (!all_)
      for (auto k : keys) names_.push_back(py::reinterpret_borrow<py::str>(k));
  }

  // The attributes of the span at data[offset:offset+length], from byte `start` of the span on
  // (0: all; a SpanRef's flow_at to skip what ingest already read).
  py::dict Decode(py::bytes data, size_t offset, size_t length, size_t start) const {
    std::string_view buf = BytesView(data);
    if (offset > buf.size() || length > buf.size() - offset || start > length)
      throw py::value_error("span range outside the payload");
    const uint8_t* base = reinterpret_cast<const uint8_t*>(buf.data()) + offset;
    Wire sp{base + start, base + length};
    py::dict out;
    for (Wire kv; sp.Next(9, &kv);) {
      Wire key{nullptr, nullptr}, value{nullptr, nullptr};
      if (!SplitKeyValue(kv, &key, &value)) continue;
      if (all_) {
        out[Utf8(key)] = Value(value);
        continue;
      }
      size_t i = keys_.Find(key.View());
      if (i < keys_.size()) out[names_[i]] = Value(value);
    }
    return out;
  }

 private:
  bool all_;
  KeyTable keys_;                // same order as names_ (iteration of the same `keys`)
  std::vector<py::str> names_;   // the caller's own key objects, handed back as dict keys
};

// The flow arrays of spans a SpanDecoder walked, as one table of int64 for numpy: a row per
// flow, a column per key in `columns`. Rows: the length of the first column's array (at most
// kMaxArray); a shorter column reads 0 past its end, a longer one is cut. A non-int element reads
// 0. String columns (`names`: key -> tuple of strings) read the position of the element in
// their tuple, len(tuple) for any other string; a non-string element reads as "".
// Time columns (`offsets`) travel as ns after the span's start, negative for not yet: they read
// as the span's start plus the offset, 0 for not yet (semconv.flow_time). `absolute`: key ->
// the key older agents sent it under, as the time itself, read where the span has no offsets.
class FlowDecoder {
 public:
  FlowDecoder(const py::tuple& columns, const py::dict& names, const py::dict& same_as, const py::tuple& offsets,
              const py::dict& absolute)
      : width_(columns.size()) {
    py::list keys(columns);  // the columns, then the older keys of those that have one
    names_.resize(width_);
    same_as_.assign(width_, width_);
    offset_.assign(width_, false);
    for (size_t i = 0; i < width_; ++i) {
      py::object k = columns[i];
      for (auto o : offsets) offset_[i] = offset_[i] || o.equal(k);
      if (absolute.contains(k)) {
        if (!offset_[i]) throw py::value_error("FlowDecoder: an absolute key for a column that is no offset");
        keys.append(absolute[k]);
        absolute_of_.push_back(i);
      }
      if (names.contains(k)) {
        auto& values = names_[i].emplace();
        for (auto v : names[k].cast<py::tuple>()) values.push_back(v.cast<std::string>());
      }
    }
    keys_ = KeyTable(keys);
    for (size_t i = 0; i < width_; ++i) {
      py::object k = columns[i];
      if (!same_as.contains(k)) continue;
      size_t j = keys_.Find(same_as[k].cast<std::string>());
      if (j >= width_) throw py::value_error("FlowDecoder: a column's same_as is not a column");
      same_as_[i] = j;
    }
    for (size_t i = 0; i < width_; ++i) {
      size_t j = same_as_[i];
      if (j < width_ && same_as_[j] < width_)
        throw py::value_error("FlowDecoder: a column's same_as has a same_as of its own");
      if (j < width_ && offset_[i] != offset_[j])
        throw py::value_error("FlowDecoder: a time column's same_as is not one (or the other way)");
    }
  }

  size_t width() const { return width_; }

  // The rows of the spans -- SpanRefs: their flows lie in the payload range they keep (raw), from
  // their flow_at on -- appended in order; returns (table bytes, rows per span as int64 bytes).
  py::tuple Table(const py::sequence& refs) const {
    std::vector<int64_t> out, counts;
    std::vector<std::vector<int64_t>> cols(keys_.size());
    for (py::handle item : refs) {
      PyObject* ref = item.ptr();
      if (!PyTuple_Check(ref) || PyTuple_GET_SIZE(ref) != SpanDecoder::kFields)
        throw py::type_error("FlowDecoder.table: expected SpanRefs");
      PyObject* raw = PyTuple_GET_ITEM(ref, SpanDecoder::kRaw);
      int64_t start = py::reinterpret_borrow<py::object>(PyTuple_GET_ITEM(ref, SpanDecoder::kFlowAt)).cast<int64_t>();
      uint64_t span_start =
          py::reinterpret_borrow<py::object>(PyTuple_GET_ITEM(ref, SpanDecoder::kStart)).cast<uint64_t>();
      size_t rows = 0;
      if (start >= 0 && PyTuple_Check(raw) && PyTuple_GET_SIZE(raw) == 3) {
        py::tuple range = py::reinterpret_borrow<py::tuple>(raw);
        std::string_view buf = BytesView(range[0].cast<py::bytes>());
        size_t offset = range[1].cast<size_t>(), length = range[2].cast<size_t>();
        if (offset > buf.size() || length > buf.size() - offset || size_t(start) > length)
          throw py::value_error("span range outside the payload");
        rows = Decode(reinterpret_cast<const uint8_t*>(buf.data()) + offset, length, size_t(start), span_start,
                      &cols, &out);
      }
      counts.push_back(int64_t(rows));
    }
    auto as_bytes = [](const std::vector<int64_t>& v) {
      return py::bytes(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int64_t));
    };
    return py::make_tuple(as_bytes(out), as_bytes(counts));
  }

 private:
  size_t Decode(const uint8_t* span, size_t length, size_t start, uint64_t span_start,
                std::vector<std::vector<int64_t>>* cols, std::vector<int64_t>* out) const {
    for (auto& c : *cols) c.clear();
    Wire sp{span + start, span + length};
    for (Wire kv; sp.Next(9, &kv);) {
      Wire key{nullptr, nullptr}, value{nullptr, nullptr};
      if (!SplitKeyValue(kv, &key, &value)) continue;
      size_t i = keys_.Find(key.View());
      if (i < keys_.size()) Column(value, i < width_ ? i : absolute_of_[i - width_], &(*cols)[i]);
      // (the last attribute with the key wins, as in a dict)
    }
    size_t rows = (*cols)[0].size();
    size_t w = width_;
    for (size_t c = 0; c < w; ++c)
      if (offset_[c])  // (unsigned: a hostile offset wraps instead of overflowing)
        for (int64_t& v : (*cols)[c]) v = v < 0 ? 0 : int64_t(span_start + uint64_t(v));
    for (size_t a = 0; a < absolute_of_.size(); ++a)  // an older agent's times, where the span has no offsets
      if ((*cols)[absolute_of_[a]].empty()) (*cols)[absolute_of_[a]].swap((*cols)[w + a]);
    for (size_t c = 0; c < w; ++c)  // an array left out reads as its same_as array (the agent left it out as equal)
      if ((*cols)[c].empty() && same_as_[c] < w) (*cols)[c] = (*cols)[same_as_[c]];
    for (size_t r = 0; r < rows; ++r)
      for (size_t c = 0; c < w; ++c) out->push_back(r < (*cols)[c].size() ? (*cols)[c][r] : 0);
    return rows;
  }

  // One attribute's array (a scalar value is no array: no rows); `i`: the column it fills.
  void Column(Wire v, size_t i, std::vector<int64_t>* col) const {
    col->clear();
    RawValue r = ReadValue(v);
    if (r.type != RawValue::kArray) return;
    for (Wire arr = r.w; arr.More();) {
      int64_t x;
      if (!names_[i] && SmallInt(&arr, &x)) {
        if (col->size() < kMaxArray) col->push_back(x);
        continue;
      }
      Wire el;
      if (!arr.Next(1, &el)) break;
      if (col->size() < kMaxArray) col->push_back(Element(ReadValue(el), i));
    }
  }

  // The common element, an AnyValue holding only an int (0x0a len 0x18 varint), read in one go;
  // false (nothing consumed) for any other shape, which the general path reads.
  static bool SmallInt(Wire* arr, int64_t* out) {
    const uint8_t* p = arr->p;
    if (arr->end - p < 4 || p[0] != 0x0a || p[1] < 2 || p[1] > 11 || p[2] != 0x18 || p[1] > arr->end - p - 2)
      return false;
    const uint8_t* end = p + 2 + p[1];
    uint64_t v = 0;
    int shift = 0;
    for (const uint8_t* q = p + 3; q < end; ++q, shift += 7) {
      v |= uint64_t(*q & 0x7f) << shift;
      if ((*q & 0x80) == 0) {
        if (q + 1 != end) return false;  // more fields after the int: the general path
        *out = int64_t(v);
        arr->p = end;
        return true;
      }
    }
    return false;
  }

  int64_t Element(const RawValue& el, size_t i) const {
    if (!names_[i]) return el.type == RawValue::kInt ? el.i : 0;
    std::string_view s = el.type == RawValue::kStr ? el.w.View() : std::string_view();
    const auto& values = *names_[i];  // a handful: a scan beats a hash
    size_t j = 0;
    while (j < values.size() && values[j] != s) ++j;
    return int64_t(j);
  }

  size_t width_;
  KeyTable keys_{py::none()};  // the columns (0..width_), then the older keys of absolute_of_
  std::vector<std::optional<std::vector<std::string>>> names_;  // per column: its string values, if it has them
  std::vector<size_t> same_as_;  // per column: the column it reads as when left out (width_: none)
  std::vector<bool> offset_;     // per column: a time sent as an offset from the span's start
  std::vector<size_t> absolute_of_;  // per older key (keys_ from width_ on): the column it fills
};

}  // namespace

void RegisterOtlp(py::module_& m) {
  py::class_<SpanDecoder>(m, "SpanDecoder",
                          "An ExportTraceServiceRequest's wire bytes -> (spans seen, SpanRefs, ignored, rejected). "
                          "Raises ValueError on a malformed payload.")
      .def(py::init<py::object, py::object, const py::tuple&, const py::tuple&, const py::tuple&, const py::tuple&,
                    const py::tuple&, py::str, std::string, int64_t, std::string, int64_t>(),
           py::arg("span_ref"), py::arg("resource"), py::arg("attr_keys"), py::arg("resource_keys"),
           py::arg("kinds"), py::arg("names"), py::arg("status_kinds"), py::arg("in_flight"), py::arg("flow_prefix"),
           py::arg("recent_max"), py::arg("step_key"), py::arg("step_max"))
      .def_property_readonly_static("fields", [](py::object) { return SpanDecoder::Fields(); })
      .def("__call__", &SpanDecoder::Decode, py::arg("data"));
  py::class_<AttrDecoder>(m, "AttrDecoder",
                          "Chosen attributes of spans a SpanDecoder walked, decoded on demand from the payload.")
      .def(py::init<const py::object&>(), py::arg("keys"))
      .def("__call__", &AttrDecoder::Decode, py::arg("data"), py::arg("offset"), py::arg("length"),
           py::arg("start") = 0);
  py::class_<FlowDecoder>(m, "FlowDecoder",
                          "The flow arrays of spans a SpanDecoder walked, as one int64 table (a row per flow).")
      .def(py::init<const py::tuple&, const py::dict&, const py::dict&, const py::tuple&, const py::dict&>(),
           py::arg("columns"), py::arg("names"), py::arg("same_as"), py::arg("offsets"), py::arg("absolute"))
      .def_property_readonly("width", &FlowDecoder::width)
      .def("table", &FlowDecoder::Table, py::arg("refs"));
}

}  // namespace mycroft::bindings
