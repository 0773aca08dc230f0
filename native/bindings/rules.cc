// The agent's local rules, run for every completed op in its poll loop (mycroft_otel/agent/sampling.py documents
// them; this is where they run). At 8 ranks x 100 collectives/s the Python flow rule cost the agent more than a
// point of a core (its dictionaries and per-value arithmetic, not the numbers), the duration baselines a tenth of
// one beside it.
//
// Each baseline is a running mean and mean absolute deviation (alpha), seeded by the median and median absolute
// deviation of its first `warmup` values so that a slow first iteration does not inflate it, plus a fast mean
// (alpha 0.3) that a sustained shift moves first.
// - FlowRule, on an op's own flow counters. Per (function, size bucket): the rank's GPU (receive side) wait per
//   step and its least-waiting send flow's network wait per step (its NIC); per (function, size bucket, channel,
//   peer): each send flow's.
// - Baselines, on an op's duration and on the gap since the communicator's previous op ended, per (function,
//   size bucket): a straggler's own collective is short, only its late arrival marks it.
// The arithmetic is the Python rules', in the same order, on doubles.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "bindings.h"
#include "mycroft/shm_layout.h"

namespace mycroft::bindings {
namespace {

using shm::Flow;

struct Ewma {
  int64_t n = 0;
  double value = 0.0, dev = 0.0, fast = 0.0;
  std::vector<double> first;  // the seed values while seeding (reserved once: `warmup` doubles)
  bool seeding = true;

  void Add(double x, double alpha, size_t seed) {
    ++n;
    if (seeding) {
      first.push_back(x);
      std::vector<double> v(first);
      std::sort(v.begin(), v.end());
      value = fast = v[v.size() / 2];
      for (double& y : v) y = std::fabs(y - value);
      std::sort(v.begin(), v.end());
      dev = v[v.size() / 2];
      if (v.size() >= seed) {
        seeding = false;
        first = std::vector<double>();
      }
      return;
    }
    dev += alpha * (std::fabs(x - value) - dev);
    value += alpha * (x - value);
    fast += 0.3 * (x - fast);
  }
};

struct Key {
  int64_t func, bits, channel, peer;  // channel, peer: -1 for the per-rank baselines
  bool operator==(const Key& o) const {
    return func == o.func && bits == o.bits && channel == o.channel && peer == o.peer;
  }
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = uint64_t(k.func) * 0x9E3779B97F4A7C15ull ^ uint64_t(k.bits) * 0xC2B2AE3D27D4EB4Full;
    h ^= uint64_t(k.channel + 1) * 0x165667B19E3779F9ull ^ uint64_t(k.peer + 1) * 0x27D4EB2F165667C5ull;
    return size_t(h ^ (h >> 29));
  }
};

using Table = std::unordered_map<Key, Ewma, KeyHash>;

// The baseline of `key`, created on first use (its seed values reserved once); a full table starts over: bounded
// memory whatever keys a ring's records bring.
Ewma& Baseline(Table& table, const Key& key, size_t max_keys, size_t seed) {
  auto it = table.find(key);
  if (it == table.end()) {
    if (table.size() >= max_keys) table.clear();
    it = table.emplace(key, Ewma()).first;
    it->second.first.reserve(seed);
  }
  return it->second;
}

class FlowRule {
 public:
  FlowRule(double factor, double sib_factor, int64_t warmup, int64_t min_step_ns, double alpha, int64_t max_keys)
      : factor_(factor), sib_factor_(sib_factor), warmup_(warmup), min_step_ns_(double(min_step_ns)),
        alpha_(alpha), seed_(size_t(std::max<int64_t>(1, warmup))), max_keys_(size_t(std::max<int64_t>(1, max_keys))) {}

