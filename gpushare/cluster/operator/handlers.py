"""Kopf registrations only: each handler is a few lines delegating to the domain modules.

Registered into a registry of our own (never Kopf's global one), so the operator can run
inside the controller process next to other asyncio servers, and tests can build it twice.
"""

import dataclasses
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

import kopf

from gpushare.api.gpushare_crd import PLURAL
from gpushare.api.names import GROUP, VERSION
from gpushare.cluster.operator.reconcile import ShareReconciler
from gpushare.cluster.operator.settings import OperatorConfig
from gpushare.cluster.operator.share_status import utcnow
from gpushare.cluster.state.pods import pod_key
from gpushare.cluster.state.shares import share_summary
from gpushare.cluster.state.view import ClusterView

log = logging.getLogger(__name__)

FINALIZER = f"{GROUP}/finalizer"
STORAGE_PREFIX = GROUP


def kopf_settings(config: OperatorConfig) -> kopf.OperatorSettings:
    """Own finalizer and progress storage under gpushare.io; Kopf's own per-handler Events
    only for warnings (ours say what happened in the user's terms)."""
    settings = kopf.OperatorSettings()
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=STORAGE_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=STORAGE_PREFIX, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    settings.peering.standalone = config.standalone
    # Kopf would SIGKILL the whole process if cancelled without its stop flag; inside the
    # controller (or a test) a cancelled operator must just stop.
    settings.process.ultimate_exiting_timeout = None
    return settings


def in_cluster_server(info: kopf.ConnectionInfo, environ: Mapping[str, str]) -> kopf.ConnectionInfo:
    """Kopf's service-account login names the API server ``kubernetes.default.svc``, which
    needs cluster DNS; like client-go's in-cluster config, use the Service address the kubelet
    puts in every pod's environment when it is there (clusters without DNS, the local one)."""
    host = environ.get("KUBERNETES_SERVICE_HOST")
    port = environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        return info
    if ":" in host:  # IPv6
        host = f"[{host}]"
    return dataclasses.replace(info, server=f"https://{host}:{port}")


def build_registry(
    *,
    config: OperatorConfig,
    view: ClusterView,
    reconciler: ShareReconciler,
    watch_nodes_and_pods: bool = True,
    on_share_event: Callable[[], None] | None = None,
) -> kopf.OperatorRegistry:
    """Kopf's GpuShare events feed ``view``, and with ``watch_nodes_and_pods`` (the standalone
    operator) its node and pod events too; else the host process's informers feed those
    (:mod:`gpushare.cluster.watches`). ``on_share_event()``: called after each GpuShare event
    went into the view (the controller's hand-over of its GpuShare watch)."""
    registry = kopf.OperatorRegistry()
    take = _taker(view)
    _register_login(registry)
    if watch_nodes_and_pods:
        _register_nodes_and_pods(registry, view, take)
    _register_share_events(registry, view, reconciler, take, on_share_event)
    _register_share_life_cycle(registry, config, view, reconciler, take)
    return registry


Take = Callable[[str, kopf.Body, Callable[[Any], Any]], Any]
"""``take(kind, body, upsert)``: ``upsert(body)`` through the view's quarantine."""


def _taker(view: ClusterView) -> Take:
    def take(kind: str, body: kopf.Body, upsert: Callable[[Any], Any]) -> Any:
        """``upsert(body)`` through the view's quarantine, as the controller's own watches do:
        an object the view cannot take is held out with its Event and metric, never raised
        into Kopf (gpushare.cluster.state.quarantine). Its result, or None when held out."""
        taken: list[Any] = []
        view.quarantine.take(kind, body, lambda obj: taken.append(upsert(obj)))
        return taken[0] if taken else None

    return take


def _register_login(registry: kopf.OperatorRegistry) -> None:
    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        """$KUBECONFIG first (tests, development), else the pod's service account."""
        if os.environ.get("KUBECONFIG"):
            return kopf.login_with_kubeconfig(**kwargs)
        info = kopf.login_with_service_account(**kwargs)
        if info is None:
            return kopf.login_with_kubeconfig(**kwargs)
        return in_cluster_server(info, os.environ)


def _register_nodes_and_pods(
    registry: kopf.OperatorRegistry, view: ClusterView, take: Take
) -> None:
    """The standalone operator's node and pod events into ``view``."""

    @kopf.on.event("", "v1", "nodes", registry=registry)
    async def node_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        if event.get("type") == "DELETED":
            view.delete_node(str(body.get("metadata", {}).get("name", "")))
        else:
            take("Node", body, view.upsert_node)

    @kopf.on.event("", "v1", "pods", registry=registry)
    async def pod_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        # The view tells the reconciler (its pod listener) about governed pods.
        if event.get("type") == "DELETED":
            view.delete_pod(pod_key(body))
        else:
            take("Pod", body, view.upsert_pod)


def _register_share_events(
    registry: kopf.OperatorRegistry,
    view: ClusterView,
    reconciler: ShareReconciler,
    take: Take,
    on_share_event: Callable[[], None] | None,
) -> None:
    """Every GpuShare event into ``view``, and a reconcile of the share it names."""

    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    async def share_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        if event.get("type") == "DELETED":
            view.delete_share(body)
            share = None
        else:
            share = take("GpuShare", body, view.upsert_share)
        if on_share_event is not None:
            on_share_event()
        if share is not None:
            reconciler.kick(share.key)


def _register_share_life_cycle(
    registry: kopf.OperatorRegistry,
    config: OperatorConfig,
    view: ClusterView,
    reconciler: ShareReconciler,
    take: Take,
) -> None:
    """Accept a created share, re-validate a changed spec, reconcile on a timer, release on
    deletion. Each handler keeps its explicit id: Kopf records progress under it."""
    shares = (GROUP, VERSION, PLURAL)

    @kopf.on.create(*shares, id="accept", registry=registry)
    async def accept(body: kopf.Body, **_: Any) -> None:
        share = share_summary(body)

        @kopf.subhandler(id="status")
        async def status(**_: Any) -> None:
            if await reconciler.validate(share, now=utcnow()) is None:
                raise kopf.TemporaryError("status changed meanwhile; retrying", delay=1)

        @kopf.subhandler(id="announce")
        async def announce(**_: Any) -> None:
            await reconciler.announce(share)

    @kopf.on.update(*shares, field="spec", id="respec", registry=registry)
    async def respec(body: kopf.Body, **_: Any) -> None:
        share = share_summary(body)
        changed = await reconciler.validate(share, now=utcnow())
        if changed is None:
            raise kopf.TemporaryError("status changed meanwhile; retrying", delay=1)
        if changed:
            await reconciler.announce(share)

    @kopf.timer(*shares, interval=config.reconcile_interval_s, id="reconcile", registry=registry)
    async def tick(body: kopf.Body, **_: Any) -> None:
        share = take("GpuShare", body, view.upsert_share) or share_summary(body)
        try:
            await reconciler.reconcile(share.key)
        except Exception as exc:
            raise kopf.TemporaryError(f"{exc}", delay=config.reconcile_interval_s) from exc

    @kopf.on.delete(*shares, id="release", registry=registry)
    async def release(body: kopf.Body, **_: Any) -> None:
        await reconciler.release_all(share_summary(body))
