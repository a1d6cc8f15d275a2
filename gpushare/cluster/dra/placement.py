"""What a DRA claim asks of gpushare and the allocation the controller writes for it; the
node and GPUs it gets are gpushare.cluster.dra.search's choice. Pure: no I/O.

kube-scheduler's DRA allocator takes the first device with room (docs/dra.md, "Known limits").
For a pod carrying the ``gpushare.io/placement`` scheduling gate, the controller instead asks
the same :class:`~gpushare.packing.placer.Placer` the extender asks in device-plugin mode (cost
per node, ties by name, then the GPU on that node), writes the claim's ``status.allocation`` as
kube-scheduler would (results with a ``shareID`` and ``consumedCapacity``, the configs, a node
selector) and removes the gate. kube-scheduler then only binds the pod to that node; its
allocator counts the allocation like its own.

gpushare places the claims it can read completely: one request of the DeviceClass it serves,
asking ``count`` devices and ``gpuPercent``/``memory`` capacity. A claim with CEL selectors,
``firstAvailable``, admin access or another allocation mode is left to kube-scheduler
(:func:`read_ask` says why), since its allocator evaluates what the controller cannot.
"""

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpushare.api.dra import (
    CAPACITY_GPU_PERCENT,
    CAPACITY_MEMORY,
    DRIVER,
    MpsConfig,
    allocation_configs,
    config_for,
)
from gpushare.api.errors import InvalidInputError
from gpushare.api.names import SLICES_PER_GPU
from gpushare.api.quantities import parse_memory
from gpushare.cluster.dra.search import Choice
from gpushare.packing.model import Demand

MAX_COUNT = 32
"""Most devices one request may ask gpushare to place (the API allows 32 per claim)."""
FINALIZER = "resource.kubernetes.io/delete-protection"
"""What kube-scheduler puts on a claim it allocates: kube-controller-manager removes it (and
the allocation) once no pod uses the claim, so a deleted claim stays until it is unprepared."""


@dataclass(frozen=True)
class ClaimAsk:
    """What a claim asks of gpushare's DeviceClass, read completely."""

    request: str
    count: int
    percent: int
    memory: str | None
    """The ``memory`` capacity request as the API server stored it; None: not asked."""
    memory_bytes: int | None
    config: MpsConfig


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def read_ask(
    claim: Mapping[str, Any],
    *,
    device_class: str,
    class_configs: Sequence[Mapping[str, Any]] = (),
) -> ClaimAsk | str:
    """The claim's ask, or why kube-scheduler places it instead (a sentence). Its MPS config
    is the DeviceClass's ``class_configs`` overridden by the claim's own, as the driver reads
    the allocation."""
    devices = _mapping(_mapping(claim.get("spec")).get("devices"))
    requests = devices.get("requests")
    if not isinstance(requests, list) or len(requests) != 1:
        return "it has more than one request"
    request = _mapping(requests[0])
    exactly = _mapping(request.get("exactly"))
    if not exactly:
        return "its request is not 'exactly' (firstAvailable)"
    if exactly.get("deviceClassName") != device_class:
        return f"its request is not of DeviceClass {device_class}"
    if exactly.get("selectors"):
        return "its request has CEL selectors"
    if exactly.get("adminAccess"):
        return "its request asks for admin access"
    if exactly.get("allocationMode", "ExactCount") != "ExactCount":
        return "its request's allocationMode is not ExactCount"
    if devices.get("constraints"):
        return "it has constraints"
    count = exactly.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_COUNT:
        return "its count is not 1..32"
    capacity = _mapping(_mapping(exactly.get("capacity")).get("requests"))
    text = str(capacity.get(CAPACITY_GPU_PERCENT, SLICES_PER_GPU)).strip()
    if not text.isdigit() or len(text) > 4 or not 1 <= int(text) <= SLICES_PER_GPU:
        return f"its {CAPACITY_GPU_PERCENT} is not a whole 1..100"
    percent = int(text)
    if count > 1 and percent < SLICES_PER_GPU:
        return "it asks for a share of several devices"
    memory = capacity.get(CAPACITY_MEMORY)
    try:
        memory_bytes = (
            None if memory is None else parse_memory(str(memory), field="capacity.memory")
        )
        configs = allocation_configs(
            {"config": [dict(c) for c in class_configs]}, field="DeviceClass spec.config"
        ) + allocation_configs(devices, field="spec.devices.config")
        config = config_for(str(request.get("name", "")), configs)
    except InvalidInputError as exc:
        return f"it cannot be read: {exc}"
    if config.limit is not None and config.limit < percent:
        return "its MpsConfig limit is below its gpuPercent (the driver refuses it)"
    return ClaimAsk(
        request=str(request.get("name", "")),
        count=count,
        percent=percent,
        memory=None if memory is None else str(memory),
        memory_bytes=memory_bytes,
        config=config,
    )


