"""Can a pod go on this GPU / this node? Each refusal says why, in words a user can act on.

The extender calls these for every candidate node (1000 nodes x 8 GPUs in < 10 ms), so each
GPU is checked in one pass over its tenants and the common "it fits" path builds no strings.
"""

from enum import IntEnum
from functools import lru_cache

from gpushare.api.names import CLASS_LATENCY, LABEL_SHARING_GROUP, SLICES_PER_GPU
from gpushare.api.quantities import format_memory
from gpushare.packing.model import Demand, GpuState, NodeState

MAX_LATENCY_TENANTS = 1
"""Latency-class pods allowed per GPU by default: two would compete at the same MPS priority."""


@lru_cache(maxsize=1024)
def allowed_models(spec: str) -> frozenset[str]:
    """The GPU models a ``Demand.gpu_model`` admits (``"A|B"`` = either); empty = any."""
    return frozenset(part.strip() for part in spec.split("|") if part.strip())


def model_allows(spec: str | None, model: str) -> bool:
    """True when a GPU of ``model`` satisfies the restriction ``spec`` (None/empty = any)."""
    if not spec:
        return True
    models = allowed_models(spec)
    return not models or model in models


def demand_memory(demand: Demand, gpu: GpuState) -> int:
    """Memory the pod gets on ``gpu``: its cap, else a share proportional to its percent."""
    if demand.memory_bytes is not None:
        return demand.memory_bytes
    return gpu.memory_bytes * min(demand.percent, SLICES_PER_GPU) // SLICES_PER_GPU


class Refusal(IntEnum):
    """Why a pod does not fit on a GPU, in the order the checks run (and node reasons list
    them)."""

    UNHEALTHY = 1
    TENANCY = 2
    AVOIDED = 3
    MODEL = 4
    COMPUTE = 5
    MEMORY = 6
    CLIENTS = 7
    LATENCY = 8


def fit_reason(
    gpu: GpuState, demand: Demand, *, max_latency_tenants: int = MAX_LATENCY_TENANTS
) -> str | None:
    """None when ``demand`` fits on ``gpu``; otherwise a short reason for the user.

    Checks health, the GPUs the pod avoids, GPU model, free compute share, free memory, the MPS
    server's client budget (processes, not pods) and the latency-class rules (guaranteed shares
    never exceed 100%, at most ``max_latency_tenants`` latency pods per GPU).
    """
    refusal = gpu_fit(gpu, demand, max_latency_tenants=max_latency_tenants)[0]
    return None if refusal is None else _gpu_words(refusal, gpu, demand, max_latency_tenants)


def gpu_fit(
    gpu: GpuState, demand: Demand, *, max_latency_tenants: int = MAX_LATENCY_TENANTS
) -> tuple[Refusal | None, int]:
    """(why the pod does not fit on ``gpu`` or None, the GPU's allocated percent) from one pass
    over its tenants; no words are built (the extender asks this for every GPU it sees)."""
    used, used_memory, clients, latency = gpu.totals()
    if not gpu.healthy:
        return Refusal.UNHEALTHY, used
    if demand.tenancy is not None and tenancy_conflict(gpu, demand.tenancy) is not None:
        return Refusal.TENANCY, used
    if gpu.uuid in demand.avoid_gpus:
        return Refusal.AVOIDED, used
    if demand.gpu_model and not model_allows(demand.gpu_model, gpu.model):
        return Refusal.MODEL, used
    if min(demand.percent, SLICES_PER_GPU) > SLICES_PER_GPU - used:
        return Refusal.COMPUTE, used
    if demand_memory(demand, gpu) > gpu.memory_bytes - used_memory:
        return Refusal.MEMORY, used
    if clients + demand.processes > gpu.max_clients:
        return Refusal.CLIENTS, used
    if demand.gpu_class == CLASS_LATENCY and latency >= max_latency_tenants:
        return Refusal.LATENCY, used
    return None, used


def _gpu_words(refusal: Refusal, gpu: GpuState, demand: Demand, max_latency_tenants: int) -> str:
    """One GPU's refusal with its numbers (what this GPU has)."""
    used, used_memory, clients, latency = gpu.totals()
    if refusal is Refusal.UNHEALTHY:
        return "GPU is unhealthy"
    if refusal is Refusal.TENANCY:
        # The other tenancy is not named: this reaches the pod's events, which its owner reads.
        return (
            f"GPU is shared by another tenancy; pods of {demand.tenancy!r} may not share it "
            "(an admin puts namespaces in one sharing group to let them share)"
        )
    if refusal is Refusal.AVOIDED:
        return f"pod avoids GPU {gpu.uuid} (gpushare.io/avoid-gpus)"
    if refusal is Refusal.MODEL:
        return f"needs GPU model {demand.gpu_model}, GPU is {gpu.model or 'of unknown model'}"
    if refusal is Refusal.COMPUTE:
        if demand.whole:
            return f"needs a whole GPU, GPU has {used}% allocated"
        want = min(demand.percent, SLICES_PER_GPU)
        return f"needs {want}% compute, GPU has {max(SLICES_PER_GPU - used, 0)}% free"
    if refusal is Refusal.MEMORY:
        return (
            f"needs {format_memory(demand_memory(demand, gpu))} GPU memory, "
            f"GPU has {format_memory(max(gpu.memory_bytes - used_memory, 0))} free"
        )
    if refusal is Refusal.CLIENTS:
        left = max(gpu.max_clients - clients, 0)
        return (
            f"needs {demand.processes} MPS client process(es), "
            f"GPU's MPS server has {left} of {gpu.max_clients} left"
        )
    return f"GPU already has {latency} latency-class pod(s); at most {max_latency_tenants} per GPU"


