"""Device-plugin mode's pods as the exporter sees them: one ``PodAllocation``
(gpushare.node.core.allocations) per pod from its placement (``allocation_from_pod`` builds one
from the agent's pod projection, ``PodInfo``, whose placement annotations were parsed once when
the pod list was read; DRA mode's come from the claims the agent prepared,
gpushare.node.dra.allocations).
"""

from collections.abc import Iterable

from gpushare.api.errors import InvalidInputError
from gpushare.api.names import ANN_CLASS, SLICES_PER_GPU
from gpushare.api.pod import PodInfo
from gpushare.api.request import parse_class, parse_request
from gpushare.node.core.allocations import PodAllocation, pod_containers


def allocation_from_pod(pod: PodInfo) -> PodAllocation | None:
    """Build the allocation from the agent's projection of a pod.

    Returns None for pods without a gpushare placement and for finished pods, whose GPU share
    is free again. Raises InvalidInputError naming the annotation when a placement is
    malformed, so the caller can log it against the pod.
    """
    if pod.finished:
        return None
    if pod.placement_error is not None:
        # Raised afresh each time: the projection keeps the one error its parse found.
        raise pod.placement_error.with_traceback(None)
    placement = pod.placement
    if placement is None:
        return None
    annotations = pod.annotations
    try:
        request = parse_request(annotations)
    except InvalidInputError:
        request = None
    if request is not None and request.percent > 0:
        compute = min(request.percent, SLICES_PER_GPU) / SLICES_PER_GPU
    else:
        # A pod governed by a GpuShare may carry no fraction of its own: its request is what
        # the scheduler accounted for at bind (older placements: its thread cap).
        compute = placement.guaranteed_percent / SLICES_PER_GPU
    return PodAllocation(
        namespace=pod.namespace or "default",
        name=pod.name,
        uid=pod.uid,
        gpu_uuids=placement.gpu_uuids,
        compute_ratio=compute,
        thread_percent=placement.thread_percent,
        memory_limit_bytes=placement.memory_limit_bytes,
        gpu_class=parse_class(annotations.get(ANN_CLASS)),
        state=placement.state,
        containers=pod_containers(pod.manifest),
    )


def allocations_from_pods(
    pods: Iterable[PodInfo], *, node_name: str | None = None
) -> list[PodAllocation]:
    """All placed pods in ``pods`` (optionally only those bound to ``node_name``); pods with a
    malformed placement are skipped (the extender and webhook report those)."""
    result: list[PodAllocation] = []
    for pod in pods:
        if node_name is not None and (pod.manifest.get("spec") or {}).get("nodeName") != node_name:
            continue
        try:
            alloc = allocation_from_pod(pod)
        except InvalidInputError:
            continue
        if alloc is not None:
            result.append(alloc)
    return result
