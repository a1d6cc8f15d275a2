"""Pods that hold claims on gpushare's DRA GPUs, as their claims say: how the operator sees
DRA-mode pods on GPUs (a GpuShare's ``status.placements``, latency protection; docs/dra.md,
"GpuShares and profiles").

A DRA-mode pod carries no placement annotations: where it runs is its claim's allocation, and
its thread cap is the one the driver gives when it prepares the claim
(:func:`gpushare.packing.threads.thread_cap`). The controller's claim watch makes these records
(``gpushare.cluster.dra.devices.DraDevices.holders``); the view turns them into
:class:`~.pods.PodFacts` for the operator's reads only, never into the device-plugin ledger,
which counts annotated pods alone.
"""

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from gpushare.api.placement import Placement
from gpushare.cluster.state.pod_facts import PodFacts, Workload


@dataclass(frozen=True)
class ClaimHolder:
    """One pod named in ``status.reservedFor`` of allocated claims on gpushare's DRA GPUs."""

    pod_key: str
    pod_uid: str
    node: str
    placement: Placement
    """Its claims' GPUs, the driver's thread cap, the memory the claims consume, the claim's
    creation as the bind time (when the pod was made: the claim is made from its template
    then), state ``allocated``, the consumed gpu-percent as the request."""
    gpu_class: str


def holder_facts(holder: ClaimHolder, kept: PodFacts | None) -> PodFacts | None:
    """The pod as the operator reads it: the view's facts of it (a pod a GpuShare governs)
    with the claim's placement and class, else what the claim says. None when the view knows another
    pod by that name (the claim still names one deleted before: never act on the new one)."""
    if kept is not None:
        if kept.uid != holder.pod_uid:
            return None
        return replace(
            kept,
            node=kept.node or holder.node,
            placement=holder.placement,
            # The claim's class is what the driver runs it by (priority, neighbours' caps).
            workload=replace(kept.workload, gpu_class=holder.gpu_class),
        )
    return PodFacts(
        key=holder.pod_key,
        uid=holder.pod_uid,
        node=holder.node,
        finished=False,
        demand=None,
        placement=holder.placement,
        dra=True,
        workload=Workload(
            gpu_pod=True, gpu_class=holder.gpu_class, created=holder.placement.bind_time
        ),
    )


def with_claim_placements(
    pods: Iterable[PodFacts], holders: Mapping[str, ClaimHolder]
) -> list[PodFacts]:
    """``pods`` with each DRA-mode pod's claim placement filled in (others unchanged)."""
    out = []
    for pod in pods:
        holder = holders.get(pod.key) if pod.dra and pod.placement is None else None
        facts = holder_facts(holder, pod) if holder is not None else None
        out.append(facts or pod)
    return out


def claim_tenants(
    holders: Mapping[str, ClaimHolder],
    *,
    kept: Callable[[str], PodFacts | None],
    placed: set[str],
) -> Iterable[tuple[tuple[str, str], PodFacts]]:
    """((node, GPU UUID), pod) for each active claim holder on one GPU, except the pods in
    ``placed`` (counted from their placement annotations already)."""
    for key, holder in holders.items():
        if key in placed:
            continue
        pod = holder_facts(holder, kept(key))
        if pod is None or not pod.active or pod.gpu_uuid is None:
            continue
        yield (holder.node, pod.gpu_uuid), pod
