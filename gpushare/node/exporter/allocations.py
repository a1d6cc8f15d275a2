"""What the exporter knows about pods on this node: their GPU placement, read from annotations
(device-plugin mode; DRA mode's come from the claims the agent prepared,
gpushare.node.dra.allocations).

The node agent already watches the pods bound to its node; it hands them to the exporter as
``PodAllocation`` values (``allocation_from_pod`` builds one from a pod manifest), so the
exporter never talks to the Kubernetes API itself.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpushare.api.errors import InvalidInputError
from gpushare.api.names import ANN_CLASS, CLASS_BATCH, SLICES_PER_GPU
from gpushare.api.placement import parse_placement
from gpushare.api.request import parse_class, parse_request

_FINISHED_PHASES = ("Succeeded", "Failed")


@dataclass(frozen=True)
class PodAllocation:
    """A pod placed on one or more GPUs of this node."""

    namespace: str
    name: str
    uid: str
    gpu_uuids: tuple[str, ...]
    compute_ratio: float
    """Guaranteed compute share per GPU, 0-1 (1.0 for each GPU of a multi-GPU pod)."""
    thread_percent: int
    """MPS active-thread percentage the pod's processes run with: its limit, which may exceed
    its guaranteed share (``compute_ratio``)."""
    memory_limit_bytes: int
    """MPS pinned device memory limit per GPU (0 = none written)."""
    gpu_class: str = CLASS_BATCH
    state: str = ""
    containers: Mapping[str, str] = field(default_factory=dict)
    """Container ID (runtime prefix stripped) -> container name, for per-container memory."""


def container_id(raw: str) -> str:
    """``containerd://abc...`` -> ``abc...`` (status fields carry the runtime as a prefix)."""
    return raw.split("://", 1)[-1]


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


def pod_containers(pod: Mapping[str, Any]) -> dict[str, str]:
    """Container ID (runtime prefix stripped) -> container name, from the pod's status."""
    status = pod.get("status") or {}
    containers: dict[str, str] = {}
    for key in ("initContainerStatuses", "containerStatuses"):
        for cs in status.get(key) or []:
            raw = cs.get("containerID")
            if raw:
                containers[container_id(str(raw))] = str(cs.get("name", ""))
    return containers


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
