// OTLP trace payloads (ExportTraceServiceRequest, protobuf wire format) -> what the
// processor's ingest reads, without building a protobuf object tree.
//
// The processor needs a handful of scalar attributes per span at ingest and the flow
// arrays of a few spans later, when a trace is analysed. Going through protobuf objects
// costs a Python call per field read; this walks the wire format once, picks the keys it
// was given, and leaves the rest where it is: each span comes back with its byte range in
// the payload, so an AttrDecoder can decode the rest later from the same bytes.
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
#include <cstring>
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

// The bytes object's own buffer (no copy; it lives as long as the caller's reference).
std::string_view BytesView(const py::bytes& b) {
  char* p = nullptr;
  Py_ssize_t n = 0;
  if (PyBytes_AsStringAndSize(b.ptr(), &p, &n) != 0) throw py::error_already_set();
  return {p, size_t(n)};
}

py::bytes Bytes(const Wire& w) { return py::bytes(reinterpret_cast<const char*>(w.p), size_t(w.end - w.p)); }

// Reads one AnyValue field whose tag was just read: a scalar (1 string, 2 bool, 3 int64,
// 4 double) sets *out and returns true; anything else is left unread (false).
bool ScalarField(Wire& v, uint32_t f, uint32_t wt, py::object* out) {
  if (f == 1 && wt == kLen) *out = Utf8(v.Sub());
  else if (f == 2 && wt == kVarint) *out = py::bool_(v.Varint() != 0);
  else if (f == 3 && wt == kVarint) *out = py::int_(int64_t(v.Varint()));
  else if (f == 4 && wt == kFixed64) {
    uint64_t bits = v.Fixed64();
    double d;
    memcpy(&d, &bits, 8);
    *out = py::float_(d);
  } else {
    return false;
  }
  return true;
}

// One AnyValue's scalar, or None (arrays, kvlists, bytes, absent). The last value field on
// the wire wins (protobuf's oneof rule).
py::object Scalar(Wire v) {
  py::object out = py::none();
  while (v.More()) {
    uint32_t f, wt;
    v.Tag(&f, &wt);
    if (ScalarField(v, f, wt, &out)) continue;
    v.Skip(wt);
    if (f >= 5 && f <= 7 && wt == kLen) out = py::none();
  }
  return out;
}

enum class ArrayAs { kAny, kInt, kStr };

// An AnyValue as Python: scalars as themselves; an array as a list (elements typed per `as`:
// kInt -> int, 0 for any other type; kStr -> str, "" otherwise; kAny -> scalar or None);
// a kvlist as {key: None}; bytes as bytes.
py::object Value(Wire v, ArrayAs as) {
  py::object out = py::none();
  while (v.More()) {
    uint32_t f, wt;
    v.Tag(&f, &wt);
    if (f == 5 && wt == kLen) {
      Wire arr = v.Sub();
      py::list items;
      for (Wire el; arr.Next(1, &el);) {
        if (size_t(py::len(items)) >= kMaxArray) continue;
        py::object x = Scalar(el);
        if (as == ArrayAs::kInt) {
          if (!py::isinstance<py::int_>(x) || py::isinstance<py::bool_>(x)) x = py::int_(0);
        } else if (as == ArrayAs::kStr) {
          if (!py::isinstance<py::str>(x)) x = py::str("");
        }
        items.append(x);
      }
      out = items;
    } else if (f == 6 && wt == kLen) {
      Wire kvl = v.Sub();
      py::dict d;
      for (Wire kv; kvl.Next(1, &kv);)
        for (Wire key; kv.Next(1, &key);) d[Utf8(key)] = py::none();
      out = d;
    } else if (f == 7 && wt == kLen) {
      out = Bytes(v.Sub());
    } else if (!ScalarField(v, f, wt, &out)) {
      v.Skip(wt);
    }
  }
  return out;
}

