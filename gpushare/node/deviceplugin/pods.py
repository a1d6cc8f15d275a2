"""The pod as the device plugin sees it (``PodInfo``), its only window on Kubernetes
(``PodSource``), and the readings of a pod's placement annotations that matching, the answer
record and reconciliation share.

The kubelet's Allocate and GetPreferredAllocation name device IDs only, never the pod; the
device plugin finds the pod among these projections of the pods bound to its node
(``gpushare.node.kube`` builds them from the API server's manifests).
"""

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from gpushare.api.names import ANN_GPU_UUID, ANN_MEMORY_LIMIT, ANN_THREAD_PERCENT

_FINISHED = ("Succeeded", "Failed")


@dataclass(frozen=True)
class PodInfo:
    """What the device plugin needs to know about a pod bound to this node."""

    namespace: str
    name: str
    uid: str
    annotations: Mapping[str, str]
    phase: str = "Pending"
    run_as_user: int | None = None
    """Effective UID of the GPU container (container, else pod securityContext); None = the
    image's default user, unknown here."""
    requested_slices: tuple[int, ...] = ()
    """gpu-percent slices asked for by each container that asks for any, in spec order."""
    created: datetime | None = None
    started: bool = False
    """Some container of the pod has been created or has run (a container ID, a running or
    terminated state, or a restart): the kubelet admitted it for good."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def finished(self) -> bool:
        return self.phase in _FINISHED


class PodSource(Protocol):
    """The device plugin's only window on Kubernetes (implemented by gpushare.node.kube)."""

    def list_node_pods(self) -> list[PodInfo]:
        """Pods bound to this node, read fresh from the API server."""

    def mark_allocated(self, pod: PodInfo) -> None:
        """Set the pod's ``gpushare.io/state`` annotation to ``allocated``."""

    def annotate_pod(self, *, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        """Merge ``annotations`` into the pod's."""

    def record_event(
        self, *, pod: PodInfo | None, reason: str, message: str, warning: bool
    ) -> None:
        """Record a Kubernetes Event on the pod, or on this node when pod is None."""


def annotated_gpus(pod: PodInfo) -> frozenset[str]:
    """The GPU UUIDs the pod's gpu-uuid annotation names, as written (not parsed)."""
    return frozenset(u.strip() for u in pod.annotations.get(ANN_GPU_UUID, "").split(",") if u)


PLACEMENT_KEYS = (ANN_GPU_UUID, ANN_THREAD_PERCENT, ANN_MEMORY_LIMIT)
"""The placement annotations an Allocate answer's environment is made of."""


def placement_values(pod: PodInfo) -> tuple[tuple[str, str], ...]:
    return tuple((k, pod.annotations[k]) for k in PLACEMENT_KEYS if k in pod.annotations)
