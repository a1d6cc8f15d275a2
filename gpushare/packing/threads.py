"""The MPS active-thread percentage a pod gets: guaranteed share for admission, generous caps.

A pod's ``percent`` is what it reserves of the GPU (admission adds these up to at most 100);
its thread cap is how many SMs its kernels may spread over. The two need not be equal: caps may
overlap, and on an H200 they had to. Measured there (bench/gpu): alone, ResNet-18 and an LSTM
keep 0.88 of their speed at 50% threads but only 0.61-0.62 at 25%, though their SM occupancy
is 0.05-0.12 -- they keep 38-41% of the SMs busy, launch-bound, and a cap sized from occupancy
halves their speed. Two ResNet-18 at full threads reach 1.69x one job's throughput and four at
25% 2.0x, so the win is many small jobs running at once with caps that overlap, not few jobs
with tight caps. Hence:

- latency-class pods are never capped (100%): a cap raised the inference p99 by 1.5-4.3 ms,
  while MPS priority 0 for them and a 50% cap on their batch neighbours kept it at solo level;
- a fractional batch pod with a profile gets ``max(percent, 50)``: never below its guarantee,
  never below half the GPU (SM utilization x 1.25 headroom is about 50% for the launch-bound
  jobs measured), and no more than half when it asked for less, so a heavy neighbour capped
  at 50% (an FP64 GEMM starved uncapped neighbours to 2% of their speed, at 50/50 both kept
  0.47-0.72) still has SMs of its own;
- a pod without a profile, or profiled on another GPU model, keeps its share as its cap
  (caution: nothing measured says it is small); whole GPUs get 100.
"""

from collections.abc import Mapping

from gpushare.api.names import CLASS_LATENCY, SLICES_PER_GPU
from gpushare.packing.model import Demand, GpuState, PipeProfile

HEADROOM = 1.25
"""Requests sized from a profile stay at least this factor above the measured demand."""
MIN_BATCH_THREADS = 50
"""Thread cap floor for a profiled fractional batch pod (GPU-percent)."""
MIN_FRACTION_OF_SHARE = 0.5
"""Kept for callers of the earlier rule; caps are now never below the guaranteed percent."""
SATURATING = 0.8
"""A pipe (or SM utilization) busier than this alone marks a job that saturates the GPU."""


def compute_demand(profile: PipeProfile) -> float:
    """Share of the GPU (0-1) the job keeps busy when alone: its busiest of SM occupancy,
    pipes, DRAM. (Occupancy, not SM utilization: this is what its neighbours feel.)"""
    return max(
        profile.sm_occupancy,
        profile.fp16,
        profile.fp32,
        profile.fp64,
        profile.tensor,
        profile.dram_bandwidth,
        0.0,
    )


def pipe_saturating(profile: PipeProfile) -> bool:
    """True for a job that alone keeps a compute pipe almost fully busy (an FP64 or tensor
    GEMM): uncapped, it starves every neighbour."""
    return max(profile.fp16, profile.fp32, profile.fp64, profile.tensor) >= SATURATING


def assign_thread_percent(demand: Demand, gpu: GpuState) -> int:
    """MPS active-thread % for the pod on ``gpu``; always 1..100 (rules in the module doc).

    Depends only on the pod and the GPU's model, never on the neighbours: the device plugin sets
    it once, when the pod's containers start.
    """
    share = max(1, min(demand.percent, SLICES_PER_GPU))
    if demand.gpu_class == CLASS_LATENCY:
        return SLICES_PER_GPU
    profile = demand.profile
    if profile is None or share >= SLICES_PER_GPU:
        return share
    if profile.gpu_model and gpu.model and profile.gpu_model != gpu.model:
        return share
    return max(share, MIN_BATCH_THREADS)


def cap_beside_latency(p99_ratio_by_threads: Mapping[int, float], *, bound: float) -> int:
    """The thread cap for a batch pod beside a latency pod, from a measured curve: the largest
    cap at which the latency pod's p99 stayed within ``bound`` x its solo p99 (more threads =
    more training throughput), else the smallest cap measured (protect the latency pod).

    ``p99_ratio_by_threads`` maps a batch cap (GPU-percent) to the measured p99 / solo p99;
    ValueError names the field when it is empty or a cap is outside 1..100."""
    if not p99_ratio_by_threads:
        raise ValueError("p99_ratio_by_threads: empty; measure at least one cap (e.g. 50)")
    bad = [t for t in p99_ratio_by_threads if not 1 <= t <= SLICES_PER_GPU]
    if bad:
        raise ValueError(f"p99_ratio_by_threads: caps {bad} are outside 1..100; give percents")
    within = [t for t, r in p99_ratio_by_threads.items() if r <= bound]
    return max(within) if within else min(p99_ratio_by_threads)
