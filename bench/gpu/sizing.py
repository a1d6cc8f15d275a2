"""What a job asks for when its trace row sets no ``fraction``: ``fraction: auto``, sized by
gpushare.

In a cluster a user either writes a fraction or lets gpushare size it (a GpuShare with
``spec.fraction: auto``: the operator profiles the job and its pods ask for
``gpushare.packing.sizing.suggested_percent`` of its profile). A row without a fraction is
the second case, with the same product function on the job's solo profile from gpushare's
profiler (docs/benchmarks-gpu.md, "Requests"). A row that sets ``fraction`` (and ``limit``)
overrides it, as a user's annotations would.
"""

from collections.abc import Mapping

from gpushare.api.names import SLICES_PER_GPU
from gpushare.packing.model import PipeProfile
from gpushare.packing.sizing import suggested_percent
from gpushare.packing.stored_profile import counters_pipe_profile


def pipe_profile(values: Mapping[str, float], *, gpu_model: str = "") -> PipeProfile:
    """The profile as gpushare's packing reads it (``stored_profile`` does the same for the
    cluster's stored profiles)."""
    return counters_pipe_profile(values, gpu_model=gpu_model)


def request_fraction(values: Mapping[str, float] | None, *, gpu_class: str) -> float:
    """The share (0-1) a job asks for under ``fraction: auto``, sized from its solo profile
    by the product (:func:`gpushare.packing.sizing.suggested_percent`); without a profile (a
    GPU without NVML GPM) the whole GPU, as the operator leaves an unprofiled share."""
    profile = pipe_profile(values) if values else None
    return suggested_percent(profile, gpu_class=gpu_class) / SLICES_PER_GPU
