"""The device plugin's Allocate answer for one container: a pod gpushare placed gets the answer
its placement says (``allocation_for_pod``), after the one-UID-per-GPU check of MPS
(``gpushare.node.core.answer.check_uid``); a pod nobody placed gets a safe answer derived from
the slice IDs alone (``derived_allocation``). The answer's shape is the node's one
(gpushare.node.core.answer).
"""

from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet

from gpushare.api.errors import InvalidInputError
from gpushare.api.names import ANN_CLASS, ANN_STATE, CLASS_BATCH, SLICES_PER_GPU, STATE_ALLOCATED
from gpushare.api.placement import Placement
from gpushare.api.pod import PodInfo
from gpushare.api.request import parse_class
from gpushare.node.core.answer import (
    AllocationContext,
    AllocationError,
    ContainerAllocation,
    check_uid,
    mps_allocation,
    whole_allocation,
)
from gpushare.node.core.pods import annotated_gpus
from gpushare.node.mps.client import MiB, runs_under_mps


def allocated_neighbours(
    pod: PodInfo, gpu: str, pods: Iterable[PodInfo], *, also: AbstractSet[str] = frozenset()
) -> list[PodInfo]:
    """Pods still running on ``gpu`` that were already allocated (or are in ``also``)."""
    return [
        other
        for other in pods
        if other.uid != pod.uid
        and not other.finished
        and gpu in annotated_gpus(other)
        and (other.annotations.get(ANN_STATE) == STATE_ALLOCATED or other.uid in also)
    ]


def allocation_for_pod(
    ctx: AllocationContext,
    pod: PodInfo,
    placement: Placement,
    neighbours: Sequence[PodInfo],
) -> tuple[ContainerAllocation, str | None]:
    """The answer for a container of ``pod``, and a warning to record (UIDs not comparable).

    A single GPU with a fractional share goes through that GPU's MPS daemon; whole GPUs go
    without MPS (one process cannot use several daemons, and a whole GPU needs none).
    """
    try:
        gpu_class = parse_class(pod.annotations.get(ANN_CLASS))
    except InvalidInputError as exc:
        raise AllocationError(f"pod {pod.key}: {exc}") from None
    uuids = list(placement.gpu_uuids)
    asked = sum(pod.requested_slices)
    if not runs_under_mps(
        gpus=len(uuids), thread_percent=placement.thread_percent, requested_percent=asked
    ):
        return whole_allocation(ctx, uuids, pod=pod.key), None
    warning = check_uid(pod, neighbours, uuids[0])
    allocation = mps_allocation(
        ctx,
        uuids[0],
        thread_percent=placement.thread_percent,
        memory_limit_bytes=placement.memory_limit_bytes,
        gpu_class=gpu_class,
        pod=pod.key,
        request_percent=placement.guaranteed_percent,
    )
    return allocation, warning


def derived_allocation(
    ctx: AllocationContext, group: Mapping[str, list[int]]
) -> tuple[ContainerAllocation, str]:
    """No pod found: a safe placement from the slice IDs alone, and the Event text saying so."""
    total = sum(len(s) for s in group.values())
    intro = (
        f"Allocate found no pod waiting with gpushare placement annotations on node "
        f"{ctx.node_name} for {total} slice(s) of GPU(s) {', '.join(group)}"
    )
    if len(group) > 1 and all(len(s) == SLICES_PER_GPU for s in group.values()):
        return whole_allocation(
            ctx, list(group), pod=None
        ), f"{intro}; gave the whole GPUs without MPS"
    # One process can use one MPS daemon: keep the GPU that holds most of the slices.
    uuid = max(group, key=lambda u: (len(group[u]), u))
    slices = len(group[uuid])
    memory = ctx.gpus[uuid].memory_bytes * slices // SLICES_PER_GPU
    if slices >= SLICES_PER_GPU:
        return whole_allocation(
            ctx, [uuid], pod=None
        ), f"{intro}; gave GPU {uuid} whole, without MPS"
    message = (
        f"{intro}; derived a safe placement: GPU {uuid}, active-thread percentage {slices}, "
        f"memory limit {memory // MiB} MiB, batch priority"
    )
    allocation = mps_allocation(
        ctx,
        uuid,
        thread_percent=slices,
        memory_limit_bytes=memory,
        gpu_class=CLASS_BATCH,
        pod=None,
    )
    return allocation, message
