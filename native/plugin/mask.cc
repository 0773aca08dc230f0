// The activation mask the plugin asks NCCL for, per profiler ABI version (= NCCL release
// line), and the MYCROFT_KERNEL_EVENTS knob that overrides its kernel part.
//
// What each event costs NCCL (docs/native.md, "Activation mask"):
//  * Coll/P2p, the API events, ProxyOp/ProxyStep: host-side callbacks only, counted by
//    benchmarks/plugin_hot_path.
//  * KernelCh makes NCCL's kernels write per-channel start/stop timestamps that a host
//    thread polls. On 2.27-2.30 that is cheap: NVIDIA/nccl#2355 measured 0.44% bus
//    bandwidth on a 1 MB AllReduce with NCCL 2.29.7 (52.648 -> 52.418 GB/s). On 2.31.2
//    asking for KernelCh alone also turns on the KernelPhase instrumentation (phase
//    timestamps plus a system-scope fence in the kernel): 10.49% on the same test
//    (52.265 -> 46.783 GB/s), 4.3-13.3% from 128 KB to 4 MB (NVIDIA/nccl PR #2357 gates the
//    phase writes on the KernelPhase bit). A profiler must not cost a tenth of the
//    bandwidth by default, and the ABI version cannot tell a fixed 2.31.x from 2.31.2,
//    so on v7 the default leaves kernel events off.
//  * KernelPhase (v7): the phase timestamps and the fence, i.e. the cost above, always.
// Without KernelCh an op completes with its launch and its ProxyOps (network work); ops
// without proxy work (intra-node P2P/SHM/NVLS) then end at launch.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "ops.h"

namespace mycroft::plugin {

namespace {

enum class KernelEvents { kAuto, kOff, kChannel, kPhase };

bool ParseKernelEvents(const char* raw, KernelEvents* out) {
  if (raw == nullptr) {
    *out = KernelEvents::kAuto;
    return true;
  }
  // Surrounding blanks are tolerated like every other knob; the words are exact.
  while (*raw == ' ' || *raw == '\t') ++raw;
  size_t n = strlen(raw);
  while (n > 0 && (raw[n - 1] == ' ' || raw[n - 1] == '\t')) --n;
  struct Word {
    const char* name;
    KernelEvents value;
  };
  static const Word kWords[] = {{"auto", KernelEvents::kAuto},
                                {"off", KernelEvents::kOff},
                                {"channel", KernelEvents::kChannel},
                                {"phase", KernelEvents::kPhase}};
  for (const Word& w : kWords) {
    if (n == strlen(w.name) && strncmp(raw, w.name, n) == 0) {
      *out = w.value;
      return true;
    }
  }
  return false;
}

}  // namespace

bool RequestedMask(int abi_version, int* mask, char* err, size_t err_len) {
  const char* raw = getenv("MYCROFT_KERNEL_EVENTS");
  KernelEvents ke;
  if (!ParseKernelEvents(raw, &ke)) {
    snprintf(err, err_len, "MYCROFT_KERNEL_EVENTS='%.64s' is not one of auto, off, channel, phase", raw);
    return false;
  }
  int m = kEvColl | kEvP2p | kEvProxyOp | kEvProxyStep;
  if (abi_version >= 5) m |= kEvGroupApi | kEvCollApi | kEvP2pApi;
  if (ke == KernelEvents::kAuto) ke = abi_version >= 7 ? KernelEvents::kOff : KernelEvents::kChannel;
  if (ke == KernelEvents::kChannel || ke == KernelEvents::kPhase) m |= kEvKernelCh;
  if (ke == KernelEvents::kPhase && abi_version >= 7) m |= kEvKernelPhase;
  *mask = m;
  return true;
}

}  // namespace mycroft::plugin
