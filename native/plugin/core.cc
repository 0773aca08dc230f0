// The version-independent core: turns normalised NCCL events into the live table and
// completion records (shm_layout.h). This file: Coll/P2p ops, KernelCh, completion,
// the ring, and the entry points; proxy.cc: ProxyOp/ProxyStep and the flow counters.
//
// Hot-path rules: no allocation, no locks, no syscalls (one vDSO clock read per
// callback), never blocks (every loop is bounded by a pool size), never throws.
//
// Completion rule (NCCL stops Coll/P2p at launch, not at completion):
//   an op completes when (a) its Coll/P2p event stopped (launched), (b) `n_channels`
//   KernelCh events stopped (NCCL's profiler proxy emits one KernelCh per channel the
//   op runs on, start = channel work started, stop = channel work done, on the proxy
//   progress thread or, 2.31+, the profiler thread), and (c) every ProxyOp it started
//   has stopped (network work; none for intra-node ops, and a send's ProxyOp usually
//   outlives its kernel). One counter `outstanding` holds 1 + n_channels +
//   started-but-not-stopped ProxyOps; the thread that takes it to 0 publishes the
//   record. Kernels of one communicator run in launch order, so the first KernelCh
//   start of a later launch (Group) also drops the KernelCh references earlier
//   launches hold for channels that never started (NCCL sent fewer KernelCh than
//   nChannels announced). A channel that started keeps its reference until its own stop:
//   NCCL 2.27-2.30 report KernelCh from the proxy thread's polling of the GPU's work
//   counters, and the stop of one channel can come a pass after the next launch's first
//   channel started (and after the op's last ProxyOp stopped). kLateKernelStopNs bounds
//   that wait. An op with n_channels == 0, or a context whose mask has no KernelCh (v7
//   by default, mask.cc), completes with its launch and ProxyOps alone. docs/native.md.
#include <cstring>
#include <unistd.h>

#include "ops.h"

