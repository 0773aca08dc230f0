// mycroft/nccl_profiler_abi.h -- our own declarations of NCCL's profiler plugin ABI, versions 4 to 7.
//
// NCCL ships no profiler headers in its wheels, so we declare the ABI ourselves. Everything here is a fact
// about the binary interface (member order, types, enum values, symbol names), written in our own words and
// checked against the DWARF debug info of the real libnccl.so.2 by tests/abi/test_nccl_abi.py. The fixture
// comes from the PyPI wheels nvidia-nccl-cu13 2.32.3 (which carries v1..v7 side by side for its adapters) and
// nvidia-nccl-cu12 2.27.7 / 2.28.9 / 2.29.7 / 2.30.7 / 2.31.2 (each version's own event and state set comes
// from the release where it is the newest). The static_asserts at the end pin the x86-64 layout.
// docs/nccl-abi.md tells the same story at more length.
//
// Loading. NCCL dlopen()s $NCCL_PROFILER_PLUGIN and dlsym()s the data symbols "ncclProfiler_v7", "_v6",
// "_v5", "_v4" (then v3..v1), newest first; each is an instance of that version's `Profiler` table. The newest
// table each release looks for: 2.27 -> v4, 2.28 -> v5, 2.29 and 2.30 -> v6, 2.31 and 2.32 -> v7. A newer
// NCCL drives an older table through an adapter that copies its descriptor into the old layout and silently
// drops event types and states the old version does not know. Since we export all four tables, every release
// from 2.27 on calls its own native version and no adapter ever runs for us (good: e.g. the v4 adapter leaves
// p2p.nChannels uninitialised).
//
// ---------------------------------------------------------------------------------------------------------
// Semantics (verified in NCCL's sources: src/plugin/profiler.cc, src/enqueue.cc, src/proxy.cc,
// src/transport/net.cc, src/transport/profiler.cc, src/plugin/profiler/profiler_v*.cc)
// ---------------------------------------------------------------------------------------------------------
// init / finalize
//   * init() runs once per communicator, from communicator initialisation (the creating thread, or NCCL's
//     init thread for non-blocking communicators). commId (v4: commHash, 4th argument) is comm->commHash,
//     identical on every rank of the communicator. commName is config.commName and is NULL unless the user set
//     one. If init returns an error, recent NCCL drops its reference to the plugin; 2.27/2.28 only log it and
//     keep calling us with whatever *context holds. So never fail: leave *context NULL (every callback must
//     accept a NULL context) and return Success.
//   * finalize() runs once per communicator from ncclCommDestroy/ncclCommAbort (only if context != NULL).
//     Events may still arrive on other threads until then; nothing arrives for that context afterwards,
//     except PXN (below).
// eActivationMask
//   * One process-wide int (NCCL's ncclProfilerEventMask) shared by all communicators; every init() call
//     gets the same pointer and may overwrite it, so always write the same value. NCCL loads it (relaxed) when
//     an API call / group starts (2.28+: at GroupApi start, copied into each task; 2.27: at task enqueue), and
//     the proxy reads it per ProxyCtrl event. Writes after init take effect for later operations.
//   * Asking for a child turns on its ancestors: any of Coll/ProxyOp/ProxyStep/KernelCh/NetPlugin makes NCCL
//     emit Group + Coll (and, v5+, GroupApi + CollApi); ProxyStep implies ProxyOp. 2.31+ forces KernelCh on
//     when KernelPhase is requested.
// Threads
//   * GroupApi, CollApi, P2pApi: the user thread inside the NCCL call. KernelLaunch, Group, Coll, P2p: the
//     thread that launches the plan (the user thread, or a CUDA host-callback thread for graph-captured /
//     persistent plans, once per replay). ProxyOp, ProxyStep, ProxyCtrl, NetPlugin: the proxy progress thread.
//   * KernelCh: 2.27..2.30 the proxy progress thread (NCCL posts an internal "profiler" proxy op per channel
//     that polls the device's work counters); 2.31+ a dedicated NCCL profiler thread per communicator (shared
//     with split children that share resources).
// Order and lifetime
//   * Group start -> Coll/P2p start (one per task in the plan) -> proxy ops handed to the proxy thread ->
//     Coll/P2p stop -> Group stop, all at LAUNCH time. Completion is only visible through the children
//     (ProxyOp/ProxyStep stops, KernelCh stop), which end (and usually start) AFTER their parent was stopped,
//     on other threads: a parent handle must stay valid after stopEvent until its last child is stopped.
//   * ProxyOp: start when the proxy appends it, state ProxyOpInProgress when progress begins, stop when all
//     its steps are done. ProxySteps are tracked in NCCL_STEPS (8) slots per op, step = DIVUP(step,
//     sliceSteps), so at most 8 are in flight per op.
// Parents (parentObj = the eHandle we returned for the parent; NULL if we returned NULL)
//   v5+: CollApi/P2pApi/KernelLaunch -> GroupApi; Coll -> CollApi and coll.parentGroup = Group; P2p -> P2pApi
//        and p2p.parentGroup = Group; ProxyOp -> Coll or P2p; ProxyStep -> ProxyOp; KernelCh -> Coll or P2p;
//        KernelPhase -> KernelCh; NetPlugin -> ProxyStep; Group, GroupApi, ProxyCtrl: none.
//   v4:  the adapter (and 2.27 natively) sets Coll/P2p parentObj = the Group handle; no API events.
//   The descriptor `rank` is set for Coll, P2p, ProxyOp, ProxyStep, NetPlugin (API events: recent releases
//   only); it is 0 for Group and KernelCh. Use the rank given to init().
// PXN (a proxy op posted by another process on the node, executed by OUR proxy thread, or vice versa)
//   * proxyOp.pid = pid of the process that posted the op (NCCL's getpid() at plugin load). When it is not
//     our getpid(), BOTH parentObj and the `context` argument are pointers from the other process: never
//     dereference them; keep such ops in process-global state. Their ProxySteps also carry the foreign
//     context, so find state through parentObj (our own ProxyOp handle) only.
// coll.seqNumber
//   * comm->seqNumber[func]: a counter per communicator AND PER COLLECTIVE FUNCTION (AllReduce and AllGather
//     each start at 0), taken before increment. It advances even without a plugin, but NOT for graph-captured
//     (persistent) plans unless KernelCh is in the mask. A collective instance is (commHash, func, seqNumber).
//     P2p has no sequence number.
// Strings (NCCL static storage, valid for the process lifetime; read from the 2.27.7..2.32.3 binaries)
//   func:     "AllGather" "ReduceScatter" "AllReduce" "Broadcast" "Reduce" "SendRecv" "Send" "Recv"; 2.28+ also
//             "AlltoAll" "Scatter" "Gather"; 2.29+ also "PutSignal" "Signal" "WaitSignal"; else "Invalid".
//   datatype: "ncclInt8" "ncclInt32" "ncclUint32" "ncclInt64" "ncclUint64" "ncclFloat16" "ncclFloat32"
//             "ncclFloat64" "ncclBfloat16" "ncclFloat8e4m3" "ncclFloat8e5m2", else "Unknown" (ncclUint8 too!).
//   algo:     "TREE" "RING" "COLLNET_DIRECT" "COLLNET_CHAIN" "NVLS" "NVLS_TREE" "PAT", else "Unknown"; for v7
//             symmetric kernels (isSymColl) algo is the kernel variant's suffix and kernelVariant the full name.
//   proto:    "LL" "LL128" "SIMPLE", else "Unknown"; "" for symmetric kernels.
// KernelCh
//   * One event per (Coll/P2p task, channel it runs on): started when the device marks the channel's work
//     started (kernelCh.pTimer = GPU start), then recordEventState(KernelChStop, stateArgs.kernelCh.pTimer =
//     GPU end) and stopEvent once it is marked complete. pTimer is the GPU %globaltimer in ns, NOT host
//     CLOCK_MONOTONIC. coll.nChannels tells how many to expect (recent releases: p2p.nChannels too, when
//     KernelCh is on).
// ProxyStep state order (each state marks the start of a wait; stop = the step is finished)
//   send: start (buffer posted to the GPU) -> SendGPUWait -> SendPeerWait (data ready, isend being tried;
//         re-recorded on every retry while the network refuses it) -> SendWait (isend posted) -> stop (done).
//   recv: start (before irecv; RE-STARTED for the same step while irecv is refused, the earlier handle is
//         then never stopped) -> RecvWait (irecv posted) -> RecvFlushWait (data arrived; flush if needed) ->
//         RecvGPUWait (handed to the GPU) -> stop (GPU consumed it).
//   stateArgs.proxyStep.transSize is meaningful at SendWait (bytes sent) and RecvFlushWait (bytes received);
//   at other states it holds a stale value. ProxyOp events exist for every proxy-driven transfer (network,
//   plus P2P/SHM when they copy through the proxy); ProxySteps come from the network transports; proxyOp.isSend
//   is 1 only for NET sends (0 for everything else, including non-network sends).
// CE collectives (v6+)
//   * A collective that NCCL runs on copy engines produces CeColl (parent = CollApi; its own counter
//     ceColl.seqNumber == ceSeqNum; syncStrategy "MC" or "UC") with CeSync/CeBatch children, started and
//     stopped on the enqueueing thread, and NO Coll event. NCCL records no states for them.
// NetPlugin
//   * Emitted only by net plugins built with profiling (NCCL_ENABLE_NET_PROFILING); the PyPI builds have it
//     compiled out, so expect none. netPlugin.id = network type | version: type in the bits above 16
//     (IB = 1 << 16, Socket = 2 << 16), version in the low 16 bits (1 for both). netPlugin.data points to that
//     plugin's descriptor: see NetIbDescrV1 / NetSockDescrV1 below. NetPluginUpdate passes new data in
//     stateArgs.netPlugin.data.
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
  Timeout = 8,  // 2.30+
};

