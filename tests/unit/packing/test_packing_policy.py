"""choose_gpus / node_cost: which GPU a pod gets under each policy and how nodes rank."""

from collections.abc import Sequence

import pytest

from gpushare.packing.fragmentation import TaskClass, Workload, fgd_option
from gpushare.packing.interference import InterferenceModel, load_of, sum_loads
from gpushare.packing.model import Demand, GpuState, NodeState, PipeProfile, Tenant
from gpushare.packing.policy import (
    Policy,
    choose_gpus,
    guaranteed_loss,
    node_cost,
)

GIB = 1 << 30


def gpu(uuid: str, *tenants: Tenant, memory: int = 80 * GIB) -> GpuState:
    return GpuState(uuid, memory, model="H100", tenants=list(tenants))


def tenant(key: str, percent: int, profile: PipeProfile | None = None) -> Tenant:
    return Tenant(key, percent, 80 * GIB * percent // 100, profile=profile)


def test_binpack_fills_the_fuller_gpu_and_spread_the_emptier() -> None:
    node = NodeState(
        "n1", [gpu("half", tenant("a", 50)), gpu("most", tenant("b", 70)), gpu("idle")]
    )
    demand = Demand(percent=30)
    binpack = choose_gpus(node, demand, policy=Policy.BINPACK)
    spread = choose_gpus(node, demand, policy=Policy.SPREAD)
    assert binpack is not None and binpack.gpu_uuids == ("most",)
    assert spread is not None and spread.gpu_uuids == ("idle",)


def test_assignment_carries_thread_percent_and_proportional_memory() -> None:
    node = NodeState("n1", [gpu("g0")])
    # Memory follows the request (25%); the thread cap is the limit (the whole GPU by default).
    a = choose_gpus(node, Demand(percent=25), policy=Policy.BINPACK)
    assert a is not None
    assert (a.node, a.thread_percent, a.memory_limit_bytes) == ("n1", 100, 20 * GIB)
    limited = choose_gpus(node, Demand(percent=25, limit_percent=40), policy=Policy.BINPACK)
    assert limited is not None and limited.thread_percent == 40
    capped = choose_gpus(node, Demand(percent=25, memory_bytes=5 * GIB), policy=Policy.BINPACK)
    assert capped is not None and capped.memory_limit_bytes == 5 * GIB


def test_multi_gpu_pod_gets_distinct_idle_gpus_with_all_threads() -> None:
    node = NodeState("n1", [gpu("g0"), gpu("g1", tenant("a", 10)), gpu("g2"), gpu("g3")])
    for policy in Policy:
        a = choose_gpus(node, Demand(percent=100, gpus=2), policy=policy)
        assert a is not None
        assert len(set(a.gpu_uuids)) == 2 and "g1" not in a.gpu_uuids
        assert a.thread_percent == 100


def test_gpushare_fills_the_exact_hole_instead_of_opening_an_idle_gpu() -> None:
    # Half the workload asks for whole GPUs: opening the idle GPU would strand it for them.
    workload = Workload([TaskClass(1, 100), TaskClass(1, 50)])
    node = NodeState("n1", [gpu("idle"), gpu("half", tenant("a", 50))])
    a = choose_gpus(node, Demand(percent=50), policy=Policy.GPUSHARE, workload=workload)
    assert a is not None and a.gpu_uuids == ("half",)


def test_gpushare_keeps_a_hole_usable_by_the_workload() -> None:
    # A 30% pod on the 60%-free GPU leaves 30% that the 30% tasks can still use; on the
    # 40%-free GPU it would leave 10% that nobody can use.
    workload = Workload([TaskClass(1, 30)])
    node = NodeState("n1", [gpu("forty", tenant("a", 60)), gpu("sixty", tenant("b", 40))])
    a = choose_gpus(node, Demand(percent=30), policy=Policy.GPUSHARE, workload=workload)
    assert a is not None and a.gpu_uuids == ("sixty",)


def test_gpushare_avoids_a_neighbour_predicted_to_interfere() -> None:
    # Thread caps split the SMs, but DRAM bandwidth stays shared.
    streaming = PipeProfile(fp32=0.2, sm_occupancy=0.3, dram_bandwidth=0.8)
    compute = PipeProfile(fp32=0.2, sm_occupancy=0.3, dram_bandwidth=0.05)
    model = InterferenceModel(coefficients=(0.0, 0.0, 0.0, 0.0, 3.0, 0.0, 0.0))
    workload = Workload([TaskClass(1, 40)])
    node = NodeState(
        "n1",
        [
            gpu("beside-streaming", tenant("a", 40, streaming)),
            gpu("beside-compute", tenant("b", 40, compute)),
        ],
    )
    demand = Demand(percent=40, profile=streaming)
    a = choose_gpus(node, demand, policy=Policy.GPUSHARE, workload=workload, model=model)
    assert a is not None and a.gpu_uuids == ("beside-compute",)
    # Without a profile there is no interference opinion: the first equal option wins.
    b = choose_gpus(
        node, Demand(percent=40), policy=Policy.GPUSHARE, workload=workload, model=model
    )
    assert b is not None and b.gpu_uuids == ("beside-streaming",)


def test_binpack_ranks_the_fuller_node_first_and_a_misfit_nowhere() -> None:
    full = NodeState("full", [gpu("a", tenant("x", 70)), gpu("b", tenant("y", 60))])
    empty = NodeState("empty", [gpu("c"), gpu("d")])
    tight = NodeState("tight", [gpu("e", tenant("z", 90))])
    demand = Demand(percent=30)

    def cost(node: NodeState, policy: Policy) -> float:
        value = node_cost(node, demand, policy=policy)
        assert value is not None
        return value

    assert cost(full, Policy.BINPACK) < cost(empty, Policy.BINPACK)
    assert cost(empty, Policy.SPREAD) < cost(full, Policy.SPREAD)
    for policy in Policy:
        assert node_cost(tight, demand, policy=policy) is None


def test_gpushare_costs_the_node_it_would_choose_least() -> None:
    workload = Workload([TaskClass(1, 100), TaskClass(1, 50)])
    hole = NodeState("hole", [gpu("a", tenant("x", 50)), gpu("b")])
    idle = NodeState("idle", [gpu("c"), gpu("d")])
    demand = Demand(percent=50)
    on_hole = node_cost(hole, demand, policy=Policy.GPUSHARE, workload=workload)
    on_idle = node_cost(idle, demand, policy=Policy.GPUSHARE, workload=workload)
    assert on_hole is not None and on_idle is not None and on_hole < on_idle


def test_cpu_starved_node_is_avoided_by_gpushare() -> None:
    # Both nodes can take the pod, but on the starved one its 8 CPUs would leave the other
    # idle GPU without the CPU any task needs.
    workload = Workload([TaskClass(1, 100, cpu_milli=8000)])
    starved = NodeState("starved", [gpu("a"), gpu("b")], cpu_milli_free=12000)
    roomy = NodeState("roomy", [gpu("c"), gpu("d")], cpu_milli_free=64000)
    demand = Demand(percent=100, cpu_milli=8000)
    starved_cost = node_cost(starved, demand, policy=Policy.GPUSHARE, workload=workload)
    roomy_cost = node_cost(roomy, demand, policy=Policy.GPUSHARE, workload=workload)
    assert starved_cost is not None and roomy_cost is not None
    assert roomy_cost < starved_cost


def test_gpushare_keeps_a_gap_the_workload_fills_where_fgd_would_strand_one() -> None:
    # openb-like mix: a 32% pod beside a 47% one leaves 21% that only rare 16% pods fit;
    # beside another 32% it leaves 36%, which the next 32% pod fills to 4%.
    workload = Workload(
        [
            TaskClass(48, 100),
            TaskClass(13, 81),
            TaskClass(9, 47),
            TaskClass(4, 32),
            TaskClass(3, 65),
            TaskClass(1, 16),
        ]
    )
    node = NodeState("n1", [gpu("with-47", tenant("a", 47)), gpu("with-32", tenant("b", 32))])
    demand = Demand(percent=32)
    fgd = fgd_option(node, demand, workload)
    assert fgd is not None and fgd.gpus == (0,)  # FGD alone: beside the 47% pod
    a = choose_gpus(node, demand, policy=Policy.GPUSHARE, workload=workload)
    assert a is not None and a.gpu_uuids == ("with-32",)


def gpu_loss(tenants: Sequence[tuple[float, PipeProfile, int]], model: InterferenceModel) -> float:
    """GPU-percent lost to interference counted against each tenant's thread cap, the way
    :func:`guaranteed_loss` must not count it: sum of percent x (1 - 1/slowdown) over the
    (percent, profile, threads) tenants."""
    if len(tenants) < 2:
        return 0.0
    loads = [load_of(profile, threads) for _, profile, threads in tenants]
    lost = 0.0
    for i, ((percent, _, _), load) in enumerate(zip(tenants, loads, strict=True)):
        others = sum_loads([other for k, other in enumerate(loads) if k != i])
        lost += percent * (1.0 - 1.0 / model.predict_load(load, others))
    return lost


def test_interference_counts_only_what_a_tenant_loses_below_its_guaranteed_share() -> None:
    # DRAM contention plus the cost of a thread cap; two 25% tenants.
    model = InterferenceModel(coefficients=(0.0, 0.0, 0.0, 0.0, 3.0, 0.0, 1.0))
    light = PipeProfile(tensor=0.3, sm_occupancy=0.4, dram_bandwidth=0.3, sm_utilization=0.4)
    heavy = PipeProfile(tensor=0.3, sm_occupancy=0.4, dram_bandwidth=0.9, sm_utilization=0.4)
    # Capped at their shares there is no headroom: every slowdown is lost share.
    at_share = [(25.0, light, 25), (25.0, light, 25)]
    assert guaranteed_loss(at_share, model) == pytest.approx(gpu_loss(at_share, model))
    assert guaranteed_loss(at_share, model) > 0
    # At 50% threads they run faster than their 25% alone would, and a light neighbour
    # takes no more than that: nothing below the guarantee is lost.
    roomy = [(25.0, light, 50), (25.0, light, 50)]
    assert gpu_loss(roomy, model) > 0
    assert guaranteed_loss(roomy, model) == 0.0
    # A heavy neighbour slows them past the headroom.
    crowded = [(25.0, heavy, 50), (25.0, heavy, 50)]
    assert 0 < guaranteed_loss(crowded, model) < gpu_loss(crowded, model)
    assert guaranteed_loss([(25.0, heavy, 50)], model) == 0.0
