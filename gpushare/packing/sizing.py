"""The share a job should ask for, sized from its measured solo profile (``fraction: auto``).

A GpuShare whose ``spec.fraction`` is ``auto`` lets gpushare size its request: once the
operator has the job's profile (measured alone, or from the profile cache), its pods ask for
:func:`suggested_percent` of a GPU. The GPU benchmark's jobs without a fraction ask the same
way, through this function (docs/packing.md, "Sized from the profile: fraction auto").

The rule: the job's compute demand (its busiest of SM occupancy, a compute pipe or DRAM
bandwidth: what its neighbours feel, ``threads.compute_demand``) times ``HEADROOM``, rounded
up to 5%, between 5% and a whole GPU. A job that saturates a pipe (an FP64 or bf16 GEMM) thus
asks for the whole GPU. SM utilization (the share of SMs with any work resident) is not
demand: a job can keep most SMs busy and still leave room for a neighbour
(docs/packing.md, "Where the constants come from"). A latency-class job asks for
``LATENCY_PERCENT``; without a profile, for the whole GPU.
"""

import math

from gpushare.api.names import CLASS_LATENCY, SLICES_PER_GPU
from gpushare.packing.model import PipeProfile
from gpushare.packing.threads import HEADROOM, compute_demand

LATENCY_PERCENT = 25
"""What a latency-class job asks for: room for bursts. It runs uncapped at MPS priority 0, so
the share is admission bookkeeping (admission counts it busy over its whole share:
``admission.reserved``; docs/packing.md, "Where the constants come from")."""
STEP_PERCENT = 5
"""Suggestions are whole multiples of this many GPU-percent, rounded up."""
MIN_PERCENT = 5


def suggested_percent(profile: PipeProfile | None, *, gpu_class: str) -> int:
    """GPU-percent (5..100) a job with this solo ``profile`` should ask for (module doc)."""
    if gpu_class == CLASS_LATENCY:
        return LATENCY_PERCENT
    if profile is None:
        return SLICES_PER_GPU
    wanted = compute_demand(profile) * HEADROOM * SLICES_PER_GPU
    steps = math.ceil(wanted / STEP_PERCENT - 1e-9)
    return max(MIN_PERCENT, min(SLICES_PER_GPU, steps * STEP_PERCENT))


def as_fraction(percent: int) -> str:
    """``percent`` as the fraction a user would write (``60`` -> ``"0.6"``, ``100`` -> ``"1"``)."""
    if percent >= SLICES_PER_GPU:
        return "1"
    return f"{percent / SLICES_PER_GPU:.2f}".rstrip("0")
