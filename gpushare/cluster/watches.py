"""The controller's watches: nodes, pods, GpuShares and namespaces into its one view.

Each runs :mod:`gpushare.kube.informer` forever (list, then watch; re-list on errors and every
resync period), so a restarted controller rebuilds everything from the API server
(docs/architecture.md, "State of record"). The process opens one watch per kind, and the
extender, the webhook and the operator all read the one view they feed; once the operator's
Kopf handlers watch GpuShares, the GpuShare informer stops and Kopf's events feed the view
(:class:`ShareHandoff`).
"""

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpushare.cluster.dra.allocator import ClaimAllocator
from gpushare.cluster.dra.devices import DraDevices
from gpushare.cluster.dra.templates import ClaimTemplates, TemplateKeeper
from gpushare.cluster.state.pods import pod_key
from gpushare.cluster.state.quarantine import Quarantine
from gpushare.cluster.state.view import ClusterView
from gpushare.kube.controller import Kube
from gpushare.kube.watching import Watched

log = logging.getLogger(__name__)


async def _watch(
    kube: Kube,
    what: Watched,
    quarantine: Quarantine,
    kind: str,
    *,
    replace: Callable[[Iterable[Mapping[str, Any]]], None],
    upsert: Callable[[Mapping[str, Any]], object],
    delete: Callable[[Mapping[str, Any]], None],
    resync_seconds: float,
    namespace: str | None = None,
) -> None:
    """``kube.inform`` for ``what``, each event through ``quarantine`` under ``kind``: one
    object the view cannot take is held out (gpushare.cluster.state.quarantine) until it is
    deleted, and the watch goes on."""

    def take(data: Mapping[str, Any]) -> object:
        return quarantine.take(kind, data, upsert)

    def forget(data: Mapping[str, Any]) -> None:
        quarantine.forget(kind, data)
        delete(data)

    await kube.inform(
        what,
        replace=replace,
        upsert=take,
        delete=forget,
        resync_seconds=resync_seconds,
        namespace=namespace,
    )


async def feed_nodes(kube: Kube, view: ClusterView, *, resync_seconds: float) -> None:
    def delete(data: Mapping[str, Any]) -> None:
        meta = data.get("metadata")
        view.delete_node(str(meta.get("name", "")) if isinstance(meta, Mapping) else "")

    await _watch(
        kube,
        Watched.NODES,
        view.quarantine,
        "Node",
        replace=view.replace_nodes,
        upsert=view.upsert_node,
        delete=delete,
        resync_seconds=resync_seconds,
    )


async def feed_pods(
    kube: Kube,
    view: ClusterView,
    *,
    resync_seconds: float,
    allocator: ClaimAllocator | None = None,
    keeper: TemplateKeeper | None = None,
) -> None:
    """Pods into the view; the view tells its pod listeners (the operator) what changed. With
    ``allocator`` (DRA mode, gpushare placement) every pod also goes to it: it keeps the pods
    gated for it. With ``keeper`` (``--annotation-mode=dra``) too: it makes the claim
    templates stored pods wait for."""

    def upsert(data: Mapping[str, Any]) -> None:
        f = view.upsert_pod(data)
        if f is not None and log.isEnabledFor(logging.DEBUG):
            log.debug(
                "pod event",
                extra={
                    "pod": f.key,
                    "node": f.node,
                    "phase": f.phase,
                    "state": f.placement.state if f.placement else None,
                    "awaiting": f.awaiting_allocation,
                },
            )
        if f is not None and f.problem is not None:
            log.warning("pod annotations unreadable", extra={"pod": f.key, "error": f.problem})
        if allocator is not None:
            allocator.pod_event(data)
        if keeper is not None:
            keeper.pod_event(data)

    def delete(data: Mapping[str, Any]) -> None:
        key = pod_key(data)  # the key the view keeps the pod under
        view.delete_pod(key)
        if allocator is not None:
            allocator.pod_gone(key, deleted=True)
        if keeper is not None:
            keeper.pod_gone(key)

    def replace(items: Iterable[Mapping[str, Any]]) -> None:
        listed = list(items)
        view.replace_pods(listed)
        if allocator is not None:
            allocator.pods_listed(listed)
        if keeper is not None:
            keeper.pods_listed(listed, take=view.quarantine.take)

    await _watch(
        kube,
        Watched.PODS,
        view.quarantine,
        "Pod",
        replace=replace,
        upsert=upsert,
        delete=delete,
        resync_seconds=resync_seconds,
    )


class ShareHandoff:
    """When the GpuShare informer may stop because the operator's Kopf watch feeds the view.

    Safe once Kopf has delivered a GpuShare event (its list has arrived, so its watch sees
    every later change), or, with the operator ready, while the view holds no GpuShare (a share
    created before Kopf lists is in its list; none can be deleted unseen). Until then both
    watches feed the view; their events agree.
    """

    def __init__(self, view: ClusterView) -> None:
        self._view = view
        self._kopf_listed = False
        self._operator_ready = False
        self.done = asyncio.Event()

    def kopf_event(self) -> None:
        self._kopf_listed = True
        self._check()

    def operator_ready(self) -> None:
        self._operator_ready = True
        self._check()

    def _check(self) -> None:
        if self.done.is_set():
            return
        if self._kopf_listed or (self._operator_ready and not self._view.share_statuses()):
            self.done.set()