// ncclDebugLogLevel.
enum class LogLevel : int {
  None = 0,
  Version = 1,
  Warn = 2,
  Info = 3,
  Abort = 4,
  Trace = 5,
  Attn = 6,  // 2.32+; use only Warn and Info from a plugin (they exist in every version)
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
  kLogDestroy = 0x10000,    // 2.30+ (older NCCL ignores unknown bits)
  kLogAllocHost = 0x20000,  // 2.30+
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
  ProxyOpSendPosted = 0,  // 0..7: legacy ProxyOp states (v1-v3), deprecated since v4, never recorded
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

// =========================================================================================================
// NetPlugin payloads: what netPlugin.data points to, chosen by netPlugin.id. Declared by NCCL for its own IB and
// socket transports (src/include/plugin/profiler/net_ib_v1.h, net_socket_v1.h). The PyPI builds compile this
// out, so these layouts are NOT in the DWARF fixture: they are checked only by the static_asserts below.
// =========================================================================================================
namespace net {

inline constexpr int kVersionBits = 16;
inline constexpr int64_t kVersionMask = (int64_t{1} << kVersionBits) - 1;
inline constexpr int64_t kTypeIb = int64_t{1} << kVersionBits;
inline constexpr int64_t kTypeSocket = int64_t{2} << kVersionBits;
inline constexpr int64_t TypeOf(int64_t id) { return id & ~kVersionMask; }
inline constexpr int64_t VersionOf(int64_t id) { return id & kVersionMask; }

struct IbDescrV1 {  // id == kTypeIb | 1
  enum : uint8_t { kQp = 1 << 0 };
  struct Qp {
    int device;      // index of the IB device (NIC) within the net plugin
    uint64_t wr_id;  // work request id
    int opcode;      // ibv_wr_opcode
    int qpNum;       // queue pair number
    size_t length;   // bytes in this work request
  };
  uint8_t type;  // kQp
  union {
    Qp qp;
  };
};

struct SockDescrV1 {  // id == kTypeSocket | 1
  enum : uint8_t { kSocket = 1 << 0 };
  struct Sock {
    int fd;
    int op;  // NCCL's socket op (send or recv)
    size_t length;
  };
  uint8_t type;  // kSocket
  union {
    Sock sock;
  };
};

}  // namespace net

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

// NetPlugin payloads (from NCCL's declarations; absent from the PyPI DWARF).
static_assert(sizeof(net::IbDescrV1) == 40 && sizeof(net::SockDescrV1) == 24, "net payload size");
MYCROFT_ABI_AT(net::IbDescrV1, qp, 8);
MYCROFT_ABI_AT(net::IbDescrV1::Qp, wr_id, 8);
MYCROFT_ABI_AT(net::IbDescrV1::Qp, qpNum, 20);
MYCROFT_ABI_AT(net::IbDescrV1::Qp, length, 24);
MYCROFT_ABI_AT(net::SockDescrV1, sock, 8);
MYCROFT_ABI_AT(net::SockDescrV1::Sock, length, 8);

#undef MYCROFT_ABI_AT
#endif  // x86-64

}  // namespace mycroft::nccl_abi
