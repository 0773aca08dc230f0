// mycroft/nccl_profiler_abi.h -- our own declarations of NCCL's profiler plugin ABI, versions 4 to 7.
//
// NCCL ships no profiler headers in its wheels, so we declare the ABI ourselves. Everything here is a fact
// about the binary interface (member order, types, enum values, symbol names), written in our own words and
// checked against the DWARF debug info of the real libnccl.so.2 (tests/abi/test_nccl_abi.py, fixture from
// nvidia-nccl-cu13 2.32.3, whose libnccl carries the v1..v7 declarations side by side for its adapters).
// The static_asserts at the end pin the x86-64 layout the DWARF shows.
//
// How NCCL finds a plugin: it dlopen()s $NCCL_PROFILER_PLUGIN and dlsym()s the data symbols
// "ncclProfiler_v7", then "_v6", "_v5", "_v4" (then older ones), taking the first it finds. Each symbol is an
// instance of that version's `Profiler` table below. NCCL releases and the newest table they look for:
//     v4: NCCL 2.27.x            (PyTorch 2.9 / 2.10)
//     v5: NCCL 2.28.x            (PyTorch 2.11)
//     v6: NCCL 2.29.x, 2.30.x
//     v7: NCCL 2.31.x, 2.32.x
// A newer NCCL drives an older table through an adapter that copies its own (newest) descriptor into the
// older layout and drops events and states the older version does not know (see "Adapters" below).
//
// ---------------------------------------------------------------------------------------------------------
// Semantics the plugin author needs (verified against NCCL's sources; docs/nccl-abi.md has the longer story)
// ---------------------------------------------------------------------------------------------------------
// Lifecycle and threads
//   * init() runs once per communicator, on the thread creating the communicator (ncclCommInitRank & co.),
//     after NCCL knows rank/nranks/nNodes. `context` is ours to fill; NCCL passes it back to startEvent and
//     finalize. commName is the user's config.commName and is NULL when the user set none: handle NULL.
//     commId/commHash is the communicator hash (derived from the random ncclUniqueId; identical on all
//     ranks of the communicator). A non-zero Result from init makes NCCL unload the plugin and continue
//     without it.
//   * eActivationMask points at ONE process-wide int shared by every communicator. init() writes the bits of
//     the events we want (EventType values OR'ed). NCCL reads it (relaxed atomic load) at the start of each
//     API call / group and when posting proxy ops; changing it later through the pointer takes effect for
//     later operations. Enabling a child event makes NCCL also emit its ancestors (e.g. ProxyStep implies
//     ProxyOp, Coll/P2p, Group and, v5+, GroupApi/CollApi/P2pApi).
//   * startEvent/stopEvent/recordEventState for API, Group, Coll, P2p, KernelLaunch events run on the user
//     thread calling NCCL. ProxyOp, ProxyStep, ProxyCtrl, NetPlugin events run on the communicator's proxy
//     progress thread (which, under PXN, may belong to ANOTHER process on the node). KernelCh events are
//     started and stopped by NCCL from the host after reading the device's per-channel work counters (on the
//     proxy progress thread in 2.27..2.30; 2.31+ also has a dedicated profiler thread for this).
//   * Any callback may be handed eHandle == NULL (we returned NULL, or the event was not enabled), and
//     startEvent must set *eHandle (NULL is allowed: NCCL then skips the children's parent link).
//   * finalize() runs once per communicator at destroy/abort, on the destroying thread.
//
// Parents (descriptor `parentObj` is the eHandle we returned for the parent event)
//   v5+: GroupApi (root) -> CollApi / P2pApi / KernelLaunch;  Group (root);  Coll/P2p: parentObj = the
//        CollApi/P2pApi handle and coll.parentGroup / p2p.parentGroup = the Group handle;  ProxyOp -> Coll or
//        P2p;  ProxyStep -> ProxyOp;  KernelCh -> Coll or P2p;  NetPlugin -> ProxyStep;  ProxyCtrl: none.
//   v4:  no API events; Coll/P2p parentObj = the Group handle (the v4 adapter puts parentGroup there).
//   Under PXN a ProxyOp can be posted by a process that is not ours: its parentObj then points into the
//   other process. proxyOp.pid is the pid of the process that posted the op; compare it with getpid() and
//   never dereference parentObj when they differ.
//
// Descriptor strings (pointers to NCCL static storage; valid for the process lifetime)
//   func:     "AllGather" "ReduceScatter" "AllReduce" "Broadcast" "Reduce" "Send" "Recv" (also "AllToAll",
//             "Gather", "Scatter" on NCCL versions that have them; CollApi/P2pApi use the same spellings)
//   datatype: "ncclInt8" "ncclUint8" "ncclInt32" "ncclUint32" "ncclInt64" "ncclUint64" "ncclFloat16"
//             "ncclFloat32" "ncclFloat64" "ncclBfloat16" "ncclFloat8e4m3" "ncclFloat8e5m2"
//   algo:     "Tree" "Ring" "CollNetDirect" "CollNetChain" "NVLS" "NVLSTree" "PAT"
//   proto:    "LL" "LL128" "Simple"
//   coll.seqNumber counts collectives per communicator (all collective functions together, in call order,
//   starting at 0), so (commHash, seqNumber) names one collective instance identically on every rank.
//
// KernelCh: one event per channel the collective/p2p runs on (coll.nChannels of them), parent = Coll/P2p,
//   started when the device reports the channel's work started (kernelCh.pTimer = GPU globaltimer at
//   start), then recordEventState(KernelChStop, stateArgs.kernelCh.pTimer = GPU end time), then stopEvent.
//
// ProxyStep state order (each state marks the START of a wait):
//   send: start -> SendGPUWait (data not yet produced by the GPU) -> [SendPeerWait: receiver has no buffer]
//         -> SendWait (posted to the network, waiting for completion) -> stop
//   recv: start -> RecvWait (posted receive, waiting for data) -> RecvFlushWait (GDR flush) -> RecvGPUWait
//         (waiting for the GPU to consume) -> stop
//   stateArgs.proxyStep.transSize carries the bytes of that step.
//
// NetPlugin events come only from net plugins that emit them (NCCL's internal IB/socket do with profiling
// support compiled in; PyPI builds emit none). `netPlugin.id` tags the kind (plugin-defined: NCCL's IB uses
// the QP event, socket uses the socket op) and `netPlugin.data` points to a plugin-private struct whose
// layout is versioned by `id`. We treat `data` as opaque.
#pragma once

