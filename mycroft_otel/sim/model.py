"""The timing model's explicit parameters (all times in ns, bandwidths in bytes/ns = GB/s).

Every number the simulator uses to place an event in time is a field here; a run is a
pure function of (topology, model, faults, seed).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class NetModel:
    nic_bw: float = 25.0           # GB/s per NIC (200 Gb/s), shared by the channels whose flows use it
    link_bw: float = 25.0          # GB/s cap of one flow (channel, peer) on the wire
    net_latency_ns: float = 4_000  # one-way wire + NIC latency
    ack_latency_ns: float = 2_000  # completion of a send after the data landed (RDMA ack)
    flush_ns: float = 1_500        # GDR flush of a received step
    nvlink_bw: float = 150.0       # GB/s per intra-node hop (P2P/NVLink: no network ProxyOps)
    nvlink_latency_ns: float = 1_000


@dataclass(frozen=True)
class GpuModel:
    reduce_bw: float = 30.0           # GB/s per channel: one thread block reducing/copying a step (Simple)
    kernel_launch_ns: float = 12_000  # Coll stop (launch) -> kernel running on the device
    proxy_post_ns: float = 6_000      # launch -> ProxyOp posted on the proxy thread
    api_gap_ns: float = 400           # between consecutive user-thread callbacks of one API call


@dataclass(frozen=True)
class NcclModel:
    chunk_size: int = 512 * 1024   # bytes per ProxyStep (Simple protocol: buffSize / NCCL_STEPS)
    dp_channels: int = 2
    tp_channels: int = 2
    pp_channels: int = 1
    datatype: str = "ncclBfloat16"
    proto: str = "Simple"
    dp_algo: str = "Ring"          # "Ring" | "Tree"
    peer_wait_retry_ns: float = 1_000_000  # a refused isend is retried (SendPeerWait recorded again) this often


@dataclass(frozen=True)
class StepModel:
    """One training step: forward (TP all-reduces per layer, PP sends), backward (TP all-reduces, DP gradient
    buckets, PP sends back), optimizer."""

    layers: int = 2                       # TP all-reduces per stage per direction
    forward_ns: float = 20_000_000        # compute per stage, split across layers
    backward_ns: float = 40_000_000
    optimizer_ns: float = 8_000_000
    tp_bytes: int = 8 * 1024 * 1024
    pp_bytes: int = 4 * 1024 * 1024
    dp_buckets: int = 2
    dp_bucket_bytes: int = 32 * 1024 * 1024
    tp_mode: str = "allreduce"            # "allreduce" | "sp" (sequence parallel: AllGather + ReduceScatter)
    dp_mode: str = "allreduce"            # "allreduce" | "zero" (ReduceScatter grads, AllGather params)
    initial_broadcast: bool = True        # step 0 starts with a DP Broadcast of the parameters from rank 0
    max_outstanding: int = 2              # CPU run-ahead: NCCL calls a rank may have launched and not completed
    cpu_fraction: float = 0.1             # CPU time to issue a compute phase, as a share of its GPU time
    jitter: float = 0.01                  # relative sigma of compute times (lognormal)
    net_jitter: float = 0.02              # relative sigma of per-collective flow bandwidth


@dataclass(frozen=True)
class TimingModel:
    net: NetModel = field(default_factory=NetModel)
    gpu: GpuModel = field(default_factory=GpuModel)
    nccl: NcclModel = field(default_factory=NcclModel)
    step: StepModel = field(default_factory=StepModel)

    def with_step(self, **kw) -> "TimingModel":
        return replace(self, step=replace(self.step, **kw))

    def with_nccl(self, **kw) -> "TimingModel":
        return replace(self, nccl=replace(self.nccl, **kw))


def fast_model() -> TimingModel:
    """Accelerated runs of big jobs: one gradient bucket, everything else as default."""
    return TimingModel().with_step(dp_buckets=1)


def eval_model() -> TimingModel:
    """Real-time runs watched by the agent (eval, demo): ~0.3 s steps that a few CPU cores keep up with, and
    DP buckets big enough (64 MiB) that an all-reduce's own transfer time (~5 ms on 4 ranks) outweighs the
    ranks' arrival skew (0.5 % compute jitter), so a 2x slowdown of a flow, NIC or GPU is visible."""
    return TimingModel().with_step(forward_ns=80_000_000, backward_ns=160_000_000, optimizer_ns=30_000_000,
                                   dp_bucket_bytes=64 * 1024 * 1024, jitter=0.005)


def light_model() -> TimingModel:
    """eval_model with 2 MiB steps (NCCL_BUFFSIZE=16MiB): 4x fewer ProxySteps, for long real-time runs of
    64+ ranks on a small machine (demo). Same collective times, coarser chunk detail."""
    return eval_model().with_nccl(chunk_size=2 * 1024 * 1024)