  bool Classify(int64_t func, uint64_t nbytes, const py::array& flows) {
    if (!py::array_t<Flow, 0>::check_(flows) || flows.ndim() != 1)
      throw py::type_error("FlowRule.classify: flows must be a 1-d array of FLOW_DTYPE records");
    const ssize_t n = flows.shape(0);
    if (n == 0) return false;
    const int64_t bits = nbytes ? 64 - __builtin_clzll(nbytes) : 0;  // Python's int.bit_length()
    const char* base = static_cast<const char*>(flows.data());
    const ssize_t stride = flows.strides(0);
    sends_.clear();
    uint64_t gpu_busy = 0, gpu_steps = 0;
    bool any_recv = false;
    for (ssize_t i = 0; i < n; ++i) {
      const Flow& f = *reinterpret_cast<const Flow*>(base + i * stride);
      const uint64_t steps = f.n_steps > 1 ? f.n_steps : 1;
      if (f.dir & 1) {
        any_recv = true;
        gpu_busy += f.gpu_busy_ns;
        gpu_steps += steps;
      } else {
        // a send flow's busy time per step (the union of its steps' waits: the processor's measure)
        sends_.push_back({double(f.net_busy_ns) / double(steps), f.channel, f.peer});
      }
    }
    bool hit = false;
    // one send flow far above its own history and above the median of the rank's other send flows
    if (sends_.size() >= 2) {
      for (size_t j = 0; j < sends_.size(); ++j) {
        others_.clear();
        for (size_t k = 0; k < sends_.size(); ++k)
          if (k != j) others_.push_back(sends_[k].x);
        std::sort(others_.begin(), others_.end());
        const double med = others_[others_.size() / 2];
        const bool above = Check(flow_, {func, bits, sends_[j].channel, sends_[j].peer}, sends_[j].x);
        if (above && sends_[j].x >= sib_factor_ / 2 * std::max(med, 1.0)) hit = true;
      }
    }
    // the rank's GPU (receive side) against its own history
    if (any_recv) hit = Check(gpu_, {func, bits, -1, -1}, double(gpu_busy) / double(gpu_steps)) || hit;
    // every send flow slower than before: the least-waiting one against its history
    if (!sends_.empty()) {
      double least = sends_[0].x;
      for (const Send& s : sends_) least = std::min(least, s.x);
      hit = Check(net_, {func, bits, -1, -1}, least) || hit;
    }
    return hit;
  }

  size_t keys() const { return gpu_.size() + net_.size() + flow_.size(); }

 private:
  struct Send {
    double x;
    int64_t channel, peer;
  };

  bool Check(Table& table, const Key& key, double x) {
    Ewma& e = Baseline(table, key, max_keys_, seed_);
    if (e.n < warmup_) {
      e.Add(x, alpha_, seed_);
      return false;
    }
    const double v = e.value;
    const bool hit = x >= factor_ * v && x - v >= std::max(min_step_ns_, 4 * e.dev);
    // clipped, and slow while above: a sustained slowdown stays flagged for dozens of collectives (the processor
    // names it only once it recurs), a new regime is still absorbed in the end
    e.Add(std::min(x, 2 * factor_ * v), hit ? alpha_ / 16 : alpha_, seed_);
    return hit;
  }

  const double factor_, sib_factor_;
  const int64_t warmup_;
  const double min_step_ns_, alpha_;
  const size_t seed_, max_keys_;
  Table gpu_, net_, flow_;
  std::vector<Send> sends_;    // scratch, reused per op (no allocation once warm)
  std::vector<double> others_;
};

// The slow / late rule of one rank context: an op is slow when its duration is an outlier of its (function, size)
// baseline (>= factor x the mean, and above it by max(min_excess, k_dev x deviation)) or the fast mean shifted
// (>= factor x the mean) with this op as slow; late when the gap before it is such an outlier of the gaps.
class Baselines {
 public:
  Baselines(double factor, int64_t warmup, int64_t min_excess_ns, double alpha, double k_dev, int64_t max_keys,
            py::str slow, py::str late)
      : factor_(factor), warmup_(warmup), min_excess_(double(min_excess_ns)), alpha_(alpha), k_dev_(k_dev),
        seed_(size_t(std::max<int64_t>(1, warmup))), max_keys_(size_t(std::max<int64_t>(1, max_keys))),
        slow_(std::move(slow)), late_(std::move(late)) {}

  // (anomaly, baseline_ns, gap_ns or None) when the op is anomalous, else None; every op updates the baselines.
  py::object Classify(int64_t func, uint64_t nbytes, uint64_t arrive_ns, uint64_t end_ns) {
    const Key key{func, nbytes ? 64 - __builtin_clzll(nbytes) : 0, -1, -1};  // Python's int.bit_length()
    // (the times come from a ring file another process writes: any uint64, so differences in 128 bits)
    const double dur = double(__int128(end_ns) - __int128(arrive_ns));
    const bool has_gap = prev_end_ && arrive_ns > prev_end_;
    const uint64_t gap = arrive_ns - prev_end_;  // (used only when has_gap: no wrap)
    if (end_ns > prev_end_) prev_end_ = end_ns;
    py::object result = py::none();
    Ewma& d = Baseline(dur_, key, max_keys_, seed_);
    const bool warm = d.n >= warmup_;
    if (has_gap) {
      Ewma& g = Baseline(gap_, key, max_keys_, seed_);
      if (g.n >= warmup_ && Exceeds(g, double(gap))) result = py::make_tuple(late_, Ns(g.value), gap);
      Update(g, double(gap));
    }
    const double base = d.value;
    const bool outlier = warm && Exceeds(d, dur);
    if (dur >= 0) Update(d, dur);  // the fast mean includes this op: a shift is seen at once
    const bool shift = warm && Shifted(d) && dur >= factor_ * d.value;
    if (result.is_none() && (outlier || shift)) result = py::make_tuple(slow_, Ns(base), py::none());
    return result;
  }

