"""The node agent's pod: :class:`~gpushare.api.pod.PodInfo` (a pod manifest read once, its
placement annotations parsed once), its only window on Kubernetes (``PodSource``), and the
readings of a pod's placement annotations that matching, the answer record and reconciliation
share.

``PodInfo`` is the agent's one pod projection: every part of the agent (the device plugin, the
DRA plugin, the exporter, the fault monitor, the MPS limits, the simulated load) reads a pod's
placement from it, built once where a pod list is read, never from the annotations again.

The kubelet's Allocate and GetPreferredAllocation name device IDs only, never the pod; the
device plugin finds the pod among these projections of the pods bound to its node
(:func:`~gpushare.api.pod.pod_info` builds them from the API server's manifests;
``gpushare.kube.node`` reads those).
"""

from collections.abc import Mapping
from typing import Protocol

from gpushare.api.names import ANN_GPU_UUID, ANN_MEMORY_LIMIT, ANN_THREAD_PERCENT
from gpushare.api.pod import PodInfo


class PodSource(Protocol):
    """The device plugin's only window on Kubernetes (implemented by gpushare.kube.node)."""

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