#include <cstddef>
#include <cstdint>
#include <sys/types.h>

namespace mycroft::nccl_abi {

// ncclResult_t. Returned by every callback; only Success should ever leave our plugin.
enum class Result : int {
  Success = 0,
  UnhandledCudaError = 1,
  SystemError = 2,
  InternalError = 3,
  InvalidArgument = 4,
  InvalidUsage = 5,
  RemoteError = 6,
  InProgress = 7,
  Timeout = 8,
};

// ncclDebugLogLevel.
enum class LogLevel : int {
  None = 0,
  Version = 1,
  Warn = 2,
  Info = 3,
  Abort = 4,
  Trace = 5,
  Attn = 6,
};

// ncclDebugLogSubSys: the `flags` argument of the logger (a bit set; NCCL_DEBUG_SUBSYS filters on it).
enum LogSubsys : unsigned long {
  kLogInit = 0x1,
  kLogColl = 0x2,
  kLogP2p = 0x4,
  kLogShm = 0x8,
  kLogNet = 0x10,
  kLogGraph = 0x20,
  kLogTuning = 0x40,
  kLogEnv = 0x80,
  kLogAlloc = 0x100,
  kLogCall = 0x200,
  kLogProxy = 0x400,
  kLogNvls = 0x800,
  kLogBootstrap = 0x1000,
  kLogReg = 0x2000,
  kLogProfile = 0x4000,
  kLogRas = 0x8000,
  kLogDestroy = 0x10000,
  kLogAllocHost = 0x20000,
  kLogAll = ~0ul,  // NCCL declares it as -1
};

// ncclDebugLogger_t: printf-style logger NCCL hands to init(). Call it as
//   logfn(LogLevel::Warn, kLogProfile, __FILE__, __LINE__, "fmt %d", x);
// It honours NCCL_DEBUG / NCCL_DEBUG_SUBSYS. It may be NULL in unusual embeddings: check before calling.
using DebugLogger = void (*)(LogLevel level, unsigned long flags, const char* file, int line, const char* fmt, ...);

// Process id type NCCL puts in proxyOp.pid (ncclPid_t == pid_t on Linux).
using Pid = pid_t;

// =========================================================================================================
// v4 (NCCL 2.27). One-byte `type`; init takes (mask, name, hash) in that order; no API-level events; the
// Coll/P2p parent is the Group event. KernelCh and NetPlugin events and ProxyOpInProgress, SendPeerWait,
// NetPluginUpdate, KernelChStop states appeared here.
// =========================================================================================================
namespace v4 {

enum EventType : int {
  kGroup = 1 << 0,
  kColl = 1 << 1,
  kP2p = 1 << 2,
  kProxyOp = 1 << 3,
  kProxyStep = 1 << 4,
  kProxyCtrl = 1 << 5,
  kKernelCh = 1 << 6,
  kNetPlugin = 1 << 7,
};

enum class State : int {
  ProxyOpSendPosted = 0,  // the next four are legacy (v1-v3 era), NCCL no longer records them
  ProxyOpSendRemFifoWait = 1,
  ProxyOpSendTransmitted = 2,
  ProxyOpSendDone = 3,
  ProxyOpRecvPosted = 4,
  ProxyOpRecvReceived = 5,
  ProxyOpRecvTransmitted = 6,
  ProxyOpRecvDone = 7,
  ProxyStepSendGPUWait = 8,
  ProxyStepSendWait = 9,
  ProxyStepRecvWait = 10,
  ProxyStepRecvFlushWait = 11,
  ProxyStepRecvGPUWait = 12,
  ProxyCtrlIdle = 13,
  ProxyCtrlActive = 14,
  ProxyCtrlSleep = 15,
  ProxyCtrlWakeup = 16,
  ProxyCtrlAppend = 17,
  ProxyCtrlAppendEnd = 18,
  ProxyOpInProgress = 19,      // NCCL name: ncclProfilerProxyOpInProgress_v4
  ProxyStepSendPeerWait = 20,  // NCCL name: ncclProfilerProxyStepSendPeerWait_v4
  NetPluginUpdate = 21,
  KernelChStop = 22,
};

struct EventDescr {
  struct Coll {
    uint64_t seqNumber;
    const char* func;
    const void* sendBuff;
    void* recvBuff;
    size_t count;
    int root;
    const char* datatype;
    uint8_t nChannels;
    uint8_t nWarps;
    const char* algo;
    const char* proto;
  };
  struct P2p {
    const char* func;
    void* buff;
    const char* datatype;
    size_t count;
    int peer;  // rank in the communicator
    uint8_t nChannels;
  };
  struct ProxyOp {
    Pid pid;  // process that posted the op (PXN: may not be us)
    uint8_t channelId;
    int peer;
    int nSteps;
    int chunkSize;
    int isSend;
  };
  struct ProxyStep {
    int step;
  };
  struct KernelCh {
    uint8_t channelId;
    uint64_t pTimer;  // GPU globaltimer (ns) when the channel started
  };
  struct NetPlugin {
    int64_t id;
    void* data;
  };

