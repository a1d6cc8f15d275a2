"""The operator's watch-fed picture of pods, GpuShares and nodes (pure data, no I/O).

Kopf event handlers feed raw objects in; the reconcilers and the protection loop read typed
summaries out. Nothing here is state of record: a restart rebuilds it from the initial listing.
"""

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gpushare.api.errors import InvalidInputError
from gpushare.api.gpushare_crd import GpuShareSpec, governing_share, parse_spec
from gpushare.api.inventory import load_inventory
from gpushare.api.names import (
    ANN_CLASS,
    ANN_CONTAINER,
    ANN_NODE_GPUS,
    ANN_SHARE,
    CLASS_BATCH,
    RESOURCE_GPU_PERCENT,
    SCHEDULER_NAME,
)
from gpushare.api.placement import Placement, parse_placement
from gpushare.api.request import parse_class

log = logging.getLogger(__name__)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_TERMINAL = ("Succeeded", "Failed")


def _time(text: object) -> datetime:
    if not isinstance(text, str) or not text:
        return _EPOCH
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return _EPOCH
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _str_map(raw: object) -> dict[str, str]:
    if not isinstance(raw, Mapping):
        return {}
    return {str(k): str(v) for k, v in raw.items()}


@dataclass(frozen=True)
class PodSummary:
    """What the operator needs of a pod."""

    namespace: str
    name: str
    uid: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    node_name: str | None
    phase: str
    created: datetime
    deleting: bool
    gpu_pod: bool
    """Asks for gpushare GPU slices (resource limit), uses gpushare-scheduler, or links a
    GpuShare by annotation. Only these pods are governed: a selector alone never turns a
    pod the webhook did not see into a GPU pod."""
    image: str
    command: tuple[str, ...]
    """The GPU container's command followed by its args."""
    gpu_class: str = CLASS_BATCH
    placement: Placement | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def active(self) -> bool:
        """Holds (or will hold) its GPU share: neither finished nor being deleted."""
        return not self.deleting and self.phase not in _TERMINAL

    @property
    def gpu_uuid(self) -> str | None:
        if self.placement is None or len(self.placement.gpu_uuids) != 1:
            return None
        return self.placement.gpu_uuids[0]


def pod_summary(body: Mapping[str, Any]) -> PodSummary:
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    annotations = _str_map(meta.get("annotations"))
    containers = [c for c in spec.get("containers") or [] if isinstance(c, Mapping)]
    wanted = annotations.get(ANN_CONTAINER)
    gpu_container = next((c for c in containers if c.get("name") == wanted), None) or (
        containers[0] if containers else {}
    )
    limits_have_gpu = any(
        RESOURCE_GPU_PERCENT in ((c.get("resources") or {}).get("limits") or {}) for c in containers
    )
    command = [str(x) for x in gpu_container.get("command") or []] + [
        str(x) for x in gpu_container.get("args") or []
    ]
    try:
        placement = parse_placement(annotations)
    except InvalidInputError as exc:
        log.warning("pod %s/%s: %s", meta.get("namespace"), meta.get("name"), exc)
        placement = None
    try:
        gpu_class = parse_class(annotations.get(ANN_CLASS))
    except InvalidInputError:
        gpu_class = CLASS_BATCH
    return PodSummary(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        labels=_str_map(meta.get("labels")),
        annotations=annotations,
        node_name=spec.get("nodeName") or None,
        phase=str((body.get("status") or {}).get("phase", "Pending")),
        created=_time(meta.get("creationTimestamp")),
        deleting=meta.get("deletionTimestamp") is not None,
        gpu_pod=limits_have_gpu
        or spec.get("schedulerName") == SCHEDULER_NAME
        or bool(annotations.get(ANN_SHARE)),
        image=str(gpu_container.get("image", "")),
        command=tuple(command),
        gpu_class=gpu_class,
        placement=placement,
    )


@dataclass(frozen=True)
class ShareSummary:
    namespace: str
    name: str
    uid: str
    body: Mapping[str, Any]
    """The latest raw object (spec, status, metadata) as watched."""
    spec: GpuShareSpec | None
    spec_error: str | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def status(self) -> Mapping[str, Any]:
        status = self.body.get("status")
        return status if isinstance(status, Mapping) else {}


