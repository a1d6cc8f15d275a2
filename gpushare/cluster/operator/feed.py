"""The operator's picture of nodes and pods, fed by the controller's own watches.

Inside the controller the operator opens no watch of its own on nodes or pods: the process's
informers pass their raw objects here as well as to the controller's view (one list/watch per
kind per process, docs/architecture.md). The standalone operator (``python -m
gpushare.cluster.operator``) has no such informers and keeps Kopf's node and pod handlers.
"""

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpushare.cluster.operator.view import ClusterView, PodSummary

log = logging.getLogger(__name__)


class _Kind:
    """One kind's events into the view; ``listed`` once a full list arrived."""

    def __init__(
        self,
        put: Callable[..., Any],
        drop: Callable[[], None],
        on_change: Callable[[Any], None],
        listed: Callable[[], None],
    ) -> None:
        self._put = put
        self._drop = drop
        self._on_change = on_change
        self._listed = listed

    def replace(self, objects: Iterable[Mapping[str, Any]]) -> None:
        self._drop()
        for obj in objects:
            self._put(obj)
        self._listed()

    def upsert(self, obj: Mapping[str, Any]) -> None:
        self._on_change(self._put(obj))

    def delete(self, obj: Mapping[str, Any]) -> None:
        self._on_change(self._put(obj, deleted=True))


class OperatorFeed:
    """Node and pod events for the operator's :class:`ClusterView`.

    ``synced`` is set once both kinds were listed in full: before that the operator acts on
    nothing (after a restart, a pod not yet seen again must not read as a deleted one).
    ``kick`` (set when the operator runs) reconciles the GpuShare governing a changed pod.
    """

    def __init__(self, view: ClusterView | None = None) -> None:
        self.view = view if view is not None else ClusterView()
        self.synced = asyncio.Event()
        self.kick: Callable[[str], None] | None = None
        self._listed: set[str] = set()
        self.nodes = _Kind(
            self.view.put_node,
            self.view.nodes.clear,
            lambda _node: None,
            lambda: self._mark_listed("nodes"),
        )
        self.pods = _Kind(
            self.view.put_pod,
            self.view.pods.clear,
            self._pod_changed,
            lambda: self._mark_listed("pods"),
        )

    def _mark_listed(self, kind: str) -> None:
        self._listed.add(kind)
        if self._listed >= {"nodes", "pods"} and not self.synced.is_set():
            self.synced.set()
            log.info(
                "operator view listed",
                extra={"pods": len(self.view.pods), "nodes": len(self.view.nodes)},
            )

    def _pod_changed(self, pod: PodSummary) -> None:
        if self.kick is None or not pod.gpu_pod:
            return
        share = self.view.share_of(pod)
        if share is not None:
            self.kick(share.key)
