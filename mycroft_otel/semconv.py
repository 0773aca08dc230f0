"""Span names and attribute keys: the one definition the agent and the processor share.

The schema is documented for users in docs/span-schema.md; keep the two in step.
Standard OpenTelemetry keys (service.*, host.*, process.*, hw.*) come from the
semantic conventions; ours live under the ``mycroft.`` prefix.
"""

from __future__ import annotations

# --- span names -------------------------------------------------------------------
#: Prefix of a rank's span for one collective or p2p transfer: ``nccl.AllReduce``, ``nccl.Send``.
OP_SPAN_PREFIX = "nccl."
#: A rank's in-flight view of an operation running longer than MYCROFT_INFLIGHT_AFTER_MS.
INFLIGHT_SPAN = "mycroft.inflight"
#: Evidence about a rank that is not taking part: idle (not entered) or process exited.
STATUS_SPAN = "mycroft.status"
#: The processor's verdict, in the trace of the collective it explains.
ROOT_CAUSE_SPAN = "mycroft.root_cause"
#: Per-window summary of the healthy, unsampled operations of one rank and communicator.
SUMMARY_SPAN = "mycroft.summary"

# --- span-id roles (ids.span_id(trace_id, rank, role[, channel])) --------------------
ROLE_OP = "op"            # the completed span of a rank's operation: links point here
ROLE_INFLIGHT = "inflight"  # + snapshot number as the channel argument
ROLE_STATUS = "status"      # + status kind ordinal as the channel argument
ROLE_ROOT_CAUSE = "root_cause"

# --- resource attributes ------------------------------------------------------------
SERVICE_NAME = "service.name"
HOST_NAME = "host.name"
PROCESS_PID = "process.pid"
HW_ID = "hw.id"            # GPU index (CUDA device) as a string
HW_TYPE = "hw.type"        # "gpu"
JOB_ID = "mycroft.job.id"
# int: the block of the job's global ranks this rank is in (global rank // MYCROFT_SHARD_RANKS), set only when
# the agent shards jobs; the gateway routes on (job id, shard), so one processor holds a shard's evidence
JOB_SHARD = "mycroft.job.shard"
PLUGIN_VERSION = "mycroft.plugin.version"
NCCL_PROFILER_ABI = "mycroft.nccl.profiler_abi"  # int: N of ncclProfiler_vN NCCL picked
# provenance (agent/provenance.py): a ring speaks only for the user who owns its file
RING_OWNER_UID = "mycroft.ring.owner.uid"        # int: uid owning the ring file
RING_VERIFIED = "mycroft.ring.verified"          # bool: job id and host backed by the agent's user or the process
RING_CLAIMED_JOB_ID = "mycroft.ring.claimed.job_id"  # the header's job id, when it was not used
RING_CLAIMED_HOST = "mycroft.ring.claimed.host"      # the header's host, when it was not used

# --- attributes on every rank span (op, inflight, status) ----------------------------
COMM_HASH = "mycroft.comm.hash"      # string, 16 lowercase hex digits
COMM_NAME = "mycroft.comm.name"
COMM_NRANKS = "mycroft.comm.nranks"
COMM_NNODES = "mycroft.comm.nnodes"
# Metrics only: where a communicator's ranks are, from NCCL's own node count (nNodes at init). One node:
# its traffic stays on NVLink/PCIe/SHM (tensor-parallel groups usually are); more: it crosses the network.
# Parallelism roles (tp/dp/pp) are the framework's and never reach NCCL, so they are not guessed.
COMM_KIND = "mycroft.comm.kind"
COMM_KIND_INTRA_NODE = "intra_node"
COMM_KIND_INTER_NODE = "inter_node"
RANK = "mycroft.rank"                # rank in the communicator
GLOBAL_RANK = "mycroft.global_rank"  # launcher's RANK, absent if unknown
LOCAL_RANK = "mycroft.local_rank"

