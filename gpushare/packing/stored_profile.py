"""A stored profile (GpuShare status, cache, pod annotation) as the policy's ``PipeProfile``.

The extender and the operator's protection both read profiles written by the operator; they
must turn them into the same ``PipeProfile`` or they would disagree about interference.
"""

from gpushare.api.gpushare_crd import ShareProfile
from gpushare.packing.model import PipeProfile


def pipe_profile(stored: ShareProfile) -> PipeProfile:
    """Counters the GPU could not measure count as idle; SM utilization stays unknown (None),
    which the interference model reads as "fills its thread cap"."""
    return PipeProfile(
        fp16=stored.fp16 or 0.0,
        fp32=stored.fp32 or 0.0,
        fp64=stored.fp64 or 0.0,
        tensor=stored.tensor or 0.0,
        sm_occupancy=stored.sm_occupancy or 0.0,
        dram_bandwidth=stored.dram_bandwidth or 0.0,
        gpu_model=stored.gpu_model,
        sm_utilization=stored.sm_utilization,
    )
