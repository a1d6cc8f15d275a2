"""Which pods a GpuShare governs, and who sits on which GPU: the operator's reads of the view.

Functions over the view's one pod projection (:class:`~.pods.PodFacts`) and its GpuShares
(:class:`~.shares.ShareRegistry`); the view exposes them as methods.

A pod is governed by the share its ``gpushare.io/share`` names (a selector only writes that
annotation at creation), so finding a pod's share costs one lookup; before, every pod was matched
against every share of the cluster on the loop that answers the extender (issue 67: 300 shares
and 300 pods took 42.6 s of loop time per 5 s period). A namespace's first
:data:`MAX_SHARES_PER_NAMESPACE` shares (by name, :class:`GoverningIndex`) are reconciled; the
rest are told so (docs/security.md, "The operator's cost is bounded").
"""

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpushare.api.gpushare_crd import linked_share
from gpushare.cluster.state.claim_holders import ClaimHolder, claim_tenants
from gpushare.cluster.state.pod_facts import PodFacts
from gpushare.cluster.state.shares import ShareRegistry, ShareSummary

MAX_SHARES_PER_NAMESPACE = 100
"""GpuShares of one namespace that are reconciled (the first by name); one more is not."""


class GoverningIndex:
    """Per namespace the GpuShares that may govern pods (the first MAX_SHARES_PER_NAMESPACE
    by name), kept while the shares' specs (``ShareRegistry.version``) stay as they were."""

    def __init__(self) -> None:
        self._version = -1
        self._by_namespace: dict[str, list[tuple[str, Any]]] = {}

    def candidates(self, shares: ShareRegistry, namespace: str) -> list[tuple[str, Any]]:
        """(name, spec) of the namespace's shares that may govern pods, by name."""
        if self._version != shares.version:
            by_namespace: dict[str, list[tuple[str, Any]]] = {}
            for s in shares.by_key.values():
                by_namespace.setdefault(s.namespace, []).append((s.name, s.spec))
            self._by_namespace = {
                ns: sorted(found, key=lambda ns_spec: ns_spec[0])[:MAX_SHARES_PER_NAMESPACE]
                for ns, found in by_namespace.items()
            }
            self._version = shares.version
        return self._by_namespace.get(namespace, [])

    def allowed(self, shares: ShareRegistry, share: ShareSummary) -> bool:
        """The share is among its namespace's first MAX_SHARES_PER_NAMESPACE."""
        return any(name == share.name for name, _ in self.candidates(shares, share.namespace))


def share_of(shares: ShareRegistry, pod: PodFacts) -> ShareSummary | None:
    """The GpuShare governing a pod (its ``gpushare.io/share``), if the view knows it."""
    name = linked_share(pod.annotations)
    return shares.by_key.get(f"{pod.namespace}/{name}") if name else None


def governed_pods(
    shares: ShareRegistry, pods: Iterable[PodFacts], share: ShareSummary
) -> list[PodFacts]:
    """GPU pods of the share's namespace that the share governs, oldest first."""
    found = [
        pod
        for pod in pods
        if pod.namespace == share.namespace
        and pod.gpu_pod
        and linked_share(pod.annotations) == share.name
    ]
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