def share_summary(body: Mapping[str, Any]) -> ShareSummary:
    meta = body.get("metadata") or {}
    spec: GpuShareSpec | None = None
    error: str | None = None
    try:
        spec = parse_spec(body.get("spec") or {})
    except InvalidInputError as exc:
        error = str(exc)
    return ShareSummary(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        body=body,
        spec=spec,
        spec_error=error,
    )


@dataclass(frozen=True)
class NodeSummary:
    name: str
    address: str | None
    """InternalIP (else the first address): where the node agent's metrics server listens."""
    gpu_models: Mapping[str, str] = field(default_factory=dict)
    """GPU UUID -> model, from the node agent's inventory annotation."""


def node_summary(body: Mapping[str, Any]) -> NodeSummary:
    meta = body.get("metadata") or {}
    addresses = [
        a for a in (body.get("status") or {}).get("addresses") or [] if isinstance(a, Mapping)
    ]
    internal = next((a.get("address") for a in addresses if a.get("type") == "InternalIP"), None)
    address = internal or (addresses[0].get("address") if addresses else None)
    models: dict[str, str] = {}
    inventory = _str_map(meta.get("annotations")).get(ANN_NODE_GPUS)
    if inventory:
        try:
            models = {g.uuid: g.model for g in load_inventory(inventory)}
        except InvalidInputError as exc:
            log.warning("node %s: %s", meta.get("name"), exc)
    return NodeSummary(name=str(meta.get("name", "")), address=address, gpu_models=models)


@dataclass
class ClusterView:
    """Pods, GpuShares and nodes keyed by namespace/name (nodes by name)."""

    pods: dict[str, PodSummary] = field(default_factory=dict)
    shares: dict[str, ShareSummary] = field(default_factory=dict)
    nodes: dict[str, NodeSummary] = field(default_factory=dict)

    def put_pod(self, body: Mapping[str, Any], *, deleted: bool = False) -> PodSummary:
        pod = pod_summary(body)
        if deleted:
            self.pods.pop(pod.key, None)
        else:
            self.pods[pod.key] = pod
        return pod

    def put_share(self, body: Mapping[str, Any], *, deleted: bool = False) -> ShareSummary:
        share = share_summary(body)
        if deleted:
            self.shares.pop(share.key, None)
        else:
            self.shares[share.key] = share
        return share

    def put_node(self, body: Mapping[str, Any], *, deleted: bool = False) -> NodeSummary:
        node = node_summary(body)
        if deleted:
            self.nodes.pop(node.name, None)
        else:
            self.nodes[node.name] = node
        return node

    def shares_in(self, namespace: str) -> Iterator[ShareSummary]:
        return (s for s in self.shares.values() if s.namespace == namespace)

    def share_of(self, pod: PodSummary) -> ShareSummary | None:
        """The GpuShare governing a pod, if it exists in the view."""
        name = governing_share(
            ((s.name, s.spec) for s in self.shares_in(pod.namespace)),
            labels=pod.labels,
            annotations=pod.annotations,
        )
        return self.shares.get(f"{pod.namespace}/{name}") if name else None

    def governed_pods(self, share: ShareSummary) -> list[PodSummary]:
        """GPU pods of the share's namespace that the share governs, oldest first."""
        pods = [
            p
            for p in self.pods.values()
            if p.namespace == share.namespace and p.gpu_pod and self._governs(share, p)
        ]
        return sorted(pods, key=lambda p: (p.created, p.name))

    def _governs(self, share: ShareSummary, pod: PodSummary) -> bool:
        found = self.share_of(pod)
        return found is not None and found.name == share.name

    def gpu_model(self, node: str | None, gpu_uuid: str | None) -> str | None:
        if node is None or gpu_uuid is None or node not in self.nodes:
            return None
        return self.nodes[node].gpu_models.get(gpu_uuid)

    def gpu_models(self) -> set[str]:
        return {m for n in self.nodes.values() for m in n.gpu_models.values()}

    def tenants_by_gpu(self) -> dict[tuple[str, str], list[PodSummary]]:
        """(node, GPU UUID) -> active pods placed on that GPU."""
        out: dict[tuple[str, str], list[PodSummary]] = {}
        for pod in self.pods.values():
            uuid = pod.gpu_uuid
            if uuid is None or pod.node_name is None or not pod.active:
                continue
            out.setdefault((pod.node_name, uuid), []).append(pod)
        return out
