"""The controller's watches: nodes, pods, GpuShares and namespaces into its one view.

Each runs :mod:`gpushare.kube.informer` forever (list, then watch; re-list on errors and every
resync period), so a restarted controller rebuilds everything from the API server
(docs/architecture.md, "State of record").
"""

import logging
from collections.abc import Mapping
from typing import Any

from gpushare.cluster.state.view import ClusterView
from gpushare.kube.controller import Kube, Watched

log = logging.getLogger(__name__)


async def feed_nodes(kube: Kube, view: ClusterView, *, resync_seconds: float) -> None:
    def delete(data: Mapping[str, Any]) -> None:
        view.delete_node(str(data.get("metadata", {}).get("name", "")))

    await kube.inform(
        Watched.NODES,
        replace=view.replace_nodes,
        upsert=view.upsert_node,
        delete=delete,
        resync_seconds=resync_seconds,
    )


async def feed_pods(kube: Kube, view: ClusterView, *, resync_seconds: float) -> None:
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

    def delete(data: Mapping[str, Any]) -> None:
        meta = data.get("metadata", {})
        view.delete_pod(f"{meta.get('namespace', 'default')}/{meta.get('name', '')}")

    await kube.inform(
        Watched.PODS,
        replace=view.replace_pods,
        upsert=upsert,
        delete=delete,
        resync_seconds=resync_seconds,
    )


async def feed_shares(kube: Kube, view: ClusterView, *, resync_seconds: float) -> None:
    """GpuShare statuses for the extender's hold rule (gpushare.cluster.state.share_rules)."""
    await kube.inform(
        Watched.SHARES,
        replace=view.replace_shares,
        upsert=view.upsert_share,
        delete=view.delete_share,
        resync_seconds=resync_seconds,
    )


async def feed_namespaces(kube: Kube, view: ClusterView, *, resync_seconds: float) -> None:
    """Namespace labels an admin sets: sharing groups and neighbour-rule grants
    (gpushare.cluster.state.tenancy)."""
    await kube.inform(
        Watched.NAMESPACES,
        replace=view.replace_namespaces,
        upsert=view.upsert_namespace,
        delete=view.delete_namespace,
        resync_seconds=resync_seconds,
    )
