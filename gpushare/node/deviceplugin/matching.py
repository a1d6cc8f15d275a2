"""Which pod an Allocate is for.

The kubelet calls Allocate with device IDs only, never the pod (docs/node-agent.md). The pod is
found from the scheduler's placement annotations: bound to this node, still Pending, not yet
``allocated``, placed on exactly the GPU(s) the slice IDs belong to, state ``assumed``, oldest
bind-time first. The request size only breaks ties between such pods; it never picks a pod on
its own. A pod ``allocated`` under a kubelet that restarted and forgot it waits again
(``again``: gpushare.node.deviceplugin.reconcile).

With no such pod, Allocate derives an answer only for a pod gpushare did not place: a
Pending pod on the node with no placement annotations asking for that many slices (bound by
another scheduler, say). It then gets a safe placement derived from the slice IDs (the GPU
they belong to, an active-thread percentage equal to the slice count, the same share of the
GPU's memory) and an Event says so. A pod with a malformed placement is refused, naming the
annotation, whichever GPU's slices the kubelet took; when no pod could be the one asking,
Allocate refuses rather than hand out a placement nobody chose (docs/node-agent.md).
"""

from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from datetime import UTC, datetime

from gpushare.api.errors import InvalidInputError
from gpushare.api.names import ANN_GPU_UUID, ANN_STATE, STATE_ALLOCATED, STATE_ASSUMED
from gpushare.api.placement import Placement
from gpushare.api.pod import PodInfo
from gpushare.node.core.answer import AllocationError
from gpushare.node.core.pods import annotated_gpus, placement_values


class MalformedPlacementError(AllocationError):
    """The pod an Allocate is for carries placement annotations that do not parse."""

    def __init__(self, pod: "PodInfo", message: str) -> None:
        super().__init__(message)
        self.pod = pod


@dataclass(frozen=True)
class WaitingPod:
    """A pod whose placement waits for its Allocate; ``error`` set when it does not parse."""

    pod: PodInfo
    placement: Placement | None
    error: InvalidInputError | None
    order: datetime


def _epoch() -> datetime:
    return datetime.fromtimestamp(0, tz=UTC)


def _candidate(pod: PodInfo, again: AbstractSet[str] = frozenset()) -> WaitingPod | None:
    """A pod with a gpushare placement that is still waiting for its Allocate; else None.

    Only Pending pods wait: a pod whose containers run was admitted long ago, whatever its
    state annotation says (a stale ``assumed`` must not capture other pods' slices). A pod in
    ``again`` (forgotten by a restarted kubelet) waits whatever its state."""
    if pod.phase != "Pending" or ANN_GPU_UUID not in pod.annotations:
        return None
    placement = pod.placement
    if pod.uid in again:
        return None if placement is None else WaitingPod(pod, placement, None, placement.bind_time)
    if pod.placement_error is not None:
        if pod.annotations.get(ANN_STATE, STATE_ASSUMED) == STATE_ALLOCATED:
            return None
        return WaitingPod(pod, None, pod.placement_error, pod.created or _epoch())
    if placement is None or placement.state != STATE_ASSUMED:
        return None
    return WaitingPod(pod, placement, None, placement.bind_time)


def waiting_pods(
    pods: Iterable[PodInfo],
    *,
    skip: AbstractSet[str] = frozenset(),
    again: AbstractSet[str] = frozenset(),
    opportunistic: bool | None = None,
) -> list[WaitingPod]:
    """Pods with a placement still waiting for their Allocate, oldest bind-time first: assumed
    pods not in ``skip``, and the forgotten pods in ``again``; with ``opportunistic`` set, only
    pods asking for that resource (opportunistic-gpu-percent, else gpu-percent)."""
    found = [
        c
        for p in pods
        if (p.uid not in skip or p.uid in again)
        and (opportunistic is None or p.opportunistic == opportunistic)
        and (c := _candidate(p, again))
    ]
    return sorted(found, key=lambda c: (c.order, c.pod.key))


def _matching(
    waiting: list[WaitingPod], gpus: AbstractSet[str], sizes: tuple[int, ...]
) -> list[WaitingPod]:
    """The waiting pods an Allocate could be for, best tier first found: placed on ``gpus``,
    else a single-GPU pod of exactly ``sizes`` elsewhere, else one of that size whose
    placement does not parse. Empty when none is."""

    def could_be(c: WaitingPod) -> bool:
        asked = c.pod.requested_slices
        return not asked or all(size in asked for size in sizes)

    matching = [
        c
        for c in waiting
        if could_be(c)
        and (
            (c.placement is not None and frozenset(c.placement.gpu_uuids) == gpus)
            or (c.placement is None and annotated_gpus(c.pod) == gpus)
        )
    ]
    if not matching:
        matching = [
            c
            for c in waiting
            if c.placement is not None
            and len(c.placement.gpu_uuids) == 1
            and c.pod.requested_slices == sizes
        ]
    if not matching:
        # Last, a pod of that size with a malformed placement, whatever GPU the kubelet took
        # the slices from: it must be refused, not served as if no pod were waiting.
        matching = [c for c in waiting if c.placement is None and c.pod.requested_slices == sizes]
    return matching


