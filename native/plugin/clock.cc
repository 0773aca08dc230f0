// The virtual clock (internal.h explains why it exists and why relaxed atomics suffice).
#include <ctime>
#include <type_traits>

#include "internal.h"
#include "mycroft/virtual_clock.h"

namespace mycroft::plugin {

std::atomic<const uint64_t*> g_virtual_mono{nullptr};
std::atomic<int64_t> g_virtual_real_offset{0};

uint64_t RealtimeNs() {
  const uint64_t* v = g_virtual_mono.load(std::memory_order_relaxed);
  if (v != nullptr) {
    return __atomic_load_n(v, __ATOMIC_RELAXED) + uint64_t(g_virtual_real_offset.load(std::memory_order_relaxed));
  }
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

}  // namespace mycroft::plugin

namespace mp = mycroft::plugin;

// Not part of NCCL's ABI: only the simulator's driver calls it (docs/simulator.md, "Virtual time").
// The offset is stored before the pointer so a reader that sees the new clock never pairs it with
// the previous run's offset on this thread; realtime is read only at init, after this call.
extern "C" __attribute__((visibility("default"))) void mycroftProfilerSetClock(const uint64_t* mono_ns,
                                                                                int64_t realtime_offset_ns) {
  static_assert(std::is_same_v<decltype(&mycroftProfilerSetClock), mycroft::vclock::SetClockFn>);
  mp::g_virtual_real_offset.store(realtime_offset_ns, std::memory_order_relaxed);
  mp::g_virtual_mono.store(mono_ns, std::memory_order_release);
}
