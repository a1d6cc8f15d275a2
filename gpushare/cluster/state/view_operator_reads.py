"""What the operator reads of the view: :class:`OperatorReads`.

The pods the view keeps (the gpushare pods and the governable others), the GpuShares and which
pods each governs (``governance``; DRA-mode pods placed by their claims, ``claim_holders``),
who sits on which GPU, and what the operator reads of every node (``nodes.NodeInfo``).
"""

from collections.abc import Iterator, Mapping

from gpushare.cluster.state import governance
from gpushare.cluster.state.claim_holders import with_claim_placements
from gpushare.cluster.state.nodes import NodeInfo
from gpushare.cluster.state.pod_facts import PodFacts
from gpushare.cluster.state.shares import ShareSummary
from gpushare.cluster.state.view_parts import ViewParts


class OperatorReads(ViewParts):
    """The view's reads for governing GpuShares and protecting latency pods."""

    def kept_pods(self) -> Iterator[PodFacts]:
        """Every pod the view keeps: the gpushare pods, then the governable others."""
        yield from self._pods.values()
        yield from self._governable.values()

    def kept_pod(self, key: str) -> PodFacts | None:
        """A kept pod by key (``pod`` has only the pods gpushare places)."""
        return self._pods.get(key) or self._governable.get(key)

    def share(self, key: str) -> ShareSummary | None:
        """A GpuShare by ``namespace/name``, as last watched."""
        return self._shares.by_key.get(key)

    def share_of(self, pod: PodFacts) -> ShareSummary | None:
        """The GpuShare governing a pod (``governance.share_of``), if that share governs at all
        (:meth:`governs`)."""
        share = governance.share_of(self._shares, pod)
        return share if share is not None and self.governs(share) else None

    def governs(self, share: ShareSummary) -> bool:
        """The share is among the first ``MAX_SHARES_PER_NAMESPACE`` of its namespace (by
        name): it governs pods and is reconciled (``governance``)."""
        return self._governing.allowed(self._shares, share)

    def governed_pods(self, share: ShareSummary) -> list[PodFacts]:
        """GPU pods of the share's namespace that it governs, oldest first; a DRA-mode pod
        with its claim's placement."""
        if not self.governs(share):
            return []
        pods = governance.governed_pods(self._shares, self.kept_pods(), share)
        holders = self.claim_holders() if self.claim_holders is not None else None
        return with_claim_placements(pods, holders) if holders else pods

    def tenants_by_gpu(self) -> dict[tuple[str, str], list[PodFacts]]:
        """(node, GPU UUID) -> active pods placed on that GPU, DRA-mode pods included."""
        return governance.tenants_by_gpu(
            self.kept_pods(),
            holders=self.claim_holders() if self.claim_holders is not None else None,
            kept=self.kept_pod,
        )

    def node_info(self, name: str) -> NodeInfo | None:
        """What the operator reads of a node (any watched node, GPUs usable or not)."""
        return self._inventory.about.get(name)

    def node_infos(self) -> Mapping[str, NodeInfo]:
        return self._inventory.about

    def gpu_model(self, node: str | None, gpu_uuid: str | None) -> str | None:
        info = self._inventory.about.get(node) if node is not None else None
        if info is None or gpu_uuid is None:
            return None
        return info.gpu_models.get(gpu_uuid)

    def gpu_models(self) -> set[str]:
        """Every GPU model of the cluster's node inventories."""
        return {m for n in self._inventory.about.values() for m in n.gpu_models.values()}