def select_pod(
    pods: Iterable[PodInfo],
    *,
    gpus: AbstractSet[str],
    sizes: tuple[int, ...],
    skip: AbstractSet[str] = frozenset(),
    again: AbstractSet[str] = frozenset(),
    previous: Mapping[str, tuple[str, ...]] | None = None,
    devices: AbstractSet[str] = frozenset(),
    opportunistic: bool = False,
) -> tuple[PodInfo, Placement] | None:
    """The pod an Allocate for slices of ``gpus`` is for: placed on exactly those GPUs, state
    assumed (or forgotten by a restarted kubelet: ``again``), a container of it asking for
    that many slices, oldest bind-time; among those, pods whose per-container requests equal
    ``sizes`` go first, then a forgotten pod whose earlier answer (``previous``: uid -> slice
    IDs) covered exactly ``devices``. When no such pod waits on ``gpus``, a single-GPU pod of
    exactly ``sizes`` waiting on another GPU: the kubelet took the slices where it saw room
    (after a restart its free slices need not match the placements), and the answer's
    environment follows the pod's placement, not the slice IDs. Last, a pod of exactly
    ``sizes`` whose placement does not parse, on any GPU. None when no pod fits.

    A pod of another size is never chosen: the kubelet asks for exactly what one container
    requested, so that pod cannot be the one admitted. Nor is a pod asking for the other
    resource (``opportunistic``: the devices are opportunistic-gpu-percent ones).

    Raises MalformedPlacementError when the pod it lands on carries malformed annotations.
    """
    waiting = waiting_pods(pods, skip=skip, again=again, opportunistic=opportunistic)
    matching = _matching(waiting, gpus, sizes)
    if not matching:
        return None
    earlier = previous or {}
    wanted = tuple(sorted(devices))

    def rank(c: WaitingPod) -> tuple[bool, bool]:
        same = bool(wanted) and c.pod.uid in again and earlier.get(c.pod.uid) == wanted
        return c.pod.requested_slices != sizes, not same

    best = min(matching, key=rank)  # min is stable: oldest bind-time within a rank
    if best.error is not None or best.placement is None:
        raise MalformedPlacementError(best.pod, f"pod {best.pod.key}: {best.error}")
    return best.pod, best.placement


def ambiguous(waiting: Iterable[WaitingPod], sizes: tuple[int, ...]) -> bool:
    """Several pods of the requested sizes wait with different placements: the kubelet may be
    admitting any of them (it admits a batch, after a restart say, in creation-time order with
    ties unordered), and the device-plugin API does not say which."""
    return (
        len(
            {
                placement_values(c.pod)
                for c in waiting
                if c.placement is not None and c.pod.requested_slices == sizes
            }
        )
        > 1
    )


def unplaced_pods(
    pods: Iterable[PodInfo],
    *,
    sizes: tuple[int, ...],
    skip: AbstractSet[str] = frozenset(),
    opportunistic: bool = False,
) -> list[PodInfo]:
    """Pods gpushare did not place that an Allocate for ``sizes`` could be for: Pending, no
    container started, no gpushare placement annotation, a container asking for that many
    slices, not already answered or refused by this process (``skip``)."""
    return [
        p
        for p in pods
        if p.phase == "Pending"
        and not p.started
        and p.uid not in skip
        and ANN_GPU_UUID not in p.annotations
        and p.opportunistic == opportunistic
        and all(size in p.requested_slices for size in sizes)
    ]


def unplaced_refusal(node: str, group: Mapping[str, list[int]]) -> str:
    """Why an Allocate no pod can be found for is refused (the kubelet shows it on the pod)."""
    total = sum(len(s) for s in group.values())
    return (
        f"Allocate found no pod on node {node} waiting for {total} gpushare.io/gpu-percent "
        f"slice(s) of GPU(s) {', '.join(sorted(group))}: no pod with a gpushare placement "
        "(gpushare.io/gpu-uuid, state assumed) of that size, and none without a placement; "
        "refusing rather than run a pod with a share nobody chose. Delete the pod so its "
        "controller recreates it and gpushare-scheduler places it"
    )
