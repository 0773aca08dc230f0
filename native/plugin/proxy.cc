// ProxyOp and ProxyStep events: the per-flow Mycroft chunk counters (design §3).
//
// A ProxyOp (one network transfer of an op on one channel, posted by the proxy thread)
// finds or claims the op's Flow for (channel, direction, peer) and a private ProxyEntry
// that tracks its up to NCCL_STEPS outstanding steps; each step start/state/stop moves
// that step's level (posted -> ready -> transmitted -> done) and updates the flow inside
// its seqlock.
#include "ops.h"

namespace mycroft::plugin {

using shm::Flow;
using shm::LiveOp;

namespace {

// Flow update inside its seqlock. One writer per flow at a time (the proxy thread
// that progresses the channel). Ordering, weakest that is correct:
//   version = v+1 (relaxed); release fence  -> any reader that observes one of the
//     following data stores (and issues its acquire fence) also observes v+1;
//   data stores (relaxed);
//   version = v+2 (release)                  -> a reader that acquires v+2 sees all data.
// Readers: v1 = load-acquire; copy (relaxed); acquire fence; v2 = load; accept iff
// v1 == v2 and even.
struct FlowWrite {
  Flow& f;
  uint32_t v;
  explicit FlowWrite(Flow& fl) : f(fl), v(Ld(fl.version)) {
    St(f.version, v + 1);
    std::atomic_thread_fence(std::memory_order_release);
  }
  ~FlowWrite() { StRel(f.version, v + 2); }
};

int32_t FindOrClaimFlow(const OpRef& r, uint8_t ch, uint8_t dir, int32_t peer) {
  LiveOp& L = r.c->live[r.slot];
  SlotCtl& ctl = r.c->slots[r.slot];
  uint32_t n = ctl.n_flows.load(std::memory_order_acquire);
  if (n > shm::kMaxFlows) n = shm::kMaxFlows;
  for (uint32_t i = 0; i < n; ++i) {
    const Flow& f = L.flows[i];
    if (Ld(f.channel) == ch && Ld(f.dir) == dir && Ld(f.peer) == peer) return int32_t(i);
  }
  uint32_t i = ctl.n_flows.fetch_add(1, std::memory_order_acq_rel);
  if (i >= shm::kMaxFlows) {
    __atomic_fetch_or(&L.op.flags, uint32_t(shm::kFlagFlowsTruncated), __ATOMIC_RELAXED);
    Add(r.c->hdr->dropped_flows, uint64_t{1});
    return -1;
  }
  Flow& f = L.flows[i];
  {
    // The version survives across ops (a reader holding an old copy must not match).
    FlowWrite w(f);
    ZeroWords(reinterpret_cast<char*>(&f) + 8, sizeof(Flow) - 8);  // all but version/peer word
    St(f.peer, peer);
    St(f.channel, ch);
    St(f.dir, dir);
  }
  // Publish the count: readers use flows[0, n_flows).
  uint8_t cur = Ld(L.op.n_flows);
  for (int t = 0; t < 64 && cur < i + 1; ++t)
    if (__atomic_compare_exchange_n(&L.op.n_flows, &cur, uint8_t(i + 1), false, __ATOMIC_RELEASE, __ATOMIC_RELAXED))
      break;
  return int32_t(i);
}

}  // namespace

Result StartProxyOp(Context* c, void** handle, const Descr& d, uint64_t now) {
  if (d.n_steps < 0 || d.peer < 0 || d.peer >= c->nranks) {
    CountBadDescr(c);
    return Result::Success;
  }
  OpRef r;
  if (!ParentOp(c, d.parent, &r)) {
    CountBadHandle(c, shm::BadHandleKind::kProxyOpStart);
    return Result::Success;
  }
  // Claim a ProxyEntry. The pool holds 16 entries per live slot; the scan starts in the
  // op's own band, at its flow, so concurrent ProxyOps start apart without a shared hint
  // written per claim (an op with more flows spills into the next band: still correct).
  uint32_t n = c->n_proxy, idx = n;
  uint32_t hint = r.slot * 16u + ((uint32_t(d.channel) * 2u + (d.is_send ? 1u : 0u)) & 15u);
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t e = (hint + i) % n;
    uint32_t z = 0;
    if (c->proxy[e].busy.load(std::memory_order_relaxed) == 0 &&
        c->proxy[e].busy.compare_exchange_strong(z, 1, std::memory_order_acq_rel)) {
      idx = e;
      break;
    }
  }
  if (idx == n) {
    Add(c->hdr->dropped_flows, uint64_t{1});
    return Result::Success;
  }
  ProxyEntry& pe = c->proxy[idx];
  if (!AcquireRef(r, now)) {
    pe.busy.store(0, std::memory_order_release);
    // The op already completed: a ProxyOp that starts after all its other children.
    CountBadHandle(c, shm::BadHandleKind::kProxyOpStart);
    return Result::Success;
  }
  uint32_t gen = pe.gen.fetch_add(1, std::memory_order_relaxed) + 1;
  uint8_t dir = d.is_send ? uint8_t(shm::Dir::kSend) : uint8_t(shm::Dir::kRecv);
  int32_t fi = FindOrClaimFlow(r, d.channel, dir, d.peer);
  pe.slot.store(r.slot, std::memory_order_relaxed);
  pe.slot_gen.store(r.gen, std::memory_order_relaxed);
  pe.flow.store(fi, std::memory_order_relaxed);
  pe.is_send.store(d.is_send ? 1 : 0, std::memory_order_relaxed);
  for (uint32_t k = 0; k < kSteps; ++k) pe.steps[k].active.store(0, std::memory_order_relaxed);
  pe.oldest.store(UINT32_MAX, std::memory_order_relaxed);
  pe.in_gpu.store(0, std::memory_order_relaxed);
  pe.in_net.store(0, std::memory_order_relaxed);
  pe.in_peer.store(0, std::memory_order_relaxed);
  LiveOp& L = c->live[r.slot];
  if (fi >= 0) {
    Flow& f = L.flows[fi];
    FlowWrite w(f);
    St(f.n_steps, Ld(f.n_steps) + uint32_t(d.n_steps));
    if (d.chunk_size > 0) St(f.chunk_size, uint32_t(d.chunk_size));
    if (Ld(f.n_proxy_ops) < 255) St(f.n_proxy_ops, uint8_t(Ld(f.n_proxy_ops) + 1));
    St(f.last_progress_ns, now);
  }
  Add(L.op.proxy_ops_started, uint32_t{1});
  St(L.op.last_progress_ns, now);
  *handle = MakeHandle(kHProxyOp, c->index, c->inc, (idx << 18) | (gen & 0x3ffff));
  return Result::Success;
}

