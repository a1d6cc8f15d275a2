"""The node side's only Kubernetes API module (lightkube, synchronous).

Reads the pods bound to this node, marks a pod ``allocated``, records Events and publishes the
node's GPU inventory annotation and labels. Everything else on the node side reaches
Kubernetes through this class (import-linter enforces it).
"""

import logging
import socket
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx2
from lightkube import ApiError, Client, KubeConfig
from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event, Node, Pod
from lightkube.types import PatchType

from gpushare.api.names import ANN_CONTAINER, ANN_STATE, RESOURCE_GPU_PERCENT, STATE_ALLOCATED
from gpushare.node.deviceplugin.pods import PodInfo

log = logging.getLogger(__name__)

COMPONENT = "gpushare-node-agent"


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


class NodeKube:
    """Kubernetes access for one node's agent. Implements the device plugin's PodSource."""

    def __init__(self, *, node_name: str, kubeconfig: Path | None = None) -> None:
        config = KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_env()
        self.client = Client(config=config, field_manager=COMPONENT)
        self.node_name = node_name
        self._host = socket.gethostname()
        self._node_uid_value: str | None = None
        self._last_pods: list[dict[str, Any]] = []
        self._last_pods_time = 0.0

    # --- pods ----------------------------------------------------------------------------

    def raw_node_pods(self) -> list[dict[str, Any]]:
        """Manifests of the pods bound to this node, read fresh from the API server."""
        pods = _retry_transient(
            lambda: [
                p.to_dict()
                for p in self.client.list(
                    Pod, namespace="*", fields={"spec.nodeName": self.node_name}
                )
            ],
            what="list this node's pods",
        )
        self._last_pods, self._last_pods_time = pods, time.monotonic()
        return pods

    def cached_node_pods(self, *, max_age_s: float) -> list[dict[str, Any]]:
        """The last listing when younger than ``max_age_s``, else a fresh one."""
        if time.monotonic() - self._last_pods_time > max_age_s:
            return self.raw_node_pods()
        return list(self._last_pods)

    def list_node_pods(self) -> list[PodInfo]:
        return [pod_info(p) for p in self.raw_node_pods()]

    def mark_allocated(self, pod: PodInfo) -> None:
        _retry_transient(
            lambda: self.client.patch(
                Pod,
                pod.name,
                {"metadata": {"annotations": {ANN_STATE: STATE_ALLOCATED}}},
                namespace=pod.namespace,
                patch_type=PatchType.MERGE,
            ),
            what=f"mark {pod.namespace}/{pod.name} allocated",
        )

    def annotate_pod(self, *, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        self.client.patch(
            Pod,
            name,
            {"metadata": {"annotations": dict(annotations)}},
            namespace=namespace,
            patch_type=PatchType.MERGE,
        )

    # --- events --------------------------------------------------------------------------

    def _node_uid(self) -> str | None:
        if self._node_uid_value is None:
            node = self.client.get(Node, self.node_name)
            self._node_uid_value = node.metadata.uid if node.metadata else None
        return self._node_uid_value

    def record_event(
        self, *, pod: PodInfo | None, reason: str, message: str, warning: bool
    ) -> None:
        now = datetime.now(UTC)
        if pod is not None:
            target = ObjectReference(
                kind="Pod", apiVersion="v1", name=pod.name, namespace=pod.namespace, uid=pod.uid
            )
            namespace = pod.namespace
        else:
            target = ObjectReference(
                kind="Node", apiVersion="v1", name=self.node_name, uid=self._node_uid()
            )
            namespace = "default"
        event = Event(
            metadata=ObjectMeta(name=f"{target.name}.{time.time_ns():x}", namespace=namespace),
            involvedObject=target,
            reason=reason,
            message=message[:1024],
            type="Warning" if warning else "Normal",
            source=EventSource(component=COMPONENT, host=self.node_name),
            reportingComponent=COMPONENT,
            reportingInstance=f"{COMPONENT}-{self.node_name}",
            firstTimestamp=now,
            lastTimestamp=now,
            count=1,
        )
        self.client.create(event, namespace=namespace)

    # --- node ----------------------------------------------------------------------------

    def node_labels(self) -> dict[str, str]:
        node = self.client.get(Node, self.node_name)
        return dict((node.metadata.labels if node.metadata else None) or {})

    def node_annotations(self) -> dict[str, str]:
        node = self.client.get(Node, self.node_name)
        return dict((node.metadata.annotations if node.metadata else None) or {})

    def publish_node(
        self, *, annotations: Mapping[str, str], labels: Mapping[str, str | None]
    ) -> None:
        """Merge-patch the node's annotations and labels (a None label value removes it)."""
        self.client.patch(
            Node,
            self.node_name,
            {"metadata": {"annotations": dict(annotations), "labels": dict(labels)}},
            patch_type=PatchType.MERGE,
        )

    def close(self) -> None:
        self.client.close()


T = TypeVar("T")
TRANSIENT_RETRY_S = 20.0
"""How long Allocate's API calls ride out an API server restart before failing the pod: the
kubelet admits pods while the API server is down, and failing Allocate then loses the pod."""


def _retry_transient(call: Callable[[], T], *, what: str) -> T:
    """Run ``call``, retrying connection errors and 429/5xx answers for TRANSIENT_RETRY_S."""
    deadline = time.monotonic() + TRANSIENT_RETRY_S
    delay = 0.2
    while True:
        try:
            return call()
        except (httpx2.TransportError, OSError, ApiError) as exc:
            status = exc.status.code if isinstance(exc, ApiError) else None
            transient = status is None or status == 429 or (status or 0) >= 500
            if not transient or time.monotonic() + delay > deadline:
                raise
            log.warning(
                "API server unavailable; retrying", extra={"action": what, "error": str(exc)}
            )
            time.sleep(delay)
            delay = min(2.0, delay * 2)
