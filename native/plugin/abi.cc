// The exported ncclProfiler_v4..v7 tables: thin adapters that copy each version's
// descriptor into the core's normalised Descr (core.cc). Everything else in the
// library is hidden (-fvisibility=hidden); these four symbols are the whole ABI.
#include <cstring>
#include <type_traits>

#include "internal.h"

namespace mycroft::plugin {
namespace {

template <class D>
inline constexpr bool kHasParentGroup = !std::is_same_v<D, abi::v4::EventDescr>;
// v7 adds coll/p2p.userTag and the KernelPhase event.
template <class D>
inline constexpr bool kIsV7 = std::is_same_v<D, abi::v7::EventDescr>;

// Fields common to every version's Coll/P2p/ProxyOp/ProxyStep/KernelCh members, plus v7's additions.
template <class D>
void CopyCommon(const D* e, Descr* d) {
  d->type = e->type;
  d->parent = e->parentObj;
  d->rank = e->rank;
  switch (d->type) {
    case kEvColl:
      d->seq_number = e->coll.seqNumber;
      d->func = e->coll.func;
      d->count = e->coll.count;
      d->root = e->coll.root;
      d->datatype = e->coll.datatype;
      d->n_channels = e->coll.nChannels;
      d->algo = e->coll.algo;
      d->proto = e->coll.proto;
      if constexpr (kHasParentGroup<D>) d->parent_group = e->coll.parentGroup;
      if constexpr (kIsV7<D>) d->user_tag = e->coll.userTag;
      break;
    case kEvP2p:
      d->func = e->p2p.func;
      d->datatype = e->p2p.datatype;
      d->count = e->p2p.count;
      d->peer = e->p2p.peer;
      d->n_channels = e->p2p.nChannels;
      if constexpr (kHasParentGroup<D>) d->parent_group = e->p2p.parentGroup;
      if constexpr (kIsV7<D>) d->user_tag = e->p2p.userTag;
      break;
    case kEvProxyOp:
      d->pid = e->proxyOp.pid;
      d->channel = e->proxyOp.channelId;
      d->peer = e->proxyOp.peer;
      d->n_steps = e->proxyOp.nSteps;
      d->chunk_size = e->proxyOp.chunkSize;
      d->is_send = e->proxyOp.isSend;
      break;
    case kEvProxyStep:
      d->step = e->proxyStep.step;
      break;
    case kEvKernelCh:
      d->channel = e->kernelCh.channelId;
      d->ptimer = e->kernelCh.pTimer;
      break;
    default:
      if constexpr (kIsV7<D>) {
        if (d->type == kEvKernelPhase) {
          d->channel = e->kernelPhase.channelId;
          d->phase = e->kernelPhase.phaseId;
          d->ptimer = e->kernelPhase.pTimer;
        }
      }
      break;
  }
}

// Event types each version defines; anything else is an out-of-range descriptor.
constexpr uint64_t kTypesV4 = (1u << 8) - 1;
constexpr uint64_t kTypesV5 = (1u << 12) - 1;
constexpr uint64_t kTypesV6 = (1u << 15) - 1;
constexpr uint64_t kTypesV7 = (1u << 16) - 1;

template <class D>
Result Start(void* context, void** handle, void* descr, uint64_t known_types) {
  if (handle == nullptr) return Result::Success;
  if (descr == nullptr) {
    *handle = nullptr;
    return Result::Success;
  }
  const D* e = static_cast<const D*>(descr);
  Descr d;
  CopyCommon(e, &d);
  // Exactly one known bit; unknown bits go to the core as an invalid type.
  if ((d.type & ~known_types) != 0 || d.type == 0 || (d.type & (d.type - 1)) != 0) d.type = 1ull << 40;
  return CoreStart(context, handle, d);
}

template <class A>
Result Record(void* handle, int state, A* args, int max_state) {
  uint64_t word = 0;
  if (args != nullptr) memcpy(&word, args, sizeof(word));  // transSize / pTimer share offset 0
  return CoreRecord(handle, state, word, word, args != nullptr, max_state);
}

// ---- v4 ----
Result InitV4(void** context, int* mask, const char* name, uint64_t hash, int n_nodes, int nranks, int rank,
              abi::DebugLogger logfn) {
  return CoreInit(4, context, mask, name, hash, 0, n_nodes, nranks, rank, logfn);
}
Result StartV4(void* context, void** handle, abi::v4::EventDescr* e) {
  return Start<abi::v4::EventDescr>(context, handle, e, kTypesV4);
}
Result RecordV4(void* handle, abi::v4::State s, abi::v4::StateArgs* a) { return Record(handle, int(s), a, 22); }

// ---- v5..v7 (same init signature: commId second) ----
template <int V>
Result InitV5Plus(void** context, uint64_t comm_id, int* mask, const char* name, int n_nodes, int nranks, int rank,
                  abi::DebugLogger logfn) {
  return CoreInit(V, context, mask, name, comm_id, comm_id, n_nodes, nranks, rank, logfn);
}
Result StartV5(void* context, void** handle, abi::v5::EventDescr* e) {
  return Start<abi::v5::EventDescr>(context, handle, e, kTypesV5);
}
Result StartV6(void* context, void** handle, abi::v6::EventDescr* e) {
  return Start<abi::v6::EventDescr>(context, handle, e, kTypesV6);
}
Result StartV7(void* context, void** handle, abi::v7::EventDescr* e) {
  return Start<abi::v7::EventDescr>(context, handle, e, kTypesV7);
}
Result RecordV5(void* handle, abi::v5::State s, abi::v5::StateArgs* a) { return Record(handle, int(s), a, 24); }
Result RecordV6(void* handle, abi::v6::State s, abi::v6::StateArgs* a) { return Record(handle, int(s), a, 30); }
Result RecordV7(void* handle, abi::v7::State s, abi::v7::StateArgs* a) { return Record(handle, int(s), a, 31); }

}  // namespace
}  // namespace mycroft::plugin

namespace mp = mycroft::plugin;
namespace mabi = mycroft::nccl_abi;

#define MYCROFT_EXPORT __attribute__((visibility("default")))

extern "C" {

MYCROFT_EXPORT mabi::v4::Profiler ncclProfiler_v4 = {mp::kPluginName, mp::InitV4, mp::StartV4, mp::CoreStop,
                                                     mp::RecordV4, mp::CoreFinalize};
MYCROFT_EXPORT mabi::v5::Profiler ncclProfiler_v5 = {mp::kPluginName, mp::InitV5Plus<5>, mp::StartV5, mp::CoreStop,
                                                     mp::RecordV5, mp::CoreFinalize};
MYCROFT_EXPORT mabi::v6::Profiler ncclProfiler_v6 = {mp::kPluginName, mp::InitV5Plus<6>, mp::StartV6, mp::CoreStop,
                                                     mp::RecordV6, mp::CoreFinalize};
MYCROFT_EXPORT mabi::v7::Profiler ncclProfiler_v7 = {mp::kPluginName, mp::InitV5Plus<7>, mp::StartV7, mp::CoreStop,
                                                     mp::RecordV7, mp::CoreFinalize};

}  // extern "C"
