"""What one allocated ResourceClaim gives its pod on this node, read from the claim's status.

The scheduler wrote the allocation (``status.allocation.devices``): which of our devices, how
much of their consumable capacity (``consumedCapacity``), and any opaque configuration for our
driver (``config``). Everything here is input a tenant or a stale cache could make hostile, so
every refusal is an :class:`InvalidInputError` naming the claim field and the fix; the kubelet
shows it on the pod and retries.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpushare.api.bounds import MAX_INT_DIGITS
from gpushare.api.dra import (
    CAPACITY_GPU_PERCENT,
    CAPACITY_MEMORY,
    DRIVER,
    MAX_RESULTS,
    MpsConfig,
    allocation_configs,
    config_for,
)
from gpushare.api.errors import InvalidInputError
from gpushare.api.inventory import GpuInfo
from gpushare.api.names import SLICES_PER_GPU
from gpushare.api.quantities import parse_memory

_RESULTS = "status.allocation.devices.results"
_CONFIG = "status.allocation.devices.config"


class ClaimSource(Protocol):
    """Reads a ResourceClaim (implemented by gpushare.kube.dra.DraKube)."""

    def get_claim(self, *, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The claim's manifest, None when it does not exist."""


@dataclass(frozen=True)
class ClaimRef:
    """A claim as the kubelet names it in NodePrepareResources / NodeUnprepareResources."""

    namespace: str
    uid: str
    name: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class AllocatedGpu:
    """One of our devices allocated to the claim, with what the claim consumes of it."""

    request: str
    pool: str
    device: str
    gpu: GpuInfo
    percent: int
    """Consumed ``gpuPercent`` (100 when the API server recorded no consumed capacity)."""
    memory_bytes: int
    """Consumed ``memory``; 0: the share of the GPU's memory in proportion to ``percent``."""
    config: MpsConfig = field(default_factory=MpsConfig)

    @property
    def memory_limit_bytes(self) -> int:
        """The pinned memory cap the MPS server enforces for this claim's clients."""
        return self.memory_bytes or self.gpu.memory_bytes * self.percent // SLICES_PER_GPU


@dataclass(frozen=True)
class ClaimPlan:
    """An allocated claim read and checked: its pod and our devices."""

    ref: ClaimRef
    pod: str
    """``namespace/name`` of the pod the claim is reserved for."""
    pod_uid: str
    gpus: tuple[AllocatedGpu, ...]


def _fix_allocation() -> str:
    return "delete the pod so the scheduler allocates the claim again"


def _consumed_percent(value: Any, *, where: str) -> int:
    fix = f"ask for a whole {CAPACITY_GPU_PERCENT} from 1 to {SLICES_PER_GPU}"
    text = str(value).strip() if isinstance(value, (str, int)) else ""
    if isinstance(value, bool) or not text.isdigit() or len(text) > MAX_INT_DIGITS:
        raise InvalidInputError(where, f"{str(value)[:40]!r} is not a whole number", fix)
    percent = int(text)
    if not 1 <= percent <= SLICES_PER_GPU:
        raise InvalidInputError(where, f"{percent} is outside 1..{SLICES_PER_GPU}", fix)
    return percent


def _consumed_memory(value: Any, *, where: str, gpu: GpuInfo) -> int:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise InvalidInputError(where, "is not a quantity", 'write a quantity like "10Gi"')
    text = str(value).strip()
    memory = 0 if text == "0" else parse_memory(text, field=where)
    if memory > gpu.memory_bytes:
        raise InvalidInputError(
            where,
            f"{memory} bytes is more than GPU {gpu.uuid} has ({gpu.memory_bytes})",
            "ask for at most the GPU's memory",
        )
    return memory


def _reserved_pod(claim: Mapping[str, Any]) -> tuple[str, str]:
    """The one pod the claim is reserved for. A claim on gpushare's GPUs is one pod's share:
    one reserved for several pods is refused (issue 67: a claim shared by 8 pods was prepared
    and accounted once; the chart's claim-sharing policy refuses the reservation itself)."""
    meta, status = claim.get("metadata"), claim.get("status")
    namespace = str(meta.get("namespace") or "") if isinstance(meta, Mapping) else ""
    reserved = status.get("reservedFor") if isinstance(status, Mapping) else None
    found = [
        (f"{namespace}/{entry.get('name', '')}", str(entry.get("uid", "")))
        for entry in (reserved if isinstance(reserved, list) else [])
        if isinstance(entry, dict) and entry.get("resource") == "pods" and not entry.get("apiGroup")
    ]
    if len(found) > 1:
        raise InvalidInputError(
            "status.reservedFor",
            f"reserves this claim on gpushare GPUs for {len(found)} pods; a claim is the share "
            "of one pod",
            "give each pod a claim of its own (a ResourceClaimTemplate)",
        )
    if found:
        return found[0]
    raise InvalidInputError(
        "status.reservedFor",
        "names no pod",
        "the kubelet prepares only claims reserved for a pod; retry once the scheduler reserved it",
    )


