"""Nodes and their GPUs, as their node agents publish them (node annotation ``gpushare.io/gpus``).

:class:`NodeInventory` keeps each node's :class:`NodeState` (the view fills in each GPU's tenants
and the node's free host resources), the same GPUs with no tenants, why a node's inventory could
not be read, and each node's *version*: a counter that every change of the node's GPUs, of their
tenants or of its free CPU and memory moves, which the extender keys its cached answers by.
:class:`NodeInfo` is what the operator reads of every node, GPUs usable or not: where its agent
listens and which GPU models it has.
"""

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpushare.api.errors import InvalidInputError
from gpushare.api.inventory import GpuInfo, load_inventory
from gpushare.api.names import (
    AGENT_MODE_DRA,
    ANN_AGENT_MODE,
    ANN_AGENT_READY,
    ANN_NODE_GPUS,
    RESOURCE_GPU_PERCENT,
)
from gpushare.packing.model import GpuState, NodeState, Tenant

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeInfo:
    """What the operator reads of any node: where its agent listens, which GPU models it has."""

    name: str
    address: str | None
    """InternalIP (else the first address): where the node agent's metrics server listens."""
    gpu_models: Mapping[str, str] = field(default_factory=dict)
    """GPU UUID -> model, from the node agent's inventory annotation (every GPU listed)."""


def parse_inventory(
    name: str, annotations: Mapping[str, Any]
) -> tuple[list[GpuInfo] | None, str | None]:
    """(the GPUs the node agent published, None); (None, why) when its annotation cannot be
    read; (None, None) when there is none."""
    text = annotations.get(ANN_NODE_GPUS)
    if not isinstance(text, str):
        return None, None
    try:
        return load_inventory(text), None
    except InvalidInputError as exc:
        log.warning("node inventory unreadable", extra={"node": name, "error": str(exc)})
        return None, str(exc)


def read_gpus(
    node: Mapping[str, Any], inventory: list[GpuInfo] | None
) -> tuple[list[GpuInfo] | None, str | None]:
    """(its GPUs, None) for a node gpushare may place pods on; else (None, why not), the reason
    None when the node simply has no gpushare GPUs (``inventory``: from ``parse_inventory``)."""
    if inventory is None:
        return None, None
    status = node.get("status") if isinstance(node.get("status"), Mapping) else {}
    assert isinstance(status, Mapping)
    allocatable = status.get("allocatable")
    if isinstance(allocatable, Mapping) and str(allocatable.get(RESOURCE_GPU_PERCENT)) == "0":
        # The kubelet lost the device plugin (node agent down or restarting): a pod bound now
        # would fail admission ("no healthy devices") and a bare pod would be lost.
        return None, (
            f"the node's kubelet has no allocatable {RESOURCE_GPU_PERCENT}: the gpushare node "
            "agent (device plugin) is not registered; waiting for it"
        )
    meta = node.get("metadata") if isinstance(node.get("metadata"), Mapping) else {}
    assert isinstance(meta, Mapping)
    annotations = meta.get("annotations") if isinstance(meta.get("annotations"), Mapping) else {}
    assert isinstance(annotations, Mapping)
    if annotations.get(ANN_AGENT_MODE) == AGENT_MODE_DRA:
        # Its GPUs are DRA devices: claims are placed there, by the claim allocator or
        # kube-scheduler; the node keeps its GPU models and address for the operator.
        return None, (
            "the node's gpushare agent serves DRA claims (agent mode dra): pods asking "
            f"{RESOURCE_GPU_PERCENT} are placed on device-plugin nodes only"
        )
    ready = annotations.get(ANN_AGENT_READY)
    if ready == "false":
        # The agent says the kubelet does not have its healthy devices yet (it is registering
        # after its own or the kubelet's restart): the kubelet would refuse the pod now.
        return None, (
            "the gpushare node agent is not ready (registering its devices with the kubelet); "
            "waiting for it"
        )
    if ready is not None and ready != "true":
        log.warning(
            "node agent readiness unreadable",
            extra={"node": str(meta.get("name")), "value": str(ready)[:64]},
        )
        shown = str(ready)[:64]
        return None, f"annotation {ANN_AGENT_READY} must be 'true' or 'false', got {shown!r}"
    return inventory, None


def node_info(node: Mapping[str, Any], name: str, inventory: list[GpuInfo] | None) -> NodeInfo:
    status = node.get("status")
    raw = status.get("addresses") if isinstance(status, Mapping) else None
    addresses = [a for a in raw if isinstance(a, Mapping)] if isinstance(raw, list) else []
    internal = next((a.get("address") for a in addresses if a.get("type") == "InternalIP"), None)
    address = internal or (addresses[0].get("address") if addresses else None)
    models = {g.uuid: g.model for g in inventory or ()}
    return NodeInfo(name=name, address=str(address) if address else None, gpu_models=models)


CHANGE_LOG_LIMIT = 200_000
"""Node changes remembered (:meth:`NodeInventory.changed_since`); the older half is dropped
beyond it."""