// Valid ProxyOp (or, with step=true, ProxyStep) handle of the live context `c` it
// resolved to.
bool ProxyFromHandle(Context* c, const Decoded& d, bool step, ProxyRef* r) {
  if (c == nullptr || d.kind != (step ? kHProxyStep : kHProxyOp) || !c->alive.load(std::memory_order_acquire))
    return false;
  uint32_t idx = d.payload >> 18;
  if (idx >= c->n_proxy) return false;
  ProxyEntry& pe = c->proxy[idx];
  if (pe.busy.load(std::memory_order_acquire) != 1) return false;
  uint32_t g = pe.gen.load(std::memory_order_relaxed);
  if (step ? ((g & 0x7fff) != (d.payload & 0x7fff)) : ((g & 0x3ffff) != (d.payload & 0x3ffff))) return false;
  *r = ProxyRef{c, &pe, idx, step ? ((d.payload >> 15) & 7) : 0};
  return true;
}

void StopProxyOp(const ProxyRef& r, uint64_t now) {
  ProxyEntry& pe = *r.pe;
  // Read which op the entry serves before freeing it: once busy is 0 another thread
  // may claim the entry and overwrite slot/slot_gen, and we would release a reference
  // of its op (completing it early) instead of ours.
  uint32_t s = pe.slot.load(std::memory_order_relaxed);
  OpRef op{r.c, s, pe.slot_gen.load(std::memory_order_relaxed)};
  uint32_t one = 1;
  if (!pe.busy.compare_exchange_strong(one, 0, std::memory_order_acq_rel)) {
    CountBadHandle(r.c, shm::BadHandleKind::kProxyOpEnd);
    return;
  }
  if (!StillLive(op)) {
    CountBadHandle(r.c, shm::BadHandleKind::kProxyOpEnd);
    return;
  }
  Add(r.c->live[s].op.proxy_ops_stopped, uint32_t{1});
  St(r.c->live[s].op.last_progress_ns, now);
  Release(r.c, s, now);
}

// Wait state a ProxyStep state value enters, and the counter level it reaches.
bool StepStateInfo(int state, uint8_t* wait, uint8_t* level) {
  switch (state) {
    case kStProxyStepSendGPUWait: *wait = uint8_t(shm::WaitState::kSendGpuWait); *level = 0; return true;
    case kStProxyStepSendPeerWait: *wait = uint8_t(shm::WaitState::kSendPeerWait); *level = 1; return true;
    case kStProxyStepSendWait: *wait = uint8_t(shm::WaitState::kSendWait); *level = 2; return true;
    case kStProxyStepRecvWait: *wait = uint8_t(shm::WaitState::kRecvWait); *level = 0; return true;
    case kStProxyStepRecvFlushWait: *wait = uint8_t(shm::WaitState::kRecvFlushWait); *level = 1; return true;
    case kStProxyStepRecvGPUWait: *wait = uint8_t(shm::WaitState::kRecvGpuWait); *level = 2; return true;
    default: return false;
  }
}

