"""An independent caller of the profiler plugin, written with ctypes from NCCL's ABI facts.

Nothing here imports our bindings (``mycroft_otel._native``), the simulator or our C++ header: the descriptor
layouts below are written from NCCL's ``profiler_v4/v5/v7.h`` (and their sizes are checked against the numbers
NCCL's DWARF gives: 104 / 112 / 136 bytes), the calling conventions from ``src/plugin/profiler.cc``.

What NCCL does that this module reproduces (read in NVIDIA/nccl):
  * ``init`` once per communicator with ONE process-wide ``int`` mask pointer; v4 takes (ctx, mask, name, hash,
    ...), v5+ take (ctx, commId, mask, name, ...).
  * descriptors are zero-initialised stack structs filled per event (``eDescr = {0}``); strings are NCCL's static
    spellings; ``rank`` is 0 for Group and KernelCh events.
  * ``stopEvent`` and ``recordEventState`` get only the handle; a NULL handle is never passed by NCCL (it checks),
    so neither do we.
  * ``recordEventState`` for a ProxyStep always passes ``transSize = sub->transSize``: the value is fresh only at
    SendWait / RecvFlushWait and stale (whatever the last transfer of that sub set) at every other state.
"""

from __future__ import annotations

import ctypes as C
import os
import threading

# --- enums (values are ABI facts) ---------------------------------------------------------------------------
GROUP, COLL, P2P, PROXY_OP, PROXY_STEP, PROXY_CTRL, KERNEL_CH, NET_PLUGIN = (1 << i for i in range(8))
GROUP_API, COLL_API, P2P_API, KERNEL_LAUNCH = (1 << i for i in range(8, 12))

ST_SEND_GPU_WAIT = 8
ST_SEND_WAIT = 9
ST_RECV_WAIT = 10
ST_RECV_FLUSH_WAIT = 11
ST_RECV_GPU_WAIT = 12
ST_PROXY_OP_IN_PROGRESS = 19
ST_SEND_PEER_WAIT = 20
ST_KERNEL_CH_STOP = 22
ST_GROUP_START_API_STOP = 23
ST_GROUP_END_API_START = 24

_STRINGS: dict[str, bytes] = {}  # NCCL's strings live for the process: keep ours alive the same way


def cstr(s: str | None) -> bytes | None:
    if s is None:
        return None
    b = _STRINGS.get(s)
    if b is None:
        b = _STRINGS[s] = s.encode()
    return b


# --- descriptor structs ---------------------------------------------------------------------------------------
class ProxyOpD(C.Structure):
    _fields_ = [("pid", C.c_int), ("channelId", C.c_uint8), ("peer", C.c_int), ("nSteps", C.c_int),
                ("chunkSize", C.c_int), ("isSend", C.c_int)]


class ProxyStepD(C.Structure):
    _fields_ = [("step", C.c_int)]


class KernelChD(C.Structure):
    _fields_ = [("channelId", C.c_uint8), ("pTimer", C.c_uint64)]


class NetPluginD(C.Structure):
    _fields_ = [("id", C.c_int64), ("data", C.c_void_p)]


class GroupApiD(C.Structure):
    _fields_ = [("graphCaptured", C.c_bool), ("groupDepth", C.c_int)]


class KernelLaunchD(C.Structure):
    _fields_ = [("stream", C.c_void_p)]


_COLL_BASE = [("seqNumber", C.c_uint64), ("func", C.c_char_p), ("sendBuff", C.c_void_p), ("recvBuff", C.c_void_p),
              ("count", C.c_size_t), ("root", C.c_int), ("datatype", C.c_char_p), ("nChannels", C.c_uint8),
              ("nWarps", C.c_uint8), ("algo", C.c_char_p), ("proto", C.c_char_p)]
_P2P_BASE = [("func", C.c_char_p), ("buff", C.c_void_p), ("datatype", C.c_char_p), ("count", C.c_size_t),
             ("peer", C.c_int), ("nChannels", C.c_uint8)]


class CollV4(C.Structure):
    _fields_ = _COLL_BASE


class P2pV4(C.Structure):
    _fields_ = _P2P_BASE


class CollV5(C.Structure):
    _fields_ = _COLL_BASE + [("parentGroup", C.c_void_p)]


