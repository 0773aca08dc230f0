// The do-nothing reference: a v7 table whose callbacks only hand out a constant handle.
// Driving it the same way as the real plugin measures the harness and the indirect calls.
#include "mycroft/nccl_profiler_abi.h"

namespace abi = mycroft::nccl_abi;

namespace {
int g_ctx;
abi::Result Init(void** ctx, uint64_t, int* mask, const char*, int, int, int, abi::DebugLogger) {
  *ctx = &g_ctx;
  if (mask) *mask = 0x71e;
  return abi::Result::Success;
}
abi::Result Start(void*, void** h, abi::v7::EventDescr*) {
  *h = &g_ctx;
  return abi::Result::Success;
}
abi::Result Stop(void*) { return abi::Result::Success; }
abi::Result Record(void*, abi::v7::State, abi::v7::StateArgs*) { return abi::Result::Success; }
abi::Result Finalize(void*) { return abi::Result::Success; }
}  // namespace

extern "C" {
__attribute__((visibility("default"))) abi::v7::Profiler ncclProfiler_v7 = {"noop", Init, Start, Stop, Record,
                                                                             Finalize};
}