namespace {
bool IsGpuWait(uint8_t w) {
  return w == uint8_t(shm::WaitState::kSendGpuWait) || w == uint8_t(shm::WaitState::kRecvGpuWait);
}
bool IsNetWait(uint8_t w) {
  return w == uint8_t(shm::WaitState::kSendWait) || w == uint8_t(shm::WaitState::kRecvWait);
}
bool IsPeerWait(uint8_t w) { return w == uint8_t(shm::WaitState::kSendPeerWait); }

// Step slot k now in (or out of) one kind of wait: the op's busy interval it closes, in ns,
// when it was the last of its steps in that wait (0 otherwise). Only the proxy thread that
// progresses the ProxyOp writes its entry: relaxed, like the step records.
uint64_t BusyEdge(std::atomic<uint8_t>& mask, std::atomic<uint64_t>& since, uint32_t k, bool in, uint64_t now) {
  uint8_t m = mask.load(std::memory_order_relaxed);
  uint8_t nm = in ? uint8_t(m | (1u << k)) : uint8_t(m & ~(1u << k));
  if (nm == m) return 0;
  mask.store(nm, std::memory_order_relaxed);
  if (m == 0) {
    since.store(now, std::memory_order_relaxed);
    return 0;
  }
  if (nm != 0) return 0;
  uint64_t t = since.load(std::memory_order_relaxed);
  return now > t ? now - t : 0;
}

uint32_t OldestActiveStep(const ProxyEntry& pe) {
  uint32_t best = UINT32_MAX;
  for (uint32_t k = 0; k < kSteps; ++k) {
    const StepRec& o = pe.steps[k];
    uint32_t sn = o.step.load(std::memory_order_relaxed);
    if (o.active.load(std::memory_order_relaxed) && sn < best) best = sn;
  }
  return best;
}
}  // namespace

