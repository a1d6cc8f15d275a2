"""A pod manifest read once: :class:`PodInfo`, its placement annotations parsed once, built by
:func:`pod_info` from the dict the API server returns.

It is the node agent's one pod projection (``gpushare.node.core.pods``: every part of the agent
takes a pod's placement from it) and what ``kubectl gpushare`` reads each listed pod into; the
controller has its own, ``gpushare.cluster.state.pod_facts.PodFacts``, built from its watch
(docs/architecture.md, "One shape per thing").
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpushare.api.errors import InvalidInputError
from gpushare.api.names import ANN_CONTAINER, GPU_RESOURCES, RESOURCE_GPU_OPPORTUNISTIC
from gpushare.api.placement import Placement, parse_placement
from gpushare.api.quantities import kube_quantity

_FINISHED = ("Succeeded", "Failed")


@dataclass(frozen=True)
class PodInfo:
    """What the node agent needs to know about a pod bound to its node (and the CLI about any
    pod it lists)."""

    namespace: str
    name: str
    uid: str
    annotations: Mapping[str, str]
    phase: str = "Pending"
    run_as_user: int | None = None
    """Effective UID of the GPU container (container, else pod securityContext); None = the
    image's default user, unknown here."""
    requested_slices: tuple[int, ...] = ()
    """gpu-percent (or opportunistic-gpu-percent) slices asked for by each container that asks
    for any, in spec order."""
    created: datetime | None = None
    opportunistic: bool = False
    """It asks for gpushare.io/opportunistic-gpu-percent: only opportunistic device IDs are for
    it (and only guaranteed ones for a pod asking gpu-percent)."""
    started: bool = False
    """Some container of the pod has been created or has run (a container ID, a running or
    terminated state, or a restart): the kubelet admitted it for good."""
    manifest: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """The manifest it was read from (:func:`pod_info`), for the parts that read more of the pod
    than this projection holds (its containers, owners, node): never parsed again."""
    placement: Placement | None = field(init=False, compare=False, repr=False)
    """Its placement annotations, parsed once here for every reader; None when it
    carries none or when they are malformed (``placement_error`` says why)."""
    placement_error: InvalidInputError | None = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        try:
            placement, error = parse_placement(self.annotations), None
        except InvalidInputError as exc:
            placement, error = None, exc
        object.__setattr__(self, "placement", placement)
        object.__setattr__(self, "placement_error", error)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def finished(self) -> bool:
        return self.phase in _FINISHED


def _quantity_int(value: object) -> int:
    """An extended-resource count as the API server stores it; 0 for anything else."""
    return kube_quantity(value) or 0


def _run_as_user(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 20:
        return int(value)
    return None


def pod_info(pod: Mapping[str, Any]) -> PodInfo:
    """PodInfo from a pod manifest (the dict the API server returns)."""
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    annotations: dict[str, str] = dict(metadata.get("annotations") or {})
    containers = list(spec.get("containers") or [])
    requested: list[int] = []
    opportunistic = False
    gpu_container: Mapping[str, Any] | None = None
    for container in containers:
        resources = container.get("resources") or {}
        limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
        # A pod asks for one of the two (the webhook sees to it): guaranteed slices, or
        # opportunistic ones in the same GPU-percent.
        amount = next(
            (v for r in GPU_RESOURCES if (v := limits.get(r) or requests.get(r)) is not None),
            None,
        )
        if amount is not None and _quantity_int(amount) > 0:
            requested.append(_quantity_int(amount))
            opportunistic |= any(r == RESOURCE_GPU_OPPORTUNISTIC for r in limits | requests)
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
        run_as_user=_run_as_user(uid),
        requested_slices=tuple(requested),
        opportunistic=opportunistic,
        created=created,
        manifest=pod,
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
