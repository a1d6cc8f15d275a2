"""The MPS active-thread percentage a pod gets: "cautiously aggressive" space sharing.

Pan (cautiously-aggressive-gpu-space-sharing, Fig. 2) found that a job with low resource demand
loses almost nothing when given fewer MPS threads, while a high-demand job slows linearly. So a
pod whose measured profile shows it uses far less than its guaranteed share gets a smaller
active-thread cap -- it then crowds its neighbours' SMs less -- and a pod that needs its share
keeps it. Caution: never below half the guaranteed share, always 25% headroom over the measured
demand, and no change at all without a profile.
"""

import math

from gpushare.api.names import SLICES_PER_GPU
from gpushare.packing.model import Demand, GpuState, PipeProfile

HEADROOM = 1.25
"""Thread cap stays at least this factor above the measured compute demand."""
MIN_FRACTION_OF_SHARE = 0.5
"""Never cap below this fraction of the guaranteed percent."""


def compute_demand(profile: PipeProfile) -> float:
    """Share of the GPU (0-1) the job keeps busy when alone: its busiest of SMs, pipes, DRAM."""
    return max(
        profile.sm_occupancy,
        profile.fp16,
        profile.fp32,
        profile.fp64,
        profile.tensor,
        profile.dram_bandwidth,
        0.0,
    )


def assign_thread_percent(demand: Demand, gpu: GpuState) -> int:
    """MPS active-thread % for the pod on ``gpu``; always 1..100.

    Default: the guaranteed percent (whole GPUs: 100). With a profile measured on the same GPU
    model (or of unknown model), a low-demand pod gets ``max(ceil(demand * 100 * 1.25),
    ceil(percent / 2))``; a pod whose demand is close to its share keeps its share.
    """
    share = max(1, min(demand.percent, SLICES_PER_GPU))
    profile = demand.profile
    if profile is None or share >= SLICES_PER_GPU:
        return share
    if profile.gpu_model and gpu.model and profile.gpu_model != gpu.model:
        return share
    need = math.ceil(compute_demand(profile) * SLICES_PER_GPU * HEADROOM)
    floor = math.ceil(share * MIN_FRACTION_OF_SHARE)
    return max(1, min(share, max(need, floor)))