  uint8_t type;  // one EventType bit (v4 only: a single byte)
  void* parentObj;
  int rank;
  union {
    Coll coll;
    P2p p2p;
    ProxyOp proxyOp;
    ProxyStep proxyStep;
    KernelCh kernelCh;
    NetPlugin netPlugin;
  };
};

union StateArgs {
  struct {
    size_t transSize;
  } proxyStep;
  struct {
    int appendedProxyOps;
  } proxyCtrl;
  struct {
    void* data;
  } netPlugin;
  struct {
    uint64_t pTimer;  // GPU globaltimer (ns) at KernelChStop
  } kernelCh;
};

using InitFn = Result (*)(void** context, int* eActivationMask, const char* commName, uint64_t commHash,
                          int nNodes, int nranks, int rank, DebugLogger logfn);
using StartEventFn = Result (*)(void* context, void** eHandle, EventDescr* eDescr);
using StopEventFn = Result (*)(void* eHandle);
using RecordEventStateFn = Result (*)(void* eHandle, State eState, StateArgs* eStateArgs);
using FinalizeFn = Result (*)(void* context);

struct Profiler {  // exported as `ncclProfiler_v4`
  const char* name;
  InitFn init;
  StartEventFn startEvent;
  StopEventFn stopEvent;
  RecordEventStateFn recordEventState;
  FinalizeFn finalize;
};

}  // namespace v4

// =========================================================================================================
// v5 (NCCL 2.28). `type` widens to uint64_t. init takes commId (the hash) SECOND, before the mask. New
// API-level events GroupApi/CollApi/P2pApi/KernelLaunch (parents of the Group/Coll/P2p work), new states
// GroupStartApiStop/GroupEndApiStart; Coll/P2p gain `parentGroup` (their parentObj is now the CollApi/P2pApi
// handle). State args unchanged.
// =========================================================================================================
namespace v5 {

enum EventType : int {
  kGroup = 1 << 0,
  kColl = 1 << 1,
  kP2p = 1 << 2,
  kProxyOp = 1 << 3,
  kProxyStep = 1 << 4,
  kProxyCtrl = 1 << 5,
  kKernelCh = 1 << 6,
  kNetPlugin = 1 << 7,
  kGroupApi = 1 << 8,
  kCollApi = 1 << 9,
  kP2pApi = 1 << 10,
  kKernelLaunch = 1 << 11,
};

enum class State : int {
  ProxyOpSendPosted = 0,
  ProxyOpSendRemFifoWait = 1,
  ProxyOpSendTransmitted = 2,
  ProxyOpSendDone = 3,
  ProxyOpRecvPosted = 4,
  ProxyOpRecvReceived = 5,
  ProxyOpRecvTransmitted = 6,
  ProxyOpRecvDone = 7,
  ProxyStepSendGPUWait = 8,
  ProxyStepSendWait = 9,
  ProxyStepRecvWait = 10,
  ProxyStepRecvFlushWait = 11,
  ProxyStepRecvGPUWait = 12,
  ProxyCtrlIdle = 13,
  ProxyCtrlActive = 14,
  ProxyCtrlSleep = 15,
  ProxyCtrlWakeup = 16,
  ProxyCtrlAppend = 17,
  ProxyCtrlAppendEnd = 18,
  ProxyOpInProgress = 19,
  ProxyStepSendPeerWait = 20,
  NetPluginUpdate = 21,
  KernelChStop = 22,
  GroupStartApiStop = 23,  // recorded on the GroupApi event: ncclGroupStart() returned
  GroupEndApiStart = 24,   // recorded on the GroupApi event: ncclGroupEnd() entered
};

struct EventDescr {
  struct GroupApi {
    bool graphCaptured;
    int groupDepth;
  };
  struct CollApi {
    const char* func;
    size_t count;
    const char* datatype;
    int root;
    void* stream;  // cudaStream_t
    bool graphCaptured;
  };
  struct P2pApi {
    const char* func;
    size_t count;
    const char* datatype;
    void* stream;
    bool graphCaptured;
  };
  struct KernelLaunch {
    void* stream;
  };
  struct Coll {
    uint64_t seqNumber;
    const char* func;
    const void* sendBuff;
    void* recvBuff;
    size_t count;
    int root;
    const char* datatype;
    uint8_t nChannels;
    uint8_t nWarps;
    const char* algo;
    const char* proto;
    void* parentGroup;  // the Group event handle (parentObj is the CollApi handle)
  };
  struct P2p {
    const char* func;
    void* buff;
    const char* datatype;
    size_t count;
    int peer;
    uint8_t nChannels;
    void* parentGroup;  // the Group event handle (parentObj is the P2pApi handle)
  };
  using ProxyOp = v4::EventDescr::ProxyOp;
  using ProxyStep = v4::EventDescr::ProxyStep;
  using KernelCh = v4::EventDescr::KernelCh;
  using NetPlugin = v4::EventDescr::NetPlugin;

