"""The profile cache ConfigMap as the reconciler reads and writes it (:mod:`.cache` decides what
an entry is, which matches and which go): the entries of a share's tenancy only, and a write
that fails loses that entry, never the share's profile (docs/operator.md, "The profile cache")."""

import logging

from gpushare.api.profile import GpuProfile
from gpushare.cluster.operator import cache
from gpushare.cluster.operator.settings import OperatorConfig
from gpushare.cluster.state.pod_facts import PodFacts
from gpushare.cluster.state.shares import ShareSummary
from gpushare.cluster.state.view import ClusterView
from gpushare.kube.operator import KubeApi

log = logging.getLogger(__name__)


class ProfileCacheStore:
    def __init__(self, *, config: OperatorConfig, kube: KubeApi, view: ClusterView) -> None:
        self.config, self.kube, self.view = config, kube, view

    def tenancy(self, namespace: str) -> str:
        """Whose profiles a share of ``namespace`` reads and writes: its sharing group's, else
        its own (also when the tenancy boundary is off: sizing is a tenant's own)."""
        return self.view.tenancies.tenancy(namespace) or namespace

    async def lookup(self, share: ShareSummary, pod: PodFacts) -> GpuProfile | None:
        """The newest profile of ``pod``'s workload its share's tenancy measured on a GPU
        model the cluster has."""
        models = self.view.gpu_models()
        if not models:
            return None
        data = await self.kube.read_configmap(
            namespace=self.config.namespace, name=self.config.cache_configmap
        )
        return cache.lookup(
            data,
            image=pod.image,
            command=pod.command,
            gpu_models=models,
            tenancy=self.tenancy(share.namespace),
        )

    async def remember(self, share: ShareSummary, pod: PodFacts, profile: GpuProfile) -> None:
        """Store ``profile`` of ``pod`` under its share's tenancy, dropping what the bounds
        say; a failed write is logged."""
        tenancy = self.tenancy(share.namespace)
        key = cache.cache_key(
            image=pod.image, command=pod.command, gpu_model=profile.gpu_model, tenancy=tenancy
        )
        entry = cache.CacheEntry(pod.image, pod.command, profile.gpu_model, profile, tenancy)
        try:
            await self._write(key, cache.encode_entry(entry))
        except Exception as exc:  # the share's own profile is kept whatever the cache does
            log.warning("profile cache not written", extra={"share": share.key, "error": str(exc)})

    async def _write(self, key: str, value: str) -> None:
        ns, name = self.config.namespace, self.config.cache_configmap
        data = await self.kube.read_configmap(namespace=ns, name=name)
        entries: dict[str, str | None] = {key: value}
        for old in cache.evictable_keys(
            {**data, key: value},
            keep=self.config.cache_max_entries,
            per_tenancy=self.config.cache_per_tenancy,
        ):
            entries[old] = None
        await self.kube.put_configmap_entries(namespace=ns, name=name, entries=entries)
