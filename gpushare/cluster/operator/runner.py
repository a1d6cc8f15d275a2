"""Start the operator inside an existing event loop (the controller's) or on its own.

``run_operator`` returns when Kopf stops (``stop_flag`` set, or SIGINT/SIGTERM when it runs
in the main thread), after stopping the protection loop and closing its clients.
"""

import asyncio
import getpass
import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path

import kopf
from prometheus_client import CollectorRegistry

from gpushare.cluster import watches
from gpushare.cluster.dra.devices import DraDevices
from gpushare.cluster.operator.guard import LatencyGuard
from gpushare.cluster.operator.handlers import build_registry, kopf_settings
from gpushare.cluster.operator.profiler_client import ProfilerClient
from gpushare.cluster.operator.reconcile import ShareReconciler
from gpushare.cluster.operator.settings import OperatorConfig
from gpushare.cluster.state.view import ClusterView
from gpushare.kube.controller import Kube
from gpushare.kube.operator import FIELD_MANAGER, KubeApi

log = logging.getLogger(__name__)

CLAIMS_RESYNC_S = 300.0
"""How often the standalone operator's claim watches list again (the controller's default)."""


async def run_operator(
    *,
    view: ClusterView | None = None,
    kube: Kube | None = None,
    host_watches: bool = False,
    settings: OperatorConfig | None = None,
    registry: CollectorRegistry | None = None,
    stop_flag: asyncio.Event | None = None,
    ready_flag: asyncio.Event | None = None,
    on_share_event: Callable[[], None] | None = None,
) -> None:
    """Run Kopf (cluster-wide) plus the latency protection loop until stopped. ``view``: the
    cluster state it reads (the controller's, else its own); ``kube``: the host's API client
    (else its own); ``host_watches``: the host's informers feed ``view`` with nodes and pods
    (else Kopf watches them, listed once at start). Kopf's GpuShare events always feed ``view``,
    ``on_share_event`` called after each; ``registry``: the protection counter's metrics."""
    config = settings or OperatorConfig()
    state = view if view is not None else ClusterView()
    own_client = None if kube else Kube.connect(kubeconfig=None, field_manager=FIELD_MANAGER)
    client = kube or own_client
    assert client is not None
    api = client.operator_api()
    profiler = _profiler(config)
    reconciler = ShareReconciler(config=config, kube=api, view=state, profiler=profiler)
    state.pod_listeners.append(reconciler.pod_changed)
    ready = ready_flag if ready_flag is not None else asyncio.Event()
    guard = _guard(
        config, api=api, state=state, profiler=profiler, registry=registry, synced=reconciler.synced
    )
    tasks = _side_tasks(
        config,
        state,
        client=client,
        reconciler=reconciler,
        guard=guard,
        ready=ready,
        host_watches=host_watches,
    )
    ensure_peering_identity()
    try:
        # In the main thread Kopf takes over SIGINT/SIGTERM; when it stops on one while
        # embedded, pass the stop on to the host process through its stop flag.
        kopf_registry = build_registry(
            config=config,
            view=state,
            reconciler=reconciler,
            watch_nodes_and_pods=not host_watches,
            on_share_event=on_share_event,
        )
        await _kopf(config, kopf_registry, stop_flag=stop_flag, ready=ready)
        if stop_flag is not None and not stop_flag.is_set():
            log.info("operator stopped on a signal; stopping the process")
            stop_flag.set()
            await asyncio.Event().wait()  # the host cancels us while it shuts down
    finally:
        state.pod_listeners.remove(reconciler.pod_changed)
        await _stop(tasks, reconciler, profiler, own_client)


def _profiler(config: OperatorConfig) -> ProfilerClient:
    """The client of the node agents' ``/profile``, with the token it presents."""
    return ProfilerClient(
        url_template=config.agent_url,
        timeout_s=config.agent_timeout_s,
        token_file=Path(config.agent_token_file) if config.agent_token_file else None,
    )


async def _stop(
    tasks: list[asyncio.Task[None]],
    reconciler: ShareReconciler,
    profiler: ProfilerClient,
    own_client: Kube | None,
) -> None:
    """Cancel the side tasks, then close what the operator opened (its own client last)."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await reconciler.close()
    await profiler.close()
    if own_client is not None:
        await own_client.close()


def _guard(
    config: OperatorConfig,
    *,
    api: KubeApi,
    state: ClusterView,
    profiler: ProfilerClient,
    registry: CollectorRegistry | None,
    synced: asyncio.Event,
) -> LatencyGuard | None:
    """The latency protection loop's guard, when protection is on."""
    if not config.protection:
        return None
    return LatencyGuard.with_default_model(
        config=config,
        kube=api,
        view=state,
        profiler=profiler,
        registry=registry,
        synced=synced,
    )


async def _kopf(
    config: OperatorConfig,
    registry: kopf.OperatorRegistry,
    *,
    stop_flag: asyncio.Event | None,
    ready: asyncio.Event,
) -> None:
    """Kopf itself, watching the namespaces ``config`` names (all when none)."""
    await kopf.operator(
        registry=registry,
        settings=kopf_settings(config),
        clusterwide=not config.watch_namespaces,
        namespaces=list(config.watch_namespaces),
        standalone=config.standalone,
        stop_flag=stop_flag,
        ready_flag=ready,
    )


def _side_tasks(
    config: OperatorConfig,
    state: ClusterView,
    *,
    client: Kube,
    reconciler: ShareReconciler,
    guard: LatencyGuard | None,
    host_watches: bool,
    ready: asyncio.Event,
) -> list[asyncio.Task[None]]:
    """What runs beside Kopf: the readiness log, the first listing of pods (without the host's
    watches), the standalone operator's claim watches and the latency protection loop."""

    async def announce_ready() -> None:
        await ready.wait()
        scope = ", ".join(config.watch_namespaces) or "the whole cluster"
        log.info("gpushare operator ready, watching %s", scope)

    tasks = [asyncio.create_task(announce_ready(), name="gpushare-operator-ready")]
    if not host_watches:
        tasks.append(asyncio.create_task(reconciler.seed(), name="gpushare-operator-seed"))
    if config.dra_claims and state.claim_holders is None:
        devices = DraDevices()
        state.claim_holders = devices.holders
        feeding = watches.feed_dra(client, devices, resync_seconds=CLAIMS_RESYNC_S)
        tasks.append(asyncio.create_task(feeding, name="gpushare-operator-claims"))
    if guard is not None:
        tasks.append(asyncio.create_task(guard.run(), name="gpushare-latency-guard"))
    return tasks


def ensure_peering_identity() -> None:
    """Give Kopf an identity it can name without a passwd entry.

    Kopf names the operator ``<user>@<host>`` from ``getpass.getuser()`` unless ``POD_ID`` is
    set; in a container running as a UID with no passwd entry (the chart's 65532) that lookup
    raises KeyError and the operator dies at start.
    """
    if os.environ.get("POD_ID"):
        return
    try:
        getpass.getuser()
    except (KeyError, OSError):
        os.environ["POD_ID"] = f"gpushare-controller@{socket.gethostname()}/{os.getpid()}"
