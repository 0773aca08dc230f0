// Prints the layout of our NCCL profiler ABI declarations (native/include/mycroft/nccl_profiler_abi.h) as JSON, in
// the shape scripts/abi/extract_nccl_abi.py extracts from libnccl's DWARF, so tests/abi/test_nccl_abi.py can
// compare the two. Build: g++ -std=c++17 -Inative/include tests/abi/layout_dump.cc -o layout_dump
//
// Everything is derived from the declarations by the compiler (offsetof, sizeof, decltype, type traits); the
// only hand-written parts are the lists of member and enumerator names to visit, and a forgotten or extra name
// shows up as a difference against NCCL's DWARF.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "mycroft/nccl_profiler_abi.h"

namespace abi = mycroft::nccl_abi;

namespace {

// ---- kinds, in the extractor's vocabulary ------------------------------------------------------------------
template <class T>
std::string Kind() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_void_v<U>) {
    return "void";
  } else if constexpr (std::is_same_v<U, bool>) {
    return "bool";
  } else if constexpr (std::is_enum_v<U>) {
    return "enum" + std::to_string(8 * sizeof(U));
  } else if constexpr (std::is_integral_v<U>) {
    return (std::is_signed_v<U> ? "i" : "u") + std::to_string(8 * sizeof(U));
  } else if constexpr (std::is_pointer_v<U>) {
    return std::is_function_v<std::remove_pointer_t<U>> ? "fnptr" : "ptr";
  } else if constexpr (std::is_union_v<U>) {
    return "union";
  } else if constexpr (std::is_class_v<U>) {
    return "struct";
  } else {
    return "other";
  }
}

std::string Quote(const std::string& s) { return "\"" + s + "\""; }

template <class F>
struct Sig {
  static std::string Json() { return ""; }
};
template <class R, class... A>
struct Sig<R (*)(A...)> {
  static std::string Json() {
    std::string s = ", \"sig\": [" + Quote(Kind<R>());
    ((s += ", " + Quote(Kind<A>())), ...);
    return s + "]";
  }
};
template <class R, class... A>
struct Sig<R (*)(A..., ...)> {
  static std::string Json() {
    std::string s = ", \"sig\": [" + Quote(Kind<R>());
    ((s += ", " + Quote(Kind<A>())), ...);
    return s + "], \"variadic\": true";
  }
};

template <class M>
std::string Member(const char* name, size_t offset) {
  std::string s = "{\"name\": " + Quote(name) + ", \"offset\": " + std::to_string(offset) +
                  ", \"size\": " + std::to_string(sizeof(M)) + ", \"kind\": " + Quote(Kind<M>());
  if constexpr (std::is_pointer_v<M> && std::is_function_v<std::remove_pointer_t<M>>) s += Sig<M>::Json();
  return s + "}";
}

std::string Join(const std::vector<std::string>& parts) {
  std::string s;
  for (size_t i = 0; i < parts.size(); ++i) s += (i ? ", " : "") + parts[i];
  return s;
}

std::string Record(size_t size, const std::vector<std::string>& members) {
  return "{\"size\": " + std::to_string(size) + ", \"members\": [" + Join(members) + "]}";
}

using Enum = std::vector<std::pair<std::string, long long>>;
std::string EnumJson(const Enum& e) {
  std::vector<std::string> parts;
  for (const auto& [name, value] : e) parts.push_back(Quote(name) + ": " + std::to_string(value));
  return "{" + Join(parts) + "}";
}

}  // namespace

