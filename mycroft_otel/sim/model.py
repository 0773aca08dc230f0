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
    # One FIFO slot of a connection: NCCL_BUFFSIZE (4 MiB default) / NCCL_STEPS (8). A SIMPLE ring chunk spans
    # chunkSteps = 4 slots (2 MiB) and moves as 2 slices of 2 slots (1 MiB): one ProxyStep per slice
    # (engine.chunk_bytes, engine.step_sizes). Broadcast, tree and p2p steps are one slot.
    step_bytes: int = 512 * 1024
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
    jitter: float = 0.01                  # relative sigma of compute times (lognormal): the job's, not NCCL's


@dataclass(frozen=True)
class NoiseModel:
    """Healthy variation: what makes two healthy collectives, flows or ranks differ. Selected per run by name
    (``NOISE_MODELS``, ``mycroft-otel sim --noise``). A run under any of them is healthy: no fault, every
    op completes, so a verdict on it is false (except one naming a straggler, Simulation.noise_events).

    The first group is NCCL's own noise, calibrated on the real capture tests/sim/fixtures/gpu_check.json
    (H200, NCCL 2.28.9, 4 ranks over the socket transport): ``golden.spreads`` measures there, per collective,
    the slowest send flow's wait per step against the median flow (p50 1.53x, p99 1.83x), the same for GPU
    waits (1.32x / 1.69x) and the slowest rank's duration against the median rank (1.04x / 1.29x);
    tests/sim/test_noise.py replays the capture's workload on the default model under ``nccl`` and checks
    every figure within x/: 1.3 (measured: 1.53/2.26, 1.17/1.60, 1.06/1.26; docs/simulator.md says where and
    why it differs). The other groups are effects of the user's job around NCCL, off in ``nccl`` and on in
    their own presets.
    """

    name: str = "nccl"
    # --- NCCL's noise: the five values were fitted together by a random search minimising the worst log error
    # of golden.spreads on test_noise.calibration_job against the capture's six figures ------------------------
    flow_spread: float = 2.7       # bandwidth of one flow for one collective, log-uniform within x/: sqrt(2.7)
    wire_sigma: float = 0.15       # wire time of one step of a flow, lognormal (per-message transport)
    gpu_spread: float = 1.9        # GPU speed of one rank for one collective, log-uniform (clocks, SM sharing)
    gpu_step_sigma: float = 1.0    # GPU time of one step, lognormal (thread-block scheduling, time slicing)
    # when the host thread reaches each call: late by a lognormal around host_median_ns (Python, launches)
    host_median_ns: float = 6_000.0
    host_sigma: float = 1.0
    # --- OS jitter on the proxy thread -------------------------------------------------------------------
    # A runnable proxy thread that the kernel deschedules hands its next step to the network late. On a
    # non-realtime Linux kernel cyclictest-style wakeup latencies are tens of us typically and reach
    # hundreds of us to a few ms in the tail; CFS bounds a runnable thread's wait by its scheduling period
    # (sched_latency_ns, 6 ms by default x (1 + log2 ncpus) capped at 8 CPUs: 24 ms). Per send step with
    # probability os_p the hand-off is late by a lognormal around os_median_ns (sigma os_sigma), capped.
    os_p: float = 0.0
    os_median_ns: float = 100_000.0
    os_sigma: float = 1.2
    os_cap_ns: float = 24_000_000.0
    # --- one-off stragglers: a GC pause, a checkpoint write, a dataloader hiccup ------------------------
    # Per rank and training step with probability straggler_p, one compute phase of that rank takes
    # log-uniformly 10 ms..2 s longer: CPython's full (generation 2) collection of a large heap takes
    # 100s of ms, a synchronous checkpoint shard write seconds, a dataloader refill tens of ms to seconds;
    # 1 s is the straggler bar Mycroft (SOSP'25) reports against.
    straggler_p: float = 0.0
    straggler_min_ns: float = 10e6
    straggler_max_ns: float = 2e9
    # --- warm-up -----------------------------------------------------------------------------------------
    # NCCL (2.22+, NCCL_RUNTIME_CONNECT=1 by default) connects a communicator's channels lazily, in the first
    # collective that needs them, and registers buffers on first use: the first calls of a communicator
    # launch late. The k-th collective (k < warmup_collectives) of each communicator launches
    # warmup_ns / 4**k later on every rank (lognormal, sigma 0.5, per rank): tens of ms for a socket/IB
    # connection setup over the bootstrap network.
    warmup_collectives: int = 0
    warmup_ns: float = 50e6
    # --- mixed message sizes -----------------------------------------------------------------------------
    # PyTorch DDP fills a small first gradient bucket (1 MiB, DDP's first_bucket_bytes_cap) and then
    # bucket_cap_mb (25 MiB) buckets; the last bucket holds what is left. With mixed_sizes the DP buckets
    # of a step are [1 MiB, bucket, ..., remainder], the remainder drawn once per job from the seed.
    mixed_sizes: bool = False
    # --- pipeline bubbles --------------------------------------------------------------------------------
    # In a deep pipeline (GPipe/1F1B with many micro-batches) a stage waits by design for the stages after
    # it: stage 0 waits (pp-1) x (forward + backward of a stage) in its backward Recv, seconds in a deep
    # pipeline (docs/deploy.md: ~7 s). Each stage's forward and backward compute gets stage_extra_ns more.
    stage_extra_ns: float = 0.0

    @property
    def any_step_noise(self) -> bool:
        return bool(self.wire_sigma or self.gpu_step_sigma or self.os_p)


