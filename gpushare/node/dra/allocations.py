"""DRA mode's pods as the exporter sees them: one :class:`PodAllocation` per pod with claims
this agent prepared, from what preparing them decided (GPUs, thread cap, memory limit, class,
guaranteed gpuPercent), so per-pod GPU series and dashboards cover DRA-mode pods as they cover
annotated ones (docs/observability.md). A DRA-mode pod carries no placement annotations."""

from collections.abc import Iterable

from gpushare.api.names import SLICES_PER_GPU, STATE_ALLOCATED
from gpushare.api.pod import PodInfo
from gpushare.node.core.allocations import PodAllocation, pod_containers
from gpushare.node.dra.checkpoint import PreparedClaim


def claim_allocations(
    prepared: Iterable[PreparedClaim], pods: Iterable[PodInfo]
) -> list[PodAllocation]:
    """The pods in ``pods`` (this node's, as the agent watches them) that hold ``prepared``
    claims and have not finished. A pod with several claims is one allocation over all their
    GPUs, at the smallest thread cap and guaranteed share among them."""
    by_pod: dict[str, list[PreparedClaim]] = {}
    for claim in prepared:
        by_pod.setdefault(claim.pod, []).append(claim)
    out: list[PodAllocation] = []
    for pod in pods:
        claims = by_pod.get(pod.key)
        if not claims or pod.finished:
            continue
        uuids = tuple(dict.fromkeys(d.gpu_uuid for c in claims for d in c.devices))
        if not uuids:
            continue
        guaranteed = min(c.percent if c.percent is not None else c.thread_percent for c in claims)
        out.append(
            PodAllocation(
                namespace=pod.namespace,
                name=pod.name,
                uid=pod.uid,
                gpu_uuids=uuids,
                compute_ratio=min(guaranteed, SLICES_PER_GPU) / SLICES_PER_GPU,
                thread_percent=min(c.thread_percent for c in claims),
                memory_limit_bytes=max(c.memory_limit_bytes for c in claims),
                gpu_class=claims[0].gpu_class,
                state=STATE_ALLOCATED,
                containers=pod_containers(pod.manifest),
            )
        )
    return out