class P2pV5(C.Structure):
    _fields_ = _P2P_BASE + [("parentGroup", C.c_void_p)]


class CollV7(C.Structure):
    _fields_ = _COLL_BASE + [("parentGroup", C.c_void_p), ("kernelVariant", C.c_char_p), ("isSymColl", C.c_bool),
                             ("userTag", C.c_uint64)]


class P2pV7(C.Structure):
    _fields_ = _P2P_BASE + [("parentGroup", C.c_void_p), ("userTag", C.c_uint64)]


_COLL_API = [("func", C.c_char_p), ("count", C.c_size_t), ("datatype", C.c_char_p), ("root", C.c_int),
             ("stream", C.c_void_p), ("graphCaptured", C.c_bool)]
_P2P_API = [("func", C.c_char_p), ("count", C.c_size_t), ("datatype", C.c_char_p), ("stream", C.c_void_p),
            ("graphCaptured", C.c_bool)]


class CollApiV5(C.Structure):
    _fields_ = _COLL_API


class P2pApiV5(C.Structure):
    _fields_ = _P2P_API


class CollApiV7(C.Structure):
    _fields_ = _COLL_API + [("userTag", C.c_uint64)]


class P2pApiV7(C.Structure):
    _fields_ = _P2P_API + [("userTag", C.c_uint64)]


class UnionV4(C.Union):
    _fields_ = [("coll", CollV4), ("p2p", P2pV4), ("proxyOp", ProxyOpD), ("proxyStep", ProxyStepD),
                ("kernelCh", KernelChD), ("netPlugin", NetPluginD)]


class UnionV5(C.Union):
    _fields_ = [("groupApi", GroupApiD), ("collApi", CollApiV5), ("p2pApi", P2pApiV5),
                ("kernelLaunch", KernelLaunchD), ("coll", CollV5), ("p2p", P2pV5), ("proxyOp", ProxyOpD),
                ("proxyStep", ProxyStepD), ("kernelCh", KernelChD), ("netPlugin", NetPluginD)]


class UnionV7(C.Union):
    _fields_ = [("groupApi", GroupApiD), ("collApi", CollApiV7), ("p2pApi", P2pApiV7),
                ("kernelLaunch", KernelLaunchD), ("coll", CollV7), ("p2p", P2pV7), ("proxyOp", ProxyOpD),
                ("proxyStep", ProxyStepD), ("kernelCh", KernelChD), ("netPlugin", NetPluginD),
                ("_ce", C.c_char * 96)]  # ceColl (v6+) is the biggest member after coll in v7


class DescrV4(C.Structure):
    _fields_ = [("type", C.c_uint8), ("parentObj", C.c_void_p), ("rank", C.c_int), ("u", UnionV4)]


class DescrV5(C.Structure):
    _fields_ = [("type", C.c_uint64), ("parentObj", C.c_void_p), ("rank", C.c_int), ("u", UnionV5)]


class DescrV7(C.Structure):
    _fields_ = [("type", C.c_uint64), ("parentObj", C.c_void_p), ("rank", C.c_int), ("u", UnionV7)]


class StateArgs(C.Union):  # proxyStep.transSize / proxyCtrl.appendedProxyOps / netPlugin.data / kernelCh.pTimer
    _fields_ = [("u64", C.c_uint64)]


# NCCL's DWARF: v4 104 bytes, v5/v6 112, v7 136; sub-structs coll 80/88/112, p2p 40/48/56.
assert C.sizeof(DescrV4) == 104 and C.sizeof(DescrV5) == 112 and C.sizeof(DescrV7) == 136
assert C.sizeof(CollV4) == 80 and C.sizeof(CollV5) == 88 and C.sizeof(CollV7) == 112
assert C.sizeof(P2pV4) == 40 and C.sizeof(P2pV5) == 48 and C.sizeof(P2pV7) == 56
assert C.sizeof(CollApiV5) == 48 and C.sizeof(CollApiV7) == 56 and C.sizeof(P2pApiV7) == 48
assert C.sizeof(StateArgs) == 8

DESCR = {4: DescrV4, 5: DescrV5, 6: DescrV5, 7: DescrV7}