// Key bytes -> position in the caller's key list, built once per decoder so a lookup
// needs no Python object. Not copyable: the map views the strings it owns.
class KeyTable {
 public:
  explicit KeyTable(const py::handle& keys) {
    if (keys.is_none()) return;
    for (auto k : keys) bytes_.push_back(k.cast<std::string>());
    for (size_t i = 0; i < bytes_.size(); ++i) index_.emplace(bytes_[i], i);
  }
  KeyTable(const KeyTable&) = delete;
  KeyTable& operator=(const KeyTable&) = delete;
  size_t size() const { return bytes_.size(); }
  // Position of `key`, or size() when it is not in the table.
  size_t Find(std::string_view key) const {
    auto it = index_.find(key);
    return it == index_.end() ? size() : it->second;
  }

 private:
  std::vector<std::string> bytes_;
  std::unordered_map<std::string_view, size_t> index_;
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

// One KeyValue: if its key is in `keys`, its scalar value goes to out[position]. Returns the key.
std::string_view PickScalar(Wire kv, const KeyTable& keys, py::tuple& out) {
  Wire key{nullptr, nullptr}, value{nullptr, nullptr};
  if (!SplitKeyValue(kv, &key, &value)) return {};
  size_t i = keys.Find(key.View());
  if (i < keys.size()) {
    Utf8(key);  // protobuf rejects a key that is not UTF-8; so do we
    out[i] = Scalar(value);
  }
  return key.View();
}

py::tuple Nones(size_t n) {
  py::tuple t(n);
  for (size_t i = 0; i < n; ++i) t[i] = py::none();
  return t;
}

// ExportDecoder(span_keys, resource_keys, stop_prefix)(data) -> (spans_seen, resources, spans)
// resources: one tuple of resource attribute values (resource_keys order, None if absent) per
// ResourceSpans; spans: (resource index, trace_id, span_id, name, start_ns, end_ns, values,
// flows_at, span_offset, span_length) per span, values in span_keys order; flows_at is the
// offset, within the span, of its first attribute whose key starts with stop_prefix (-1 if
// none): decoding stops there at ingest, AttrDecoder starts there later. Built once: the
// key tables are made at construction, not per payload.
class ExportDecoder {
 public:
  ExportDecoder(const py::tuple& span_keys, const py::tuple& resource_keys, std::string stop_prefix)
      : span_keys_(span_keys), resource_keys_(resource_keys), stop_prefix_(std::move(stop_prefix)) {}

  py::tuple Decode(py::bytes data) const {
    std::string_view buf = BytesView(data);
    const uint8_t* base = reinterpret_cast<const uint8_t*>(buf.data());
    py::list resources, spans;
    size_t seen = 0;
    Wire req{base, base + buf.size()};
    for (Wire rs; req.Next(1, &rs);) {
      py::tuple rvals = Nones(resource_keys_.size());
      int res_index = int(py::len(resources));
      // The resource may come after the spans on the wire: read it first.
      for (Wire scan = rs, res; scan.Next(1, &res);)
        for (Wire kv; res.Next(1, &kv);) PickScalar(kv, resource_keys_, rvals);
      resources.append(rvals);
      for (Wire ss; rs.Next(2, &ss);) {
        for (Wire sp; ss.Next(2, &sp);) {
          ++seen;
          spans.append(Span(sp, base, res_index));
        }
      }
    }
    return py::make_tuple(seen, resources, spans);
  }

