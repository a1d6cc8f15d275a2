"""Device-plugin mode's pods as the exporter sees them: one ``PodAllocation``
(gpushare.node.core.allocations) per pod from its placement annotations (``allocation_from_pod``
builds one from a pod manifest; DRA mode's come from the claims the agent prepared,
gpushare.node.dra.allocations).
"""

from collections.abc import Iterable, Mapping
from typing import Any

from gpushare.api.errors import InvalidInputError
from gpushare.api.names import ANN_CLASS, SLICES_PER_GPU
from gpushare.api.placement import parse_placement
from gpushare.api.request import parse_class, parse_request
from gpushare.node.core.allocations import PodAllocation, pod_containers

_FINISHED_PHASES = ("Succeeded", "Failed")


def allocation_from_pod(pod: Mapping[str, Any]) -> PodAllocation | None:
    """Build the allocation from a pod manifest (a dict as the API returns it).

    Returns None for pods without a gpushare placement and for finished pods, whose GPU share
    is free again. Raises InvalidInputError naming the annotation when a placement is
    malformed, so the caller can log it against the pod.
    """
    metadata = pod.get("metadata") or {}
    annotations: Mapping[str, str] = metadata.get("annotations") or {}
    status = pod.get("status") or {}
    if status.get("phase") in _FINISHED_PHASES:
        return None
    placement = parse_placement(annotations)
    if placement is None:
        return None
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
        namespace=str(metadata.get("namespace", "default")),
        name=str(metadata.get("name", "")),
        uid=str(metadata.get("uid", "")),
        gpu_uuids=placement.gpu_uuids,
        compute_ratio=compute,
        thread_percent=placement.thread_percent,
        memory_limit_bytes=placement.memory_limit_bytes,
        gpu_class=parse_class(annotations.get(ANN_CLASS)),
        state=placement.state,
        containers=pod_containers(pod),
    )


def allocations_from_pods(
    pods: Iterable[Mapping[str, Any]], *, node_name: str | None = None
) -> list[PodAllocation]:
    """All placed pods in ``pods`` (optionally only those bound to ``node_name``); pods with a
    malformed placement are skipped (the extender and webhook report those)."""
    result: list[PodAllocation] = []
    for pod in pods:
        if node_name is not None and (pod.get("spec") or {}).get("nodeName") != node_name:
            continue
        try:
            alloc = allocation_from_pod(pod)
        except InvalidInputError:
            continue
        if alloc is not None:
            result.append(alloc)
    return result
