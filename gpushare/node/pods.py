"""The node agent's pod: :class:`~gpushare.node.deviceplugin.allocation.PodInfo` from a
manifest as the API server returns it (the projection the agent hands its Kubernetes client)."""

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from gpushare.api.names import ANN_CONTAINER, RESOURCE_GPU_PERCENT
from gpushare.node.deviceplugin.allocation import PodInfo


def _quantity_int(value: object) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def pod_info(pod: Mapping[str, Any]) -> PodInfo:
    """PodInfo from a pod manifest (the dict the API server returns)."""
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    annotations: dict[str, str] = dict(metadata.get("annotations") or {})
    containers = list(spec.get("containers") or [])
    requested: list[int] = []
    gpu_container: Mapping[str, Any] | None = None
    for container in containers:
        resources = container.get("resources") or {}
        amount = (resources.get("limits") or {}).get(RESOURCE_GPU_PERCENT) or (
            resources.get("requests") or {}
        ).get(RESOURCE_GPU_PERCENT)
        if amount is not None and _quantity_int(amount) > 0:
            requested.append(_quantity_int(amount))
            gpu_container = gpu_container or container
    named = annotations.get(ANN_CONTAINER)
    if named:
        gpu_container = next((c for c in containers if c.get("name") == named), gpu_container)
    if gpu_container is None and containers:
        gpu_container = containers[0]
    uid = ((gpu_container or {}).get("securityContext") or {}).get("runAsUser")
    if uid is None:
        uid = (spec.get("securityContext") or {}).get("runAsUser")
    created_text = metadata.get("creationTimestamp")
    created: datetime | None = None
    if isinstance(created_text, datetime):
        created = created_text
    elif created_text:
        created = datetime.fromisoformat(str(created_text).replace("Z", "+00:00"))
    return PodInfo(
        started=_started(status),
        namespace=str(metadata.get("namespace", "")),
        name=str(metadata.get("name", "")),
        uid=str(metadata.get("uid", "")),
        annotations=annotations,
        phase=str(status.get("phase") or "Pending"),
        run_as_user=int(uid) if uid is not None else None,
        requested_slices=tuple(requested),
        created=created,
    )


def _started(status: Mapping[str, Any]) -> bool:
    """Whether any container (init containers included) was ever created or run."""
    for key in ("initContainerStatuses", "containerStatuses"):
        for container in status.get(key) or []:
            state = container.get("state") or {}
            if (
                container.get("containerID")
                or state.get("running")
                or state.get("terminated")
                or (container.get("lastState") or {}).get("terminated")
                or int(container.get("restartCount") or 0) > 0
            ):
                return True
    return False
