"""Allocation and invariants read back from the API server: bound pods and their placements.

``snapshot`` takes the node and pod lists as the API server returns them; the GPU side is the
scale bench's independent oracle (:func:`bench.scale.invariant.check`: shares per GPU from the
placement annotations, never the controller's view), and host CPU and memory are checked the
way kube-scheduler counts them.
"""

from collections.abc import Iterable, Mapping
from typing import Any

from bench.scale.invariant import check
from gpushare.api.names import SLICES_PER_GPU
from gpushare.cluster.state.host_resources import node_allocatable, pod_requests


def snapshot(
    nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]
) -> dict[str, Any]:
    """Allocated GPU share (% of the GPU capacity of ``nodes``) and every broken constraint."""
    node_list, pod_list = list(nodes), list(pods)
    report = check(node_list, pod_list)
    violations = list(report.violations)
    allocatable: dict[str, tuple[int, int]] = {}
    for node in node_list:
        name = str(node.get("metadata", {}).get("name", ""))
        value = node_allocatable(node)
        if value is not None:
            allocatable[name] = value
    used: dict[str, list[int]] = {}
    bound = 0
    for pod in pod_list:
        node_name = pod.get("spec", {}).get("nodeName")
        if not node_name or pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            continue
        bound += 1
        cpu, memory = pod_requests(pod)
        entry = used.setdefault(str(node_name), [0, 0])
        entry[0] += cpu
        entry[1] += memory
    for name, (cpu, memory) in used.items():
        limit = allocatable.get(name)
        if limit is None:
            continue
        if cpu > limit[0]:
            violations.append(f"node {name}: CPU requests {cpu}m > allocatable {limit[0]}m")
        if memory > limit[1]:
            violations.append(f"node {name}: memory requests {memory} B > allocatable {limit[1]} B")
    capacity = SLICES_PER_GPU * report.gpus
    return {
        "alloc_percent": round(100.0 * report.allocated_percent / capacity, 3) if capacity else 0.0,
        "allocated_gpu_percent": report.allocated_percent,
        "gpus": report.gpus,
        "pods_bound": bound,
        "gpu_pods_placed": report.pods_placed,
        "gpu_pods_unbound": report.pods_unbound,
        "max_percent_on_a_gpu": report.max_percent,
        "violations": len(violations),
        "violation_examples": violations[:20],
    }