  // An idle time longer than factor x the longest usual gap before an op (any function and size), once the gaps
  // are learnt: the rank is not merely between steps.
  bool UnusualIdle(double idle_ns) const {
    double usual = -INFINITY;
    for (const auto& kv : gap_)
      if (kv.second.n >= warmup_) usual = std::max(usual, kv.second.value + k_dev_ * kv.second.dev);
    return usual != -INFINITY && idle_ns >= factor_ * std::max(usual, min_excess_);
  }

  size_t keys() const { return dur_.size() + gap_.size(); }

 private:
  // a baseline as integer ns (Python's int(); a hostile ring's times can put it beyond int64)
  static int64_t Ns(double v) { return v >= 9.2e18 ? INT64_MAX : v <= -9.2e18 ? INT64_MIN : int64_t(v); }

  bool Exceeds(const Ewma& e, double x) const {
    return x >= factor_ * e.value && x - e.value >= std::max(min_excess_, k_dev_ * e.dev);
  }

  bool Shifted(const Ewma& e) const { return e.fast >= factor_ * e.value && e.fast - e.value >= min_excess_; }

  // Anomalies update the baseline too (a new regime is absorbed in ~1/alpha ops instead of locking in one learnt
  // from an unusual warm-up), clipped and four times slower while shifted: a sustained slowdown stays visible for
  // a few dozen ops.
  void Update(Ewma& e, double x) {
    if (e.n >= warmup_) e.Add(std::min(x, 2 * factor_ * e.value), Shifted(e) ? alpha_ / 4 : alpha_, seed_);
    else e.Add(x, alpha_, seed_);
  }

  const double factor_;
  const int64_t warmup_;
  const double min_excess_, alpha_, k_dev_;
  const size_t seed_, max_keys_;
  const py::str slow_, late_;
  uint64_t prev_end_ = 0;  // end of the communicator's previous op (monotonic ns)
  Table dur_, gap_;
};

}  // namespace

void RegisterRules(py::module_& m) {
  py::class_<FlowRule>(m, "FlowRule",
                       "The agent's local rule on a completed op's own flow counters (agent/sampling.py).")
      .def(py::init<double, double, int64_t, int64_t, double, int64_t>(), py::arg("factor") = 3.0,
           py::arg("sib_factor") = 8.0, py::arg("warmup") = 8, py::arg("min_step_ns") = 20000,
           py::arg("alpha") = 0.1, py::arg("max_keys") = 4096)
      .def("classify", &FlowRule::Classify, py::arg("func"), py::arg("nbytes"), py::arg("flows"),
           "True when the op looks slow by its flows (``flows``: its valid FLOW_DTYPE records).")
      .def_property_readonly("keys", &FlowRule::keys, "Baselines held (bounded by max_keys per table).");
  py::class_<Baselines>(m, "Baselines", "The agent's local slow / late rule of one rank context (agent/sampling.py).")
      .def(py::init<double, int64_t, int64_t, double, double, int64_t, py::str, py::str>(), py::arg("factor"),
           py::arg("warmup"), py::arg("min_excess_ns"), py::arg("alpha"), py::arg("k_dev"), py::arg("max_keys"),
           py::arg("slow"), py::arg("late"))
      .def("classify", &Baselines::Classify, py::arg("func"), py::arg("nbytes"), py::arg("arrive_ns"),
           py::arg("end_ns"), "Update with one completed op; (anomaly, baseline_ns, gap_ns or None) when anomalous.")
      .def("unusual_idle", &Baselines::UnusualIdle, py::arg("idle_ns"),
           "An idle time beyond factor x the longest usual gap before an op, once the gaps are learnt.")
      .def_property_readonly("keys", &Baselines::keys, "Baselines held (bounded by max_keys per table).");
}

}  // namespace mycroft::bindings