def parse_claim(
    claim: Mapping[str, Any], *, ref: ClaimRef, pool: str, gpus: Mapping[str, GpuInfo]
) -> ClaimPlan:
    """Read ``claim`` for this node's ``pool``, whose devices are ``gpus`` (by device name)."""
    devices, results = _allocation_results(claim, ref)
    configs = allocation_configs(devices, field=_CONFIG)
    ours: list[AllocatedGpu] = []
    for i, result in enumerate(results):
        if not isinstance(result, dict) or result.get("driver") != DRIVER:
            continue
        ours.append(_allocated_gpu(result, f"{_RESULTS}[{i}]", pool, gpus, configs))
    if not ours:
        raise InvalidInputError(
            _RESULTS, f"allocates no device of driver {DRIVER}", _fix_allocation()
        )
    if len(ours) > 1 and any(g.percent < SLICES_PER_GPU for g in ours):
        raise InvalidInputError(
            _RESULTS,
            f"allocates {len(ours)} {DRIVER} devices, some of them shared: a process can use "
            "one GPU's MPS server only",
            "ask for one device to share a GPU, or for whole GPUs (gpuPercent 100)",
        )
    pod, pod_uid = _reserved_pod(claim)
    return ClaimPlan(ref=ref, pod=pod, pod_uid=pod_uid, gpus=tuple(ours))


def _allocation_results(
    claim: Mapping[str, Any], ref: ClaimRef
) -> tuple[Mapping[str, Any], list[Any]]:
    """The claim's ``status.allocation.devices`` and its results, refused when the claim is
    not the one the kubelet asked for, not allocated, or lists too many devices."""
    meta, status = claim.get("metadata"), claim.get("status")
    uid = meta.get("uid") if isinstance(meta, Mapping) else None
    if uid != ref.uid:
        raise InvalidInputError(
            "metadata.uid",
            f"claim {ref.key} has UID {str(uid)[:64]!r}, the kubelet asked for {ref.uid!r} (it "
            "was deleted and created again)",
            "the kubelet retries with the current claim; delete the pod if it does not",
        )
    allocation = status.get("allocation") if isinstance(status, Mapping) else None
    if not isinstance(allocation, dict):
        raise InvalidInputError(
            "status.allocation", f"claim {ref.key} is not allocated", _fix_allocation()
        )
    devices = allocation.get("devices") or {}
    results = devices.get("results") if isinstance(devices, dict) else None
    if not isinstance(results, list):
        raise InvalidInputError(_RESULTS, "is missing", _fix_allocation())
    if len(results) > MAX_RESULTS:
        raise InvalidInputError(_RESULTS, f"lists {len(results)} devices", _fix_allocation())
    return devices, results


def _allocated_gpu(
    result: Mapping[str, Any],
    where: str,
    pool: str,
    gpus: Mapping[str, GpuInfo],
    configs: Sequence[tuple[list[str], MpsConfig]],
) -> AllocatedGpu:
    """One result of our driver: its GPU of this node's pool, the share and memory it
    consumes and its MPS config; refused (naming the field) when any of them is wrong."""
    if result.get("pool") != pool:
        raise InvalidInputError(
            f"{where}.pool",
            f"{str(result.get('pool'))[:64]!r} is not this node's pool {pool!r}",
            _fix_allocation(),
        )
    name = result.get("device")
    gpu = gpus.get(name) if isinstance(name, str) else None
    if gpu is None or not isinstance(name, str):
        raise InvalidInputError(
            f"{where}.device",
            f"{str(name)[:64]!r} is not a GPU gpushare manages on this node",
            _fix_allocation(),
        )
    consumed = result.get("consumedCapacity") or {}
    if not isinstance(consumed, dict):
        raise InvalidInputError(f"{where}.consumedCapacity", "must be an object", _fix_allocation())
    percent = SLICES_PER_GPU
    if CAPACITY_GPU_PERCENT in consumed:
        percent = _consumed_percent(
            consumed[CAPACITY_GPU_PERCENT],
            where=f"{where}.consumedCapacity.{CAPACITY_GPU_PERCENT}",
        )
    memory = 0
    if CAPACITY_MEMORY in consumed:
        memory = _consumed_memory(
            consumed[CAPACITY_MEMORY],
            where=f"{where}.consumedCapacity.{CAPACITY_MEMORY}",
            gpu=gpu,
        )
    request = str(result.get("request", ""))
    config = config_for(request, configs)
    if config.limit is not None and config.limit < percent:
        raise InvalidInputError(
            f"{_CONFIG}.opaque.parameters.limit",
            f"{config.limit} is below the {percent} {CAPACITY_GPU_PERCENT} request "
            f"{request!r} consumes",
            f"set limit to at least {percent}, or leave it out",
        )
    return AllocatedGpu(request, pool, name, gpu, percent, memory, config)
