"""The packing invariant, checked after a run from what the API server holds.

An independent oracle: it reads only the node inventory annotations and the pods' request and
placement annotations (the contract in ``gpushare.api``), not the controller's view, and checks
every GPU: guaranteed shares <= 100%, memory caps within the GPU's memory, MPS clients within
the server's limit; every bound gpushare pod has a placement on a GPU of its own node.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpushare.api.errors import InvalidInputError
from gpushare.api.inventory import GpuInfo, load_inventory
from gpushare.api.names import (
    ANN_NODE_GPUS,
    MPS_MAX_CLIENTS,
    RESOURCE_GPU_PERCENT,
    SLICES_PER_GPU,
)
from gpushare.api.placement import parse_placement
from gpushare.api.request import parse_request


@dataclass
class GpuLoad:
    node: str
    info: GpuInfo
    percent: int = 0
    memory_bytes: int = 0
    pods: list[str] = field(default_factory=list)


@dataclass
class InvariantReport:
    """What the check found. ``violations`` is empty when every GPU is within its limits."""

    violations: list[str] = field(default_factory=list)
    gpus: int = 0
    gpus_used: int = 0
    pods_placed: int = 0
    pods_unbound: int = 0
    """gpushare pods with no node (pending, or placement written but never bound)."""
    max_percent: int = 0
    max_pods_per_gpu: int = 0
    allocated_percent: int = 0
    """Sum of guaranteed shares over all GPUs, in GPU-percent."""

    def summary(self) -> dict[str, Any]:
        return {
            "violations": len(self.violations),
            "violation_examples": self.violations[:20],
            "gpus": self.gpus,
            "gpus_used": self.gpus_used,
            "pods_placed": self.pods_placed,
            "pods_unbound": self.pods_unbound,
            "max_guaranteed_percent_on_a_gpu": self.max_percent,
            "max_pods_on_a_gpu": self.max_pods_per_gpu,
            "allocated_gpu_equivalents": round(self.allocated_percent / SLICES_PER_GPU, 2),
        }


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _annotations(obj: Mapping[str, Any]) -> dict[str, str]:
    raw = _meta(obj).get("annotations")
    if not isinstance(raw, Mapping):
        return {}
    return {k: v for k, v in raw.items() if isinstance(k, str) and isinstance(v, str)}


def _resource_percent(pod: Mapping[str, Any]) -> int | None:
    total: int | None = None
    containers = pod.get("spec", {}).get("containers") or []
    for c in containers:
        limits = (c.get("resources") or {}).get("limits") or {}
        requests = (c.get("resources") or {}).get("requests") or {}
        value = limits.get(RESOURCE_GPU_PERCENT, requests.get(RESOURCE_GPU_PERCENT))
        if value is not None:
            total = (total or 0) + int(value)
    return total


def check(nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]) -> InvariantReport:
    """Check every GPU of ``nodes`` against the placements of ``pods`` (API server JSON)."""
    report = InvariantReport()
    gpus: dict[str, GpuLoad] = {}
    for node in nodes:
        name = str(_meta(node).get("name", ""))
        text = _annotations(node).get(ANN_NODE_GPUS)
        if text is None:
            continue
        try:
            inventory = load_inventory(text)
        except InvalidInputError as exc:
            report.violations.append(f"node {name}: {exc}")
            continue
        for info in inventory:
            gpus[info.uuid] = GpuLoad(node=name, info=info)
    report.gpus = len(gpus)

    for pod in pods:
        meta = _meta(pod)
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            continue
        ann = _annotations(pod)
        try:
            request = parse_request(ann)
            placement = parse_placement(ann)
            resource = _resource_percent(pod)
        except (InvalidInputError, ValueError) as exc:
            report.violations.append(f"pod {key}: unreadable ({exc})")
            continue
        percent = request.percent if request is not None and request.percent > 0 else resource
        if percent is None:
            continue  # not a gpushare pod
        node = pod.get("spec", {}).get("nodeName")
        if not node:
            report.pods_unbound += 1
            continue
        if placement is None:
            if request is not None:
                report.violations.append(f"pod {key}: bound to {node} without a GPU placement")
            continue  # a plain gpu-percent pod of the stock scheduler: no GPU assignment
        report.pods_placed += 1
        per_gpu = min(percent, SLICES_PER_GPU)
        for gpu_id in placement.gpu_uuids:
            load = gpus.get(gpu_id)
            if load is None:
                report.violations.append(f"pod {key}: placed on unknown GPU {gpu_id}")
                continue
            if load.node != node:
                report.violations.append(
                    f"pod {key}: bound to {node} but placed on GPU {gpu_id} of {load.node}"
                )
            memory = placement.memory_limit_bytes or load.info.memory_bytes
            load.percent += per_gpu
            load.memory_bytes += memory
            load.pods.append(key)

    for uuid, load in gpus.items():
        if not load.pods:
            continue
        report.gpus_used += 1
        report.allocated_percent += load.percent
        report.max_percent = max(report.max_percent, load.percent)
        report.max_pods_per_gpu = max(report.max_pods_per_gpu, len(load.pods))
        where = f"GPU {uuid} on {load.node}"
        if load.percent > SLICES_PER_GPU:
            report.violations.append(f"{where}: guaranteed shares {load.percent}% > 100%")
        if load.memory_bytes > load.info.memory_bytes:
            report.violations.append(
                f"{where}: memory caps {load.memory_bytes} B > capacity {load.info.memory_bytes} B"
            )
        if len(load.pods) > MPS_MAX_CLIENTS:
            report.violations.append(
                f"{where}: {len(load.pods)} pods > MPS client limit {MPS_MAX_CLIENTS}"
            )
    return report
