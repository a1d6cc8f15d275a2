"""The exporter as Prometheus sees it: what a scrape of a node with simulated GPUs returns."""

from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpushare.api.profile import PIPES
from gpushare.node.exporter import (
    HealthRecorder,
    MpsDaemonStatus,
    PodAllocation,
    SamplerSettings,
    build_exporter,
)
from gpushare.node.gpu.backend import HealthEvent
from gpushare.node.gpu.simulated import SimulatedBackend

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def scrape(registry: CollectorRegistry) -> Series:
    text = generate_latest(registry).decode()
    series: Series = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            series[(s.name, frozenset(s.labels.items()))] = s.value
    return series


def values(series: Series, name: str, **labels: str) -> list[float]:
    want = set(labels.items())
    return [v for (n, ls), v in series.items() if n == name and want <= ls]


def alloc(
    name: str, uuids: tuple[str, ...], ratio: float, *, uid: str = "", threads: int = 0
) -> PodAllocation:
    return PodAllocation(
        namespace="ml",
        name=name,
        uid=uid or f"uid-{name}",
        gpu_uuids=uuids,
        compute_ratio=ratio,
        thread_percent=threads or round(ratio * 100),
        memory_limit_bytes=4 * 2**30,
    )


def make(
    spec: str = "2xH100-80GB",
    *,
    placements: Callable[[], list[PodAllocation]] | None = None,
    clock: Clock | None = None,
    mps: dict[str, MpsDaemonStatus] | None = None,
    health: HealthRecorder | None = None,
) -> tuple[SimulatedBackend, CollectorRegistry, Callable[[], None]]:
    backend = SimulatedBackend(spec, node_name="node-a")
    exporter = build_exporter(
        backend=backend,
        node_name="node-a",
        placements=placements or (lambda: []),
        mps_status=(lambda: mps) if mps is not None else None,
        settings=SamplerSettings(interval_s=1.0),
        health=health,
    )
    if clock is not None:
        exporter.sampler._clock = clock
    registry = CollectorRegistry()
    registry.register(exporter.collector)
    return backend, registry, exporter.sampler.sample_once


def test_pipe_load_shows_up_on_its_gpu_and_pipe_only() -> None:
    backend, registry, sample = make()
    gpu0, gpu1 = (g.uuid for g in backend.inventory())
    backend.set_load(
        gpu0, pipes={"fp64": 0.9, "tensor_dmma": 0.4}, sm_occupancy=0.5, memory_used_bytes=2**30
    )
    sample()
    series = scrape(registry)
    ratio = "gpushare_gpu_pipe_utilization_ratio"
    assert values(series, ratio, gpu_uuid=gpu0, pipe="fp64") == [pytest.approx(0.9)]
    assert values(series, ratio, gpu_uuid=gpu0, pipe="tensor_dmma") == [pytest.approx(0.4)]
    assert values(series, ratio, gpu_uuid=gpu0, pipe="fp16") == [0.0]
    assert values(series, ratio, gpu_uuid=gpu1, pipe="fp64") == [0.0]
    assert values(series, "gpushare_gpu_sm_occupancy_ratio", gpu_uuid=gpu0) == [0.5]
    assert values(series, "gpushare_gpu_memory_used_bytes", gpu_uuid=gpu0) == [2**30]
    assert {dict(ls)["pipe"] for (n, ls) in series if n == ratio} == set(PIPES)


def test_every_series_says_simulated() -> None:
    backend, registry, sample = make(
        placements=lambda: [alloc("a", (backend.inventory()[0].uuid,), 0.25)]
    )
    sample()
    series = scrape(registry)
    assert len(series) > 50
    unlabelled = [n for (n, ls) in series if ("simulated", "true") not in ls]
    assert unlabelled == []


def test_pod_that_left_leaves_no_series_at_the_next_scrape() -> None:
    pods: list[PodAllocation] = []
    backend, registry, sample = make(placements=lambda: list(pods))
    gpu0 = backend.inventory()[0].uuid
    pods.extend([alloc("a", (gpu0,), 0.25), alloc("b", (gpu0,), 0.5)])
    sample()
    first = scrape(registry)
    assert values(first, "gpushare_pod_gpu_allocated_compute_ratio", pod="a") == [0.25]
    assert values(first, "gpushare_gpu_pods", gpu_uuid=gpu0) == [2]
    pods.pop(0)
    second = scrape(registry)
    assert values(second, "gpushare_pod_gpu_allocated_compute_ratio", pod="a") == []
    assert values(second, "gpushare_pod_gpu_active_thread_ratio", pod="a") == []
    assert values(second, "gpushare_gpu_pods", gpu_uuid=gpu0) == [1]