 private:
  py::tuple Span(Wire sp, const uint8_t* base, int res_index) const {
    const uint8_t* span_start = sp.p;
    size_t span_len = size_t(sp.end - sp.p);
    py::bytes tid(""), sid("");
    py::str name("");
    uint64_t start = 0, end = 0;
    py::tuple vals = Nones(span_keys_.size());
    int64_t flows_at = -1;
    while (sp.More()) {
      const uint8_t* field_start = sp.p;
      uint32_t f, wt;
      sp.Tag(&f, &wt);
      if (f == 1 && wt == kLen) {
        tid = Bytes(sp.Sub());
      } else if (f == 2 && wt == kLen) {
        sid = Bytes(sp.Sub());
      } else if (f == 5 && wt == kLen) {
        name = Utf8(sp.Sub());
      } else if (f == 7 && wt == kFixed64) {
        start = sp.Fixed64();
      } else if (f == 8 && wt == kFixed64) {
        end = sp.Fixed64();
      } else if (f == 9 && wt == kLen && flows_at < 0) {
        // One KeyValue per field 9. Stop picking at the first flow attribute; the
        // remaining attributes are decoded on demand (AttrDecoder).
        std::string_view k = PickScalar(sp.Sub(), span_keys_, vals);
        if (!stop_prefix_.empty() && k.substr(0, stop_prefix_.size()) == stop_prefix_)
          flows_at = field_start - span_start;
      } else {
        sp.Skip(wt);
      }
    }
    return py::make_tuple(res_index, tid, sid, name, py::int_(start), py::int_(end), vals, py::int_(flows_at),
                          py::int_(span_start - base), py::int_(span_len));
  }

  KeyTable span_keys_, resource_keys_;
  std::string stop_prefix_;
};

// Decodes chosen attributes of spans that an ExportDecoder walked, on demand. Built once per
// key set: selection happens on the key bytes, so attributes not asked for cost no Python
// object, and the keys handed back are the caller's own str objects.
//
// Arrays are typed: keys in str_keys hold strings (other elements read ""), other arrays
// ints (other elements read 0) -- unless the decoder is untyped (str_keys None): then
// elements keep their own scalar type (None for anything else). keys None: every attribute.
class AttrDecoder {
 public:
  AttrDecoder(const py::object& keys, const py::object& str_keys)
      : all_(keys.is_none()), typed_(!str_keys.is_none()), keys_(keys) {
    if (!all_) {
      for (auto k : keys) {
        py::str key = py::reinterpret_borrow<py::str>(k);
        names_.push_back(key);
        as_.push_back(!typed_ ? ArrayAs::kAny : str_keys.contains(key) ? ArrayAs::kStr : ArrayAs::kInt);
      }
    }
  }

  // The attributes of the span at data[offset:offset+length], from byte `start` of the span on
  // (0: all; an ExportDecoder flows_at to skip what ingest already read).
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
        out[Utf8(key)] = Value(value, ArrayAs::kAny);
        continue;
      }
      size_t i = keys_.Find(key.View());
      if (i < keys_.size()) out[names_[i]] = Value(value, as_[i]);
    }
    return out;
  }

 private:
  bool all_, typed_;
  KeyTable keys_;                // same order as names_ and as_ (iteration of the same `keys`)
  std::vector<py::str> names_;   // the caller's own key objects, handed back as dict keys
  std::vector<ArrayAs> as_;
};

}  // namespace

void RegisterOtlp(py::module_& m) {
  py::class_<ExportDecoder>(m, "ExportDecoder",
                            "Walks an ExportTraceServiceRequest's wire bytes: (spans seen, resource attribute "
                            "tuples, span tuples). Raises ValueError on a malformed payload.")
      .def(py::init<const py::tuple&, const py::tuple&, std::string>(), py::arg("span_keys"),
           py::arg("resource_keys"), py::arg("stop_prefix"))
      .def("__call__", &ExportDecoder::Decode, py::arg("data"));
  py::class_<AttrDecoder>(m, "AttrDecoder",
                          "Chosen attributes of spans an ExportDecoder walked, decoded on demand from the payload.")
      .def(py::init<const py::object&, const py::object&>(), py::arg("keys"), py::arg("str_keys"))
      .def("__call__", &AttrDecoder::Decode, py::arg("data"), py::arg("offset"), py::arg("length"),
           py::arg("start") = 0);
}

}  // namespace mycroft::bindings
