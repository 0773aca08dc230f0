// The activation mask the plugin asks NCCL for, per profiler ABI version (= NCCL release
// line), and the MYCROFT_KERNEL_EVENTS knob that overrides its kernel part.
//
// Why KernelCh is always on: Coll/P2p stop at launch and NCCL hands ProxyOps to the
// proxy thread around that moment, so a ProxyOp can start after its Coll stopped, and
// ops without proxy work (intra-node P2P/SHM/NVLS) have no other end at all. The
// KernelCh stop of every channel is the only completion signal NCCL gives; without it
// the plugin could not tell a finished collective from a hung one.
//
// What the kernel events cost NCCL (NVIDIA/nccl#2355, all_reduce_perf, 8 x A100):
//  * 2.27-2.30, KernelCh: the kernels write per-channel start/stop timestamps that a host
//    thread polls: 0.44% bus bandwidth on a 1 MB AllReduce with 2.29.7 (52.648 -> 52.418
//    GB/s), 0.1-1.1% from 128 KB to 4 MB.
//  * 2.31.2, KernelCh: asking for KernelCh also turns on the KernelPhase instrumentation
//    (phase timestamps and a system-scope fence in the kernel): 10.49% on the same test
//    (52.265 -> 46.783 GB/s), 4.3-13.3% from 128 KB to 4 MB. NVIDIA/nccl PR #2357 gates
//    the phase writes on the KernelPhase bit, after which that cost belongs to KernelPhase.
// So the default ("auto") asks for KernelCh everywhere and for KernelPhase only where its
// cost is paid anyway: NCCL 2.31.0-2.31.2 (read with ncclGetVersion at init; the ABI
// version alone cannot tell 2.31.2 from a fixed release). MYCROFT_KERNEL_EVENTS=phase
// asks for the phases on any v7 NCCL, =channel never.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "ops.h"

namespace mycroft::plugin {

namespace {

enum class KernelEvents { kAuto, kChannel, kPhase };

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

int NcclVersion() {
  // NCCL loaded us, so its symbols are in the process; ncclGetVersion is its public API
  // (X*10000 + Y*100 + Z since 2.9). Absent (a driver, a test): 0, treated as unknown.
  using GetVersionFn = int (*)(int*);
  auto fn = reinterpret_cast<GetVersionFn>(dlsym(RTLD_DEFAULT, "ncclGetVersion"));
  int v = 0;
  if (fn == nullptr || fn(&v) != 0 || v < 0) return 0;
  return v;
}

bool RequestedMask(int abi_version, int nccl_version, int* mask, char* err, size_t err_len) {
  const char* raw = getenv("MYCROFT_KERNEL_EVENTS");
  KernelEvents ke;
  if (!ParseKernelEvents(raw, &ke)) {
    snprintf(err, err_len, "MYCROFT_KERNEL_EVENTS='%.64s' is not one of auto, channel, phase", raw);
    return false;
  }
  int m = kEvColl | kEvP2p | kEvProxyOp | kEvProxyStep | kEvKernelCh;
  if (abi_version >= 5) m |= kEvGroupApi | kEvCollApi | kEvP2pApi;
  if (ke == KernelEvents::kAuto)
    ke = (nccl_version >= 23100 && nccl_version <= 23102) ? KernelEvents::kPhase : KernelEvents::kChannel;
  if (ke == KernelEvents::kPhase && abi_version >= 7) m |= kEvKernelPhase;
  *mask = m;
  return true;
}

}  // namespace mycroft::plugin
