"""A profile (stored in GpuShare status, cache, pod annotation, or just measured) as the
policy's ``PipeProfile``.

The extender and the operator's protection both read profiles written by the operator; they
must turn them into the same ``PipeProfile`` or they would disagree about interference.
"""

from gpushare.api.errors import InvalidInputError
from gpushare.api.gpushare_crd import ShareProfile
from gpushare.api.profile import GpuProfile
from gpushare.packing.model import PipeProfile

NEEDED = ("fp16", "fp32", "fp64", "tensor", "sm_occupancy", "dram_bandwidth")
"""Counters a measurement must have to place a job by it."""


def pipe_profile(stored: ShareProfile) -> PipeProfile:
    """Counters the GPU could not measure count as idle; SM utilization stays unknown (None),
    which the interference model reads as "fills its thread cap"."""
    return _as_pipe(stored)


def measured_pipe_profile(measured: GpuProfile) -> PipeProfile:
    """A fresh measurement (a ``/profile`` answer) as the policy's ``PipeProfile``; refuses one
    lacking a counter the profile needs, naming it (a GPU without GPM cannot profile jobs)."""
    for key in NEEDED:
        if getattr(measured, key) is None:
            raise InvalidInputError(
                f"profile.{key}",
                f"was not measured on {measured.gpu_model}",
                "profile the job on a GPU with NVML GPM (Hopper or newer)",
            )
    return _as_pipe(measured)


def _as_pipe(profile: ShareProfile | GpuProfile) -> PipeProfile:
    return PipeProfile(
        fp16=profile.fp16 or 0.0,
        fp32=profile.fp32 or 0.0,
        fp64=profile.fp64 or 0.0,
        tensor=profile.tensor or 0.0,
        sm_occupancy=profile.sm_occupancy or 0.0,
        dram_bandwidth=profile.dram_bandwidth or 0.0,
        gpu_model=profile.gpu_model,
        sm_utilization=profile.sm_utilization,
    )
