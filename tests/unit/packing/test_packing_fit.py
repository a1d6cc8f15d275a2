"""fit_reason / node_fit_reason: what fits where, and the reason a user reads when it does not."""

import pytest

from gpushare.api.names import CLASS_LATENCY, MPS_MAX_CLIENTS
from gpushare.packing.fit import fit_reason, model_allows, node_fit_reason
from gpushare.packing.model import Demand, GpuState, NodeState, Tenant
from gpushare.packing.policy import Policy, choose_gpus

GIB = 1 << 30


def gpu(
    uuid: str, *used: int, memory: int = 80 * GIB, model: str = "H100", healthy: bool = True
) -> GpuState:
    tenants = [Tenant(f"ns/{uuid}-{i}", p, memory * p // 100) for i, p in enumerate(used)]
    return GpuState(uuid, memory, model=model, healthy=healthy, tenants=tenants)


def test_30_percent_pod_never_lands_on_two_15_percent_holes() -> None:
    node = NodeState("n1", [gpu("g0", 85), gpu("g1", 85)])
    demand = Demand(percent=30)
    assert fit_reason(node.gpus[0], demand) == "needs 30% compute, GPU has 15% free"
    reason = node_fit_reason(node, demand)
    assert reason == "no GPU fits (needs 30% compute free)"
    for policy in Policy:
        assert choose_gpus(node, demand, policy=policy) is None


def test_unhealthy_gpu_is_refused_with_its_name() -> None:
    sick = gpu("GPU-bad", healthy=False)
    assert fit_reason(sick, Demand(percent=10)) == "GPU is unhealthy"


def test_memory_cap_larger_than_free_memory_is_refused() -> None:
    g = gpu("g0", 50, memory=80 * GIB)  # 40 GiB used
    reason = fit_reason(g, Demand(percent=20, memory_bytes=48 * GIB))
    assert reason == "needs 48Gi GPU memory, GPU has 40Gi free"
    assert fit_reason(g, Demand(percent=20, memory_bytes=40 * GIB)) is None


def test_proportional_memory_share_is_checked_when_no_cap_given() -> None:
    g = GpuState("g0", 80 * GIB, tenants=[Tenant("ns/a", 10, 70 * GIB)])
    reason = fit_reason(g, Demand(percent=20))  # wants 16 GiB, 10 GiB free
    assert reason is not None and "GPU memory" in reason


def test_mps_client_budget_counts_processes_not_pods() -> None:
    g = GpuState("g0", 80 * GIB, tenants=[Tenant("ns/a", 10, GIB, processes=MPS_MAX_CLIENTS - 1)])
    assert fit_reason(g, Demand(percent=10, processes=1)) is None
    reason = fit_reason(g, Demand(percent=10, processes=2))
    assert (
        reason
        == f"needs 2 MPS client process(es), GPU's MPS server has 1 of {MPS_MAX_CLIENTS} left"
    )


def test_gpu_model_restriction_accepts_alternatives() -> None:
    assert model_allows("A100|H100", "H100")
    assert not model_allows("A100|H100", "T4")
    reason = fit_reason(gpu("g0", model="T4"), Demand(percent=10, gpu_model="A100|H100"))
    assert reason == "needs GPU model A100|H100, GPU is T4"


def test_second_latency_pod_is_refused_but_a_batch_pod_fits() -> None:
    g = GpuState("g0", 80 * GIB, tenants=[Tenant("ns/web", 30, 24 * GIB, gpu_class=CLASS_LATENCY)])
    reason = fit_reason(g, Demand(percent=20, gpu_class=CLASS_LATENCY))
    assert reason is not None and "latency-class" in reason
    assert fit_reason(g, Demand(percent=20)) is None


def test_whole_gpu_demand_needs_an_idle_gpu() -> None:
    demand = Demand(percent=100)
    assert fit_reason(gpu("g0", 5), demand) == "needs a whole GPU, GPU has 5% allocated"
    assert fit_reason(gpu("g1"), demand) is None


def test_multi_gpu_pod_needs_that_many_idle_gpus() -> None:
    node = NodeState("n1", [gpu("g0"), gpu("g1", 10), gpu("g2")])
    assert node_fit_reason(node, Demand(percent=100, gpus=2)) is None
    assert node_fit_reason(node, Demand(percent=100, gpus=3)) == (
        "needs 3 idle GPUs, node has 2 (needs a whole GPU, none idle)"
    )


@pytest.mark.parametrize(
    ("cpu_free", "memory_free", "expected"),
    [
        (1000, None, "needs 4000m CPU, node has 1000m free"),
        (None, 2 * GIB, "needs 8Gi memory, node has 2Gi free"),
        (8000, 16 * GIB, None),
    ],
)
def test_host_cpu_and_memory_are_checked_when_tracked(
    cpu_free: int | None, memory_free: int | None, expected: str | None
) -> None:
    node = NodeState("n1", [gpu("g0")], cpu_milli_free=cpu_free, memory_free_bytes=memory_free)
    demand = Demand(percent=10, cpu_milli=4000, host_memory_bytes=8 * GIB)
    assert node_fit_reason(node, demand) == expected


def test_node_without_room_lists_what_its_gpus_lack() -> None:
    node = NodeState("n1", [gpu("g0", 90), gpu("g1", healthy=False)])
    reason = node_fit_reason(node, Demand(percent=20))
    assert reason == "no GPU fits (unhealthy GPU; needs 20% compute free)"


def test_nodes_short_of_the_same_things_give_the_same_words() -> None:
    """kube-scheduler counts equal reasons as one line of its event: a node's reason names no
    GPU and no GPU's numbers, only what the pod lacks there."""
    a = NodeState("a", [gpu("a0", 90), gpu("a1", 90), gpu("a2", 95)])
    b = NodeState("b", [gpu("b0", 75, memory=8 * GIB), gpu("b1", 85)])
    demand = Demand(percent=20, memory_bytes=10 * GIB)
    assert node_fit_reason(a, demand) == "no GPU fits (needs 20% compute free)"
    assert node_fit_reason(b, demand) == (
        "no GPU fits (needs 20% compute free; needs 10Gi GPU memory free)"
    )
    assert fit_reason(b.gpus[0], demand) == "needs 10Gi GPU memory, GPU has 2Gi free"
