"""Which pods a GpuShare governs, and who sits on which GPU: the operator's reads of the view.

Pure functions over the view's one pod projection (:class:`~.pods.PodFacts`) and its GpuShares
(:class:`~.shares.ShareRegistry`); the view exposes them as methods.
"""

from collections.abc import Callable, Iterable, Mapping

from gpushare.api.gpushare_crd import linked_share
from gpushare.cluster.state.claim_holders import ClaimHolder, claim_tenants
from gpushare.cluster.state.pod_facts import PodFacts
from gpushare.cluster.state.shares import ShareRegistry, ShareSummary


def share_of(shares: ShareRegistry, pod: PodFacts) -> ShareSummary | None:
    """The GpuShare governing a pod (its ``gpushare.io/share``), if the view knows it."""
    name = linked_share(pod.annotations)
    return shares.by_key.get(f"{pod.namespace}/{name}") if name else None


def governed_pods(
    shares: ShareRegistry, pods: Iterable[PodFacts], share: ShareSummary
) -> list[PodFacts]:
    """GPU pods of the share's namespace that the share governs, oldest first."""
    found = []
    for pod in pods:
        if pod.namespace != share.namespace or not pod.gpu_pod:
            continue
        governing = share_of(shares, pod)
        if governing is not None and governing.name == share.name:
            found.append(pod)
    return sorted(found, key=lambda p: (p.created, p.name))


def tenants_by_gpu(
    pods: Iterable[PodFacts],
    *,
    holders: Mapping[str, ClaimHolder] | None = None,
    kept: Callable[[str], PodFacts | None] | None = None,
) -> dict[tuple[str, str], list[PodFacts]]:
    """(node, GPU UUID) -> active pods placed on that GPU (pods on several GPUs left out):
    annotated pods by their placement, DRA-mode pods by their claims (``holders``; ``kept``
    finds the view's facts of such a pod)."""
    out: dict[tuple[str, str], list[PodFacts]] = {}
    placed: set[str] = set()
    for pod in pods:
        uuid = pod.gpu_uuid
        if uuid is None or pod.node is None or not pod.active:
            continue
        out.setdefault((pod.node, uuid), []).append(pod)
        placed.add(pod.key)
    if holders:
        for gpu, pod in claim_tenants(holders, kept=kept or (lambda _: None), placed=placed):
            out.setdefault(gpu, []).append(pod)
    return out