def demand(ask: ClaimAsk, *, cpu_milli: int, memory_bytes: int, tenancy: str | None) -> Demand:
    """The placer's demand for ``ask`` from a pod requesting ``cpu_milli``/``memory_bytes`` of
    its host, in ``tenancy`` (a whole GPU per device when ``count`` > 1)."""
    return Demand(
        percent=SLICES_PER_GPU if ask.count > 1 else ask.percent,
        limit_percent=ask.config.limit,
        memory_bytes=ask.memory_bytes if ask.count == 1 else None,
        gpu_class=ask.config.gpu_class,
        gpus=ask.count,
        cpu_milli=cpu_milli,
        host_memory_bytes=memory_bytes,
        tenancy=tenancy,
    )


def allocation(
    claim: Mapping[str, Any],
    ask: ClaimAsk,
    choice: Choice,
    *,
    class_configs: Sequence[Mapping[str, Any]] = (),
    share_id: Callable[[], str] = lambda: str(uuid.uuid4()),
) -> dict[str, Any]:
    """``status.allocation`` for ``claim``, as kube-scheduler writes one: a result per device
    (a fresh ``shareID``, the consumed capacity), the DeviceClass's configs then the claim's,
    and a node selector naming the chosen node."""
    consumed = {
        CAPACITY_GPU_PERCENT: str(ask.percent),
        CAPACITY_MEMORY: ask.memory if ask.memory is not None and ask.count == 1 else "0",
    }
    results = [
        {
            "request": ask.request,
            "driver": DRIVER,
            "pool": g.pool,
            "device": g.device,
            "shareID": share_id(),
            "consumedCapacity": dict(consumed),
        }
        for g in choice.gpus
    ]
    configs = [
        {"source": "FromClass", "requests": [ask.request], **_config_body(c)} for c in class_configs
    ]
    spec_configs = _mapping(_mapping(claim.get("spec")).get("devices")).get("config")
    for c in spec_configs if isinstance(spec_configs, list) else ():
        entry = _mapping(c)
        configs.append({"source": "FromClaim", **_config_body(entry), **_requests(entry)})
    out: dict[str, Any] = {
        "devices": {"results": results},
        "nodeSelector": {
            "nodeSelectorTerms": [
                {
                    "matchFields": [
                        {
                            "key": "metadata.name",
                            "operator": "In",
                            "values": [choice.assignment.node],
                        }
                    ]
                }
            ]
        },
    }
    if configs:
        out["devices"]["config"] = configs
    return out


def _config_body(entry: Mapping[str, Any]) -> dict[str, Any]:
    return {"opaque": dict(_mapping(entry.get("opaque")))}


def _requests(entry: Mapping[str, Any]) -> dict[str, Any]:
    requests = entry.get("requests")
    return {"requests": list(requests)} if isinstance(requests, list) and requests else {}


def pod_claim_names(pod: Mapping[str, Any]) -> Iterable[tuple[str, str | None]]:
    """(pod claim name, ResourceClaim name) of each of the pod's claims; the name is None for a
    claim from a template that kube-controller-manager has not made yet."""
    spec, status = _mapping(pod.get("spec")), _mapping(pod.get("status"))
    made = {
        str(_mapping(s).get("name")): _mapping(s).get("resourceClaimName")
        for s in status.get("resourceClaimStatuses") or []
        if isinstance(s, Mapping)
    }
    for raw in spec.get("resourceClaims") or []:
        entry = _mapping(raw)
        name = str(entry.get("name", ""))
        direct = entry.get("resourceClaimName")
        if isinstance(direct, str) and direct:
            yield name, direct
        else:
            made_name = made.get(name)
            yield name, made_name if isinstance(made_name, str) and made_name else None


__all__ = ["FINALIZER", "ClaimAsk", "allocation", "demand", "pod_claim_names", "read_ask"]