# --- the operation -----------------------------------------------------------------
OP_KIND = "mycroft.op.kind"          # "coll" | "send" | "recv"
OP_STATE = "mycroft.op.state"        # "completed" | "in_flight"
COLL_SEQ = "mycroft.coll.seq"        # per-communicator collective number (p2p: transfer n)
# int: the collective's place in its communicator's training step, seq modulo the step's length in collectives as
# the rank learnt it from its call times (agent/sampling.py StepPattern); absent while unknown or without pattern
COLL_STEP_INDEX = "mycroft.coll.step_index"
COLL_FUNC = "mycroft.coll.func"      # "AllReduce", "Send", ...
NCCL_SEQ = "mycroft.nccl.seq"        # NCCL's own seqNumber; absent: equal to COLL_SEQ
COLL_COUNT = "mycroft.coll.count"
COLL_BYTES = "mycroft.coll.bytes"
COLL_DATATYPE = "mycroft.coll.datatype"
COLL_ROOT = "mycroft.coll.root"
COLL_ALGO = "mycroft.coll.algo"
COLL_PROTO = "mycroft.coll.proto"
COLL_NCHANNELS = "mycroft.coll.nchannels"
P2P_PEER = "mycroft.p2p.peer"
P2P_SRC = "mycroft.p2p.src"
P2P_DST = "mycroft.p2p.dst"
# Times are CLOCK_REALTIME nanoseconds (the agent converts from the plugin's monotonic clock).
TIME_API = "mycroft.time.api_ns"     # not sent: an op span starts at the API call when known (older agents sent it)
TIME_ENQUEUE = "mycroft.time.enqueue_ns"
TIME_LAUNCH = "mycroft.time.launch_ns"
TIME_END = "mycroft.time.end_ns"
TIME_LAST_PROGRESS = "mycroft.time.last_progress_ns"
KERNEL_DURATION = "mycroft.kernel.duration_ns"
BUS_BW = "mycroft.busbw_gbps"
ANOMALY = "mycroft.anomaly"          # "slow" | "stalled" | absent (sampled healthy span)
BASELINE_NS = "mycroft.baseline_ns"  # the rank's running baseline duration when flagged
SNAPSHOT_SEQ = "mycroft.snapshot.seq"  # in-flight snapshot number, 0-based
# [started, stopped] counts, left out when both are the whole: a ProxyOp per flow, a kernel channel per channel
# NCCL used (COLL_NCHANNELS). What a completed op says in most spans, so a reader takes a missing pair as that.
PROXY_OPS = "mycroft.proxy_ops"
KERNEL_CHANNELS = "mycroft.kernel_channels"
COLL_USER_TAG = "mycroft.coll.user_tag"  # int: v7 per-call userTag (ncclCollConfig_t.userProfilerTag); absent if 0

# --- kernel channels: arrays indexed like KERNEL_CH_CHANNEL (one entry per GPU channel) ----
# GPU-timed (%globaltimer) durations in ns; present only when NCCL reported them (KernelCh;
# the phases need v7 KernelPhase). Initial sync is the GPU's own wait for its peers' flags
# before the first byte moves: a straggler signal independent of the proxy thread's timing.
KERNEL_CH_CHANNEL = "mycroft.kernel.channel"
KERNEL_CH_DURATION = "mycroft.kernel.channel_duration_ns"
KERNEL_INITIAL_SYNC = "mycroft.kernel.initial_sync_ns"
KERNEL_COMPUTE = "mycroft.kernel.compute_ns"
KERNEL_FINAL_SYNC = "mycroft.kernel.final_sync_ns"