// One step transition: start (new_level 0, wait kNone), a state, or stop (level 3).
void StepUpdate(const ProxyRef& r, StepRec& st, bool start, uint8_t wait, uint8_t new_level, uint64_t bytes,
                uint64_t now) {
  ProxyEntry& pe = *r.pe;
  int32_t fi = pe.flow.load(std::memory_order_relaxed);
  uint32_t s = pe.slot.load(std::memory_order_relaxed);
  OpRef op{r.c, s, pe.slot_gen.load(std::memory_order_relaxed)};
  // Time spent in the state the step leaves.
  uint64_t gpu_add = 0, net_add = 0;
  uint8_t old_level = 0;
  // NCCL re-records SendPeerWait on every isend retry: a repeated state keeps its start time.
  bool same_state = !start && new_level != 3 && wait == st.state.load(std::memory_order_relaxed);
  if (!start) {
    old_level = st.level.load(std::memory_order_relaxed);
    if (!same_state) {
      uint8_t prev = st.state.load(std::memory_order_relaxed);
      uint64_t since = st.since.load(std::memory_order_relaxed);
      uint64_t dt = now > since ? now - since : 0;
      if (IsGpuWait(prev)) gpu_add = dt;
      if (IsNetWait(prev)) net_add = dt;
    }
  }
  uint64_t add_bytes = 0;
  uint64_t prev_bytes = st.bytes.load(std::memory_order_relaxed);
  if (bytes > prev_bytes) {
    add_bytes = bytes - prev_bytes;
    st.bytes.store(bytes, std::memory_order_relaxed);
  }
  if (new_level > old_level || start) st.level.store(new_level, std::memory_order_relaxed);
  if (!same_state) {
    st.state.store(wait, std::memory_order_relaxed);
    st.since.store(now, std::memory_order_relaxed);
  }
  if (new_level == 3) st.active.store(0, std::memory_order_relaxed);
  // The busy times: the step's slot leaves the wait it was in and enters the new one (a start,
  // also of a slot NCCL reused while its old step was unfinished, and a stop leave every wait).
  uint64_t gpu_busy_add = 0, net_busy_add = 0, peer_busy_add = 0;
  if (!same_state) {
    uint32_t k = uint32_t(&st - pe.steps);
    uint8_t now_in = new_level == 3 ? uint8_t(shm::WaitState::kNone) : wait;
    gpu_busy_add = BusyEdge(pe.in_gpu, pe.gpu_since, k, IsGpuWait(now_in), now);
    net_busy_add = BusyEdge(pe.in_net, pe.net_since, k, IsNetWait(now_in), now);
    peer_busy_add = BusyEdge(pe.in_peer, pe.peer_since, k, IsPeerWait(now_in), now);
  }
  // A re-recorded state that moves no counter is a retry (NCCL records SendPeerWait
  // before every isend attempt), not progress: leaving last_progress_ns alone is what
  // lets a stalled flow look stalled.
  if (same_state && add_bytes == 0 && new_level <= old_level) return;

  if (fi < 0 || !StillLive(op)) return;
  // The step the flow waits on: the oldest unfinished step of this ProxyOp. It changes
  // only when an older step starts or the oldest one finishes (NCCL finishes steps in
  // order), so the scan over the kSteps outstanding runs once per step, not per state.
  uint32_t sn = st.step.load(std::memory_order_relaxed);
  uint32_t best_step = pe.oldest.load(std::memory_order_relaxed);
  if (new_level == 3 ? sn == best_step : sn < best_step) {
    best_step = new_level == 3 ? OldestActiveStep(pe) : sn;
    pe.oldest.store(best_step, std::memory_order_relaxed);
  }
  uint8_t best_state = 0;
  uint64_t best_since = 0;
  if (best_step != UINT32_MAX) {
    StepRec* o = &pe.steps[best_step % kSteps];
    if (!o->active.load(std::memory_order_relaxed) || o->step.load(std::memory_order_relaxed) != best_step) {
      // NCCL reused the oldest step's record out of order: fall back to the scan.
      best_step = OldestActiveStep(pe);
      pe.oldest.store(best_step, std::memory_order_relaxed);
      o = best_step == UINT32_MAX ? nullptr : &pe.steps[best_step % kSteps];
    }
    if (o != nullptr) {
      best_state = o->state.load(std::memory_order_relaxed);
      best_since = o->since.load(std::memory_order_relaxed);
    }
  }
  LiveOp& L = r.c->live[s];
  Flow& f = L.flows[fi];
  {
    FlowWrite w(f);
    if (start) {
      St(f.posted, Ld(f.posted) + 1);
      if (Ld(f.first_ns) == 0) St(f.first_ns, now);
    } else {
      if (old_level < 1 && new_level >= 1) St(f.ready, Ld(f.ready) + 1);
      if (old_level < 2 && new_level >= 2) St(f.transmitted, Ld(f.transmitted) + 1);
      if (old_level < 3 && new_level >= 3) {
        St(f.done, Ld(f.done) + 1);
        if (Ld(f.done) >= Ld(f.n_steps)) St(f.end_ns, now);
      }
    }
    if (add_bytes) St(f.bytes, Ld(f.bytes) + add_bytes);
    if (gpu_add) St(f.gpu_wait_ns, Ld(f.gpu_wait_ns) + gpu_add);
    if (net_add) St(f.net_wait_ns, Ld(f.net_wait_ns) + net_add);
    if (gpu_busy_add) St(f.gpu_busy_ns, Ld(f.gpu_busy_ns) + gpu_busy_add);
    if (net_busy_add) St(f.net_busy_ns, Ld(f.net_busy_ns) + net_busy_add);
    if (peer_busy_add) St(f.peer_busy_ns, Ld(f.peer_busy_ns) + peer_busy_add);
    St(f.last_progress_ns, now);
    if (best_step == UINT32_MAX) {
      St(f.wait_state, uint8_t(shm::WaitState::kNone));
      St(f.wait_since_ns, uint64_t{0});
    } else {
      St(f.wait_state, best_state);
      St(f.wait_step, best_step);
      St(f.wait_since_ns, best_since);
    }
  }
  St(L.op.last_progress_ns, now);
}

Result StartProxyStep(Context* c, void** handle, const Descr& d, uint64_t now) {
  if (d.step < 0) {
    CountBadDescr(c);
    return Result::Success;
  }
  Decoded pd;
  ProxyRef r;
  if (Resolve(d.parent, &pd) != c || !ProxyFromHandle(c, pd, false, &r)) {
    CountBadHandle(c, shm::BadHandleKind::kProxyStepStart);
    return Result::Success;
  }
  uint32_t k = uint32_t(d.step) % kSteps;
  StepRec& st = r.pe->steps[k];
  // NCCL starts a recv step again while irecv is refused (the earlier handle is never
  // stopped): a restart of a step that has not progressed reuses its slot, uncounted.
  bool restart = st.active.load(std::memory_order_relaxed) && st.step.load(std::memory_order_relaxed) == uint32_t(d.step) &&
                 st.level.load(std::memory_order_relaxed) == 0;
  if (!restart) {
    st.step.store(uint32_t(d.step), std::memory_order_relaxed);
    st.bytes.store(0, std::memory_order_relaxed);
    st.active.store(1, std::memory_order_relaxed);
    StepUpdate(r, st, true, uint8_t(shm::WaitState::kNone), 0, 0, now);
  }
  uint32_t gen = r.pe->gen.load(std::memory_order_relaxed);
  *handle = MakeHandle(kHProxyStep, c->index, c->inc, (r.idx << 18) | (k << 15) | (gen & 0x7fff));
  return Result::Success;
}

}  // namespace mycroft::plugin
