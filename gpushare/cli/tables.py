"""``kubectl gpushare get pods|gpus``: one row per pod or GPU, as ``kubectl get`` prints them.

Both are flat views of the same data ``top`` shows (gpushare.cli.view); ``-o wide`` adds
columns, ``-o json|yaml`` gives the rows as an ``items`` list.
"""

from dataclasses import dataclass
from typing import Any

from gpushare.cli.render import NO_GPUS, gib, memory_limit, percent, request, table
from gpushare.cli.view import GpuRow, NodeRow, PodRow


@dataclass
class PodLine:
    """A pod with every GPU it holds (a multi-GPU pod appears once)."""

    node: str
    pod: PodRow
    gpus: list[GpuRow]


def pod_lines(nodes: list[NodeRow]) -> list[PodLine]:
    found: dict[tuple[str, str], PodLine] = {}
    for node in nodes:
        for gpu in node.gpus:
            for pod in gpu.pods:
                line = found.setdefault(
                    (pod.namespace, pod.name), PodLine(node=node.name, pod=pod, gpus=[])
                )
                line.gpus.append(gpu)
    return sorted(found.values(), key=lambda p: (p.pod.namespace, p.pod.name))


def _pod_memory_used(line: PodLine, *, live: bool) -> str:
    if not live:
        return "-"
    # Each GpuRow holds its own copy of the pod with that GPU's reading.
    key = (line.pod.namespace, line.pod.name)
    used = [p.memory_used_bytes for g in line.gpus for p in g.pods if (p.namespace, p.name) == key]
    known = [u for u in used if u is not None]
    return gib(sum(known)) if known else "-"


def render_pods(
    nodes: list[NodeRow], *, all_namespaces: bool, wide: bool, live: bool, namespace: str
) -> str:
    lines = pod_lines(nodes)
    if not lines:
        where = "any namespace" if all_namespaces else f"{namespace} namespace"
        return f"No gpushare pods found in {where}.\n"
    header = ["NAME", "NODE", "GPU", "REQUEST", "LIMIT", "MEM-LIMIT", "STATE", "PAUSED"]
    if all_namespaces:
        header.insert(0, "NAMESPACE")
    if wide:
        header += ["CLASS", "TIER", "PHASE", "MEM-USED", "GPU-UUID", "PAUSE-REASON"]
    rows = [tuple(header)]
    for line in lines:
        p = line.pod
        row = [
            p.name,
            line.node,
            ",".join(str(g.info.index) for g in line.gpus),
            request(p),
            f"{p.thread_percent}%",
            memory_limit(p.memory_limit_bytes),
            p.state or "-",
            p.paused,
        ]
        if all_namespaces:
            row.insert(0, p.namespace)
        if wide:
            row += [
                p.gpu_class,
                p.tier,
                p.phase or "-",
                _pod_memory_used(line, live=live),
                ",".join(g.info.uuid for g in line.gpus),
                p.pause_reason or "-",
            ]
        rows.append(tuple(row))
    return "\n".join(table(rows)) + "\n"


def render_gpus(nodes: list[NodeRow], *, wide: bool, live: bool) -> str:
    gpus = [(n.name, g) for n in nodes for g in n.gpus]
    if not gpus:
        return NO_GPUS
    header = ["NODE", "GPU", "MODEL", "ALLOCATED", "LIMITS", "PODS", "MEMORY"]
    if wide:
        header += ["UUID", "HEALTHY", "UTIL", "MEM-USED", "SIMULATED"]
    rows = [tuple(header)]
    for node, g in gpus:
        row = [
            node,
            str(g.info.index),
            g.info.model,
            f"{g.allocated_percent}%",
            f"{g.limit_percent}%",
            str(len(g.pods)),
            gib(g.info.memory_bytes),
        ]
        if wide:
            row += [
                g.info.uuid,
                "yes" if g.info.healthy else "NO",
                percent(g.utilization) if live else "-",
                gib(g.memory_used_bytes) if live else "-",
                "yes" if g.simulated else "no",
            ]
        rows.append(tuple(row))
    return "\n".join(table(rows)) + "\n"


def pods_document(nodes: list[NodeRow]) -> dict[str, Any]:
    return {
        "items": [
            {
                "namespace": line.pod.namespace,
                "name": line.pod.name,
                "node": line.node,
                "gpus": [{"index": g.info.index, "uuid": g.info.uuid} for g in line.gpus],
                "class": line.pod.gpu_class,
                "request_percent": line.pod.fraction_percent,
                "limit_percent": line.pod.thread_percent,
                "memory_limit_bytes": line.pod.memory_limit_bytes,
                "state": line.pod.state,
                "phase": line.pod.phase,
                "paused": line.pod.paused,
                "pause_reason": line.pod.pause_reason,
                "pause_message": line.pod.pause_message,
            }
            for line in pod_lines(nodes)
        ]
    }


def gpus_document(nodes: list[NodeRow]) -> dict[str, Any]:
    return {
        "items": [
            {
                "node": n.name,
                "index": g.info.index,
                "uuid": g.info.uuid,
                "model": g.info.model,
                "memory_bytes": g.info.memory_bytes,
                "healthy": g.info.healthy,
                "simulated": g.simulated,
                "allocated_percent": g.allocated_percent,
                "limit_percent": g.limit_percent,
                "pods": [f"{p.namespace}/{p.name}" for p in g.pods],
                "utilization": g.utilization,
                "memory_used_bytes": g.memory_used_bytes,
            }
            for n in nodes
            for g in n.gpus
        ]
    }
