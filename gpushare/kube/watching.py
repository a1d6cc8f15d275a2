"""List + watch of the kinds the controller keeps in its view, into callbacks
(:func:`gpushare.kube.informer.inform`): through :class:`~gpushare.kube.raw.RawApi` (plain
dicts decoded by msgspec) where the kubeconfig allows it, else lightkube's AsyncClient."""

import enum
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from lightkube import ALL_NS, AsyncClient
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Namespace, Node, Pod, ResourceQuota

from gpushare.kube.errors import translated
from gpushare.kube.informer import Objects, inform
from gpushare.kube.raw import RawApi
from gpushare.kube.resources import (
    GpuShareResource,
    ResourceClaimResource,
    ResourceClaimTemplateResource,
    ResourceSliceResource,
)


class Watched(enum.Enum):
    """What the controller watches."""

    NODES = "nodes"
    PODS = "pods"
    SHARES = "gpushares"
    NAMESPACES = "namespaces"
    RESOURCE_SLICES = "resourceslices"
    RESOURCE_CLAIMS = "resourceclaims"
    CLAIM_TEMPLATES = "resourceclaimtemplates"
    LEASES = "leases"
    """Of one namespace (the release's): the node agents' Leases (gpushare.api.agent_lease)."""
    RESOURCE_QUOTAS = "resourcequotas"
    """Their bounds on guaranteed GPU share (gpushare.cluster.state.quotas)."""


_WATCHED: dict[Watched, tuple[Any, bool, str | None]] = {
    Watched.NODES: (Node, False, "/api/v1/nodes"),
    Watched.PODS: (Pod, True, "/api/v1/pods"),
    Watched.SHARES: (GpuShareResource, True, None),
    Watched.NAMESPACES: (Namespace, False, "/api/v1/namespaces"),
    Watched.RESOURCE_SLICES: (
        ResourceSliceResource,
        False,
        "/apis/resource.k8s.io/v1/resourceslices",
    ),
    Watched.RESOURCE_CLAIMS: (
        ResourceClaimResource,
        True,
        "/apis/resource.k8s.io/v1/resourceclaims",
    ),
    Watched.CLAIM_TEMPLATES: (
        ResourceClaimTemplateResource,
        True,
        "/apis/resource.k8s.io/v1/resourceclaimtemplates",
    ),
    Watched.LEASES: (Lease, True, None),
    Watched.RESOURCE_QUOTAS: (ResourceQuota, True, "/api/v1/resourcequotas"),
}
"""Each kind: lightkube resource, namespaced, path for the raw (msgspec) watch."""


class Watching:
    """Informers over one client (and its RawApi, when there is one)."""

    def __init__(self, client: AsyncClient, raw: RawApi | None) -> None:
        self._client, self._raw = client, raw

    async def inform(
        self,
        kind: Watched,
        *,
        replace: Callable[[Objects], None],
        upsert: Callable[[Mapping[str, Any]], object],
        delete: Callable[[Mapping[str, Any]], None],
        resync_seconds: float,
        namespace: str | None = None,
    ) -> None:
        """:func:`~gpushare.kube.informer.inform` for ``kind``, in every namespace for
        namespaced kinds (lightkube's default is the kubeconfig's namespace only), or in
        ``namespace`` only (lightkube's client then, not the raw path)."""
        res, namespaced, raw_path = _WATCHED[kind]
        raw = self._raw if raw_path is not None and namespace is None else None
        scope: dict[str, Any] = {"namespace": namespace or ALL_NS} if namespaced else {}

        async def list_all() -> tuple[list[dict[str, Any]], str]:
            return await self._list(res, scope=scope, raw=raw, raw_path=raw_path)

        def watch(version: str, timeout_seconds: int) -> AsyncIterator[tuple[str, dict[str, Any]]]:
            return self._watch(
                res, version, timeout_seconds, scope=scope, raw=raw, raw_path=raw_path
            )

        await inform(
            res.__name__,
            list_all=list_all,
            watch=watch,
            replace=replace,
            upsert=upsert,
            delete=delete,
            resync_seconds=resync_seconds,
        )

    async def _list(
        self, res: Any, *, scope: dict[str, Any], raw: RawApi | None, raw_path: str | None
    ) -> tuple[list[dict[str, Any]], str]:
        what = f"list {res.__name__}"
        with translated(what):
            if raw is not None and raw_path is not None:
                return await raw.list(raw_path, what=what)
            listing = self._client.list(res, chunk_size=500, **scope)
            items: list[dict[str, Any]] = [obj.to_dict() async for obj in listing]
            return items, str(listing.resourceVersion)

    async def _watch(
        self,
        res: Any,
        version: str,
        timeout_seconds: int,
        *,
        scope: dict[str, Any],
        raw: RawApi | None,
        raw_path: str | None,
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        what = f"watch {res.__name__}"
        with translated(what):
            if raw is not None and raw_path is not None:
                async for event, data in raw.watch(
                    raw_path, resource_version=version, timeout_seconds=timeout_seconds, what=what
                ):
                    yield event, data
                return
            async for event, obj in self._client.watch(
                res, resource_version=version, server_timeout=timeout_seconds, **scope
            ):
                yield event, obj.to_dict()
