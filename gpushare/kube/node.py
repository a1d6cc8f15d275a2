"""The API calls the node agent makes (lightkube, synchronous).

Reads the pods bound to this node, marks a pod ``allocated``, records Events and publishes the
node's GPU inventory annotation and labels. The agent gives it its pod projection (``project``:
a manifest -> the agent's pod type), so this layer knows no node-side type.
"""

import socket
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar, cast

from lightkube import Client
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import PatchType

from gpushare.api.names import ANN_STATE, STATE_ALLOCATED
from gpushare.kube.access import PROFILE_AUDIENCE, AccessReviewer
from gpushare.kube.config import load_config
from gpushare.kube.dra import DraKube
from gpushare.kube.errors import NotFoundError, translated
from gpushare.kube.events import ObjectRef, Reporter
from gpushare.kube.retry import retry_transient

P = TypeVar("P")

COMPONENT = "gpushare-node-agent"


class PodRef(Protocol):
    """What a pod must say of itself to be patched or reported on."""

    @property
    def namespace(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def uid(self) -> str: ...


class NodeKube(Generic[P]):
    """Kubernetes access for one node's agent, its pods projected by ``project``. Implements
    the device plugin's PodSource."""

    def __init__(
        self,
        *,
        node_name: str,
        project: Callable[[Mapping[str, Any]], P],
        kubeconfig: Path | None = None,
    ) -> None:
        self.client = Client(config=load_config(kubeconfig), field_manager=COMPONENT)
        self._project = project
        self.node_name = node_name
        self._host = socket.gethostname()
        self._dra = DraKube(client=self.client, node_name=node_name)
        self._last_pods: list[dict[str, Any]] = []
        self._last_pods_time = 0.0

    # --- pods ----------------------------------------------------------------------------

    def raw_node_pods(self) -> list[dict[str, Any]]:
        """Manifests of the pods bound to this node, read fresh from the API server."""
        what = "list this node's pods"
        with translated(what):
            pods = retry_transient(
                lambda: [
                    p.to_dict()
                    for p in self.client.list(
                        Pod, namespace="*", fields={"spec.nodeName": self.node_name}
                    )
                ],
                what=what,
            )
        self._last_pods, self._last_pods_time = pods, time.monotonic()
        return pods

    def cached_node_pods(self, *, max_age_s: float) -> list[dict[str, Any]]:
        """The last listing when younger than ``max_age_s``, else a fresh one."""
        if time.monotonic() - self._last_pods_time > max_age_s:
            return self.raw_node_pods()
        return list(self._last_pods)

    def list_node_pods(self) -> list[P]:
        return [self._project(p) for p in self.raw_node_pods()]

    def mark_allocated(self, pod: PodRef) -> None:
        what = f"mark {pod.namespace}/{pod.name} allocated"
        with translated(what):
            retry_transient(
                lambda: self.client.patch(
                    Pod,
                    pod.name,
                    {"metadata": {"annotations": {ANN_STATE: STATE_ALLOCATED}}},
                    namespace=pod.namespace,
                    patch_type=PatchType.MERGE,
                ),
                what=what,
            )

    def watch_node_pods(self, *, timeout_s: int = 300) -> Iterator[tuple[str, dict[str, Any]]]:
        """(event type, manifest) of every change to the pods bound to this node, forever: a
        watch with the field selector spec.nodeName=<node>, opened again where it stopped each
        ``timeout_s``. It starts with every current pod as ADDED (no resourceVersion given).
        The pause loop wakes on it (gpushare.node.pausing.loop)."""
        with translated(f"watch the pods of node {self.node_name}"):
            for event, pod in self.client.watch(
                Pod,
                namespace="*",
                fields={"spec.nodeName": self.node_name},
                server_timeout=timeout_s,
            ):
                yield event, pod.to_dict()

    def set_pod_annotation(self, *, pod: PodRef, key: str, value: str | None) -> None:
        """Set one annotation of the pod, or remove it (``value`` None), if the pod is still
        the one read (its UID in the patch: a pod of the same name created since is refused
        by the API server, the UID being immutable)."""
        what = f"{'set' if value is not None else 'remove'} {key} of pod {pod.namespace}/{pod.name}"
        body = {"metadata": {"uid": pod.uid, "annotations": {key: value}}}
        with translated(what):
            retry_transient(
                lambda: self.client.patch(
                    Pod, pod.name, body, namespace=pod.namespace, patch_type=PatchType.MERGE
                ),
                what=what,
            )

    def annotate_pod(self, *, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        with translated(f"annotate pod {namespace}/{name}"):
            self.client.patch(
                Pod,
                name,
                {"metadata": {"annotations": dict(annotations)}},
                namespace=namespace,
                patch_type=PatchType.MERGE,
            )

    # --- events --------------------------------------------------------------------------

    def record_event(self, *, pod: PodRef | None, reason: str, message: str, warning: bool) -> None:
        if pod is not None:
            about = ObjectRef.pod(namespace=pod.namespace, name=pod.name, uid=pod.uid)
        else:
            about = ObjectRef.node(name=self.node_name, uid=self._dra.node_uid() or "")
        reporter = Reporter(
            COMPONENT, COMPONENT, instance=f"{COMPONENT}-{self.node_name}", host=self.node_name
        )
        body = reporter.event(about, reason=reason, message=message, warning=warning)
        with translated(f"record event {reason}"):
            self.client.create(body, namespace=about.namespace or "default")

    # --- node ----------------------------------------------------------------------------

    def node_labels(self) -> dict[str, str]:
        with translated(f"get node {self.node_name}"):
            node = self.client.get(Node, self.node_name)
        return dict((node.metadata.labels if node.metadata else None) or {})

    def node_annotations(self) -> dict[str, str]:
        with translated(f"get node {self.node_name}"):
            node = self.client.get(Node, self.node_name)
        return dict((node.metadata.annotations if node.metadata else None) or {})

    def publish_node(
        self, *, annotations: Mapping[str, str], labels: Mapping[str, str | None]
    ) -> None:
        """Merge-patch the node's annotations and labels (a None label value removes it)."""
        with translated(f"publish node {self.node_name}"):
            self.client.patch(
                Node,
                self.node_name,
                {"metadata": {"annotations": dict(annotations), "labels": dict(labels)}},
                patch_type=PatchType.MERGE,
            )

    def renew_agent_lease(self, *, namespace: str, name: str, duration_s: int) -> None:
        """Say this node's agent is alive for ``duration_s`` (gpushare.api.agent_lease): a
        merge-patch of the Lease's renewal, creating it the first time, owned by the Node so
        it goes when the node does."""
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        spec = {
            "holderIdentity": f"{COMPONENT}/{self.node_name}",
            "leaseDurationSeconds": duration_s,
            "renewTime": now,
        }
        what = f"renew lease {namespace}/{name}"
        try:
            with translated(what):
                self.client.patch(
                    Lease, name, {"spec": spec}, namespace=namespace, patch_type=PatchType.MERGE
                )
            return
        except NotFoundError:
            pass
        owner = [
            {"apiVersion": "v1", "kind": "Node", "name": self.node_name, "uid": uid}
            for uid in [self._dra.node_uid()]
            if uid
        ]
        body = cast(
            Lease,
            Lease.from_dict(
                {
                    "metadata": {"name": name, "namespace": namespace, "ownerReferences": owner},
                    "spec": {**spec, "acquireTime": now},
                }
            ),
        )
        with translated(f"create lease {namespace}/{name}"):
            self.client.create(body, namespace=namespace)

    def access_reviewer(self) -> AccessReviewer:
        """Checks the bearer tokens of callers of /metrics and /profile (gpushare.kube.access):
        /profile only with a token bound to PROFILE_AUDIENCE (the operator's)."""
        return AccessReviewer(self.client, audiences={"/profile": [PROFILE_AUDIENCE]})

    def dra(self) -> DraKube:
        """The DRA plugin's calls (ResourceClaims, this node's ResourceSlices), on this client."""
        return self._dra

    def close(self) -> None:
        self.client.close()