def _noise_presets() -> dict[str, NoiseModel]:
    nccl = NoiseModel()
    return {
        "quiet": NoiseModel(name="quiet", flow_spread=1.0, wire_sigma=0.0, gpu_spread=1.0, gpu_step_sigma=0.0,
                            host_median_ns=0.0),
        "nccl": nccl,
        "jittery": replace(nccl, name="jittery", os_p=0.002),
        "stragglers": replace(nccl, name="stragglers", straggler_p=0.02),
        "warmup": replace(nccl, name="warmup", warmup_collectives=3),
        "mixed": replace(nccl, name="mixed", mixed_sizes=True),
        "bubbles": replace(nccl, name="bubbles", stage_extra_ns=500e6),
        "everything": replace(nccl, name="everything", os_p=0.002, straggler_p=0.02, warmup_collectives=3,
                              mixed_sizes=True, stage_extra_ns=500e6),
    }


#: name -> NoiseModel; "nccl" (NCCL's calibrated noise alone) is the default.
NOISE_MODELS: dict[str, NoiseModel] = _noise_presets()
DEFAULT_NOISE = "nccl"


class NoiseModelError(ValueError):
    """A noise model name that is not in NOISE_MODELS."""


def noise_model(name: str) -> NoiseModel:
    try:
        return NOISE_MODELS[name]
    except KeyError:
        raise NoiseModelError(f"unknown noise model {name!r}; known: {', '.join(NOISE_MODELS)}") from None


@dataclass(frozen=True)
class TimingModel:
    net: NetModel = field(default_factory=NetModel)
    gpu: GpuModel = field(default_factory=GpuModel)
    nccl: NcclModel = field(default_factory=NcclModel)
    step: StepModel = field(default_factory=StepModel)
    noise: NoiseModel = field(default_factory=NoiseModel)

    def with_step(self, **kw) -> "TimingModel":
        return replace(self, step=replace(self.step, **kw))

    def with_nccl(self, **kw) -> "TimingModel":
        return replace(self, nccl=replace(self.nccl, **kw))

    def with_noise(self, noise: "NoiseModel | str", **kw) -> "TimingModel":
        base = noise_model(noise) if isinstance(noise, str) else noise
        return replace(self, noise=replace(base, **kw))


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
    """eval_model with NCCL_BUFFSIZE=16MiB (2 MiB FIFO slots): 4x fewer ProxySteps, for long real-time runs of
    64+ ranks on a small machine (demo). Same collective times, coarser chunk detail."""
    return eval_model().with_nccl(step_bytes=2 * 1024 * 1024)
