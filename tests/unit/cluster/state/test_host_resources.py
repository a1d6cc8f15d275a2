"""Host CPU and memory read the way kube-scheduler counts them, from API JSON of any shape."""

import pytest

from gpushare.cluster.state.host_resources import (
    cpu_milli,
    memory_bytes,
    node_allocatable,
    pod_requests,
)


@pytest.mark.parametrize(
    ("text", "cpu", "memory"),
    [
        ("8000m", 8000, 8),
        ("16", 16000, 16),
        ("0.5", 500, 1),
        ("512Mi", (512 << 20) * 1000, 512 << 20),
        ("1Gi", 1000 << 30, 1 << 30),
        ("100M", 100_000_000_000, 100_000_000),
        ("1e3", 1_000_000, 1000),
    ],
)
def test_quantities_in_every_spelling_kubernetes_accepts(text: str, cpu: int, memory: int) -> None:
    assert memory_bytes(text) == memory
    assert cpu_milli(text) == cpu


@pytest.mark.parametrize("junk", ["", "abc", "-1", "NaN", "Infinity", "1" * 80, None, True, [1]])
def test_what_the_api_server_would_refuse_reads_as_nothing(junk: object) -> None:
    assert cpu_milli(junk) == 0 and memory_bytes(junk) == 0


def test_a_pods_request_is_its_containers_sum_or_its_largest_init_container_plus_overhead() -> None:
    pod = {
        "spec": {
            "containers": [
                {"resources": {"requests": {"cpu": "1", "memory": "1Gi"}}},
                {"resources": {"requests": {"cpu": "500m"}}},
                {"resources": {}},
                "not a container",
            ],
            "initContainers": [{"resources": {"requests": {"cpu": "4", "memory": "512Mi"}}}],
            "overhead": {"cpu": "100m", "memory": "64Mi"},
        }
    }
    assert pod_requests(pod) == (4100, (1 << 30) + (64 << 20))
    assert pod_requests({"spec": {"containers": "oops"}}) == (0, 0)


def test_a_node_without_allocatable_cpu_and_memory_is_not_tracked() -> None:
    assert node_allocatable({"status": {"allocatable": {"cpu": "96", "memory": "384Gi"}}}) == (
        96000,
        384 << 30,
    )
    assert node_allocatable({"status": {"allocatable": {"cpu": "96"}}}) is None
    assert node_allocatable({}) is None
