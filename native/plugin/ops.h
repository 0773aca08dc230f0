// Shared internals of the event core: core.cc (ops, KernelCh, completion, ring,
// entry points) and proxy.cc (ProxyOp, ProxyStep, flows).
#pragma once

#include <cstring>

#include "context.h"

namespace mycroft::plugin {

inline constexpr uint64_t kHeartbeatEveryNs = 1000000;  // 1 ms: keep the header line mostly read-only

inline void Beat(Context* c, uint64_t now) {
  if (now - c->last_beat.load(std::memory_order_relaxed) > kHeartbeatEveryNs) {
    c->last_beat.store(now, std::memory_order_relaxed);
    St(c->hdr->heartbeat_ns, now);
  }
}

// Every unusable handle is counted twice: in the total and under the callback it came in,
// so a run that reports bad handles also says which events arrived late.
inline void CountBadHandle(Context* c, shm::BadHandleKind kind) {
  Add(c->hdr->dropped_bad_handle, uint64_t{1});
  uint32_t k = uint32_t(kind);
  Add(c->hdr->bad_handle_by_kind[k < shm::kBadHandleKinds ? k : uint32_t(shm::BadHandleKind::kOther)], uint64_t{1});
}
inline void CountBadDescr(Context* c) { Add(c->hdr->dropped_bad_descr, uint64_t{1}); }

// Word-wise relaxed atomic copy (structs are 8-byte aligned, sizes multiples of 8).
inline void CopyWords(void* dst, const void* src, size_t bytes) {
  auto* d = static_cast<uint64_t*>(dst);
  auto* s = static_cast<const uint64_t*>(src);
  for (size_t i = 0; i < bytes / 8; ++i) __atomic_store_n(d + i, __atomic_load_n(s + i, __ATOMIC_RELAXED), __ATOMIC_RELAXED);
}
inline void ZeroWords(void* dst, size_t bytes) {
  auto* d = static_cast<uint64_t*>(dst);
  for (size_t i = 0; i < bytes / 8; ++i) __atomic_store_n(d + i, uint64_t{0}, __ATOMIC_RELAXED);
}

// Resolves any handle to its context (alive or not); nullptr if not ours.
inline Context* Resolve(const void* h, Decoded* d) {
  if (!DecodeHandle(h, d)) return nullptr;
  return LookupContext(d->ctx, d->inc);
}

struct OpRef {
  Context* c;
  uint32_t slot;
  uint32_t gen;  // full, even generation of the slot while the op lives
};

inline bool StillLive(const OpRef& r) { return LdAcq(r.c->live[r.slot].generation) == r.gen; }

// core.cc
bool OpFromHandle(Context* c, const Decoded& d, OpRef* r);  // d: the handle as Resolve() decoded it into c
bool ParentOp(Context* c, const void* parent, OpRef* r);     // live Coll/P2p handle of context c
void Complete(Context* c, uint32_t s, uint64_t now);
void Release(Context* c, uint32_t s, uint64_t now);
bool AcquireRef(const OpRef& r, uint64_t now);
void ReleaseEarlierKernels(Context* c, uint32_t group, uint64_t now);

// KernelCh completion references (SlotCtl::kref): (slot generation << 32) | superseded
// (bit 31) | channels started and not yet stopped (bits 16..30) | references held (bits
// 0..15). One word, so a channel's stop and a later launch's release never race apart.
inline constexpr uint64_t kKrefSuperseded = 1ull << 31;
inline constexpr uint32_t KrefHeld(uint64_t v) { return uint32_t(v) & 0xffff; }
inline constexpr uint32_t KrefOpen(uint64_t v) { return (uint32_t(v) >> 16) & 0x7fff; }
inline constexpr uint64_t KrefWord(uint32_t gen, bool superseded, uint32_t open, uint32_t held) {
  return (uint64_t(gen) << 32) | (superseded ? kKrefSuperseded : 0) | (uint64_t(open & 0x7fff) << 16) |
         (held & 0xffff);
}
// How long a KernelCh that started but has not stopped keeps its op open after a later
// launch began (2.27-2.30: the proxy thread reports the stop on its next polling pass,
// microseconds to a few ms behind on a busy proxy; 2.31+: the profiler thread's next pass).
inline constexpr uint64_t kLateKernelStopNs = 200ull * 1000000ull;

// proxy.cc
struct ProxyRef {
  Context* c;
  ProxyEntry* pe;
  uint32_t idx;
  uint32_t step_slot;
};
Result StartProxyOp(Context* c, void** handle, const Descr& d, uint64_t now);
Result StartProxyStep(Context* c, void** handle, const Descr& d, uint64_t now);
bool ProxyFromHandle(Context* c, const Decoded& d, bool step, ProxyRef* r);
void StopProxyOp(const ProxyRef& r, uint64_t now);
bool StepStateInfo(int state, uint8_t* wait, uint8_t* level);
void StepUpdate(const ProxyRef& r, StepRec& st, bool start, uint8_t wait, uint8_t new_level, uint64_t bytes,
                uint64_t now);

}  // namespace mycroft::plugin
