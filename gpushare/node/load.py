"""Plausible counters for simulated GPUs, derived from the placements on each GPU.

The simulated backend reports whatever ``set_load`` was last given; the node agent feeds it
from the pods allocated on each GPU, so dashboards, the exporter and the profiler see load
move as pods come and go. With ``a`` = the summed busy share of the running pods on the GPU /
100 (capped at 1), where a pod's busy share is its active-thread percentage, or its guaranteed
``gpushare.io/gpu-percent`` when that is smaller (thread caps may overlap: a latency pod runs
uncapped while it reserved 30%):

- pipes: tensor and tensor_hmma ``0.55 a``, fp32 ``0.45 a``, integer ``0.25 a``,
  fp16 ``0.10 a``, fp64 ``0.02 a``, tensor_dmma and tensor_imma 0 (a bf16-training-like mix);
- SM occupancy ``0.6 a``;
- memory used: 80% of each pod's memory limit (its thread share of the GPU's memory when the
  pod carries no limit), capped at the GPU's memory.

It is a stand-in for measurement, never a measurement: every series of a simulated GPU is
labelled ``simulated="true"``.
"""

from collections.abc import Iterable
from dataclasses import dataclass

from gpushare.api.inventory import GpuInfo

PIPE_WEIGHTS: dict[str, float] = {
    "tensor": 0.55,
    "tensor_hmma": 0.55,
    "fp32": 0.45,
    "integer": 0.25,
    "fp16": 0.10,
    "fp64": 0.02,
    "tensor_dmma": 0.0,
    "tensor_imma": 0.0,
}
SM_OCCUPANCY_WEIGHT = 0.6
MEMORY_USED_SHARE = 0.8


@dataclass(frozen=True)
class Share:
    """One running pod's share of a GPU."""

    thread_percent: int
    memory_limit_bytes: int
    guaranteed_percent: int | None = None
    """The pod's gpushare.io/gpu-percent on this GPU, when known."""

    @property
    def busy_percent(self) -> int:
        if self.guaranteed_percent is None:
            return self.thread_percent
        return min(self.thread_percent, self.guaranteed_percent)


@dataclass(frozen=True)
class Load:
    pipes: dict[str, float]
    sm_occupancy: float
    memory_used_bytes: int


def simulated_load(gpu: GpuInfo, shares: Iterable[Share]) -> Load:
    """The load formula above, for one GPU."""
    items = list(shares)
    active = min(1.0, sum(s.busy_percent for s in items) / 100.0)
    memory = 0
    for share in items:
        limit = share.memory_limit_bytes or gpu.memory_bytes * share.thread_percent // 100
        memory += int(limit * MEMORY_USED_SHARE)
    return Load(
        pipes={pipe: round(weight * active, 4) for pipe, weight in PIPE_WEIGHTS.items()},
        sm_occupancy=round(SM_OCCUPANCY_WEIGHT * active, 4),
        memory_used_bytes=min(gpu.memory_bytes, memory),
    )
