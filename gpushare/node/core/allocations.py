"""A pod's GPUs on this node as the exporter, the dashboards and the simulated load see them
(``PodAllocation``), whichever plugin placed it: device-plugin mode reads it from placement
annotations (gpushare.node.exporter.allocations), DRA mode from the claims the agent prepared
(gpushare.node.dra.allocations). The node agent hands these to the exporter, so the exporter
never talks to the Kubernetes API itself.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpushare.api.names import CLASS_BATCH


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