# --- flows: arrays indexed by flow (one (channel, direction) pair each) -------------
FLOW_CHANNEL = "mycroft.flow.channel"
FLOW_DIRECTION = "mycroft.flow.direction"    # "send" | "recv"
FLOW_PEER = "mycroft.flow.peer"
FLOW_STEPS = "mycroft.flow.steps"            # steps NCCL announced
FLOW_POSTED = "mycroft.flow.posted"
FLOW_READY = "mycroft.flow.ready"            # send: GPU ready   | recv: received
FLOW_TRANSMITTED = "mycroft.flow.transmitted"  # send: on the wire | recv: flushed
FLOW_DONE = "mycroft.flow.done"              # send: completed   | recv: consumed by GPU
FLOW_BYTES = "mycroft.flow.bytes"
# A flow's times travel as ns after its span's start (a few varint bytes where a CLOCK_REALTIME ns takes nine),
# -1 for a time not reached yet; readers get them back as CLOCK_REALTIME ns, 0 for not yet (flow_time).
FLOW_START = "mycroft.flow.start_offset_ns"
FLOW_END = "mycroft.flow.end_offset_ns"      # not yet while running
FLOW_LAST_PROGRESS = "mycroft.flow.last_progress_offset_ns"
FLOW_WAIT_STATE = "mycroft.flow.wait_state"  # "SendGpuWait", ..., "" when idle
FLOW_WAIT_STEP = "mycroft.flow.wait_step"    # the step a waiting flow waits on (0 when it waits on nothing)
FLOW_WAIT_SINCE = "mycroft.flow.wait_since_offset_ns"
FLOW_GPU_WAIT = "mycroft.flow.gpu_wait_ns"
FLOW_NET_WAIT = "mycroft.flow.net_wait_ns"
FLOW_GPU_BUSY = "mycroft.flow.gpu_busy_ns"   # the same waits as a union over steps: time >= 1 step waited
FLOW_NET_BUSY = "mycroft.flow.net_busy_ns"
FLOW_PEER_BUSY = "mycroft.flow.peer_busy_ns"  # a send flow's time >= 1 step waited for credit (SendPeerWait)
FLOW_NIC = "mycroft.flow.nic"                # NIC name/index when NCCL emits NetPlugin events
FLOW_OFFSETS = (FLOW_START, FLOW_END, FLOW_LAST_PROGRESS, FLOW_WAIT_SINCE)
FLOW_NOT_YET = -1
# The keys agents before 2026-12-06 sent these times under, as CLOCK_REALTIME ns (0 = not yet): readers take them
# where a span has no offsets, so that processors upgraded before their agents read both (docs/deploy.md)
FLOW_ABSOLUTE = {FLOW_START: "mycroft.flow.start_ns", FLOW_END: "mycroft.flow.end_ns",
                 FLOW_LAST_PROGRESS: "mycroft.flow.last_progress_ns", FLOW_WAIT_SINCE: "mycroft.flow.wait_since_ns"}
# A flow array an op span leaves out when it equals another of its arrays, and that a reader takes from it:
# a completed flow's stages all reached its steps and its last progress is its end; its busy times equal its
# summed waits unless two of its steps waited at once. (Any other flow array is left out when all its
# elements are 0 and reads as zeros.)
FLOW_SAME_AS = {FLOW_POSTED: FLOW_STEPS, FLOW_READY: FLOW_STEPS, FLOW_TRANSMITTED: FLOW_STEPS,
                FLOW_DONE: FLOW_STEPS, FLOW_LAST_PROGRESS: FLOW_END, FLOW_GPU_BUSY: FLOW_GPU_WAIT,
                FLOW_NET_BUSY: FLOW_NET_WAIT}

# --- status spans ---------------------------------------------------------------------
STATUS_KIND = "mycroft.status.kind"          # one of STATUS_KINDS
STATUS_NOT_ENTERED = "not_entered"
STATUS_PROCESS_EXITED = "process_exited"
STATUS_KINDS = (STATUS_NOT_ENTERED, STATUS_PROCESS_EXITED)
STATUS_LAST_SEQ = "mycroft.status.last_seq"    # last completed collective number (-1 none)
STATUS_IDLE_SINCE = "mycroft.status.idle_since_ns"
STATUS_LAST_STATE = "mycroft.status.last_state"  # human text: what the rank last did

# --- links -------------------------------------------------------------------------
LINK_ROLE = "mycroft.link.role"              # one of LINK_ROLES
LINK_RECV_FROM = "recv_from"   # this rank receives from the linked span's rank (data dependency)
LINK_SEND_TO = "send_to"       # this rank feeds the linked span's rank
LINK_SNAPSHOT_OF = "snapshot_of"  # an in-flight/status span points at the op span it stands for
LINK_CULPRIT = "culprit"       # root-cause span -> the culprit's spans
LINK_EVIDENCE = "evidence"     # root-cause span -> other spans the verdict used
LINK_ROLES = (LINK_RECV_FROM, LINK_SEND_TO, LINK_SNAPSHOT_OF, LINK_CULPRIT, LINK_EVIDENCE)
LINK_PEER = "mycroft.link.peer"             # the linked op span's rank (send_to / recv_from)

