"""Wiring the node exporter (``gpushare.node.exporter``) into the agent's process.

The agent owns the pieces the exporter reads: the GPU backend, the pods bound to this node,
the MPS daemons' status and the one consumer of the backend's health events. It hands them to
``gpushare.node.exporter.register`` (its collectors join the agent's registry on /metrics),
serves the exporter's ``/profile`` endpoint on the same HTTP server, and forwards every health
event to the exporter's recorder.
"""

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry

from gpushare.api.pod import PodInfo
from gpushare.node import exporter
from gpushare.node.exporter.server import profile_reply
from gpushare.node.gpu.backend import GpuBackend, HealthEvent
from gpushare.node.metrics import MetricsServer
from gpushare.node.mps.manager import MpsManager

log = logging.getLogger(__name__)


@dataclass
class ExporterHandle:
    """What the agent keeps of the exporter: where health events go, and how to stop it."""

    record_health: Callable[[HealthEvent], None]
    stop: Callable[[], None]


def wire_exporter(
    *,
    registry: CollectorRegistry,
    server: MetricsServer,
    backend: GpuBackend,
    node_name: str,
    pods: Callable[[], list[PodInfo]],
    mps: MpsManager,
    pod_resources_socket: Path | None,
    claim_placements: Callable[[], list[exporter.PodAllocation]] | None = None,
) -> ExporterHandle:
    """``pods``: the agent's projection of the pods bound to this node as of its last read;
    ``claim_placements``: DRA mode's pods, from the claims the agent prepared (their pods
    carry no placement annotations)."""

    def mps_status() -> dict[str, exporter.MpsDaemonStatus]:
        return {
            uuid: exporter.MpsDaemonStatus(up=status.up, clients=None)
            for uuid, status in mps.status().items()
        }

    poller = None
    if pod_resources_socket is not None:
        poller = exporter.PodResourcesPoller(socket_path=pod_resources_socket)
        poller.start()
    handle = exporter.register(
        registry,
        exporter.build_exporter(
            backend=backend,
            node_name=node_name,
            placements=lambda: [
                *exporter.allocations_from_pods(pods(), node_name=node_name),
                *(claim_placements() if claim_placements is not None else ()),
            ],
            mps_status=mps_status,
            pod_resources=poller,
        ),
    )

    server.add_route("/profile", lambda query: profile_reply(handle.profiler, query))

    def stop() -> None:
        handle.stop()
        if poller is not None:
            poller.stop()

    log.info("node exporter wired in: collectors on /metrics, profiler on /profile")
    return ExporterHandle(record_health=handle.health.record, stop=stop)
