"""This node's ResourceSlice of driver ``gpu.gpushare.io``: one device per healthy GPU.

Each device ``gpu-<index>`` carries its attributes (``uuid``, ``model``, ``index``,
``computeCapability``, ``mpsCapable``, and ``simulated`` on simulated GPUs) and two consumable
capacities (KEP-5075, alpha behind the DRAConsumableCapacity feature gate in Kubernetes 1.34):
``gpuPercent`` = 100, where a request that names none consumes the whole GPU (default 100,
whole percents 1..100), and ``memory`` = the GPU's bytes, where a request that names none
consumes 0 and gets memory in proportion to its ``gpuPercent``. ``allowMultipleAllocations``
lets several claims share a device. Where the feature gate is off the API server drops these
fields; the publisher notices in what it reads back and logs one warning: every GPU is then
allocated whole to one claim.

Publishing is idempotent: a content hash in an annotation says whether the stored slice is
current; a change is written with the pool's generation raised, and any other slice of this
node and driver is deleted.
"""

import hashlib
import json
import logging
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from gpushare.api.dra import (
    ATTR_COMPUTE_CAPABILITY,
    ATTR_INDEX,
    ATTR_MODEL,
    ATTR_MPS_CAPABLE,
    ATTR_SIMULATED,
    ATTR_UUID,
    CAPACITY_GPU_PERCENT,
    CAPACITY_MEMORY,
    DRIVER,
    device_name,
)
from gpushare.api.inventory import GpuInfo
from gpushare.api.names import GROUP, SLICES_PER_GPU

log = logging.getLogger(__name__)

ANN_CONTENT_HASH = f"{GROUP}/slice-content"
"""Hash of the devices the agent last wrote: equal means nothing to write."""
MPS_MIN_CAPABILITY = (7, 0)
"""Volta and newer run MPS with execution-resource provisioning (active-thread %)."""
MAX_ATTRIBUTE_CHARS = 64
_VERSION = re.compile(r"^(\d{1,3})\.(\d{1,3})$")


class SliceStore(Protocol):
    """This node's slices of our driver (implemented by gpushare.kube.dra.DraKube)."""

    def list_slices(self) -> list[dict[str, Any]]: ...

    def create_slice(self, body: Mapping[str, Any]) -> dict[str, Any]: ...

    def replace_slice(self, body: Mapping[str, Any]) -> dict[str, Any]: ...

    def delete_slice(self, name: str) -> None: ...


def _capability(text: str) -> tuple[int, int] | None:
    match = _VERSION.match(text.strip())
    return (int(match.group(1)), int(match.group(2))) if match else None


def slice_device(gpu: GpuInfo) -> dict[str, Any]:
    """One GPU as a ResourceSlice device (resource.k8s.io/v1)."""
    capability = _capability(gpu.compute_capability)
    attributes: dict[str, Any] = {
        ATTR_UUID: {"string": gpu.uuid[:MAX_ATTRIBUTE_CHARS]},
        ATTR_MODEL: {"string": gpu.model[:MAX_ATTRIBUTE_CHARS]},
        ATTR_INDEX: {"int": gpu.index},
        ATTR_COMPUTE_CAPABILITY: (
            {"version": f"{capability[0]}.{capability[1]}.0"}
            if capability
            else {"string": gpu.compute_capability[:MAX_ATTRIBUTE_CHARS]}
        ),
        ATTR_MPS_CAPABLE: {"bool": capability is not None and capability >= MPS_MIN_CAPABILITY},
    }
    if gpu.simulated:
        attributes[ATTR_SIMULATED] = {"bool": True}
    return {
        "name": device_name(gpu.index),
        "attributes": attributes,
        "capacity": {
            CAPACITY_GPU_PERCENT: {
                "value": str(SLICES_PER_GPU),
                "requestPolicy": {
                    "default": str(SLICES_PER_GPU),
                    "validRange": {"min": "1", "max": str(SLICES_PER_GPU), "step": "1"},
                },
            },
            CAPACITY_MEMORY: {
                "value": str(gpu.memory_bytes),
                "requestPolicy": {
                    "default": "0",
                    "validRange": {"min": "0", "max": str(gpu.memory_bytes)},
                },
            },
        },
        "allowMultipleAllocations": True,
    }


