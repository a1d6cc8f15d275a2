"""Host CPU and memory as kube-scheduler counts them: node allocatable and pod requests.

The gpushare policy charges a placement for the GPU share it strands on a node whose CPU or
memory runs out (docs/packing.md, "Stranding"), so the view needs every node's free CPU and
memory: its ``status.allocatable`` minus the requests of every pod bound there, gpushare's or
not. A pod's request is what the scheduler's NodeResourcesFit uses: the larger of the sum over
its containers and the largest init container, plus its ``overhead``.

Pure functions over API JSON; a value the API server would not have accepted reads as 0, and
one it stores but no node could hold (an exponent near a million) saturates at int64's largest,
which fits no node here as it fits none in kube-scheduler's int64 arithmetic. Never raises: one
strange pod in any namespace must not stop the pod list (docs/security.md).
"""

from collections.abc import Mapping
from typing import Any

from gpushare.api.quantities import kube_quantity

_WHOLE_SCALE = {"m": None, "": 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def _whole(value: object, milli: bool) -> int | None:
    """The common spellings ("8000m", "16", "512Mi") without the general parser: every pod
    event of the cluster comes through here."""
    if not isinstance(value, str) or len(value) > 15:
        return None
    for suffix in ("m", "Ki", "Mi", "Gi", "Ti", ""):
        if value.endswith(suffix):
            digits = value[: len(value) - len(suffix)] if suffix else value
            if not digits.isdigit() or not digits.isascii():
                return None
            scale = _WHOLE_SCALE[suffix]
            if scale is None:  # milli
                return int(digits) if milli else -(-int(digits) // 1000)
            return int(digits) * scale * (1000 if milli else 1)
    return None


def cpu_milli(value: object) -> int:
    """Milli-CPU of a quantity, rounded up; 0 when unreadable, at most int64's largest."""
    whole = _whole(value, True)
    if whole is not None:
        return whole
    return kube_quantity(value, milli=True) or 0


def memory_bytes(value: object) -> int:
    """Bytes of a quantity, rounded up; 0 when unreadable, at most int64's largest."""
    whole = _whole(value, False)
    if whole is not None:
        return whole
    return kube_quantity(value) or 0


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _requests(container: object) -> tuple[int, int]:
    requests = _mapping(_mapping(_mapping(container).get("resources")).get("requests"))
    return cpu_milli(requests.get("cpu")), memory_bytes(requests.get("memory"))


def pod_requests(pod: Mapping[str, Any]) -> tuple[int, int]:
    """(milli-CPU, memory bytes) the pod requests, as NodeResourcesFit counts them."""
    spec = _mapping(pod.get("spec"))
    cpu = memory = 0
    containers = spec.get("containers")
    for c in containers if isinstance(containers, list) else ():
        c_cpu, c_memory = _requests(c)
        cpu += c_cpu
        memory += c_memory
    inits = spec.get("initContainers")
    for c in inits if isinstance(inits, list) else ():
        c_cpu, c_memory = _requests(c)
        cpu, memory = max(cpu, c_cpu), max(memory, c_memory)
    overhead = _mapping(spec.get("overhead"))
    return cpu + cpu_milli(overhead.get("cpu")), memory + memory_bytes(overhead.get("memory"))


def node_allocatable(node: Mapping[str, Any]) -> tuple[int, int] | None:
    """(milli-CPU, memory bytes) the node offers pods; None when its status does not say."""
    allocatable = _mapping(_mapping(node.get("status")).get("allocatable"))
    cpu = kube_quantity(allocatable.get("cpu"), milli=True)
    memory = kube_quantity(allocatable.get("memory"))
    if cpu is None or memory is None:
        return None
    return cpu, memory
