// The plugin's virtual-clock entry point: a simulator (the ABI driver) sets the time the plugin
// stamps its records with. NCCL never looks this symbol up, so under NCCL the plugin reads
// CLOCK_MONOTONIC / CLOCK_REALTIME as usual.
//
//   void mycroftProfilerSetClock(const uint64_t* mono_ns, int64_t realtime_offset_ns);
//
// mono_ns: the caller-owned clock (nanoseconds, read with relaxed atomic loads; the caller updates
// it with atomic stores and keeps it alive until it calls the setter again with nullptr).
// realtime_offset_ns: CLOCK_REALTIME - CLOCK_MONOTONIC in that virtual time (what the header's
// start_realtime_ns - start_mono_ns will read). nullptr restores the real clocks.
// One clock per process (the plugin's timestamps are process-wide, like CLOCK_MONOTONIC).
#pragma once

#include <cstdint>

namespace mycroft::vclock {

inline constexpr const char kSetClockSymbol[] = "mycroftProfilerSetClock";
using SetClockFn = void (*)(const uint64_t* mono_ns, int64_t realtime_offset_ns);

}  // namespace mycroft::vclock
