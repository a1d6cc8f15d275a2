"""Can a pod go on this GPU / this node? Each refusal says why, in words a user can act on.

The extender calls these for every candidate node (1000 nodes x 8 GPUs in < 10 ms), so each
GPU is checked in one pass over its tenants and the common "it fits" path builds no strings.
"""

from functools import lru_cache

from gpushare.api.names import CLASS_LATENCY, SLICES_PER_GPU
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


def fit_reason(
    gpu: GpuState, demand: Demand, *, max_latency_tenants: int = MAX_LATENCY_TENANTS
) -> str | None:
    """None when ``demand`` fits on ``gpu``; otherwise a short reason for the user.

    Checks health, the GPUs the pod avoids, GPU model, free compute share, free memory, the MPS
    server's client budget (processes, not pods) and the latency-class rules (guaranteed shares
    never exceed 100%, at most ``max_latency_tenants`` latency pods per GPU).
    """
    return gpu_fit(gpu, demand, max_latency_tenants=max_latency_tenants)[0]


def gpu_fit(
    gpu: GpuState, demand: Demand, *, max_latency_tenants: int = MAX_LATENCY_TENANTS
) -> tuple[str | None, int]:
    """(:func:`fit_reason`, the GPU's allocated percent) from one pass over its tenants."""
    used, used_memory, clients, latency = gpu.totals()
    if not gpu.healthy:
        return f"GPU {gpu.uuid} is unhealthy", used
    if demand.tenancy is not None:
        other = tenancy_conflict(gpu, demand.tenancy)
        if other is not None:
            return (
                f"GPU is shared by tenancy {other!r}; pods of {demand.tenancy!r} may not share it "
                "(an admin puts namespaces in one sharing group to let them share)"
            ), used
    if gpu.uuid in demand.avoid_gpus:
        return f"pod avoids GPU {gpu.uuid} (gpushare.io/avoid-gpus)", used
    if demand.gpu_model and not model_allows(demand.gpu_model, gpu.model):
        model = gpu.model or "of unknown model"
        return f"needs GPU model {demand.gpu_model}, GPU is {model}", used
    want = min(demand.percent, SLICES_PER_GPU)
    free = SLICES_PER_GPU - used
    if want > free:
        if demand.whole:
            return f"needs a whole GPU, GPU has {used}% allocated", used
        return f"needs {want}% compute, GPU has {max(free, 0)}% free", used
    need_memory = demand_memory(demand, gpu)
    free_memory = gpu.memory_bytes - used_memory
    if need_memory > free_memory:
        return (
            f"needs {format_memory(need_memory)} GPU memory, "
            f"GPU has {format_memory(max(free_memory, 0))} free"
        ), used
    if clients + demand.processes > gpu.max_clients:
        left = max(gpu.max_clients - clients, 0)
        return (
            f"needs {demand.processes} MPS client process(es), "
            f"GPU's MPS server has {left} of {gpu.max_clients} left"
        ), used
    if demand.gpu_class == CLASS_LATENCY and latency >= max_latency_tenants:
        return (
            f"GPU already has {latency} latency-class pod(s); at most {max_latency_tenants} per GPU"
        ), used
    return None, used


def tenancy_conflict(gpu: GpuState, tenancy: str) -> str | None:
    """The tenancy of a tenant on ``gpu`` other than ``tenancy``, if any: the tenancy boundary
    (docs/security.md). A GPU is shared only inside one namespace or sharing group, so no
    tenant's MPS client settings, faults or memory pressure reach another's. Tenants of
    unknown tenancy count as foreign."""
    for tenant in gpu.tenants:
        if tenant.tenancy != tenancy:
            return tenant.tenancy or "unknown"
    return None


def _host_reason(node: NodeState, demand: Demand) -> str | None:
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
    """
    host = _host_reason(node, demand)
    if host is not None:
        return host
    if demand.gpus <= 0 or demand.percent <= 0:
        return None  # asks for no GPU: host resources are all it needs
    if not node.gpus:
        return "node has no GPUs"
    wanted = max(demand.gpus, 1)
    found = 0
    for gpu in node.gpus:
        if fit_reason(gpu, demand) is None:
            found += 1
            if found >= wanted:
                return None
    if wanted > 1:
        return f"needs {wanted} idle GPUs, node has {found}"
    reasons = [f"{g.uuid}: {fit_reason(g, demand)}" for g in node.gpus[:3]]
    more = f"; and {len(node.gpus) - 3} more" if len(node.gpus) > 3 else ""
    return "no GPU fits (" + "; ".join(reasons) + more + ")"