class NodeInventory:
    """GPUs by node and by UUID, with each node's version and the cluster-wide maxima."""

    def __init__(self) -> None:
        self.nodes: dict[str, NodeState] = {}
        self.empty: dict[str, NodeState] = {}
        """Each node's GPUs with no tenants: what fits after preempting everyone."""
        self.problems: dict[str, str] = {}
        """Node -> why its GPUs cannot be used (inventory unreadable, device plugin missing)."""
        self.gpus: dict[str, GpuState] = {}
        self.gpu_node: dict[str, str] = {}
        """GPU UUID -> the node it is on."""
        self.versions: dict[str, int] = {}
        self.about: dict[str, NodeInfo] = {}
        """Every node watched (GPUs usable or not), by name: what the operator reads."""
        self._changes: list[str] = []
        """Node names in the order they changed (:meth:`bump`), the oldest dropped past
        :data:`CHANGE_LOG_LIMIT`: what a cache kept per node since some point must forget."""
        self._changes_base = 0
        """Sequence number of ``_changes[0]``."""
        self._maxima: tuple[int, int] | None = (0, 0)
        """(largest healthy GPU memory, most healthy GPUs on one node); None until read again
        after an inventory changed (worked out on read: at 5,000 nodes, working it out at
        every node's arrival made the first list quadratic)."""

    def bump(self, name: str) -> None:
        """The node (its GPUs, their tenants or its free host resources) changed."""
        self.versions[name] = self.versions.get(name, 0) + 1
        self._changes.append(name)
        if len(self._changes) > CHANGE_LOG_LIMIT:
            drop = len(self._changes) // 2
            del self._changes[:drop]
            self._changes_base += drop

    @property
    def change_seq(self) -> int:
        """How many node changes there were: :meth:`changed_since` takes it back."""
        return self._changes_base + len(self._changes)

    def changed_since(self, seq: int) -> list[str] | None:
        """Nodes that changed since :attr:`change_seq` read ``seq`` (repeats kept), or None
        when the log no longer reaches that far back (treat every node as changed)."""
        if seq < self._changes_base:
            return None
        return self._changes[seq - self._changes_base :]

    def set_gpus(
        self,
        name: str,
        inventory: list[GpuInfo],
        tenants_by_gpu: Mapping[str, Mapping[str, Tenant]],
    ) -> bool:
        """Take the node's inventory in, each GPU carrying the tenants already placed on it;
        False when it is the inventory already kept."""
        old = self.nodes.get(name)
        if old is not None and [_signature(g) for g in old.gpus] == [
            (g.uuid, g.index, g.model, g.memory_bytes, g.healthy) for g in inventory
        ]:
            return False
        self._drop_gpus(name)
        gpus: list[GpuState] = []
        empties: list[GpuState] = []
        for info in sorted(inventory, key=lambda g: g.index):
            state = GpuState(
                uuid=info.uuid,
                memory_bytes=info.memory_bytes,
                model=info.model,
                index=info.index,
                healthy=info.healthy,
                tenants=list(tenants_by_gpu.get(info.uuid, {}).values()),
            )
            gpus.append(state)
            empties.append(replace(state, tenants=[]))
            self.gpus[info.uuid] = state
            self.gpu_node[info.uuid] = name
        self.nodes[name] = NodeState(name=name, gpus=gpus)
        self.bump(name)
        self.empty[name] = NodeState(name=name, gpus=empties)
        self._refresh_maxima()
        return True

    def drop(self, name: str) -> bool:
        """Forget the node's GPUs and its problem; True when it had GPUs."""
        self.problems.pop(name, None)
        if name not in self.nodes:
            return False
        self._drop_gpus(name)
        self.bump(name)
        self._refresh_maxima()
        return True

    def _drop_gpus(self, name: str) -> None:
        old = self.nodes.pop(name, None)
        self.empty.pop(name, None)
        if old is None:
            return
        for g in old.gpus:
            if self.gpu_node.get(g.uuid) == name:
                self.gpus.pop(g.uuid, None)
                self.gpu_node.pop(g.uuid, None)

    def _refresh_maxima(self) -> None:
        self._maxima = None

    def _read_maxima(self) -> tuple[int, int]:
        if self._maxima is None:
            self._maxima = (
                max((g.memory_bytes for g in self.gpus.values() if g.healthy), default=0),
                max((sum(1 for g in n.gpus if g.healthy) for n in self.nodes.values()), default=0),
            )
        return self._maxima

    @property
    def max_gpu_memory(self) -> int:
        """The largest healthy GPU's memory (0: no GPU)."""
        return self._read_maxima()[0]

    @property
    def max_gpus_per_node(self) -> int:
        """The most healthy GPUs one node has (0: no GPU)."""
        return self._read_maxima()[1]


def _signature(g: GpuState) -> tuple[str, int, str, int, bool]:
    return (g.uuid, g.index, g.model, g.memory_bytes, g.healthy)