  uint64_t type;
  void* parentObj;
  int rank;
  union {
    GroupApi groupApi;
    CollApi collApi;
    P2pApi p2pApi;
    KernelLaunch kernelLaunch;
    Coll coll;
    P2p p2p;
    ProxyOp proxyOp;
    ProxyStep proxyStep;
    KernelCh kernelCh;
    NetPlugin netPlugin;
  };
};

using StateArgs = v4::StateArgs;  // unchanged

using InitFn = Result (*)(void** context, uint64_t commId, int* eActivationMask, const char* commName, int nNodes,
                          int nranks, int rank, DebugLogger logfn);
using StartEventFn = Result (*)(void* context, void** eHandle, EventDescr* eDescr);
using StopEventFn = Result (*)(void* eHandle);
using RecordEventStateFn = Result (*)(void* eHandle, State eState, StateArgs* eStateArgs);
using FinalizeFn = Result (*)(void* context);

struct Profiler {  // exported as `ncclProfiler_v5`
  const char* name;
  InitFn init;
  StartEventFn startEvent;
  StopEventFn stopEvent;
  RecordEventStateFn recordEventState;
  FinalizeFn finalize;
};

}  // namespace v5

// =========================================================================================================
// v6 (NCCL 2.29, 2.30). Everything of v5 unchanged (same init, same state args) plus copy-engine collective
// events CeColl/CeSync/CeBatch (descriptor members ceColl/ceCollSync/ceCollBatch) and their six states.
// The descriptor size does not change (ceColl fits in the existing 88-byte union).
// =========================================================================================================
namespace v6 {

enum EventType : int {
  kGroup = 1 << 0,
  kColl = 1 << 1,
  kP2p = 1 << 2,
  kProxyOp = 1 << 3,
  kProxyStep = 1 << 4,
  kProxyCtrl = 1 << 5,
  kKernelCh = 1 << 6,
  kNetPlugin = 1 << 7,
  kGroupApi = 1 << 8,
  kCollApi = 1 << 9,
  kP2pApi = 1 << 10,
  kKernelLaunch = 1 << 11,
  kCeColl = 1 << 12,
  kCeSync = 1 << 13,
  kCeBatch = 1 << 14,
};

enum class State : int {
  ProxyOpSendPosted = 0,
  ProxyOpSendRemFifoWait = 1,
  ProxyOpSendTransmitted = 2,
  ProxyOpSendDone = 3,
  ProxyOpRecvPosted = 4,
  ProxyOpRecvReceived = 5,
  ProxyOpRecvTransmitted = 6,
  ProxyOpRecvDone = 7,
  ProxyStepSendGPUWait = 8,
  ProxyStepSendWait = 9,
  ProxyStepRecvWait = 10,
  ProxyStepRecvFlushWait = 11,
  ProxyStepRecvGPUWait = 12,
  ProxyCtrlIdle = 13,
  ProxyCtrlActive = 14,
  ProxyCtrlSleep = 15,
  ProxyCtrlWakeup = 16,
  ProxyCtrlAppend = 17,
  ProxyCtrlAppendEnd = 18,
  ProxyOpInProgress = 19,
  ProxyStepSendPeerWait = 20,
  NetPluginUpdate = 21,
  KernelChStop = 22,
  GroupStartApiStop = 23,
  GroupEndApiStart = 24,
  CeCollStart = 25,
  CeCollComplete = 26,
  CeSyncStart = 27,
  CeSyncComplete = 28,
  CeBatchStart = 29,
  CeBatchComplete = 30,
};

struct EventDescr {
  using GroupApi = v5::EventDescr::GroupApi;
  using CollApi = v5::EventDescr::CollApi;
  using P2pApi = v5::EventDescr::P2pApi;
  using KernelLaunch = v5::EventDescr::KernelLaunch;
  using Coll = v5::EventDescr::Coll;
  using P2p = v5::EventDescr::P2p;
  using ProxyOp = v5::EventDescr::ProxyOp;
  using ProxyStep = v5::EventDescr::ProxyStep;
  using KernelCh = v5::EventDescr::KernelCh;
  using NetPlugin = v5::EventDescr::NetPlugin;
  struct CeColl {  // a collective executed by copy engines instead of kernels
    uint64_t seqNumber;
    const char* func;
    const void* sendBuff;
    void* recvBuff;
    size_t count;
    int root;
    const char* datatype;
    const char* syncStrategy;
    bool intraBatchSync;
    uint32_t batchSize;
    uint32_t numBatches;
    uint32_t ceSeqNum;
    void* stream;
  };
  struct CeCollSync {
    bool isComplete;
    int nRanks;
  };
  struct CeCollBatch {
    int numOps;
    size_t totalBytes;
    bool useIntraSync;
  };