LOGFN = C.CFUNCTYPE(None, C.c_int, C.c_ulong, C.c_char_p, C.c_int, C.c_char_p)  # variadic tail ignored
INIT_V4 = C.CFUNCTYPE(C.c_int, C.POINTER(C.c_void_p), C.POINTER(C.c_int), C.c_char_p, C.c_uint64, C.c_int, C.c_int,
                      C.c_int, LOGFN)
INIT_V5 = C.CFUNCTYPE(C.c_int, C.POINTER(C.c_void_p), C.c_uint64, C.POINTER(C.c_int), C.c_char_p, C.c_int, C.c_int,
                      C.c_int, LOGFN)
STOP = C.CFUNCTYPE(C.c_int, C.c_void_p)
FINALIZE = C.CFUNCTYPE(C.c_int, C.c_void_p)


class _Table(C.Structure):
    _fields_ = [("name", C.c_char_p), ("init", C.c_void_p), ("startEvent", C.c_void_p), ("stopEvent", C.c_void_p),
                ("recordEventState", C.c_void_p), ("finalize", C.c_void_p)]


def default_plugin_path() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(here, "..", "..", "mycroft_otel", "lib", "libnccl-profiler-mycroft.so")


class Plugin:
    """The plugin as one NCCL release sees it: dlopen, the newest table this 'release' knows, one mask int."""

    def __init__(self, version: int = 7, path: str | None = None) -> None:
        self.version = version
        self.path = os.path.abspath(path or default_plugin_path())
        self.lib = C.CDLL(self.path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
        self.table = _Table.in_dll(self.lib, f"ncclProfiler_v{version}")
        self.name = self.table.name.decode()
        self.Descr = DESCR[version]
        self._init = (INIT_V4 if version == 4 else INIT_V5)(self.table.init)
        self._start = C.CFUNCTYPE(C.c_int, C.c_void_p, C.POINTER(C.c_void_p), C.POINTER(self.Descr))(
            self.table.startEvent)
        self._stop = STOP(self.table.stopEvent)
        self._record = C.CFUNCTYPE(C.c_int, C.c_void_p, C.c_int, C.POINTER(StateArgs))(self.table.recordEventState)
        self._record.argtypes = [C.c_void_p, C.c_int, C.POINTER(StateArgs)]
        self._finalize = FINALIZE(self.table.finalize)
        self.mask = C.c_int(0)  # ncclProfilerEventMask: one per process, every init gets its address
        self.log_lines: list[str] = []
        self._logfn = LOGFN(self._log)
        self.pid = os.getpid()  # NCCL stores getpid() at plugin load for proxyOp.pid

    def _log(self, level, flags, file, line, fmt):  # pragma: no cover - only on plugin warnings
        self.log_lines.append(f"{level} {fmt.decode(errors='replace') if fmt else ''}")

    def init(self, comm_hash: int, nranks: int, rank: int, nnodes: int, name: str | None = None) -> "Context":
        ctx = C.c_void_p(None)
        if self.version == 4:
            rc = self._init(C.byref(ctx), C.byref(self.mask), cstr(name), comm_hash, nnodes, nranks, rank,
                            self._logfn)
        else:
            rc = self._init(C.byref(ctx), comm_hash, C.byref(self.mask), cstr(name), nnodes, nranks, rank,
                            self._logfn)
        return Context(self, ctx.value, rc, rank)


class Context:
    """One communicator's plugin context. Methods are what NCCL's profiler.cc does, event by event."""

    def __init__(self, plugin: Plugin, ctx: int | None, rc: int, rank: int) -> None:
        self.p, self.ctx, self.rc, self.rank = plugin, ctx, rc, rank
        self.v = plugin.version
        self._tls = threading.local()

    # -- raw calls --
    def _descr(self, etype: int, parent, rank: int):
        d = self.p.Descr()  # zeroed, like eDescr = {0}
        d.type = etype
        d.parentObj = parent
        d.rank = rank
        return d

    def start(self, d) -> int | None:
        h = C.c_void_p(None)
        self.p._start(self.ctx, C.byref(h), C.byref(d))
        return h.value

    def stop(self, h) -> None:
        if h:  # NCCL checks the handle before calling
            self.p._stop(h)

    def record(self, h, state: int, value: int = 0) -> None:
        if h:
            a = getattr(self._tls, "args", None)
            if a is None:  # one args struct per calling thread, reused (NCCL's is a stack variable)
                a = self._tls.args = StateArgs()
            a.u64 = value
            self.p._record(h, state, a)

    def finalize(self) -> None:
        if self.ctx:
            self.p._finalize(self.ctx)

    # -- API events (v5+) --
    def group_api_start(self, depth: int = 1):
        if self.v < 5 or not (self.p.mask.value & (GROUP_API | COLL | P2P | PROXY_OP | PROXY_STEP | KERNEL_CH)):
            return None
        d = self._descr(GROUP_API, None, self.rank)
        d.u.groupApi.groupDepth = depth
        return self.start(d)

    def coll_api(self, gapi, func: str, count: int, dtype: str, root: int = 0):
        if self.v < 5:
            return None
        d = self._descr(COLL_API, gapi, self.rank)
        ca = d.u.collApi
        ca.func, ca.count, ca.datatype, ca.root = cstr(func), count, cstr(dtype), root
        h = self.start(d)
        self.stop(h)  # CollApi stops when the enqueue call returns
        return h

    def p2p_api(self, gapi, func: str, count: int, dtype: str):
        if self.v < 5:
            return None
        d = self._descr(P2P_API, gapi, self.rank)
        pa = d.u.p2pApi
        pa.func, pa.count, pa.datatype = cstr(func), count, cstr(dtype)
        h = self.start(d)
        self.stop(h)
        return h

    def kernel_launch(self, gapi):
        if self.v < 5:
            return None
        d = self._descr(KERNEL_LAUNCH, gapi, self.rank)
        return self.start(d)

    # -- launch-time events --
    def group_start(self):
        return self.start(self._descr(GROUP, None, 0))  # NCCL leaves rank 0 for Group

    def coll_start(self, api, group, seq: int, func: str, count: int, dtype: str, nch: int, algo: str = "RING",
                   proto: str = "SIMPLE", root: int = 0):
        parent = group if self.v == 4 else api  # v4 (2.27) parents Coll with the Group
        d = self._descr(COLL, parent, self.rank)
        c = d.u.coll
        c.seqNumber, c.func, c.count, c.root, c.datatype = seq, cstr(func), count, root, cstr(dtype)
        c.sendBuff, c.recvBuff = 0x7F0000001000, 0x7F0000002000
        c.nChannels, c.nWarps, c.algo, c.proto = nch, 16, cstr(algo), cstr(proto)
        if self.v >= 5:
            c.parentGroup = group
        return self.start(d)

    def p2p_start(self, api, group, func: str, peer: int, count: int, dtype: str, nch: int):
        parent = group if self.v == 4 else api
        d = self._descr(P2P, parent, self.rank)
        c = d.u.p2p
        c.func, c.count, c.datatype, c.peer, c.nChannels = cstr(func), count, cstr(dtype), peer, nch
        c.buff = 0x7F0000003000
        if self.v >= 5:
            c.parentGroup = group
        return self.start(d)

    # -- proxy thread --
    def proxy_op_start(self, parent, channel: int, peer: int, nsteps: int, chunk: int, is_send: bool,
                       pid: int | None = None):
        d = self._descr(PROXY_OP, parent, self.rank)
        o = d.u.proxyOp
        o.pid = self.p.pid if pid is None else pid
        o.channelId, o.peer, o.nSteps, o.chunkSize, o.isSend = channel, peer, nsteps, chunk, 1 if is_send else 0
        return self.start(d)

    def proxy_step_start(self, op_handle, step: int):
        d = self._descr(PROXY_STEP, op_handle, self.rank)
        d.u.proxyStep.step = step
        return self.start(d)

    # -- KernelCh (proxy thread 2.27-2.30, profiler thread 2.31+) --
    def kernel_ch_start(self, parent, channel: int, gpu_ns: int):
        d = self._descr(KERNEL_CH, parent, 0)  # NCCL does not set rank for KernelCh
        d.u.kernelCh.channelId = channel
        d.u.kernelCh.pTimer = gpu_ns
        return self.start(d)

    def kernel_ch_stop(self, h, gpu_ns: int) -> None:
        if h:
            self.record(h, ST_KERNEL_CH_STOP, gpu_ns)
            self.stop(h)
