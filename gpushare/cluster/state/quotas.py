"""What a namespace's quota lets its pods be guaranteed: the hard limits of its ResourceQuotas
on ``gpushare.io/gpu-percent``, and the pods that hold guaranteed shares there.

The webhook swaps an opted-in pod's request to ``gpushare.io/opportunistic-gpu-percent``, which
a quota on ``gpu-percent`` does not count (issue 67: a tenant at its 100% quota held 400%
guaranteed, promoted as requests fitted, and locked another tenant off the node). So a pod
asking for the opportunistic resource is bound or promoted as a guaranteed share only while
its namespace's guaranteed shares, counted here, stay within every such quota; otherwise it
runs opportunistically, preemptible, holding no share (docs/security.md, "Opting in keeps to
the quota"). A pod under Kueue (label ``kueue.x-k8s.io/queue-name``) that asks for the
opportunistic resource was admitted against that resource's quota, never gpu-percent's: it is
never guaranteed a share.

A quota's scopes are not read: every ResourceQuota of the namespace that names the resource
bounds the guaranteed shares (stricter than the API server for scoped quotas, never looser).
"""

from collections.abc import Iterable, Mapping
from typing import Any

from gpushare.api.names import RESOURCE_GPU_PERCENT
from gpushare.api.quantities import kube_quantity
from gpushare.cluster.state.quarantine import Take, take_plainly

QUOTA_KEYS = (f"requests.{RESOURCE_GPU_PERCENT}", RESOURCE_GPU_PERCENT)
"""The keys of ``spec.hard`` that bound guaranteed GPU share (extended resources take the
``requests.`` form; the plain one is read too)."""
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def hard_of(quota: Mapping[str, Any]) -> tuple[str, int | None] | None:
    """(``namespace/name``, its bound on guaranteed GPU-percent or None) of a watched
    ResourceQuota; None when it has no name."""
    meta = quota.get("metadata")
    if not isinstance(meta, Mapping):
        return None
    name, namespace = meta.get("name"), meta.get("namespace")
    if not isinstance(name, str) or not isinstance(namespace, str):
        return None
    spec = quota.get("spec")
    hard = spec.get("hard") if isinstance(spec, Mapping) else None
    bound: int | None = None
    if isinstance(hard, Mapping):
        for key in QUOTA_KEYS:
            if key in hard:
                value = kube_quantity(hard[key])
                value = 0 if value is None else value  # unreadable: nothing is guaranteed
                bound = value if bound is None else min(bound, value)
    return f"{namespace}/{name}", bound


class GuaranteeQuotas:
    """ResourceQuotas' bounds on guaranteed GPU share, by namespace (fed by their watch)."""

    def __init__(self) -> None:
        self._bounds: dict[str, int] = {}
        """``namespace/name`` of each quota that names the resource -> its bound."""
        self._by_namespace: dict[str, int] = {}
        self.synced = False

    def hard(self, namespace: str) -> int | None:
        """The least bound of the namespace's quotas on guaranteed GPU-percent; None: none."""
        return self._by_namespace.get(namespace)

    def upsert(self, quota: Mapping[str, Any]) -> None:
        found = hard_of(quota)
        if found is None:
            return
        key, bound = found
        if bound is None:
            self._bounds.pop(key, None)
        else:
            self._bounds[key] = bound
        self._recount()

    def delete(self, quota: Mapping[str, Any]) -> None:
        found = hard_of(quota)
        if found is not None and self._bounds.pop(found[0], None) is not None:
            self._recount()

    def replace(self, quotas: Iterable[Mapping[str, Any]], *, take: Take = take_plainly) -> None:
        """A full list (``take``: the view's quarantine; one it holds out keeps its bound)."""
        before = self._bounds
        self._bounds = {}

        def take_in(quota: Mapping[str, Any]) -> None:
            found = hard_of(quota)
            if found is not None and found[1] is not None:
                self._bounds[found[0]] = found[1]

        for quota in quotas:
            if not take("ResourceQuota", quota, take_in):
                found = _key(quota)
                if found is not None and found in before:
                    self._bounds[found] = before[found]
        self.synced = True
        self._recount()

    def _recount(self) -> None:
        by_namespace: dict[str, int] = {}
        for key, bound in self._bounds.items():
            namespace = key.partition("/")[0]
            by_namespace[namespace] = min(bound, by_namespace.get(namespace, bound))
        self._by_namespace = by_namespace


def _key(quota: Mapping[str, Any]) -> str | None:
    meta = quota.get("metadata")
    if not isinstance(meta, Mapping):
        return None
    name, namespace = meta.get("name"), meta.get("namespace")
    return f"{namespace}/{name}" if isinstance(name, str) and isinstance(namespace, str) else None