def test_allocated_compute_adds_fractions_and_counts_multi_gpu_pods_whole() -> None:
    holder: list[PodAllocation] = []
    backend, registry, sample = make(placements=lambda: holder)
    gpu0, gpu1 = (g.uuid for g in backend.inventory())
    holder.extend(
        [
            alloc("quarter", (gpu0,), 0.25),
            alloc("half", (gpu0,), 0.5, threads=60),
            alloc("two-gpus", (gpu0, gpu1), 1.0),
        ]
    )
    sample()
    series = scrape(registry)
    assert values(series, "gpushare_gpu_allocated_compute_ratio", gpu_uuid=gpu0) == [1.75]
    assert values(series, "gpushare_gpu_allocated_compute_ratio", gpu_uuid=gpu1) == [1.0]
    assert values(series, "gpushare_gpu_allocated_memory_bytes", gpu_uuid=gpu0) == [12 * 2**30]
    assert values(series, "gpushare_pod_gpu_active_thread_ratio", pod="half") == [0.6]
    # Limits may overlap: 25% + 60% + 100% of threads on a GPU with 175% guaranteed.
    assert values(series, "gpushare_gpu_limit_compute_ratio", gpu_uuid=gpu0) == [1.85]
    assert len(values(series, "gpushare_pod_gpu_allocated_compute_ratio", pod="two-gpus")) == 2


def test_stale_reading_is_reported_unavailable_never_zero() -> None:
    clock = Clock()
    backend, registry, sample = make(clock=clock)
    gpu0 = backend.inventory()[0].uuid
    backend.set_load(gpu0, pipes={"fp32": 0.7}, sm_occupancy=0.3, memory_used_bytes=0)
    sample()
    assert values(scrape(registry), "gpushare_gpu_pipe_utilization_ratio", pipe="fp32")
    clock.now += 60  # the sampler stopped (hung NVML): nothing fresh for a minute
    series = scrape(registry)
    assert values(series, "gpushare_gpu_pipe_utilization_ratio") == []
    assert values(series, "gpushare_gpu_sm_occupancy_ratio") == []
    available = values(
        series,
        "gpushare_gpu_metric_available",
        gpu_uuid=gpu0,
        metric="gpushare_gpu_pipe_utilization_ratio",
    )
    assert available == [0.0] * len(PIPES)
    assert values(series, "gpushare_exporter_sample_age_seconds", gpu_uuid=gpu0) == [60.0]
    # Inventory-derived facts stay: the GPU is still there.
    assert values(series, "gpushare_gpu_memory_total_bytes", gpu_uuid=gpu0)


def test_gpu_without_gpm_reports_pipes_unavailable() -> None:
    """A100s have no GPM: pipe series are absent and flagged 0, NVML utilization is still there."""
    backend, registry, sample = make("1xA100-80GB")
    gpu = backend.inventory()[0].uuid
    sample()
    series = scrape(registry)
    assert values(series, "gpushare_gpu_pipe_utilization_ratio", gpu_uuid=gpu) == []
    flags = values(
        series,
        "gpushare_gpu_metric_available",
        gpu_uuid=gpu,
        metric="gpushare_gpu_pipe_utilization_ratio",
    )
    assert flags == [0.0] * len(PIPES)
    assert values(series, "gpushare_gpu_utilization_ratio", gpu_uuid=gpu) != []


def test_mps_daemon_down_and_client_count_come_from_the_mps_manager() -> None:
    backend = SimulatedBackend("2xH100-80GB", node_name="node-a")
    gpu0, gpu1 = (g.uuid for g in backend.inventory())
    _, registry, sample = make(mps={gpu0: MpsDaemonStatus(up=True, clients=3)})
    sample()
    series = scrape(registry)
    assert values(series, "gpushare_mps_daemon_up", gpu_uuid=gpu0) == [1.0]
    assert values(series, "gpushare_mps_daemon_up", gpu_uuid=gpu1) == [0.0]
    assert values(series, "gpushare_mps_clients", gpu_uuid=gpu0) == [3.0]


def test_xid_errors_are_counted_per_gpu_and_mark_it_unhealthy() -> None:
    health = HealthRecorder()
    backend, registry, sample = make(health=health)
    gpu0, gpu1 = (g.uuid for g in backend.inventory())
    health.record(HealthEvent(uuid=gpu0, healthy=True, reason="xid 31", xid=31))
    health.record(HealthEvent(uuid=gpu0, healthy=False, reason="xid 79", xid=79))
    sample()
    series = scrape(registry)
    assert values(series, "gpushare_gpu_xid_errors_total", gpu_uuid=gpu0) == [2.0]
    assert values(series, "gpushare_gpu_xid_errors_total", gpu_uuid=gpu1) == [0.0]
    assert values(series, "gpushare_gpu_last_xid", gpu_uuid=gpu0) == [79.0]
    assert values(series, "gpushare_gpu_healthy", gpu_uuid=gpu0) == [0.0]
    assert values(series, "gpushare_gpu_healthy", gpu_uuid=gpu1) == [1.0]


def test_a_failing_pod_view_drops_only_the_allocation_series() -> None:
    def broken() -> list[PodAllocation]:
        raise ConnectionError("pod cache not synced")

    _backend, registry, sample = make(placements=broken)
    sample()
    series = scrape(registry)
    assert values(series, "gpushare_gpu_pipe_utilization_ratio")
    assert values(series, "gpushare_pod_gpu_allocated_compute_ratio") == []
    assert values(series, "gpushare_exporter_source_errors_total") == [1.0]