# --- the root-cause span (design §4, a contract) -----------------------------------
RCA_KIND = "mycroft.rca.kind"                # "hang" | "slowdown"
RCA_CATEGORY = "mycroft.rca.category"
RCA_CULPRIT_RANKS = "mycroft.rca.culprit.ranks"
RCA_CULPRIT_GLOBAL_RANKS = "mycroft.rca.culprit.global_ranks"
RCA_CULPRIT_HOSTS = "mycroft.rca.culprit.hosts"
RCA_CULPRIT_CHANNEL = "mycroft.rca.culprit.channel"
RCA_CULPRIT_PEER = "mycroft.rca.culprit.peer"
RCA_CONFIDENCE = "mycroft.rca.confidence"
RCA_EVIDENCE = "mycroft.rca.evidence"
RCA_ONSET = "mycroft.rca.onset_ns"
RCA_DETECTED = "mycroft.rca.detected_ns"
# which explanation won and by how much over the best one of another place (outcome.py; the walks' vote share
# for a hang, the CUSUM evidence for a slowdown)
RCA_HYPOTHESIS = "mycroft.rca.hypothesis"
RCA_RUNNER_UP = "mycroft.rca.runner_up"
RCA_MARGIN = "mycroft.rca.margin"
# the span's own trace id (32 hex digits) as an attribute: metrics made from spans (the gateway's
# spanmetrics connector, and the alerts on them) see attributes only
RCA_TRACE_ID = "mycroft.rca.trace_id"

KIND_HANG = "hang"
KIND_SLOWDOWN = "slowdown"
# Every category the processor emits (design §4: extend, but keep these names).
CAT_RANK_ABSENT = "rank_absent"                  # a rank never entered the collective, or went silent
CAT_PROCESS_EXITED = "process_exited"            # a rank's process died
CAT_GPU_STALLED = "gpu_stalled"                  # data reached the rank, its GPU neither consumes nor produces
CAT_NET_SEND_STALLED = "net_send_stalled"        # data ready, not transmitted on a flow
CAT_NET_DELIVERY_STALLED = "net_delivery_stalled"  # transmitted, never completes
CAT_COLL_MISMATCH = "coll_mismatch"              # ranks called different collectives, sizes or types
CAT_LATE_RANK = "late_rank"                      # a rank starts late and everybody waits for it
CAT_SLOW_GPU = "slow_gpu"                        # a rank's GPU consumes received data slowly
CAT_SLOW_FLOW = "slow_flow"                      # one flow (channel, peer) waits longer per step than its siblings
CAT_SLOW_NIC = "slow_nic"                        # every flow out of (or into) one rank is slow
CAT_SLOW_PROXY = "slow_proxy"                    # a rank's proxy thread posts ready chunks late
#: category -> kind.
CATEGORIES: dict[str, str] = {
    CAT_RANK_ABSENT: KIND_HANG,
    CAT_PROCESS_EXITED: KIND_HANG,
    CAT_GPU_STALLED: KIND_HANG,
    CAT_NET_SEND_STALLED: KIND_HANG,
    CAT_NET_DELIVERY_STALLED: KIND_HANG,
    CAT_COLL_MISMATCH: KIND_HANG,
    CAT_LATE_RANK: KIND_SLOWDOWN,
    CAT_SLOW_GPU: KIND_SLOWDOWN,
    CAT_SLOW_FLOW: KIND_SLOWDOWN,
    CAT_SLOW_NIC: KIND_SLOWDOWN,
    CAT_SLOW_PROXY: KIND_SLOWDOWN,
}

WAIT_STATE_NAMES = ("", "SendGpuWait", "SendPeerWait", "SendWait", "RecvWait", "RecvFlushWait", "RecvGpuWait")


def op_span_name(func: str) -> str:
    """Name of a rank's span for an operation of NCCL function ``func``."""
    return OP_SPAN_PREFIX + func

