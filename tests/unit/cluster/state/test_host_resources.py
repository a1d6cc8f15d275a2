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


@pytest.mark.parametrize(
    ("text", "cpu", "memory"),
    [
        ("1e999999", 2**63 - 1, 2**63 - 1),  # the API server stores it (issue #45)
        ("9E999999", 2**63 - 1, 2**63 - 1),
        ("1e-999999", 1, 1),  # rounds up, as kube-scheduler's MilliValue and Value do
        ("999999Ei", 2**63 - 1, 2**63 - 1),
        ("1E", 2**63 - 1, 10**18),  # E is exa, not an exponent
        (".5", 500, 1),
        ("5.", 5000, 5),
        ("+2", 2000, 2),
        ("1.5k", 1_500_000, 1500),
        ("100n", 1, 1),
    ],
)
def test_every_quantity_the_api_server_stores_reads_without_raising(
    text: str, cpu: int, memory: int
) -> None:
    assert cpu_milli(text) == cpu
    assert memory_bytes(text) == memory


def test_a_pod_asking_more_than_any_node_has_cannot_fit_anywhere_and_breaks_nothing() -> None:
    containers = [{"resources": {"requests": {"cpu": "1e999999", "memory": "1e999998"}}}] * 3
    cpu, memory = pod_requests({"spec": {"containers": containers, "overhead": {"cpu": "1e9"}}})
    assert cpu > 2**63 and memory > 2**63  # summed past int64 as plain ints, never an error
    assert node_allocatable({"status": {"allocatable": {"cpu": "1e999999", "memory": "1"}}}) == (
        2**63 - 1,
        1,
    )
