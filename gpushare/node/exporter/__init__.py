"""Node exporter: per-pipe GPU counters, allocations, per-pod memory, MPS and XID metrics, and
the profiler endpoint the operator reads job profiles from.

The node agent wires it in with one call::

    exporter = gpushare.node.exporter.register(
        registry,                       # the agent's CollectorRegistry served on /metrics
        build_exporter(
            backend=backend,            # the GpuBackend the agent opened
            node_name=node_name,
            # pods(): the agent's PodInfo of each pod bound to the node (node.core.pods)
            placements=lambda: allocations_from_pods(pods(), node_name=node_name),
            mps_status=mps_manager.status,  # optional: uuid -> MpsDaemonStatus
        ),
    )
    server.add_route("/profile", lambda q: profile_reply(exporter.profiler, q))  # MetricsServer
    ...  # in the health loop: exporter.health.record(event) for every HealthEvent
    exporter.stop()                     # at shutdown
"""

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.registry import Collector

from gpushare.node.core.allocations import PodAllocation
from gpushare.node.exporter.allocations import allocation_from_pod, allocations_from_pods
from gpushare.node.exporter.collector import GpuShareCollector, MpsDaemonStatus
from gpushare.node.exporter.health import HealthRecorder
from gpushare.node.exporter.podresources import ContainerDevices, PodResourcesPoller
from gpushare.node.exporter.profiler import Profiler, pipe_profile_from_json
from gpushare.node.exporter.sampler import GpmSampler, SamplerSettings
from gpushare.node.gpu.backend import GpuBackend

__all__ = [
    "ContainerDevices",
    "Exporter",
    "GpmSampler",
    "GpuShareCollector",
    "HealthRecorder",
    "MpsDaemonStatus",
    "PodAllocation",
    "PodResourcesPoller",
    "Profiler",
    "SamplerSettings",
    "allocation_from_pod",
    "allocations_from_pods",
    "build_exporter",
    "pipe_profile_from_json",
    "register",
]


@dataclass
class Exporter:
    """The exporter's parts; the sampler thread runs between ``start`` and ``stop``."""

    sampler: GpmSampler
    collector: GpuShareCollector
    profiler: Profiler
    health: HealthRecorder

    def collectors(self) -> list[Collector]:
        return [self.collector]

    def start(self) -> None:
        self.sampler.start()

    def stop(self) -> None:
        self.sampler.stop()


def build_exporter(
    *,
    backend: GpuBackend,
    node_name: str,
    placements: Callable[[], Iterable[PodAllocation]],
    mps_status: Callable[[], Mapping[str, MpsDaemonStatus]] | None = None,
    pod_resources: Callable[[], Sequence[ContainerDevices]] | None = None,
    settings: SamplerSettings | None = None,
    health: HealthRecorder | None = None,
) -> Exporter:
    """Create the sampler, collector and profiler over one backend (nothing started)."""
    sampler = GpmSampler(backend=backend, settings=settings)
    recorder = health or HealthRecorder()
    collector = GpuShareCollector(
        node_name=node_name,
        sampler=sampler,
        placements=placements,
        mps_status=mps_status,
        health=recorder,
        pod_resources=pod_resources,
    )
    return Exporter(
        sampler=sampler, collector=collector, profiler=Profiler(sampler=sampler), health=recorder
    )


def register(registry: CollectorRegistry, exporter: Exporter, *, start: bool = True) -> Exporter:
    """Register the exporter's collectors in ``registry`` and start sampling."""
    for collector in exporter.collectors():
        registry.register(collector)
    if start:
        exporter.start()
    return exporter