// A member M of aggregate T.
#define MEM(T, m) Member<decltype(T::m)>(#m, offsetof(T, m))
// A struct-typed variant `v` of union-ish owner T, listing its members.
#define VARIANT(T, v, ...) \
  Quote(#v) + ": " + Record(sizeof(decltype(T::v)), {FOR_EACH_MEMBER(decltype(T::v), __VA_ARGS__)})

// Small fixed-arity expansion: up to 16 members per struct (the biggest, v7 coll, has 15).
#define FE_1(T, a) MEM(T, a)
#define FE_2(T, a, ...) MEM(T, a), FE_1(T, __VA_ARGS__)
#define FE_3(T, a, ...) MEM(T, a), FE_2(T, __VA_ARGS__)
#define FE_4(T, a, ...) MEM(T, a), FE_3(T, __VA_ARGS__)
#define FE_5(T, a, ...) MEM(T, a), FE_4(T, __VA_ARGS__)
#define FE_6(T, a, ...) MEM(T, a), FE_5(T, __VA_ARGS__)
#define FE_7(T, a, ...) MEM(T, a), FE_6(T, __VA_ARGS__)
#define FE_8(T, a, ...) MEM(T, a), FE_7(T, __VA_ARGS__)
#define FE_9(T, a, ...) MEM(T, a), FE_8(T, __VA_ARGS__)
#define FE_10(T, a, ...) MEM(T, a), FE_9(T, __VA_ARGS__)
#define FE_11(T, a, ...) MEM(T, a), FE_10(T, __VA_ARGS__)
#define FE_12(T, a, ...) MEM(T, a), FE_11(T, __VA_ARGS__)
#define FE_13(T, a, ...) MEM(T, a), FE_12(T, __VA_ARGS__)
#define FE_14(T, a, ...) MEM(T, a), FE_13(T, __VA_ARGS__)
#define FE_15(T, a, ...) MEM(T, a), FE_14(T, __VA_ARGS__)
#define FE_16(T, a, ...) MEM(T, a), FE_15(T, __VA_ARGS__)
#define FE_PICK(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, NAME, ...) NAME
#define FOR_EACH_MEMBER(T, ...)                                                                                  \
  FE_PICK(__VA_ARGS__, FE_16, FE_15, FE_14, FE_13, FE_12, FE_11, FE_10, FE_9, FE_8, FE_7, FE_6, FE_5, FE_4, FE_3, \
          FE_2, FE_1, unused)                                                                                    \
  (T, __VA_ARGS__)

// The union's variants share one offset (checked by comparing every variant's offsetof with the first).
template <class D>
std::string DescrJson(size_t union_offset, const std::vector<size_t>& variant_offsets,
                      const std::vector<std::string>& variants) {
  for (size_t off : variant_offsets) {
    if (off != union_offset) return "{\"error\": \"union variants at different offsets\"}";
  }
  return "{\"size\": " + std::to_string(sizeof(D)) + ", \"members\": [" +
         Join({MEM(D, type), MEM(D, parentObj), MEM(D, rank)}) + "], \"union\": {\"size\": " +
         std::to_string(sizeof(D) - union_offset) + ", \"variants\": {" + Join(variants) +
         "}, \"offset\": " + std::to_string(union_offset) + "}}";
}

template <class P>
std::string ProfilerJson() {
  return Record(sizeof(P), {MEM(P, name), MEM(P, init), MEM(P, startEvent), MEM(P, stopEvent),
                            MEM(P, recordEventState), MEM(P, finalize)});
}

template <class S>
std::string StateArgsJson() {
  return "{\"size\": " + std::to_string(sizeof(S)) + ", \"variants\": {" +
         Join({VARIANT(S, proxyStep, transSize), VARIANT(S, proxyCtrl, appendedProxyOps),
               VARIANT(S, netPlugin, data), VARIANT(S, kernelCh, pTimer)}) +
         "}}";
}

#define ET(ns, n) {#n, static_cast<long long>(abi::ns::k##n)}
#define ST(ns, n) {#n, static_cast<long long>(abi::ns::State::n)}

// Variants present from v4 on, with the member lists they have in every version that keeps them unchanged.
#define V_PROXY(D)                                                                           \
  VARIANT(D, proxyOp, pid, channelId, peer, nSteps, chunkSize, isSend),                      \
      VARIANT(D, proxyStep, step), VARIANT(D, kernelCh, channelId, pTimer),                  \
      VARIANT(D, netPlugin, id, data)
#define V_API5(D)                                                                            \
  VARIANT(D, groupApi, graphCaptured, groupDepth),                                           \
      VARIANT(D, collApi, func, count, datatype, root, stream, graphCaptured),               \
      VARIANT(D, p2pApi, func, count, datatype, stream, graphCaptured), VARIANT(D, kernelLaunch, stream)
#define V_COLL5(D)                                                                                                  \
  VARIANT(D, coll, seqNumber, func, sendBuff, recvBuff, count, root, datatype, nChannels, nWarps, algo, proto,      \
          parentGroup),                                                                                             \
      VARIANT(D, p2p, func, buff, datatype, count, peer, nChannels, parentGroup)
#define V_CE6(D)                                                                                                    \
  VARIANT(D, ceCollSync, isComplete, nRanks), VARIANT(D, ceCollBatch, numOps, totalBytes, useIntraSync)

std::string V4() {
  using D = abi::v4::EventDescr;
  std::string descr = DescrJson<D>(
      offsetof(D, coll),
      {offsetof(D, p2p), offsetof(D, proxyOp), offsetof(D, proxyStep), offsetof(D, kernelCh), offsetof(D, netPlugin)},
      {VARIANT(D, coll, seqNumber, func, sendBuff, recvBuff, count, root, datatype, nChannels, nWarps, algo, proto),
       VARIANT(D, p2p, func, buff, datatype, count, peer, nChannels), V_PROXY(D)});
  Enum et = {ET(v4, Group), ET(v4, Coll), ET(v4, P2p), ET(v4, ProxyOp), ET(v4, ProxyStep), ET(v4, ProxyCtrl),
             ET(v4, KernelCh), ET(v4, NetPlugin)};
  Enum st = {ST(v4, ProxyOpSendPosted),      ST(v4, ProxyOpSendRemFifoWait), ST(v4, ProxyOpSendTransmitted),
             ST(v4, ProxyOpSendDone),        ST(v4, ProxyOpRecvPosted),      ST(v4, ProxyOpRecvReceived),
             ST(v4, ProxyOpRecvTransmitted), ST(v4, ProxyOpRecvDone),        ST(v4, ProxyStepSendGPUWait),
             ST(v4, ProxyStepSendWait),      ST(v4, ProxyStepRecvWait),      ST(v4, ProxyStepRecvFlushWait),
             ST(v4, ProxyStepRecvGPUWait),   ST(v4, ProxyCtrlIdle),          ST(v4, ProxyCtrlActive),
             ST(v4, ProxyCtrlSleep),         ST(v4, ProxyCtrlWakeup),        ST(v4, ProxyCtrlAppend),
             ST(v4, ProxyCtrlAppendEnd),     ST(v4, ProxyOpInProgress),      ST(v4, ProxyStepSendPeerWait),
             ST(v4, NetPluginUpdate),        ST(v4, KernelChStop)};
  return "{\"Profiler\": " + ProfilerJson<abi::v4::Profiler>() + ", \"EventDescr\": " + descr +
         ", \"StateArgs\": " + StateArgsJson<abi::v4::StateArgs>() + ", \"EventType\": " + EnumJson(et) +
         ", \"State\": " + EnumJson(st) + "}";
}

#define ST5(ns)                                                                                               \
  ST(ns, ProxyOpSendPosted), ST(ns, ProxyOpSendRemFifoWait), ST(ns, ProxyOpSendTransmitted),                  \
      ST(ns, ProxyOpSendDone), ST(ns, ProxyOpRecvPosted), ST(ns, ProxyOpRecvReceived),                        \
      ST(ns, ProxyOpRecvTransmitted), ST(ns, ProxyOpRecvDone), ST(ns, ProxyStepSendGPUWait),                  \
      ST(ns, ProxyStepSendWait), ST(ns, ProxyStepRecvWait), ST(ns, ProxyStepRecvFlushWait),                   \
      ST(ns, ProxyStepRecvGPUWait), ST(ns, ProxyCtrlIdle), ST(ns, ProxyCtrlActive), ST(ns, ProxyCtrlSleep),   \
      ST(ns, ProxyCtrlWakeup), ST(ns, ProxyCtrlAppend), ST(ns, ProxyCtrlAppendEnd), ST(ns, ProxyOpInProgress), \
      ST(ns, ProxyStepSendPeerWait), ST(ns, NetPluginUpdate), ST(ns, KernelChStop), ST(ns, GroupStartApiStop), \
      ST(ns, GroupEndApiStart)
#define ET5(ns)                                                                                                   \
  ET(ns, Group), ET(ns, Coll), ET(ns, P2p), ET(ns, ProxyOp), ET(ns, ProxyStep), ET(ns, ProxyCtrl), ET(ns, KernelCh), \
      ET(ns, NetPlugin), ET(ns, GroupApi), ET(ns, CollApi), ET(ns, P2pApi), ET(ns, KernelLaunch)
#define ST6(ns)                                                                                           \
  ST5(ns), ST(ns, CeCollStart), ST(ns, CeCollComplete), ST(ns, CeSyncStart), ST(ns, CeSyncComplete), \
      ST(ns, CeBatchStart), ST(ns, CeBatchComplete)
#define ET6(ns) ET5(ns), ET(ns, CeColl), ET(ns, CeSync), ET(ns, CeBatch)
#define OFFS5(D)                                                                                            \
  offsetof(D, collApi), offsetof(D, p2pApi), offsetof(D, kernelLaunch), offsetof(D, coll), offsetof(D, p2p), \
      offsetof(D, proxyOp), offsetof(D, proxyStep), offsetof(D, kernelCh), offsetof(D, netPlugin)

template <class P, class S>
std::string Version(const std::string& descr, const Enum& et, const Enum& st) {
  return "{\"Profiler\": " + ProfilerJson<P>() + ", \"EventDescr\": " + descr + ", \"StateArgs\": " +
         StateArgsJson<S>() + ", \"EventType\": " + EnumJson(et) + ", \"State\": " + EnumJson(st) + "}";
}

std::string V5() {
  using D = abi::v5::EventDescr;
  std::string descr = DescrJson<D>(offsetof(D, groupApi), {OFFS5(D)}, {V_API5(D), V_COLL5(D), V_PROXY(D)});
  return Version<abi::v5::Profiler, abi::v5::StateArgs>(descr, {ET5(v5)}, {ST5(v5)});
}

std::string V6() {
  using D = abi::v6::EventDescr;
  std::string descr = DescrJson<D>(
      offsetof(D, groupApi), {OFFS5(D), offsetof(D, ceColl), offsetof(D, ceCollSync), offsetof(D, ceCollBatch)},
      {V_API5(D), V_COLL5(D), V_PROXY(D),
       VARIANT(D, ceColl, seqNumber, func, sendBuff, recvBuff, count, root, datatype, syncStrategy, intraBatchSync,
               batchSize, numBatches, ceSeqNum, stream),
       V_CE6(D)});
  return Version<abi::v6::Profiler, abi::v6::StateArgs>(descr, {ET6(v6)}, {ST6(v6)});
}

std::string V7() {
  using D = abi::v7::EventDescr;
  std::string descr = DescrJson<D>(
      offsetof(D, groupApi),
      {OFFS5(D), offsetof(D, ceColl), offsetof(D, ceCollSync), offsetof(D, ceCollBatch), offsetof(D, kernelPhase)},
      {VARIANT(D, groupApi, graphCaptured, groupDepth),
       VARIANT(D, collApi, func, count, datatype, root, stream, graphCaptured, userTag),
       VARIANT(D, p2pApi, func, count, datatype, stream, graphCaptured, userTag), VARIANT(D, kernelLaunch, stream),
       VARIANT(D, coll, seqNumber, func, sendBuff, recvBuff, count, root, datatype, nChannels, nWarps, algo, proto,
               parentGroup, kernelVariant, isSymColl, userTag),
       VARIANT(D, p2p, func, buff, datatype, count, peer, nChannels, parentGroup, userTag), V_PROXY(D),
       VARIANT(D, ceColl, seqNumber, func, sendBuff, recvBuff, count, root, datatype, syncStrategy, intraBatchSync,
               batchSize, numBatches, ceSeqNum, stream, userTag),
       V_CE6(D), VARIANT(D, kernelPhase, channelId, phaseId, phaseName, pTimer)});
  return Version<abi::v7::Profiler, abi::v7::StateArgs>(descr, {ET6(v7), ET(v7, KernelPhase)},
                                                       {ST6(v7), ST(v7, KernelPhaseStop)});
}

std::string Shared() {
  using abi::LogLevel;
  using abi::Result;
  Enum result = {{"Success", (long long)Result::Success},
                 {"UnhandledCudaError", (long long)Result::UnhandledCudaError},
                 {"SystemError", (long long)Result::SystemError},
                 {"InternalError", (long long)Result::InternalError},
                 {"InvalidArgument", (long long)Result::InvalidArgument},
                 {"InvalidUsage", (long long)Result::InvalidUsage},
                 {"RemoteError", (long long)Result::RemoteError},
                 {"InProgress", (long long)Result::InProgress},
                 {"Timeout", (long long)Result::Timeout}};
  Enum level = {{"NONE", (long long)LogLevel::None},   {"VERSION", (long long)LogLevel::Version},
                {"WARN", (long long)LogLevel::Warn},   {"INFO", (long long)LogLevel::Info},
                {"ABORT", (long long)LogLevel::Abort}, {"TRACE", (long long)LogLevel::Trace},
                {"ATTN", (long long)LogLevel::Attn}};
  // NCCL declares the subsystem bits in an int-sized enum (ALL == -1); compare them as such.
  auto sub = [](const char* n, abi::LogSubsys v) { return std::make_pair(std::string(n), (long long)(int)v); };
  Enum subsys = {sub("INIT", abi::kLogInit),     sub("COLL", abi::kLogColl),       sub("P2P", abi::kLogP2p),
                 sub("SHM", abi::kLogShm),       sub("NET", abi::kLogNet),         sub("GRAPH", abi::kLogGraph),
                 sub("TUNING", abi::kLogTuning), sub("ENV", abi::kLogEnv),         sub("ALLOC", abi::kLogAlloc),
                 sub("CALL", abi::kLogCall),     sub("PROXY", abi::kLogProxy),     sub("NVLS", abi::kLogNvls),
                 sub("BOOTSTRAP", abi::kLogBootstrap), sub("REG", abi::kLogReg), sub("PROFILE", abi::kLogProfile),
                 sub("RAS", abi::kLogRas),       sub("DESTROY", abi::kLogDestroy),
                 sub("ALLOC_HOST", abi::kLogAllocHost), sub("ALL", abi::kLogAll)};
  return "{\"Result\": " + EnumJson(result) + ", \"LogLevel\": " + EnumJson(level) + ", \"LogSubsys\": " +
         EnumJson(subsys) + ", \"DebugLogger\": {" + Sig<abi::DebugLogger>::Json().substr(2) + "}}";
}

int main() {
  std::printf("{\"shared\": %s, \"versions\": {\"v4\": %s, \"v5\": %s, \"v6\": %s, \"v7\": %s}}\n", Shared().c_str(),
              V4().c_str(), V5().c_str(), V6().c_str(), V7().c_str());
  return 0;
}
