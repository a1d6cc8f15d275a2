"""Plausible counters for simulated GPUs, derived from the placements on each GPU.

The simulated backend reports whatever ``set_load`` was last given; the node agent feeds it
(``SimulatedLoadFeeder``) from the pods allocated on each GPU, so dashboards, the exporter and
the profiler see load move as pods come and go. With ``a`` = the summed busy share of the
running pods on the GPU / 100 (capped at 1), where a pod's busy share is its active-thread
percentage, or its guaranteed ``gpushare.io/gpu-percent`` when that is smaller (thread caps
may overlap: a latency pod runs uncapped while it reserved 30%):

- pipes: tensor and tensor_hmma ``0.55 a``, fp32 ``0.45 a``, integer ``0.25 a``,
  fp16 ``0.10 a``, fp64 ``0.02 a``, tensor_dmma and tensor_imma 0 (a bf16-training-like mix);
- SM occupancy ``0.6 a``;
- memory used: 80% of each pod's memory limit (its thread share of the GPU's memory when the
  pod carries no limit), capped at the GPU's memory.

It is a stand-in for measurement, never a measurement: every series of a simulated GPU is
labelled ``simulated="true"``.
"""

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gpushare.api.inventory import GpuInfo
from gpushare.api.names import RESOURCE_GPU_PERCENT, STATE_ALLOCATED
from gpushare.api.pod import PodInfo
from gpushare.node.gpu.backend import GpuBackend

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


class PreparedShare(Protocol):
    """A DRA claim the agent prepared, as the load sees it (gpushare.node.dra.checkpoint)."""

    @property
    def pod(self) -> str:
        """namespace/name of the pod holding it."""

    @property
    def gpu_uuids(self) -> tuple[str, ...]: ...

    @property
    def thread_percent(self) -> int: ...

    @property
    def memory_limit_bytes(self) -> int: ...

    @property
    def percent(self) -> int | None: ...


class SimulatedLoadFeeder:
    """Gives each simulated GPU the load of the pods running on it (the formula above): in
    DRA mode those of the claims prepared for running pods, at their thread caps or their
    guaranteed share when smaller, as annotated pods. The agent calls ``feed`` every pod
    refresh on a simulated backend, with the pods it read (their placements parsed once, in
    ``PodInfo``)."""

    def __init__(
        self,
        *,
        backend: GpuBackend,
        gpus: Sequence[GpuInfo],
        prepared: Callable[[], Iterable[PreparedShare]] = tuple,
    ) -> None:
        self.backend = backend
        self.gpus = list(gpus)
        self.prepared = prepared

    def feed(self, pods: Iterable[PodInfo]) -> None:
        pods = list(pods)
        shares: dict[str, list[Share]] = defaultdict(list)
        running = {pod.key for pod in pods if pod.phase == "Running"}
        for claim in self.prepared():
            if claim.pod in running:
                for uuid in claim.gpu_uuids:
                    shares[uuid].append(
                        Share(claim.thread_percent, claim.memory_limit_bytes, claim.percent)
                    )
        for pod in pods:
            if pod.phase != "Running":
                continue
            # A malformed placement is None here (PodInfo.placement_error says why).
            placement = pod.placement
            if placement is None or placement.state != STATE_ALLOCATED:
                continue
            guaranteed = _guaranteed_percent(pod.manifest, gpus=len(placement.gpu_uuids))
            for uuid in placement.gpu_uuids:
                shares[uuid].append(
                    Share(placement.thread_percent, placement.memory_limit_bytes, guaranteed)
                )
        set_load = getattr(self.backend, "set_load", None)
        if set_load is None:
            return
        for gpu in self.gpus:
            load = simulated_load(gpu, shares.get(gpu.uuid, []))
            set_load(
                gpu.uuid,
                pipes=load.pipes,
                sm_occupancy=load.sm_occupancy,
                memory_used_bytes=load.memory_used_bytes,
            )


def _guaranteed_percent(pod: Mapping[str, Any], *, gpus: int) -> int | None:
    """The pod's gpushare.io/gpu-percent per GPU (limits of all containers), None if unset."""
    total = 0
    for container in (pod.get("spec") or {}).get("containers") or []:
        limits = (container.get("resources") or {}).get("limits") or {}
        value = limits.get(RESOURCE_GPU_PERCENT)
        if value is None:
            continue
        try:
            total += int(str(value))
        except ValueError:
            return None
    if total <= 0:
        return None
    return total // max(1, gpus)
