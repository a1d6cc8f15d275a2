"""Reading the DRA objects of gpushare's driver: the GPUs a node agent publishes in its
ResourceSlice and what an allocated ResourceClaim consumes of them. Pure parsing, shared by
the controller (gpushare.cluster.dra.devices) and ``kubectl gpushare``.

Everything read here may be hostile or half-written (a tenant writes its own claims): what
cannot be read raises :class:`~gpushare.api.errors.InvalidInputError` naming the field.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpushare.api.dra import (
    ATTR_INDEX,
    ATTR_MODEL,
    ATTR_UUID,
    CAPACITY_GPU_PERCENT,
    CAPACITY_MEMORY,
    DRIVER,
    MAX_RESULTS,
    allocation_configs,
    config_for,
)
from gpushare.api.errors import InvalidInputError
from gpushare.api.names import SLICES_PER_GPU
from gpushare.api.quantities import parse_memory

MAX_DEVICES_PER_SLICE = 128
"""Most devices of one slice read (the API allows 128)."""


@dataclass(frozen=True)
class DraGpu:
    """One GPU a node agent published: where it is in the DRA API and what placement reads."""

    node: str
    pool: str
    device: str
    uuid: str
    model: str
    index: int
    memory_bytes: int


@dataclass(frozen=True)
class ClaimShare:
    """What one allocated claim consumes of one of our GPUs."""

    claim: str
    """``namespace/name`` of the claim."""
    namespace: str
    pool: str
    device: str
    percent: int
    memory_bytes: int
    """Consumed memory; 0: in proportion to ``percent`` (the driver's rule)."""
    gpu_class: str
    limit: int | None = None
    """The MPS active-thread cap its MpsConfig sets (None: the driver's default)."""


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def claim_key(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` of an object."""
    meta = _mapping(obj.get("metadata"))
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


MAX_RESERVED = 256
"""Most ``status.reservedFor`` entries read (the API allows 256)."""


def reserved_pods(obj: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(name, uid) of each pod a claim's ``status.reservedFor`` names, in order."""
    reserved = _mapping(obj.get("status")).get("reservedFor")
    return [
        (str(r.get("name", "")), str(r.get("uid", "")))
        for r in (reserved[:MAX_RESERVED] if isinstance(reserved, list) else [])
        if isinstance(r, Mapping)
        and r.get("resource") == "pods"
        and not r.get("apiGroup")
        and r.get("name")
    ]


def read_slice(obj: Mapping[str, Any]) -> list[DraGpu] | None:
    """The GPUs of one ResourceSlice of our driver; None for another driver's slice."""
    spec = _mapping(obj.get("spec"))
    if spec.get("driver") != DRIVER:
        return None
    node = spec.get("nodeName")
    pool = _mapping(spec.get("pool")).get("name")
    if not isinstance(node, str) or not node or not isinstance(pool, str) or not pool:
        raise InvalidInputError("spec.nodeName", "a gpushare slice names no node or pool", "")
    devices = spec.get("devices")
    out: list[DraGpu] = []
    for i, device in enumerate(
        devices[:MAX_DEVICES_PER_SLICE] if isinstance(devices, list) else []
    ):
        if not isinstance(device, Mapping) or not isinstance(device.get("name"), str):
            continue
        attributes = _mapping(device.get("attributes"))
        memory = _mapping(_mapping(device.get("capacity")).get(CAPACITY_MEMORY)).get("value")
        index = _mapping(attributes.get(ATTR_INDEX)).get("int", i)
        memory_bytes = parse_memory(str(memory), field=f"spec.devices[{i}].capacity.memory")
        uuid = _mapping(attributes.get(ATTR_UUID)).get("string")
        out.append(
            DraGpu(
                node=node,
                pool=pool,
                device=device["name"],
                uuid=uuid if isinstance(uuid, str) and uuid else f"{pool}/{device['name']}",
                model=str(_mapping(attributes.get(ATTR_MODEL)).get("string", "")),
                index=index if isinstance(index, int) and not isinstance(index, bool) else i,
                memory_bytes=memory_bytes,
            )
        )
    return out


def _percent(value: Any) -> int:
    text = str(value).strip()
    if not text.isdigit() or len(text) > 4 or not 1 <= int(text) <= SLICES_PER_GPU:
        raise InvalidInputError(
            f"consumedCapacity.{CAPACITY_GPU_PERCENT}", f"{text[:20]!r} is not 1..100", ""
        )
    return int(text)


def read_allocation(obj: Mapping[str, Any]) -> list[ClaimShare]:
    """What an allocated claim consumes of our GPUs; empty when it is not allocated or uses
    another driver's devices only."""
    devices = _mapping(_mapping(_mapping(obj.get("status")).get("allocation")).get("devices"))
    results = devices.get("results")
    if not isinstance(results, list):
        return []
    namespace = str(_mapping(obj.get("metadata")).get("namespace", ""))
    configs = allocation_configs(devices, field="status.allocation.devices.config")
    out: list[ClaimShare] = []
    for result in results[:MAX_RESULTS]:
        if not isinstance(result, Mapping) or result.get("driver") != DRIVER:
            continue
        consumed = _mapping(result.get("consumedCapacity"))
        config = config_for(str(result.get("request", "")), configs)
        memory = consumed.get(CAPACITY_MEMORY, "0")
        out.append(
            ClaimShare(
                claim=claim_key(obj),
                namespace=namespace,
                pool=str(result.get("pool", "")),
                device=str(result.get("device", "")),
                percent=_percent(consumed.get(CAPACITY_GPU_PERCENT, SLICES_PER_GPU)),
                memory_bytes=0
                if str(memory).strip() == "0"
                else parse_memory(str(memory), field="consumedCapacity.memory"),
                gpu_class=config.gpu_class,
                limit=config.limit,
            )
        )
    return out


__all__ = [
    "MAX_DEVICES_PER_SLICE",
    "ClaimShare",
    "DraGpu",
    "claim_key",
    "read_allocation",
    "read_slice",
    "reserved_pods",
]