namespace mycroft::plugin {

using shm::Flow;
using shm::LiveOp;
using shm::OpInfo;

namespace {

uint8_t NameIndex(const char* s, const char* const* names, size_t n) {
  if (s == nullptr) return shm::kUnknownIndex;
  for (size_t i = 0; i < n; ++i)
    if (strcmp(s, names[i]) == 0) return uint8_t(i);
  return shm::kUnknownIndex;
}
template <size_t N>
uint8_t NameIndex(const char* s, const char* const (&names)[N]) {
  return NameIndex(s, names, N);
}

}  // namespace

// ---- live slots ---------------------------------------------------------------------
// Slot generation modulo 4: 0 free, 1 initialising, 2 active (odd while the slot
// header is being written, as shm_layout.h promises readers). The scan starts at
// `hint`, a value the caller already owns (the op's sequence number): consecutive ops
// land on consecutive slots, which their predecessors usually freed, and no shared
// "next slot" word is written per op (it would bounce between NCCL's threads).
bool ClaimSlot(Context* c, uint64_t hint, uint32_t* slot, uint32_t* odd_gen) {
  uint32_t n = c->live_slots;
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t s = uint32_t((hint + i) % n);
    LiveOp& L = c->live[s];
    uint32_t g = Ld(L.generation);
    if ((g & 3) != 0) continue;
    if (__atomic_compare_exchange_n(&L.generation, &g, g + 1, false, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
      *slot = s;
      *odd_gen = g + 1;
      return true;
    }
  }
  return false;
}

// Decoded handle of `kind` whose payload is (slot << 20 | ... | generation & gen_mask)
// -> live slot, checking the generation (stale handles after completion) and that the
// context `c` it resolved to is alive. Callers resolve a handle once and pass it on.
static bool SlotFromHandle(Context* c, const Decoded& d, uint32_t kind, uint32_t gen_mask, OpRef* r) {
  if (c == nullptr || d.kind != kind || !c->alive.load(std::memory_order_acquire)) return false;
  uint32_t s = d.payload >> 20;
  if (s >= c->live_slots) return false;
  uint32_t g = LdAcq(c->live[s].generation);
  if ((g & 3) != 2 || (g & gen_mask) != (d.payload & gen_mask)) return false;
  *r = OpRef{c, s, g};
  return true;
}

bool OpFromHandle(Context* c, const Decoded& d, OpRef* r) { return SlotFromHandle(c, d, kHOp, 0xfffff, r); }

bool ParentOp(Context* c, const void* parent, OpRef* r) {
  Decoded pd;
  return Resolve(parent, &pd) == c && OpFromHandle(c, pd, r);
}

void Complete(Context* c, uint32_t s, uint64_t now) {
  OpInfo& op = c->live[s].op;
  St(op.end_ns, now);
  St(op.last_progress_ns, now);
  PublishOp(c, s, 0, now);
  FreeSlot(c, s);
  Add(c->hdr->ops_completed, uint64_t{1});
}

// Drops one completion reference; the last one publishes the op.
void Release(Context* c, uint32_t s, uint64_t now) {
  if (c->slots[s].outstanding.fetch_sub(1, std::memory_order_acq_rel) == 1) Complete(c, s, now);
}

// Takes a completion reference for a child that starts (ProxyOp). Refuses an op
// that already completed; undoes itself if the slot was reused meanwhile.
bool AcquireRef(const OpRef& r, uint64_t now) {
  auto& out = r.c->slots[r.slot].outstanding;
  int64_t v = out.load(std::memory_order_relaxed);
  for (int tries = 0; tries < 64; ++tries) {
    if (v <= 0) return false;
    if (out.compare_exchange_weak(v, v + 1, std::memory_order_acq_rel, std::memory_order_relaxed)) {
      if (!StillLive(r)) {
        Release(r.c, r.slot, now);
        return false;
      }
      return true;
    }
  }
  return false;
}

void MinStore(uint64_t& f, uint64_t v) {
  uint64_t cur = Ld(f);
  for (int i = 0; i < 16 && (cur == 0 || v < cur); ++i)
    if (__atomic_compare_exchange_n(&f, &cur, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) return;
}
void MaxStore(uint64_t& f, uint64_t v) {
  uint64_t cur = Ld(f);
  for (int i = 0; i < 16 && v > cur; ++i)
    if (__atomic_compare_exchange_n(&f, &cur, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) return;
}

// ---- Coll / P2p ---------------------------------------------------------------------
Result StartOp(Context* c, void** handle, const Descr& d, uint64_t now) {
  const bool p2p = (d.type == kEvP2p);
  uint8_t kind = uint8_t(shm::OpKind::kColl);
  uint64_t seq, slot_hint;
  uint8_t func = NameIndex(d.func, shm::kFuncNames);
  if (p2p) {
    int dir;
    if (func == uint8_t(shm::Func::kSend)) {
      dir = 0;
      kind = uint8_t(shm::OpKind::kP2pSend);
    } else if (func == uint8_t(shm::Func::kRecv)) {
      dir = 1;
      kind = uint8_t(shm::OpKind::kP2pRecv);
    } else {
      CountBadDescr(c);
      return Result::Success;
    }
    if (d.peer < 0 || d.peer >= c->nranks) {
      CountBadDescr(c);
      return Result::Success;
    }
    // Transfer number n per (peer, direction): the sender's n-th Send to a peer and
    // that peer's n-th Recv from the sender name the same transfer (design §2).
    seq = c->p2p_counts[size_t(d.peer) * 2 + dir].fetch_add(1, std::memory_order_relaxed);
    slot_hint = seq * 2 * uint64_t(c->nranks) + uint64_t(d.peer) * 2 + uint64_t(dir);
    Add(dir == 0 ? c->hdr->p2p_send_count_total : c->hdr->p2p_recv_count_total, uint64_t{1});
  } else {
    // Per-context collective number: every rank calls the collectives of a
    // communicator in the same order, so this agrees across ranks.
    seq = c->coll_seq.fetch_add(1, std::memory_order_relaxed);
    slot_hint = seq;
  }

  // API start time (v5+: parent is the CollApi/P2pApi handle).
  uint64_t api_ns = 0;
  Decoded pd;
  if (d.parent != nullptr && Resolve(d.parent, &pd) == c && pd.kind == kHApi && pd.payload != 0) {
    ApiEntry& e = c->api[(pd.payload - 1) % kApiEntries];
    if (uint32_t(e.tag.load(std::memory_order_acquire)) == pd.payload)
      api_ns = e.start_ns.load(std::memory_order_relaxed);
  }

  // The launch (Group) this op belongs to: v5+ parentGroup, v4 parentObj.
  uint32_t group = 0;
  Decoded gd;
  void* gh = c->abi_version >= 5 ? d.parent_group : d.parent;
  if (gh != nullptr && Resolve(gh, &gd) == c && gd.kind == kHGroup) group = gd.payload;

  uint32_t s, odd;
  if (!ClaimSlot(c, slot_hint, &s, &odd)) {
    Add(c->hdr->dropped_live_full, uint64_t{1});
    return Result::Success;
  }
  SlotCtl& ctl = c->slots[s];
  // Without KernelCh in the mask NCCL sends none: nothing to wait for.
  const uint32_t kernel_refs = (Ld(c->hdr->activation_mask) & int(kEvKernelCh)) ? d.n_channels : 0;
  ctl.outstanding.store(1 + int64_t(kernel_refs), std::memory_order_relaxed);
  ctl.launched.store(0, std::memory_order_relaxed);
  ctl.kref.store(KrefWord(odd + 1, false, 0, kernel_refs), std::memory_order_relaxed);
  ctl.superseded_ns.store(0, std::memory_order_relaxed);
  ctl.group.store(group, std::memory_order_relaxed);
  ctl.n_flows.store(0, std::memory_order_relaxed);
  for (int w = 0; w < 4; ++w) {
    ctl.kch_started_bits[w].store(0, std::memory_order_relaxed);
    ctl.kch_stopped_bits[w].store(0, std::memory_order_relaxed);
  }

  OpInfo op;
  memset(&op, 0, sizeof(op));
  // The header's started count doubles as the op id (one shared RMW per op, not two).
  op.op_id = Add(c->hdr->ops_started, uint64_t{1}) + 1;
  op.seq = seq;
  op.nccl_seq = p2p ? 0 : d.seq_number;
  op.count = d.count;
  uint8_t dt = NameIndex(d.datatype, shm::kDatatypeNames);
  uint64_t esz = dt == shm::kUnknownIndex ? 0 : shm::kDatatypeSizes[dt];
  op.bytes = (esz != 0 && d.count > UINT64_MAX / esz) ? UINT64_MAX : d.count * esz;
  op.kind = kind;
  op.func = func;
  op.datatype = dt;
  op.algo = p2p ? shm::kUnknownIndex : NameIndex(d.algo, shm::kAlgoNames);
  op.proto = p2p ? shm::kUnknownIndex : NameIndex(d.proto, shm::kProtoNames);
  op.n_channels = d.n_channels;
  op.abi_version = uint8_t(c->abi_version);
  if (p2p) {
    op.root_or_peer = d.peer;
  } else {
    op.root_or_peer = (func == uint8_t(shm::Func::kBroadcast) || func == uint8_t(shm::Func::kReduce) ||
                       func == uint8_t(shm::Func::kGather) || func == uint8_t(shm::Func::kScatter))
                          ? d.root
                          : -1;
  }
  op.api_ns = api_ns;
  op.user_tag = d.user_tag;
  op.start_ns = now;
  op.last_progress_ns = now;
  LiveOp& L = c->live[s];
  CopyWords(&L.op, &op, sizeof(op));
  // Generation first, state last: a reader lists a slot only once it is active, so a
  // writer preempted between the two stores leaves nothing half-visible (no torn copy).
  StRel(L.generation, odd + 1);
  StRel(L.state, uint32_t(shm::SlotState::kActive));  // publish: the slot header is complete
  *handle = MakeHandle(kHOp, c->index, c->inc, (s << 20) | ((odd + 1) & 0xfffff));
  return Result::Success;
}

void StopOp(const OpRef& r, uint64_t now) {
  St(r.c->live[r.slot].op.launch_ns, now);
  if (r.c->slots[r.slot].launched.exchange(1, std::memory_order_acq_rel) == 0) Release(r.c, r.slot, now);
}

// ---- KernelCh -------------------------------------------------------------------------
// Adds `open_delta` to the op's open-channel count and drops references as the rule
// in the header says; returns how many references the caller must release.
static uint32_t KrefUpdate(SlotCtl& ctl, uint32_t gen, int open_delta) {
  uint64_t v = ctl.kref.load(std::memory_order_relaxed);
  for (int tries = 0; tries < 64; ++tries) {
    if (uint32_t(v >> 32) != gen) return 0;
    bool sup = (v & kKrefSuperseded) != 0;
    uint32_t open = KrefOpen(v), held = KrefHeld(v);
    if (open_delta > 0) {
      ++open;
    } else if (open_delta < 0) {
      open = open > 0 ? open - 1 : 0;
      // Before a later launch: every stopped channel gives back one of the nChannels
      // references. After it: only the still-open channels keep one each.
      held = sup ? (held < open ? held : open) : (held > 0 ? held - 1 : 0);
    }
    uint64_t nv = KrefWord(gen, sup, open, held);
    if (ctl.kref.compare_exchange_weak(v, nv, std::memory_order_acq_rel, std::memory_order_relaxed))
      return KrefHeld(v) - held;
  }
  return 0;
}

Result StartKernelCh(Context* c, void** handle, const Descr& d, uint64_t now) {
  OpRef r;
  if (!ParentOp(c, d.parent, &r)) {
    CountBadHandle(c, shm::BadHandleKind::kKernelChStart);
    return Result::Success;
  }
  uint32_t ch = d.channel;
  SlotCtl& ctl = c->slots[r.slot];
  LiveOp& L = c->live[r.slot];
  OpInfo& op = L.op;
  uint64_t bit = 1ull << (ch & 63);
  if ((ctl.kch_started_bits[ch >> 6].fetch_or(bit, std::memory_order_relaxed) & bit) == 0) {
    KrefUpdate(ctl, r.gen, +1);
    if (ch < shm::kMaxKernelChannels) {
      // One thread reports a communicator's KernelCh and KernelPhase events (the proxy
      // thread, 2.31+ the profiler thread): plain relaxed stores; the valid bit goes last.
      shm::KernelChannel& k = L.kch[ch];
      St(k.start_ns, d.ptimer);
      St(k.end_ns, uint64_t{0});
      for (uint32_t p = 0; p < shm::kKernelPhases; ++p) {
        St(k.phase_start_ns[p], uint64_t{0});
        St(k.phase_end_ns[p], uint64_t{0});
      }
      __atomic_fetch_or(&op.kch_valid, uint32_t(1u << ch), __ATOMIC_RELEASE);
    }
    if (Add(op.kernel_ch_started, uint32_t{1}) == 0)
      ReleaseEarlierKernels(c, ctl.group.load(std::memory_order_relaxed), now);
  }
  if (d.ptimer != 0) {
    MinStore(op.kernel_start_ns, d.ptimer);
    __atomic_fetch_or(&op.flags, uint32_t(shm::kFlagKernelTimes), __ATOMIC_RELAXED);
  }
  St(op.last_progress_ns, now);
  *handle = MakeHandle(kHKernelCh, c->index, c->inc, (r.slot << 20) | (ch << 12) | (r.gen & 0xfff));
  return Result::Success;
}

static bool KernelChFromHandle(Context* c, const Decoded& d, OpRef* r, uint32_t* ch) {
  if (!SlotFromHandle(c, d, kHKernelCh, 0xfff, r)) return false;
  *ch = (d.payload >> 12) & 0xff;
  return true;
}

void StopKernelCh(const OpRef& r, uint32_t ch, uint64_t now) {
  SlotCtl& ctl = r.c->slots[r.slot];
  OpInfo& op = r.c->live[r.slot].op;
  uint64_t bit = 1ull << (ch & 63);
  if (ctl.kch_stopped_bits[ch >> 6].fetch_or(bit, std::memory_order_acq_rel) & bit) {
    CountBadHandle(r.c, shm::BadHandleKind::kKernelChStop);  // second stop of the same channel
    return;
  }
  Add(op.kernel_ch_stopped, uint32_t{1});
  St(op.last_progress_ns, now);
  if (ctl.kref.load(std::memory_order_relaxed) & kKrefSuperseded) Add(r.c->hdr->late_kernel_stops, uint64_t{1});
  // More KernelCh than coll.nChannels announced: the extra ones hold no reference.
  for (uint32_t k = KrefUpdate(ctl, r.gen, -1); k > 0; --k) Release(r.c, r.slot, now);
}

// Kernels of one communicator run one after another on the GPU. When the first
// channel of a later launch (Group) starts, every op of an earlier launch has
// finished its kernel work: channels of theirs that never started will not (NCCL
// emitted fewer KernelCh than nChannels said), so their references go now. Channels
// that started keep theirs until their stop arrives, up to kLateKernelStopNs after
// this first supersession; a launch after that deadline drops them too, and the op
// then ends at its last recorded progress.
void ReleaseEarlierKernels(Context* c, uint32_t group, uint64_t now) {
  if (group == 0) return;
  for (uint32_t s = 0; s < c->live_slots; ++s) {
    uint32_t g = Ld(c->live[s].generation);
    if ((g & 3) != 2) continue;
    SlotCtl& ctl = c->slots[s];
    uint32_t og = ctl.group.load(std::memory_order_relaxed);
    if (og == 0 || int32_t(group - og) <= 0) continue;
    uint64_t v = ctl.kref.load(std::memory_order_relaxed);
    if (uint32_t(v >> 32) != g || KrefHeld(v) == 0) continue;
    bool sup = (v & kKrefSuperseded) != 0;
    uint64_t since = ctl.superseded_ns.load(std::memory_order_relaxed);
    bool expired = sup && since != 0 && now - since > kLateKernelStopNs;
    if (sup && !expired) continue;
    uint32_t open = KrefOpen(v), held = KrefHeld(v);
    uint32_t keep = expired ? 0 : (held < open ? held : open);
    if (!ctl.kref.compare_exchange_strong(v, KrefWord(g, true, open, keep), std::memory_order_acq_rel)) continue;
    if (!sup) ctl.superseded_ns.store(now, std::memory_order_relaxed);
    // We hold (held - keep) references of that op: it cannot complete (or be reused)
    // before we drop them.
    int64_t k = int64_t(held - keep);
    if (k == 0) continue;
    uint64_t end = expired ? Ld(c->live[s].op.last_progress_ns) : now;
    if (ctl.outstanding.fetch_sub(k, std::memory_order_acq_rel) == k) Complete(c, s, end);
  }
}

// ---- KernelPhase (v7) ------------------------------------------------------------------
// A sub-event of one KernelCh: phase 0 initial sync (the channel waits for its peers
// before data moves), 1 compute, 2 final sync; GPU-timed start (descriptor) and stop
// (KernelPhaseStop state). Kept per channel for channels below kMaxKernelChannels.
Result StartKernelPhase(Context* c, void** handle, const Descr& d, uint64_t now) {
  Decoded pd;
  OpRef r;
  if (Resolve(d.parent, &pd) != c || !SlotFromHandle(c, pd, kHKernelCh, 0xfff, &r)) {
    CountBadHandle(c, shm::BadHandleKind::kKernelPhase);
    return Result::Success;
  }
  uint32_t ch = (pd.payload >> 12) & 0xff;
  if (d.phase >= shm::kKernelPhases) {
    CountBadDescr(c);
    return Result::Success;
  }
  if (ch >= shm::kMaxKernelChannels) {
    *handle = MakeHandle(kHIgnored, c->index, c->inc, 0);
    return Result::Success;
  }
  LiveOp& L = c->live[r.slot];
  if (d.ptimer != 0) St(L.kch[ch].phase_start_ns[d.phase], d.ptimer);
  __atomic_fetch_or(&L.op.flags, uint32_t(shm::kFlagKernelPhases), __ATOMIC_RELAXED);
  St(L.op.last_progress_ns, now);
  *handle = MakeHandle(kHKernelPhase, c->index, c->inc,
                       (r.slot << 20) | (ch << 12) | (uint32_t(d.phase) << 10) | (r.gen & 0x3ff));
  return Result::Success;
}

static bool KernelPhaseFromHandle(Context* c, const Decoded& d, OpRef* r, uint32_t* ch, uint32_t* phase) {
  if (!SlotFromHandle(c, d, kHKernelPhase, 0x3ff, r)) return false;
  *ch = (d.payload >> 12) & 0xff;
  *phase = (d.payload >> 10) & 3;
  return *ch < shm::kMaxKernelChannels && *phase < shm::kKernelPhases;
}

void StartApi(Context* c, void** handle, uint64_t now) {
  uint64_t cur = c->api_cursor.fetch_add(1, std::memory_order_relaxed);
  uint32_t tag = uint32_t(cur + 1);
  if (tag == 0) tag = 1;  // never hand out payload 0
  ApiEntry& e = c->api[(tag - 1) % kApiEntries];
  e.start_ns.store(now, std::memory_order_relaxed);
  e.tag.store(tag, std::memory_order_release);
  *handle = MakeHandle(kHApi, c->index, c->inc, tag);
}

// ---- publication (also used by finalize) ------------------------------------------------
// Ring record protocol. Record i (counted since the ring began) lives at ring[i % cap]
// and is published when seq == i + 1. While a writer fills it, seq = (i + 1) | kWriting.
// seq only ever grows: a writer that was lapped (a later writer of the same record
// claimed or published it while this one was descheduled) never lowers it, so a slow
// writer cannot hide a newer record behind an older sequence number.
void PublishOp(Context* c, uint32_t s, uint32_t extra_flags, uint64_t end_ns) {
  constexpr uint64_t kWriting = 1ull << 63;
  LiveOp& L = c->live[s];
  uint64_t idx = __atomic_fetch_add(&c->hdr->ring_head, uint64_t{1}, __ATOMIC_RELAXED);
  shm::RingRecord& R = c->ring[idx % c->ring_cap];
  const uint64_t target = idx + 1;
  uint64_t cur = Ld(R.seq);
  bool claimed = false;
  for (int tries = 0; tries < 16; ++tries) {
    if ((cur & ~kWriting) >= target) break;  // lapped: a newer record owns the slot, ours is lost
    // Acquire on the RMW keeps the payload stores below after the claim (readers that see
    // any of them then see the writing marker).
    if (__atomic_compare_exchange_n(&R.seq, &cur, target | kWriting, false, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
      claimed = true;
      break;
    }
  }
  if (!claimed) return;
  // Flows past a record's n_flows are kept zero, so only those the previous occupant
  // used need clearing (not all 64: the record is 6 KiB, an op usually has a few flows).
  uint32_t old_nf = Ld(R.op.n_flows);
  if (old_nf > shm::kMaxFlows) old_nf = shm::kMaxFlows;
  CopyWords(&R.op, &L.op, sizeof(OpInfo));
  if (extra_flags) St(R.op.flags, Ld(R.op.flags) | extra_flags);
  if (end_ns) St(R.op.end_ns, end_ns);
  uint32_t nf = Ld(L.op.n_flows);
  if (nf > shm::kMaxFlows) nf = shm::kMaxFlows;
  // Flows: every writer of this op has stopped (completion) or NCCL has stopped its
  // threads (finalize), so a plain copy is consistent.
  CopyWords(R.flows, L.flows, nf * sizeof(Flow));
  if (old_nf > nf) ZeroWords(R.flows + nf, (old_nf - nf) * sizeof(Flow));
  // Kernel channels: only those the op's kch_valid names (readers ignore the rest).
  for (uint32_t valid = Ld(L.op.kch_valid); valid != 0; valid &= valid - 1) {
    uint32_t ch = uint32_t(__builtin_ctz(valid));
    CopyWords(&R.kch[ch], &L.kch[ch], sizeof(shm::KernelChannel));
  }
  uint64_t mine = target | kWriting;
  // Fails only if a newer writer took the record over meanwhile: then it is theirs.
  __atomic_compare_exchange_n(&R.seq, &mine, target, false, __ATOMIC_RELEASE, __ATOMIC_RELAXED);
}

void FreeSlot(Context* c, uint32_t s) {
  LiveOp& L = c->live[s];
  // State first, then the generation straight to the next free value (never odd here):
  // the slot's content does not change on free, so a reader copying it meanwhile still
  // gets a consistent (just-finished) op, and a writer preempted between the stores
  // cannot make readers spin into a torn copy. The new generation retires old handles.
  uint32_t g = Ld(L.generation);
  StRel(L.state, uint32_t(shm::SlotState::kFree));
  StRel(L.generation, g + 2);
}

// ---- entry points ------------------------------------------------------------------------
Result CoreStart(void* context, void** handle, const Descr& d) {
  if (handle == nullptr) return Result::Success;
  *handle = nullptr;
  // PXN: a ProxyOp posted by another process runs on our proxy thread with BOTH its
  // parentObj and the `context` argument being that process's values. Touch neither
  // as ours: hand out a context-free Foreign handle; its ProxySteps (found through
  // that handle) are foreign too. Counted in the context the value names here, if
  // any (peer processes create communicators in the same order), else process-wide.
  if (d.type == kEvProxyOp && d.pid != g_pid.load(std::memory_order_relaxed)) {
    Decoded fd;
    Context* fc = DecodeHandle(context, &fd) && fd.kind == kHCtx ? LookupContext(fd.ctx, fd.inc) : nullptr;
    if (fc != nullptr && fc->alive.load(std::memory_order_relaxed)) Add(fc->hdr->pxn_foreign_ops, uint64_t{1});
    else g_foreign_ops.fetch_add(1, std::memory_order_relaxed);
    *handle = MakeHandle(kHForeign, 0xffff, 0xff, 0);
    return Result::Success;
  }
  if (d.type == kEvProxyStep) {
    Decoded pd;
    if (DecodeHandle(d.parent, &pd) && pd.kind == kHForeign) {
      *handle = MakeHandle(kHForeign, 0xffff, 0xff, 0);
      return Result::Success;
    }
  }
  Decoded cd;
  if (!DecodeHandle(context, &cd) || cd.kind != kHCtx) {
    g_null_handles.fetch_add(1, std::memory_order_relaxed);
    return Result::Success;
  }
  Context* c = LookupContext(cd.ctx, cd.inc);
  if (c == nullptr) return Result::Success;
  if (!c->alive.load(std::memory_order_acquire)) {
    CountBadHandle(c, shm::BadHandleKind::kStartAfterFinalize);
    return Result::Success;
  }
  uint64_t now = NowNs();
  Beat(c, now);
  switch (d.type) {
    case kEvColl:
    case kEvP2p:
      return StartOp(c, handle, d, now);
    case kEvProxyOp:
      return StartProxyOp(c, handle, d, now);
    case kEvProxyStep:
      return StartProxyStep(c, handle, d, now);
    case kEvKernelCh:
      return StartKernelCh(c, handle, d, now);
    case kEvKernelPhase:
      return StartKernelPhase(c, handle, d, now);
    case kEvGroupApi:
    case kEvCollApi:
    case kEvP2pApi:
      StartApi(c, handle, now);
      return Result::Success;
    case kEvGroup: {
      uint32_t gseq = c->group_seq.fetch_add(1, std::memory_order_relaxed) + 1;
      if (gseq == 0) gseq = c->group_seq.fetch_add(1, std::memory_order_relaxed) + 1;
      *handle = MakeHandle(kHGroup, c->index, c->inc, gseq);
      return Result::Success;
    }
    case kEvKernelLaunch:
    case kEvProxyCtrl:
    case kEvNetPlugin:
    case kEvCeColl:
    case kEvCeSync:
    case kEvCeBatch:
      *handle = MakeHandle(kHIgnored, c->index, c->inc, 0);
      return Result::Success;
    default:
      CountBadDescr(c);
      return Result::Success;
  }
}

Result CoreStop(void* handle) {
  if (handle == nullptr) {
    g_null_handles.fetch_add(1, std::memory_order_relaxed);
    return Result::Success;
  }
  Decoded d;
  Context* c = Resolve(handle, &d);
  if (c == nullptr) return Result::Success;  // not ours (or a long-gone context)
  uint64_t now = NowNs();
  shm::BadHandleKind bad = shm::BadHandleKind::kOther;
  switch (d.kind) {
    case kHOp: {
      OpRef r;
      if (OpFromHandle(c, d, &r)) {
        Beat(c, now);
        StopOp(r, now);
        return Result::Success;
      }
      bad = shm::BadHandleKind::kOpEnd;
      break;
    }
    case kHKernelCh: {
      OpRef r;
      uint32_t ch;
      if (KernelChFromHandle(c, d, &r, &ch)) {
        Beat(c, now);
        StopKernelCh(r, ch, now);
        return Result::Success;
      }
      bad = shm::BadHandleKind::kKernelChStop;
      break;
    }
    case kHKernelPhase: {
      OpRef r;
      uint32_t ch, phase;
      if (KernelPhaseFromHandle(c, d, &r, &ch, &phase)) return Result::Success;  // the stop state carries the time
      bad = shm::BadHandleKind::kKernelPhase;
      break;
    }
    case kHProxyOp: {
      ProxyRef r;
      if (ProxyFromHandle(c, d, false, &r)) {
        Beat(c, now);
        StopProxyOp(r, now);
        return Result::Success;
      }
      bad = shm::BadHandleKind::kProxyOpEnd;
      break;
    }
    case kHProxyStep: {
      ProxyRef r;
      if (ProxyFromHandle(c, d, true, &r)) {
        StepRec& st = r.pe->steps[r.step_slot];
        if (st.active.load(std::memory_order_relaxed)) {
          Beat(c, now);
          StepUpdate(r, st, false, uint8_t(shm::WaitState::kNone), 3, 0, now);
          return Result::Success;
        }
      }
      bad = shm::BadHandleKind::kProxyStepEnd;
      break;
    }
    case kHApi:
    case kHGroup:
    case kHIgnored:
    case kHForeign:
      if (c->alive.load(std::memory_order_relaxed)) return Result::Success;
      break;
    default:
      break;
  }
  CountBadHandle(c, bad);
  return Result::Success;
}

Result CoreRecord(void* handle, int state, uint64_t arg_size, uint64_t arg_ptimer, bool has_args, int max_state) {
  if (handle == nullptr) {
    g_null_handles.fetch_add(1, std::memory_order_relaxed);
    return Result::Success;
  }
  Decoded d;
  Context* c = Resolve(handle, &d);
  if (c == nullptr) return Result::Success;
  if (state < 0 || state > max_state) {
    CountBadDescr(c);
    return Result::Success;
  }
  uint64_t now = NowNs();
  shm::BadHandleKind bad = shm::BadHandleKind::kOther;
  switch (d.kind) {
    case kHProxyStep: {
      ProxyRef r;
      uint8_t wait, level;
      if (!StepStateInfo(state, &wait, &level)) {
        CountBadDescr(c);
        return Result::Success;
      }
      if (ProxyFromHandle(c, d, true, &r)) {
        StepRec& st = r.pe->steps[r.step_slot];
        if (st.active.load(std::memory_order_relaxed)) {
          Beat(c, now);
          // transSize is meaningful at SendWait (bytes sent) and RecvFlushWait (bytes received) only.
          bool sized = state == kStProxyStepSendWait || state == kStProxyStepRecvFlushWait;
          StepUpdate(r, st, false, wait, level, (has_args && sized) ? arg_size : 0, now);
          return Result::Success;
        }
      }
      bad = shm::BadHandleKind::kProxyStepEnd;
      break;
    }
    case kHKernelCh: {
      OpRef r;
      uint32_t ch;
      if (state != kStKernelChStop) return Result::Success;
      if (KernelChFromHandle(c, d, &r, &ch)) {
        if (has_args && arg_ptimer != 0) {
          LiveOp& L = r.c->live[r.slot];
          MaxStore(L.op.kernel_end_ns, arg_ptimer);
          if (ch < shm::kMaxKernelChannels) St(L.kch[ch].end_ns, arg_ptimer);
        }
        return Result::Success;
      }
      bad = shm::BadHandleKind::kKernelChState;
      break;
    }
    case kHKernelPhase: {
      OpRef r;
      uint32_t ch, phase;
      if (KernelPhaseFromHandle(c, d, &r, &ch, &phase)) {
        if (state == kStKernelPhaseStop && has_args && arg_ptimer != 0)
          St(r.c->live[r.slot].kch[ch].phase_end_ns[phase], arg_ptimer);
        return Result::Success;
      }
      bad = shm::BadHandleKind::kKernelPhase;
      break;
    }
    case kHProxyOp: {
      ProxyRef r;
      if (ProxyFromHandle(c, d, false, &r)) return Result::Success;  // ProxyOpInProgress: nothing to count
      bad = shm::BadHandleKind::kProxyOpEnd;
      break;
    }
    case kHOp: {
      OpRef r;
      if (OpFromHandle(c, d, &r)) return Result::Success;
      bad = shm::BadHandleKind::kOpEnd;
      break;
    }
    case kHApi:
    case kHGroup:
    case kHIgnored:
    case kHForeign:
      if (c->alive.load(std::memory_order_relaxed)) return Result::Success;
      break;
    default:
      break;
  }
  CountBadHandle(c, bad);
  return Result::Success;
}

}  // namespace mycroft::plugin