# --- appended by the agent (docs/span-schema.md) ---------------------------------------
#: Values of ANOMALY set by the agent's local rule.
ANOMALY_SLOW = "slow"        # duration >= MYCROFT_SLOW_FACTOR x the running baseline
ANOMALY_LATE = "late"        # the rank started late: gap since its previous op >= factor x baseline gap
ANOMALY_STALLED = "stalled"  # in flight past MYCROFT_INFLIGHT_AFTER_MS without progress for that long
GAP_NS = "mycroft.gap_ns"    # time since the rank's previous op on this communicator ended (late starts)
# How many of the rank's last 8 collectives on this communicator its local rules flagged slow (this one included):
# the persistence of a slowdown, carried inside each trace so that a processor needs no other trace to see it
ANOMALY_RECENT = "mycroft.anomaly.recent"
RECENT_WINDOW = 8
# What a rank's spans on a communicator share, carried once by their resource and not by each span: a reader
# takes them from the resource (OpenTelemetry: a resource's attributes describe every span it holds; TraceQL's
# unscoped `.mycroft.rank` finds them there)
RESOURCE_SPAN_ATTRS = (COMM_HASH, COMM_NAME, COMM_NRANKS, COMM_NNODES, RANK, GLOBAL_RANK, LOCAL_RANK, HOST_NAME)


def with_shared(attrs: dict, resource: dict) -> dict:
    """A span's attributes with those its resource carries for all its spans (RESOURCE_SPAN_ATTRS), its own
    first: how a reader of a rank's spans takes them (the processor's native decoder does the same)."""
    shared = {k: resource[k] for k in RESOURCE_SPAN_ATTRS if k in resource and k not in attrs}
    return {**shared, **attrs} if shared else attrs


def flow_offset(t_ns: int, span_start_ns: int) -> int:
    """A flow time (CLOCK_REALTIME ns, 0 = not yet) as its span carries it (FLOW_OFFSETS): a flow moves no data
    before its operation was called, so an earlier time (clocks stepped between them) reads as the start."""
    return max(t_ns - span_start_ns, 0) if t_ns else FLOW_NOT_YET


def flow_time(offset: int, span_start_ns: int) -> int:
    """A flow time as a reader wants it (CLOCK_REALTIME ns, 0 = not yet) from its span's offset."""
    return span_start_ns + offset if offset >= 0 else 0


OP_STATE_COMPLETED = "completed"
OP_STATE_IN_FLIGHT = "in_flight"
PROCESS_STOPPED = "mycroft.process.stopped"  # bool on in-flight/status spans: the writer is SIGSTOPped (state T)
# Summary spans (one per rank, communicator and window): healthy operations that were not sampled.
SUMMARY_WINDOW_START = "mycroft.summary.window_start_ns"
SUMMARY_OPS = "mycroft.summary.ops"              # operations completed in the window (all of them)
SUMMARY_EXPORTED = "mycroft.summary.exported"    # of which exported as op spans (sampled or anomalous)
SUMMARY_SEQ_FIRST = "mycroft.summary.seq_first"
SUMMARY_SEQ_LAST = "mycroft.summary.seq_last"
SUMMARY_BYTES = "mycroft.summary.bytes"
SUMMARY_DURATION_MEAN = "mycroft.summary.duration_mean_ns"
SUMMARY_DURATION_MAX = "mycroft.summary.duration_max_ns"
SUMMARY_FUNCS = "mycroft.summary.funcs"          # string array: function of each row of the per-function arrays
SUMMARY_FUNC_OPS = "mycroft.summary.func_ops"    # int array, per function
SUMMARY_FUNC_DURATION_MEAN = "mycroft.summary.func_duration_mean_ns"  # int array, per function
SUMMARY_DROPPED_RING = "mycroft.summary.dropped_ring"  # completions lost to ring overwrite in the window
# Plugin counters since the context began (cumulative), only when non-zero:
SUMMARY_BAD_HANDLE_KINDS = "mycroft.summary.bad_handle_kinds"  # string array: callback kinds (shm BadHandleKind)
SUMMARY_BAD_HANDLES = "mycroft.summary.bad_handles"            # int array, per kind
SUMMARY_LATE_KERNEL_STOPS = "mycroft.summary.late_kernel_stops"  # KernelCh stops after a later launch (kept)