def slice_name(node_name: str) -> str:
    """``<node>-gpu.gpushare.io``, shortened with a hash where a long node name needs it."""
    name = f"{node_name}-{DRIVER}"
    if len(name) <= 253:
        return name
    digest = hashlib.sha256(node_name.encode()).hexdigest()[:10]
    return f"{node_name[:200]}-{digest}-{DRIVER}"


def content_hash(devices: Sequence[Mapping[str, Any]]) -> str:
    text = json.dumps(list(devices), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def build_slice(
    *, node_name: str, gpus: Sequence[GpuInfo], generation: int, node_uid: str | None = None
) -> dict[str, Any]:
    """The node's ResourceSlice: its healthy GPUs, pool = the node name."""
    devices = [slice_device(g) for g in sorted(gpus, key=lambda g: g.index) if g.healthy]
    metadata: dict[str, Any] = {
        "name": slice_name(node_name),
        "annotations": {ANN_CONTENT_HASH: content_hash(devices)},
    }
    if node_uid:
        metadata["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid}
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": metadata,
        "spec": {
            "driver": DRIVER,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def consumable_capacity_dropped(stored: Mapping[str, Any]) -> bool:
    """Whether the API server dropped the consumable-capacity fields of a slice we wrote
    (feature gate DRAConsumableCapacity off): devices without ``allowMultipleAllocations`` or
    capacities without ``requestPolicy``."""
    for device in (stored.get("spec") or {}).get("devices") or []:
        if not device.get("allowMultipleAllocations"):
            return True
        capacity = (device.get("capacity") or {}).get(CAPACITY_GPU_PERCENT) or {}
        if "requestPolicy" not in capacity:
            return True
    return False


class SlicePublisher:
    """Keeps this node's slice equal to its GPUs. Thread-safe (one publish at a time)."""

    def __init__(
        self,
        *,
        node_name: str,
        store: SliceStore,
        node_uid: Callable[[], str | None] | None = None,
    ) -> None:
        self.node_name = node_name
        self.store = store
        self.node_uid = node_uid
        self.writes = 0
        self.gate_warned = False
        self._lock = threading.Lock()

    def _owner(self) -> str | None:
        if self.node_uid is None:
            return None
        try:
            return self.node_uid()
        except Exception as exc:
            log.warning("cannot read this node's UID for the ResourceSlice owner: %s", exc)
            return None

    def publish(self, gpus: Sequence[GpuInfo]) -> dict[str, Any]:
        """Create or update the slice, delete stale ones; returns the slice as stored."""
        with self._lock:
            return self._publish(gpus)

    def _publish(self, gpus: Sequence[GpuInfo]) -> dict[str, Any]:
        name = slice_name(self.node_name)
        existing = {str((s.get("metadata") or {}).get("name")): s for s in self.store.list_slices()}
        generations = [
            int(((s.get("spec") or {}).get("pool") or {}).get("generation") or 0)
            for s in existing.values()
        ]
        current = existing.get(name)
        wanted = build_slice(
            node_name=self.node_name,
            gpus=gpus,
            generation=max(generations, default=0) + 1,
            node_uid=self._owner(),
        )
        digest = wanted["metadata"]["annotations"][ANN_CONTENT_HASH]
        if current is not None and (
            ((current.get("metadata") or {}).get("annotations") or {}).get(ANN_CONTENT_HASH)
            == digest
        ):
            stored = current
        else:
            if current is None:
                stored = self.store.create_slice(wanted)
            else:
                wanted["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                stored = self.store.replace_slice(wanted)
            self.writes += 1
            log.info(
                "published ResourceSlice %s: %d device(s), pool generation %d",
                name,
                len(wanted["spec"]["devices"]),
                wanted["spec"]["pool"]["generation"],
            )
        for other in existing:
            if other != name:
                self.store.delete_slice(other)
                log.info("deleted stale ResourceSlice %s", other)
        if consumable_capacity_dropped(stored) and not self.gate_warned:
            self.gate_warned = True
            log.warning(
                "the API server dropped the consumable-capacity fields of ResourceSlice %s "
                "(allowMultipleAllocations, requestPolicy): the DRAConsumableCapacity feature "
                "gate is off. Every GPU is allocated whole to one claim until it is enabled on "
                "kube-apiserver, kube-scheduler and kubelet",
                name,
            )
        return stored
