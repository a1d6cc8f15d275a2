"""The GPU memory an opportunistic pod gets: a few fixed caps, never what a guaranteed pod needs.

Memory is what a paused pod keeps and the one thing a guaranteed pod evicts it for
(docs/packing.md, "The sharing contract"), so an opportunistic pod gets the least of a few
fixed sizes it is seen to need and leaves :data:`GUARANTEED_ROOM` of the GPU free.
"""

import math

from gpushare.api.names import SLICES_PER_GPU
from gpushare.packing.model import Demand, GpuState

MEMORY_STEPS = 3
"""An opportunistic pod without ``gpushare.io/gpu-memory`` gets its request's share of the
GPU's memory, else a half or a quarter of it, the largest that fits beside every tenant's cap:
a few fixed sizes, not whatever is left, so a node can prepare for them."""
MIN_MEMORY_BYTES = 2**30
"""Smallest such memory cap."""
GUARANTEED_ROOM = 0.10
"""Share of a GPU's memory an opportunistic pod leaves free beside every tenant's cap, so that
a small guaranteed pod arriving next fits without preempting it (a preemption restarts the
opportunistic job: docs/packing.md, "Where the constants come from")."""
PEAK_HEADROOM = 1.25
"""A pod whose profile measured its peak memory may also get that peak with this headroom
(at least :data:`MIN_MEMORY_BYTES`) as its cap, the last step: what it was seen to need, not
what its compute share would have given it."""


def memory_steps(demand: Demand, gpu_memory_bytes: int) -> list[int]:
    """The memory caps an opportunistic pod may get, largest first (:data:`MEMORY_STEPS`;
    where its profile measured its peak, the last step is that peak with
    :data:`PEAK_HEADROOM`): its ``gpushare.io/gpu-memory`` alone when set."""
    if demand.memory_bytes is not None:
        return [demand.memory_bytes]
    share = gpu_memory_bytes * min(demand.percent, SLICES_PER_GPU) // SLICES_PER_GPU
    steps = [share >> i for i in range(MEMORY_STEPS)]
    if demand.peak_memory_bytes is None:
        return [m for m in steps if m >= MIN_MEMORY_BYTES] or [share]
    # Its measured peak sets the floor: never a cap it was seen to outgrow.
    need = max(MIN_MEMORY_BYTES, math.ceil(demand.peak_memory_bytes * PEAK_HEADROOM))
    if need >= share:
        return [share]
    return [m for m in steps[: MEMORY_STEPS - 1] if m > need] + [need]


def memory_for(demand: Demand, gpu: GpuState) -> int | None:
    """The memory cap an opportunistic pod gets on ``gpu``, beside every tenant's cap and
    leaving :data:`GUARANTEED_ROOM` free; None when it does not fit. Where its profile measured
    its peak, that peak with :data:`PEAK_HEADROOM` (the last of :func:`memory_steps`): the least
    it is seen to need, since memory is what a paused pod keeps and the one thing a guaranteed
    pod evicts it for (run 27: a ViT given the largest step that fitted was evicted by the next
    15% pod). Otherwise the largest step that fits."""
    free = gpu.free_memory - int(gpu.memory_bytes * GUARANTEED_ROOM)
    steps = memory_steps(demand, gpu.memory_bytes)
    if demand.memory_bytes is None and demand.peak_memory_bytes is not None:
        steps = steps[-1:]
    return next((m for m in steps if 0 < m <= free), None)