def _node_words(refusal: Refusal, demand: Demand) -> str:
    """What GPUs refusing for ``refusal`` lack, without any one GPU's numbers: nodes whose
    GPUs refuse for the same reasons give the same words."""
    if refusal is Refusal.UNHEALTHY:
        return "unhealthy GPU"
    if refusal is Refusal.TENANCY:
        # Where users first meet the boundary (a Pending pod's event): say how to go on.
        return (
            f"GPU shared by another tenancy than {demand.tenancy!r} (a GPU serves one namespace "
            f"or sharing group: wait for a free GPU, or an admin labels the namespaces "
            f"{LABEL_SHARING_GROUP}=<one name>; docs/security.md)"
        )
    if refusal is Refusal.AVOIDED:
        return f"avoids GPU {', '.join(sorted(demand.avoid_gpus))} (gpushare.io/avoid-gpus)"
    if refusal is Refusal.MODEL:
        return f"GPU not of model {demand.gpu_model}"
    if refusal is Refusal.COMPUTE:
        if demand.whole:
            return "needs a whole GPU, none idle"
        return f"needs {min(demand.percent, SLICES_PER_GPU)}% compute free"
    if refusal is Refusal.MEMORY:
        wanted = (
            format_memory(demand.memory_bytes)
            if demand.memory_bytes is not None
            else f"{min(demand.percent, SLICES_PER_GPU)}% of a GPU's"
        )
        return f"needs {wanted} GPU memory free"
    if refusal is Refusal.CLIENTS:
        return f"needs room for {demand.processes} MPS client process(es)"
    return "GPU already has a latency-class pod"


def tenancy_conflict(gpu: GpuState, tenancy: str) -> str | None:
    """The tenancy of a tenant on ``gpu`` other than ``tenancy``, if any: the tenancy boundary
    (docs/security.md). A GPU is shared only inside one namespace or sharing group, so no
    tenant's MPS client settings, faults or memory pressure reach another's. Tenants of
    unknown tenancy count as foreign."""
    for tenant in gpu.tenants:
        if tenant.tenancy != tenancy:
            return tenant.tenancy or "unknown"
    return None


def host_reason(node: NodeState, demand: Demand) -> str | None:
    """Why the node's free CPU or memory cannot take the pod, or None (also when untracked)."""
    if node.cpu_milli_free is not None and demand.cpu_milli > node.cpu_milli_free:
        return f"needs {demand.cpu_milli}m CPU, node has {max(node.cpu_milli_free, 0)}m free"
    if node.memory_free_bytes is not None and demand.host_memory_bytes > node.memory_free_bytes:
        return (
            f"needs {format_memory(demand.host_memory_bytes)} memory, "
            f"node has {format_memory(max(node.memory_free_bytes, 0))} free"
        )
    return None


def node_fit_reason(node: NodeState, demand: Demand) -> str | None:
    """None when the pod fits somewhere on ``node``; otherwise why not.

    Multi-GPU demands need ``demand.gpus`` idle healthy GPUs of an allowed model; a fractional
    demand needs one GPU with room. Host CPU and memory are checked when the node tracks them.
    The reason names no GPU and no GPU's numbers, only what the pod lacks on this node's GPUs
    (each :class:`Refusal` met, in check order): nodes short of the same things give the same
    words, which kube-scheduler counts as one line of its event ("0/1213 nodes are available:
    497 gpushare: no GPU fits (needs 23 percent compute free)"), and the extender's answer for
    hundreds of nodes stays small. :func:`fit_reason` has one GPU's numbers.
    """
    return host_reason(node, demand) or gpus_fit_reason(node, demand)


def gpus_fit_reason(node: NodeState, demand: Demand) -> str | None:
    """The GPU half of :func:`node_fit_reason`: None when the node's GPUs have room."""
    if demand.gpus <= 0 or demand.percent <= 0:
        return None  # asks for no GPU: host resources are all it needs
    if not node.gpus:
        return "node has no GPUs"
    wanted = max(demand.gpus, 1)
    found = 0
    refusals: set[Refusal] = set()
    for gpu in node.gpus:
        refusal = gpu_fit(gpu, demand)[0]
        if refusal is None:
            found += 1
            if found >= wanted:
                return None
        else:
            refusals.add(refusal)
    words = "; ".join(_node_words(r, demand) for r in sorted(refusals))
    if wanted > 1:
        return f"needs {wanted} idle GPUs, node has {found}" + (f" ({words})" if words else "")
    return f"no GPU fits ({words})"
