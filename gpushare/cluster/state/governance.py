"""Which pods a GpuShare governs, and who sits on which GPU: the operator's reads of the view.

Functions over the view's one pod projection (:class:`~.pods.PodFacts`) and its GpuShares
(:class:`~.shares.ShareRegistry`); the view exposes them as methods.

What governs a pod is cached (:class:`GoverningIndex`) until the pod or a share's spec changes:
every share was reconciled every 5 s against every pod of its namespace, each pod matched
against every share of the cluster, on the loop that answers the extender (issue 67: 300
shares and 300 pods took 42.6 s of loop time per 5 s period). A namespace's first
:data:`MAX_SHARES_PER_NAMESPACE` shares (by name) govern pods and are reconciled; the rest are
told so (docs/security.md, "The operator's cost is bounded").
"""

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpushare.api.gpushare_crd import governing_share
from gpushare.cluster.state.claim_holders import ClaimHolder, claim_tenants
from gpushare.cluster.state.pod_facts import PodFacts
from gpushare.cluster.state.shares import ShareRegistry, ShareSummary

MAX_SHARES_PER_NAMESPACE = 100
"""GpuShares of one namespace that govern pods (the first by name); one more governs none."""
_KEPT = 200_000
"""Pods whose governing share is remembered before all are forgotten (a bound on memory)."""


class GoverningIndex:
    """Per namespace its governing shares, and per pod its governing share's name, kept while
    the shares' specs (``ShareRegistry.version``) and the pod's facts (the object the view
    holds, replaced on every change) stay as they were."""

    def __init__(self) -> None:
        self._version = -1
        self._by_namespace: dict[str, list[tuple[str, Any]]] = {}
        self._by_pod: dict[str, tuple[PodFacts, str | None]] = {}

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
            self._by_pod = {}
            self._version = shares.version
        return self._by_namespace.get(namespace, [])

    def allowed(self, shares: ShareRegistry, share: ShareSummary) -> bool:
        """The share is among its namespace's first MAX_SHARES_PER_NAMESPACE."""
        return any(name == share.name for name, _ in self.candidates(shares, share.namespace))

    def governing(self, shares: ShareRegistry, pod: PodFacts) -> str | None:
        candidates = self.candidates(shares, pod.namespace)
        known = self._by_pod.get(pod.key)
        if known is not None and known[0] is pod:
            return known[1]
        name = governing_share(candidates, labels=pod.labels, annotations=pod.annotations)
        if len(self._by_pod) >= _KEPT:
            self._by_pod = {}
        self._by_pod[pod.key] = (pod, name)
        return name


def share_of(
    shares: ShareRegistry, pod: PodFacts, index: GoverningIndex | None = None
) -> ShareSummary | None:
    """The GpuShare governing a pod, if the view knows it."""
    name = (index or GoverningIndex()).governing(shares, pod)
    return shares.by_key.get(f"{pod.namespace}/{name}") if name else None


def governed_pods(
    shares: ShareRegistry,
    pods: Iterable[PodFacts],
    share: ShareSummary,
    index: GoverningIndex | None = None,
) -> list[PodFacts]:
    """GPU pods of the share's namespace that the share governs, oldest first."""
    index = index or GoverningIndex()
    found = []
    for pod in pods:
        if pod.namespace != share.namespace or not pod.gpu_pod:
            continue
        if index.governing(shares, pod) == share.name:
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