  uint64_t type;
  void* parentObj;
  int rank;
  union {
    GroupApi groupApi;
    CollApi collApi;
    P2pApi p2pApi;
    KernelLaunch kernelLaunch;
    Coll coll;
    P2p p2p;
    ProxyOp proxyOp;
    ProxyStep proxyStep;
    KernelCh kernelCh;
    NetPlugin netPlugin;
    CeColl ceColl;
    CeCollSync ceCollSync;
    CeCollBatch ceCollBatch;
  };
};

using StateArgs = v5::StateArgs;  // unchanged

using InitFn = v5::InitFn;  // unchanged signature
using StartEventFn = Result (*)(void* context, void** eHandle, EventDescr* eDescr);
using StopEventFn = Result (*)(void* eHandle);
using RecordEventStateFn = Result (*)(void* eHandle, State eState, StateArgs* eStateArgs);
using FinalizeFn = Result (*)(void* context);

struct Profiler {  // exported as `ncclProfiler_v6`
  const char* name;
  InitFn init;
  StartEventFn startEvent;
  StopEventFn stopEvent;
  RecordEventStateFn recordEventState;
  FinalizeFn finalize;
};

}  // namespace v6

// =========================================================================================================
// v7 (NCCL 2.31+). init unchanged. Adds `userTag` (per-call user tag, 0 = none) at the end of collApi, p2pApi,
// coll, p2p and ceColl; coll also gains `kernelVariant` and `isSymColl` (symmetric-memory kernels); new
// KernelPhase event (sub-event of KernelCh: 0 initial sync, 1 compute, 2 final sync) whose stop state
// KernelPhaseStop reuses stateArgs.kernelCh.pTimer. The descriptor grows to 136 bytes.
// =========================================================================================================
namespace v7 {

enum EventType : int {
  kGroup = 1 << 0,
  kColl = 1 << 1,
  kP2p = 1 << 2,
  kProxyOp = 1 << 3,
  kProxyStep = 1 << 4,
  kProxyCtrl = 1 << 5,
  kKernelCh = 1 << 6,
  kNetPlugin = 1 << 7,
  kGroupApi = 1 << 8,
  kCollApi = 1 << 9,
  kP2pApi = 1 << 10,
  kKernelLaunch = 1 << 11,
  kCeColl = 1 << 12,
  kCeSync = 1 << 13,
  kCeBatch = 1 << 14,
  kKernelPhase = 1 << 15,  // NCCL turns kKernelCh on implicitly when this is set
};

enum class State : int {
  ProxyOpSendPosted = 0,
  ProxyOpSendRemFifoWait = 1,
  ProxyOpSendTransmitted = 2,
  ProxyOpSendDone = 3,
  ProxyOpRecvPosted = 4,
  ProxyOpRecvReceived = 5,
  ProxyOpRecvTransmitted = 6,
  ProxyOpRecvDone = 7,
  ProxyStepSendGPUWait = 8,
  ProxyStepSendWait = 9,
  ProxyStepRecvWait = 10,
  ProxyStepRecvFlushWait = 11,
  ProxyStepRecvGPUWait = 12,
  ProxyCtrlIdle = 13,
  ProxyCtrlActive = 14,
  ProxyCtrlSleep = 15,
  ProxyCtrlWakeup = 16,
  ProxyCtrlAppend = 17,
  ProxyCtrlAppendEnd = 18,
  ProxyOpInProgress = 19,
  ProxyStepSendPeerWait = 20,
  NetPluginUpdate = 21,
  KernelChStop = 22,
  GroupStartApiStop = 23,
  GroupEndApiStart = 24,
  CeCollStart = 25,
  CeCollComplete = 26,
  CeSyncStart = 27,
  CeSyncComplete = 28,
  CeBatchStart = 29,
  CeBatchComplete = 30,
  KernelPhaseStop = 31,
};

struct EventDescr {
  using GroupApi = v6::EventDescr::GroupApi;
  struct CollApi {
    const char* func;
    size_t count;
    const char* datatype;
    int root;
    void* stream;
    bool graphCaptured;
    uint64_t userTag;
  };
  struct P2pApi {
    const char* func;
    size_t count;
    const char* datatype;
    void* stream;
    bool graphCaptured;
    uint64_t userTag;
  };
  using KernelLaunch = v6::EventDescr::KernelLaunch;
  struct Coll {
    uint64_t seqNumber;
    const char* func;
    const void* sendBuff;
    void* recvBuff;
    size_t count;
    int root;
    const char* datatype;
    uint8_t nChannels;
    uint8_t nWarps;
    const char* algo;
    const char* proto;
    void* parentGroup;
    const char* kernelVariant;
    bool isSymColl;
    uint64_t userTag;
  };
  struct P2p {
    const char* func;
    void* buff;
    const char* datatype;
    size_t count;
    int peer;
    uint8_t nChannels;
    void* parentGroup;
    uint64_t userTag;
  };
  using ProxyOp = v6::EventDescr::ProxyOp;
  using ProxyStep = v6::EventDescr::ProxyStep;
  using KernelCh = v6::EventDescr::KernelCh;
  using NetPlugin = v6::EventDescr::NetPlugin;
  struct CeColl {
    uint64_t seqNumber;
    const char* func;
    const void* sendBuff;
    void* recvBuff;
    size_t count;
    int root;
    const char* datatype;
    const char* syncStrategy;
    bool intraBatchSync;
    uint32_t batchSize;
    uint32_t numBatches;
    uint32_t ceSeqNum;
    void* stream;
    uint64_t userTag;
  };
  using CeCollSync = v6::EventDescr::CeCollSync;
  using CeCollBatch = v6::EventDescr::CeCollBatch;
  struct KernelPhase {
    uint8_t channelId;
    uint8_t phaseId;  // 0 initial sync, 1 compute, 2 final sync
    const char* phaseName;
    uint64_t pTimer;  // GPU globaltimer at phase start
  };