async def feed_shares(
    kube: Kube,
    view: ClusterView,
    *,
    resync_seconds: float,
    handoff: ShareHandoff | None = None,
) -> None:
    """GpuShare statuses for the extender's hold rule (gpushare.cluster.state.share_rules),
    until ``handoff`` is done (then returns: the operator's Kopf watch feeds them)."""
    informer = asyncio.create_task(
        _watch(
            kube,
            Watched.SHARES,
            view.quarantine,
            "GpuShare",
            replace=view.replace_shares,
            upsert=view.upsert_share,
            delete=view.delete_share,
            resync_seconds=resync_seconds,
        )
    )
    if handoff is None:
        await informer
        return
    handed = asyncio.create_task(handoff.done.wait())
    try:
        await asyncio.wait({informer, handed}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (informer, handed):
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
    if informer.done() and not informer.cancelled():
        informer.result()  # the informer ended by itself: its error (or return) is the caller's
        return
    log.info("GpuShare watch handed to the operator (Kopf's events feed the view)")


async def feed_namespaces(kube: Kube, view: ClusterView, *, resync_seconds: float) -> None:
    """Namespace labels an admin sets: sharing groups, neighbour-rule grants and consent to
    GpuShare selectors (gpushare.cluster.state.tenancy)."""
    await _watch(
        kube,
        Watched.NAMESPACES,
        view.quarantine,
        "Namespace",
        replace=view.replace_namespaces,
        upsert=view.upsert_namespace,
        delete=view.delete_namespace,
        resync_seconds=resync_seconds,
    )


async def feed_quotas(kube: Kube, view: ClusterView, *, resync_seconds: float) -> None:
    """ResourceQuotas' bounds on guaranteed GPU share: an opted-in pod holds a guaranteed
    share only within them (gpushare.cluster.state.quotas)."""
    await _watch(
        kube,
        Watched.RESOURCE_QUOTAS,
        view.quarantine,
        "ResourceQuota",
        replace=lambda quotas: view.quotas.replace(quotas, take=view.quarantine.take),
        upsert=view.quotas.upsert,
        delete=view.quotas.delete,
        resync_seconds=resync_seconds,
    )


async def feed_claim_templates(
    kube: Kube, templates: ClaimTemplates, *, resync_seconds: float
) -> None:
    """ResourceClaimTemplates of gpushare's name form (``--annotation-mode=dra``): what the
    webhook checks a DRA-mode pod's template against and the keeper counts per namespace
    (gpushare.cluster.dra.templates)."""
    await _watch(
        kube,
        Watched.CLAIM_TEMPLATES,
        templates.quarantine,
        "ResourceClaimTemplate",
        replace=templates.replace,
        upsert=templates.upsert,
        delete=templates.delete,
        resync_seconds=resync_seconds,
    )


async def feed_dra(kube: Kube, devices: DraDevices, *, resync_seconds: float) -> None:
    """ResourceSlices and ResourceClaims into the DRA ledger the claim allocator places by
    (gpushare.cluster.dra.devices)."""
    await asyncio.gather(
        _watch(
            kube,
            Watched.RESOURCE_SLICES,
            devices.quarantine,
            "ResourceSlice",
            replace=devices.replace_slices,
            upsert=devices.upsert_slice,
            delete=devices.delete_slice,
            resync_seconds=resync_seconds,
        ),
        _watch(
            kube,
            Watched.RESOURCE_CLAIMS,
            devices.quarantine,
            "ResourceClaim",
            replace=devices.replace_claims,
            upsert=devices.upsert_claim,
            delete=devices.delete_claim,
            resync_seconds=resync_seconds,
        ),
    )


async def feed_agent_leases(
    kube: Kube, view: ClusterView, *, namespace: str, resync_seconds: float
) -> None:
    """The node agents' Leases of the release namespace: whose agent is alive
    (gpushare.cluster.state.agents). Other Leases there (leader election) are ignored."""
    await _watch(
        kube,
        Watched.LEASES,
        view.quarantine,
        "Lease",
        replace=view.replace_agent_leases,
        upsert=view.upsert_agent_lease,
        delete=view.delete_agent_lease,
        resync_seconds=resync_seconds,
        namespace=namespace,
    )


async def judge_agent_leases(view: ClusterView, *, every_s: float = 1.0) -> None:
    """Every ``every_s``: nodes whose agent's Lease expired stop getting pods (and get them
    again once it is renewed; a renewal seen by the watch revives a node at once)."""
    while True:
        await asyncio.sleep(every_s)
        view.check_agent_leases()
