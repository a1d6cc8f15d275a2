"""A profile (stored in GpuShare status, cache, pod annotation, or just measured) as the
policy's ``PipeProfile``.

The extender and the operator's protection both read profiles written by the operator; they
must turn them into the same ``PipeProfile`` or they would disagree about interference.
"""

from collections.abc import Mapping

from gpushare.api.errors import InvalidInputError
from gpushare.api.profile import PLACEMENT_COUNTERS, GpuProfile
from gpushare.packing.model import PipeProfile


def pipe_profile(stored: GpuProfile) -> PipeProfile:
    """Counters the GPU could not measure count as idle; SM utilization and kernel time stay
    unknown (None), which the interference model reads as "fills its thread cap" and "always
    has a kernel running"."""
    return PipeProfile(
        **{counter: stored.ratio(counter) or 0.0 for counter in PLACEMENT_COUNTERS},
        gpu_model=stored.gpu_model,
        sm_utilization=stored.sm_utilization,
        utilization=stored.utilization,
    )


def measured_pipe_profile(measured: GpuProfile) -> PipeProfile:
    """A fresh measurement (a ``/profile`` answer) as the policy's ``PipeProfile``; refuses one
    lacking a counter the profile needs, naming it (a GPU without GPM cannot profile jobs)."""
    for key in PLACEMENT_COUNTERS:
        if measured.ratio(key) is None:
            raise InvalidInputError(
                f"profile.{key}",
                f"was not measured on {measured.gpu_model}",
                "profile the job on a GPU with NVML GPM (Hopper or newer)",
            )
    return pipe_profile(measured)


def counters_pipe_profile(
    values: Mapping[str, float | None], *, gpu_model: str = ""
) -> PipeProfile:
    """Counters keyed by their names of record (a benchmark's measurement, a trace's job) as
    the policy's ``PipeProfile``, read as a stored profile is."""
    return pipe_profile(GpuProfile.from_counters(values, gpu_model=gpu_model))
