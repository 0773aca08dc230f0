// mycroft_otel._native: the Python face of native/ (see bindings.h for the file map).
//
// Every numpy dtype here is derived from the C++ struct itself (PYBIND11_NUMPY_DTYPE), so the
// offsets Python sees are the offsets the plugin writes: shm_layout.h stays the one description.
#include <pybind11/stl.h>

#include "bindings.h"
#include "mycroft/driver_event.h"
#include "mycroft/nccl_profiler_abi.h"
#include "mycroft/shm_layout.h"

namespace py = pybind11;
using namespace mycroft::shm;
using mycroft::driver::Event;

namespace {

template <size_t N>
py::tuple Names(const char* const (&table)[N]) {
  py::tuple t(N);
  for (size_t i = 0; i < N; ++i) t[i] = py::str(table[i]);
  return t;
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() =
      "Native core of mycroft-otel: read the plugin's shared memory (RingReader) and drive a profiler "
      "plugin through NCCL's ABI (Driver). Prefer the typed facade mycroft_otel.native.";

  PYBIND11_NUMPY_DTYPE(Flow, version, peer, channel, dir, wait_state, n_proxy_ops, n_steps, posted, ready,
                       transmitted, done, wait_step, chunk_size, bytes, first_ns, last_progress_ns, wait_since_ns,
                       end_ns, gpu_wait_ns, net_wait_ns, gpu_busy_ns, net_busy_ns, peer_busy_ns);
  PYBIND11_NUMPY_DTYPE(OpInfo, op_id, seq, nccl_seq, count, bytes, kind, func, datatype, algo, proto, n_channels,
                       n_flows, abi_version, root_or_peer, flags, api_ns, start_ns, launch_ns, end_ns,
                       kernel_start_ns, kernel_end_ns, proxy_ops_started, proxy_ops_stopped, kernel_ch_started,
                       kernel_ch_stopped, last_progress_ns, user_tag, kch_valid, reserved);
  PYBIND11_NUMPY_DTYPE(KernelChannel, start_ns, end_ns, phase_start_ns, phase_end_ns);
  PYBIND11_NUMPY_DTYPE(LiveOp, generation, state, reserved, op, flows, kch);
  PYBIND11_NUMPY_DTYPE(RingRecord, seq, reserved, op, flows, kch);
  PYBIND11_NUMPY_DTYPE(ShmHeader, magic, layout_version, header_size, live_slots, ring_capacity, live_offset,
                       ring_offset, file_size, job_id, comm_name, host, plugin_version, comm_hash, comm_id, rank,
                       nranks, nnodes, global_rank, local_rank, cuda_device, pid, abi_version, activation_mask,
                       reserved0, start_realtime_ns, start_mono_ns, ring_head, heartbeat_ns, finalized_ns,
                       ops_started, ops_completed, dropped_live_full, dropped_bad_handle, dropped_bad_descr,
                       dropped_flows, pxn_foreign_ops, p2p_send_count_total, p2p_recv_count_total, bad_handle_by_kind,
                       late_kernel_stops, nccl_version, reserved1, reserved);
  PYBIND11_NUMPY_DTYPE(Event, t_ns, ctx, slot, parent_slot, type, state, op, func, datatype, algo, proto,
                       n_channels, channel, is_send, rank, root_or_peer, pid, n_steps, chunk_size, step, seq, count,
                       size, ptimer);

  m.attr("FLOW_DTYPE") = py::dtype::of<Flow>();
  m.attr("OP_INFO_DTYPE") = py::dtype::of<OpInfo>();
  m.attr("KERNEL_CHANNEL_DTYPE") = py::dtype::of<KernelChannel>();
  m.attr("LIVE_OP_DTYPE") = py::dtype::of<LiveOp>();
  m.attr("RING_RECORD_DTYPE") = py::dtype::of<RingRecord>();
  m.attr("HEADER_DTYPE") = py::dtype::of<ShmHeader>();
  m.attr("EVENT_DTYPE") = py::dtype::of<Event>();

  m.attr("MAGIC") = py::int_(kMagic);
  m.attr("LAYOUT_VERSION") = py::int_(kLayoutVersion);
  m.attr("MAX_FLOWS") = py::int_(kMaxFlows);
  m.attr("MAX_KERNEL_CHANNELS") = py::int_(kMaxKernelChannels);
  m.attr("BAD_HANDLE_KINDS") = Names(kBadHandleKindNames);
  m.attr("NAME_LEN") = py::int_(kNameLen);
  m.attr("UNKNOWN_INDEX") = py::int_(kUnknownIndex);
  m.attr("NO_SLOT") = py::int_(mycroft::driver::kNoSlot);
  m.attr("SLOT_ACTIVE") = py::int_(static_cast<uint32_t>(SlotState::kActive));

  m.attr("FUNC_NAMES") = Names(kFuncNames);
  m.attr("DATATYPE_NAMES") = Names(kDatatypeNames);
  m.attr("ALGO_NAMES") = Names(kAlgoNames);
  m.attr("PROTO_NAMES") = Names(kProtoNames);
  {
    py::tuple sizes(std::size(kDatatypeSizes));
    for (size_t i = 0; i < std::size(kDatatypeSizes); ++i) sizes[i] = py::int_(kDatatypeSizes[i]);
    m.attr("DATATYPE_SIZES") = sizes;
  }
  // Indexed by WaitState / OpKind / Dir values.
  m.attr("WAIT_STATE_NAMES") = py::make_tuple("None", "SendGpuWait", "SendPeerWait", "SendWait", "RecvWait",
                                              "RecvFlushWait", "RecvGpuWait");
  m.attr("OP_KIND_NAMES") = py::make_tuple("none", "coll", "send", "recv");
  m.attr("DIR_NAMES") = py::make_tuple("send", "recv");
  m.attr("OP_FLAGS") = py::dict(py::arg("FLOWS_TRUNCATED") = uint32_t(kFlagFlowsTruncated),
                                py::arg("KERNEL_TIMES") = uint32_t(kFlagKernelTimes),
                                py::arg("ABORTED") = uint32_t(kFlagAborted),
                                py::arg("KERNEL_PHASES") = uint32_t(kFlagKernelPhases));

  // Event rows: ops, NCCL's event-type bits and state values of the newest ABI (v7).
  namespace v7 = mycroft::nccl_abi::v7;
  m.attr("OP_START") = py::int_(uint8_t(mycroft::driver::Op::kStart));
  m.attr("OP_STOP") = py::int_(uint8_t(mycroft::driver::Op::kStop));
  m.attr("OP_RECORD") = py::int_(uint8_t(mycroft::driver::Op::kRecord));
  py::dict types;
  types["Group"] = int(v7::kGroup);
  types["Coll"] = int(v7::kColl);
  types["P2p"] = int(v7::kP2p);
  types["ProxyOp"] = int(v7::kProxyOp);
  types["ProxyStep"] = int(v7::kProxyStep);
  types["ProxyCtrl"] = int(v7::kProxyCtrl);
  types["KernelCh"] = int(v7::kKernelCh);
  types["NetPlugin"] = int(v7::kNetPlugin);
  types["GroupApi"] = int(v7::kGroupApi);
  types["CollApi"] = int(v7::kCollApi);
  types["P2pApi"] = int(v7::kP2pApi);
  types["KernelLaunch"] = int(v7::kKernelLaunch);
  types["CeColl"] = int(v7::kCeColl);
  types["CeSync"] = int(v7::kCeSync);
  types["CeBatch"] = int(v7::kCeBatch);
  types["KernelPhase"] = int(v7::kKernelPhase);
  m.attr("EVENT_TYPES") = types;
  py::dict states;
#define MYCROFT_STATE(name) states[#name] = int(v7::State::name)
  MYCROFT_STATE(ProxyOpSendPosted);
  MYCROFT_STATE(ProxyOpSendRemFifoWait);
  MYCROFT_STATE(ProxyOpSendTransmitted);
  MYCROFT_STATE(ProxyOpSendDone);
  MYCROFT_STATE(ProxyOpRecvPosted);
  MYCROFT_STATE(ProxyOpRecvReceived);
  MYCROFT_STATE(ProxyOpRecvTransmitted);
  MYCROFT_STATE(ProxyOpRecvDone);
  MYCROFT_STATE(ProxyStepSendGPUWait);
  MYCROFT_STATE(ProxyStepSendWait);
  MYCROFT_STATE(ProxyStepRecvWait);
  MYCROFT_STATE(ProxyStepRecvFlushWait);
  MYCROFT_STATE(ProxyStepRecvGPUWait);
  MYCROFT_STATE(ProxyCtrlIdle);
  MYCROFT_STATE(ProxyCtrlActive);
  MYCROFT_STATE(ProxyCtrlSleep);
  MYCROFT_STATE(ProxyCtrlWakeup);
  MYCROFT_STATE(ProxyCtrlAppend);
  MYCROFT_STATE(ProxyCtrlAppendEnd);
  MYCROFT_STATE(ProxyOpInProgress);
  MYCROFT_STATE(ProxyStepSendPeerWait);
  MYCROFT_STATE(NetPluginUpdate);
  MYCROFT_STATE(KernelChStop);
  MYCROFT_STATE(GroupStartApiStop);
  MYCROFT_STATE(GroupEndApiStart);
  MYCROFT_STATE(CeCollStart);
  MYCROFT_STATE(CeCollComplete);
  MYCROFT_STATE(CeSyncStart);
  MYCROFT_STATE(CeSyncComplete);
  MYCROFT_STATE(CeBatchStart);
  MYCROFT_STATE(CeBatchComplete);
  MYCROFT_STATE(KernelPhaseStop);
#undef MYCROFT_STATE
  m.attr("STATES") = states;
  m.attr("ABI_VERSIONS") = py::make_tuple(7, 6, 5, 4);

  m.def("monotonic_ns", &mycroft::bindings::MonotonicNs, "CLOCK_MONOTONIC in ns (the clock of every shm timestamp).");

  mycroft::bindings::RegisterReader(m);
  mycroft::bindings::RegisterDriver(m);
  mycroft::bindings::RegisterOtlp(m);
  mycroft::bindings::RegisterRules(m);
}