  uint64_t type;
  void* parentObj;
  int rank;
  union {
    GroupApi groupApi;
    CollApi collApi;
    P2pApi p2pApi;
    KernelLaunch kernelLaunch;
    Coll coll;
    P2p p2p;
    ProxyOp proxyOp;
    ProxyStep proxyStep;
    KernelCh kernelCh;
    NetPlugin netPlugin;
    CeColl ceColl;
    CeCollSync ceCollSync;
    CeCollBatch ceCollBatch;
    KernelPhase kernelPhase;
  };
};

using StateArgs = v6::StateArgs;  // unchanged (KernelPhaseStop uses kernelCh.pTimer)

using InitFn = v6::InitFn;  // unchanged signature
using StartEventFn = Result (*)(void* context, void** eHandle, EventDescr* eDescr);
using StopEventFn = Result (*)(void* eHandle);
using RecordEventStateFn = Result (*)(void* eHandle, State eState, StateArgs* eStateArgs);
using FinalizeFn = Result (*)(void* context);

struct Profiler {  // exported as `ncclProfiler_v7`
  const char* name;
  InitFn init;
  StartEventFn startEvent;
  StopEventFn stopEvent;
  RecordEventStateFn recordEventState;
  FinalizeFn finalize;
};

}  // namespace v7

// Exported symbol names, newest first (the order NCCL tries them).
inline constexpr const char* kProfilerSymbols[] = {"ncclProfiler_v7", "ncclProfiler_v6", "ncclProfiler_v5",
                                                   "ncclProfiler_v4"};

// ---------------------------------------------------------------------------------------------------------
// x86-64 layout, as the DWARF of libnccl.so.2 (nvidia-nccl-cu13 2.32.3) shows it.
// ---------------------------------------------------------------------------------------------------------
#if defined(__x86_64__) || defined(_M_X64)
#define MYCROFT_ABI_AT(T, m, off) static_assert(offsetof(T, m) == (off), #T "::" #m " offset")

// Function tables: six pointers, identical in every version.
static_assert(sizeof(v4::Profiler) == 48 && sizeof(v5::Profiler) == 48, "profiler table size");
static_assert(sizeof(v6::Profiler) == 48 && sizeof(v7::Profiler) == 48, "profiler table size");
MYCROFT_ABI_AT(v7::Profiler, init, 8);
MYCROFT_ABI_AT(v7::Profiler, startEvent, 16);
MYCROFT_ABI_AT(v7::Profiler, stopEvent, 24);
MYCROFT_ABI_AT(v7::Profiler, recordEventState, 32);
MYCROFT_ABI_AT(v7::Profiler, finalize, 40);

// State args: one 8-byte union in every version.
static_assert(sizeof(v4::StateArgs) == 8, "state args size");
static_assert(sizeof(v4::State) == 4 && sizeof(Result) == 4 && sizeof(LogLevel) == 4, "enum size");

// v4
static_assert(sizeof(v4::EventDescr) == 104, "v4 descr size");
MYCROFT_ABI_AT(v4::EventDescr, type, 0);
MYCROFT_ABI_AT(v4::EventDescr, parentObj, 8);
MYCROFT_ABI_AT(v4::EventDescr, rank, 16);
MYCROFT_ABI_AT(v4::EventDescr, coll, 24);
static_assert(sizeof(v4::EventDescr::Coll) == 80 && sizeof(v4::EventDescr::P2p) == 40, "v4 sub-structs");
MYCROFT_ABI_AT(v4::EventDescr::Coll, root, 40);
MYCROFT_ABI_AT(v4::EventDescr::Coll, nChannels, 56);
MYCROFT_ABI_AT(v4::EventDescr::Coll, nWarps, 57);
MYCROFT_ABI_AT(v4::EventDescr::Coll, proto, 72);
MYCROFT_ABI_AT(v4::EventDescr::P2p, nChannels, 36);
static_assert(sizeof(v4::EventDescr::ProxyOp) == 24 && sizeof(v4::EventDescr::KernelCh) == 16, "v4 sub-structs");
MYCROFT_ABI_AT(v4::EventDescr::ProxyOp, channelId, 4);
MYCROFT_ABI_AT(v4::EventDescr::ProxyOp, isSend, 20);
MYCROFT_ABI_AT(v4::EventDescr::KernelCh, pTimer, 8);
MYCROFT_ABI_AT(v4::EventDescr::NetPlugin, data, 8);

// v5
static_assert(sizeof(v5::EventDescr) == 112, "v5 descr size");
MYCROFT_ABI_AT(v5::EventDescr, coll, 24);
static_assert(sizeof(v5::EventDescr::Coll) == 88 && sizeof(v5::EventDescr::P2p) == 48, "v5 sub-structs");
static_assert(sizeof(v5::EventDescr::CollApi) == 48 && sizeof(v5::EventDescr::P2pApi) == 40, "v5 sub-structs");
MYCROFT_ABI_AT(v5::EventDescr::GroupApi, groupDepth, 4);
MYCROFT_ABI_AT(v5::EventDescr::CollApi, graphCaptured, 40);
MYCROFT_ABI_AT(v5::EventDescr::P2pApi, graphCaptured, 32);
MYCROFT_ABI_AT(v5::EventDescr::Coll, parentGroup, 80);
MYCROFT_ABI_AT(v5::EventDescr::P2p, parentGroup, 40);

// v6
static_assert(sizeof(v6::EventDescr) == 112, "v6 descr size");
static_assert(sizeof(v6::EventDescr::CeColl) == 88, "v6 ceColl size");
MYCROFT_ABI_AT(v6::EventDescr::CeColl, syncStrategy, 56);
MYCROFT_ABI_AT(v6::EventDescr::CeColl, intraBatchSync, 64);
MYCROFT_ABI_AT(v6::EventDescr::CeColl, batchSize, 68);
MYCROFT_ABI_AT(v6::EventDescr::CeColl, ceSeqNum, 76);
MYCROFT_ABI_AT(v6::EventDescr::CeColl, stream, 80);
static_assert(sizeof(v6::EventDescr::CeCollSync) == 8 && sizeof(v6::EventDescr::CeCollBatch) == 24, "v6 ce");
MYCROFT_ABI_AT(v6::EventDescr::CeCollBatch, useIntraSync, 16);

// v7
static_assert(sizeof(v7::EventDescr) == 136, "v7 descr size");
static_assert(sizeof(v7::EventDescr::Coll) == 112 && sizeof(v7::EventDescr::P2p) == 56, "v7 sub-structs");
static_assert(sizeof(v7::EventDescr::CollApi) == 56 && sizeof(v7::EventDescr::P2pApi) == 48, "v7 sub-structs");
MYCROFT_ABI_AT(v7::EventDescr::Coll, kernelVariant, 88);
MYCROFT_ABI_AT(v7::EventDescr::Coll, isSymColl, 96);
MYCROFT_ABI_AT(v7::EventDescr::Coll, userTag, 104);
MYCROFT_ABI_AT(v7::EventDescr::P2p, userTag, 48);
MYCROFT_ABI_AT(v7::EventDescr::CollApi, userTag, 48);
MYCROFT_ABI_AT(v7::EventDescr::P2pApi, userTag, 40);
static_assert(sizeof(v7::EventDescr::CeColl) == 96, "v7 ceColl size");
MYCROFT_ABI_AT(v7::EventDescr::CeColl, userTag, 88);
static_assert(sizeof(v7::EventDescr::KernelPhase) == 24, "v7 kernelPhase size");
MYCROFT_ABI_AT(v7::EventDescr::KernelPhase, phaseId, 1);
MYCROFT_ABI_AT(v7::EventDescr::KernelPhase, phaseName, 8);
MYCROFT_ABI_AT(v7::EventDescr::KernelPhase, pTimer, 16);

#undef MYCROFT_ABI_AT
#endif  // x86-64

}  // namespace mycroft::nccl_abi
