"""Scarce GPU models (gpushare.packing.scarcity, issue 69): a pod that could go anywhere pays
for taking a model the pods limited to it need, priced from the measured mix and the free
capacity, and the placer keeps that model for them."""

import pytest

from gpushare.packing.fragmentation import Workload
from gpushare.packing.mix import PRICE_TOLERANCE, PodMix
from gpushare.packing.model import Demand, GpuState, NodeState, Tenant
from gpushare.packing.placer import Placer, best_node
from gpushare.packing.scarcity import free_by_model, model_prices

GIB = 1 << 30


def _node(name: str, model: str, used: int = 0, gpus: int = 2) -> NodeState:
    tenants = [Tenant(key=f"{name}/t", percent=used, memory_bytes=GIB)] if used else []
    return NodeState(
        name=name,
        gpus=[
            GpuState(
                uuid=f"{name}-{i}",
                memory_bytes=16 * GIB,
                model=model,
                index=i,
                tenants=list(tenants) if i == 0 else [],
            )
            for i in range(gpus)
        ],
        cpu_milli_free=64_000,
        memory_free_bytes=256 * GIB,
    )


def test_a_model_the_limited_pods_need_more_of_costs_more() -> None:
    # 30 % of the GPU demand can only use T4, which is 10 % of the capacity; 10 % can only
    # use G2 (90 %); the rest goes anywhere.
    demands = [(3, 100, 1, "T4", 0, 0), (1, 100, 1, "G2", 0, 0), (6, 100, 1, None, 0, 0)]
    prices = model_prices(demands, {"T4": 100, "G2": 900})
    assert prices == {"T4": pytest.approx(3.0), "G2": pytest.approx(1 / 9)}
    # Nothing limited, or limited to every model there is: nothing is priced.
    assert model_prices([(1, 100, 1, None, 0, 0)], {"T4": 100, "G2": 900}) == {}
    assert model_prices([(1, 50, 1, "G2|T4", 0, 0)], {"T4": 100, "G2": 900}) == {}
    assert model_prices(demands, {}) == {}
    # A model with no capacity left prices nothing: pods limited to it fit nowhere.
    assert set(model_prices(demands, {"T4": 0, "G2": 900})) == set()


def test_a_pod_only_some_models_nodes_can_hold_is_limited_to_them() -> None:
    """openb's 8-GPU pods asking for 120 CPUs fit only the G3 nodes (128 CPUs), not the G2
    ones (96): limited to G3 by their size, as a node constraint would limit them."""
    shapes = {
        "G2": {(8, 96_000, 384 * GIB)},
        "G3": {(8, 128_000, 768 * GIB)},
        "T4": {(2, 104_000, 512 * GIB)},
    }
    capacity = {"G2": 4400, "G3": 300, "T4": 800}
    big = (1, 100, 8, None, 120_000, 720 * GIB)
    small = (100, 50, 1, None, 8_000, 32 * GIB)
    prices = model_prices([big, small], capacity, shapes=shapes)
    assert set(prices) == {"G3"} and prices["G3"] > 0
    # Without the node kinds only node constraints limit a pod.
    assert model_prices([big, small], capacity) == {}
    # A pod of 8 GPUs that every 8-GPU node holds is not limited: which nodes stay whole for
    # it is the fragmentation term's to say.
    assert (
        model_prices([(1, 100, 8, None, 64_000, 256 * GIB), small], capacity, shapes=shapes) == {}
    )
    # A model whose nodes are not known is taken to hold anything; a pod no node holds limits
    # nothing (kube-scheduler refuses it).
    assert set(model_prices([big, small], capacity, shapes={"G2": shapes["G2"]})) == {"G3", "T4"}
    assert model_prices([(1, 100, 8, None, 200_000, 0), small], capacity, shapes=shapes) == {}
    # Node constraints and size together.
    assert set(
        model_prices([(1, 100, 1, "G2|G3", 100_000, 0), small], capacity, shapes=shapes)
    ) == {"G3"}


def test_free_capacity_counts_healthy_gpus_by_model() -> None:
    nodes = [_node("a", "T4", used=40), _node("b", "G2", gpus=1)]
    nodes[1].gpus.append(
        GpuState(uuid="sick", memory_bytes=GIB, model="G2", index=1, healthy=False)
    )
    assert free_by_model(nodes) == {"T4": 160, "G2": 100}


def test_a_pod_that_may_go_anywhere_keeps_off_the_scarce_model() -> None:
    # Without prices the pod fills the half-used T4 (a hole the whole-GPU pods cannot use,
    # FGD's choice); with T4-only pods needing more of the T4 left than there is, it goes to
    # G2 and the T4's hole stays for them.
    nodes = [_node("a-t4", "T4", used=50), _node("b-g2", "G2")]
    free = {"T4": 100, "G2": 1800}
    mix = PodMix(refit_every=10, free_capacity=lambda: free)
    plain = PodMix(refit_every=10)
    for m in (mix, plain):
        for _ in range(4):
            m.observe(Demand(percent=100, gpu_model="T4"))
        for _ in range(6):
            m.observe(Demand(percent=100))
    assert mix.workload.prices["T4"] > mix.workload.prices.get("G2", 0.0)
    assert plain.workload.prices == {}
    pod = Demand(percent=50)
    for placer, where in ((Placer(mix=plain), "a-t4"), (Placer(mix=mix), "b-g2")):
        costs = [(n.name, placer.node_cost(n, pod)) for n in nodes]
        assert best_node((n, c) for n, c in costs if c is not None) == where
    # A T4-only pod still goes to the T4 node (kube-scheduler offers it no other).
    only = Demand(percent=50, gpu_model="T4")
    assert Placer(mix=mix).node_cost(nodes[1], only) is None
    assert Placer(mix=mix).node_cost(nodes[0], only) is not None


def test_prices_follow_the_free_capacity_between_refits() -> None:
    free = {"T4": 200, "G2": 1800}
    mix = PodMix(refit_every=10, free_capacity=lambda: free)
    for _ in range(5):
        mix.observe(Demand(percent=100, gpu_model="T4"))
    for _ in range(5):
        mix.observe(Demand(percent=100))
    before, generation = mix.workload, mix.generation
    assert not mix.reprice()  # nothing changed: the costs cached stay valid
    free["T4"] = 50  # others took T4 capacity: what is left is worth more to the T4 pods
    assert mix.reprice() and mix.generation == generation + 1
    assert mix.workload.prices["T4"] > before.prices["T4"]
    assert mix.workload.tasks == before.tasks and mix.workload.basis is before.basis
    # Repriced on its own every REPRICE_EVERY pods counted.
    free["T4"] = 20
    count = 0
    while mix.generation == generation + 1:
        mix.observe(Demand(percent=100))
        count += 1
    assert count <= 50


def test_a_small_move_of_the_free_capacity_keeps_the_prices_and_the_cached_costs() -> None:
    """Every placement moves the free capacity; a reprice that moved no price by more than
    PRICE_TOLERANCE keeps the prices in force and the generation (the extender's kept answers
    stay valid), so that pricing does not slow the filter (issue 69: 197 generations on
    gpuspec33 doubled its mean)."""
    free = {"T4": 1000, "G2": 1800}
    mix = PodMix(refit_every=10, free_capacity=lambda: free)
    for _ in range(5):
        mix.observe(Demand(percent=100, gpu_model="T4"))
    for _ in range(5):
        mix.observe(Demand(percent=100))
    prices, generation = dict(mix.workload.prices), mix.generation
    free["T4"] = 960  # one T4 pod placed: T4's price moves by about 3%
    assert not mix.reprice()
    assert mix.workload.prices == prices and mix.generation == generation
    free["T4"] = 500  # half the T4 capacity gone since the prices were set
    assert mix.reprice() and mix.generation == generation + 1
    assert mix.workload.prices["T4"] > prices["T4"] * (1 + PRICE_TOLERANCE)


def test_a_workload_without_prices_costs_as_before() -> None:
    workload = Workload.default()
    assert workload.prices == {} and workload.with_prices({"T4": 1.0}).basis is workload


def test_the_first_pod_only_some_models_can_hold_by_its_size_refits_the_mix_at_once() -> None:
    # cpu050, seed 42: the first 8-GPU pod asking for 120 CPUs came at 41.8% arrived demand;
    # refitting only once the count doubled left the G3 nodes unpriced until smaller pods had
    # taken them (issue 69, docs/packing.md, "Limited by size").
    shapes = {"G2": {(8, 96_000, 384 * GIB)}, "G3": {(8, 128_000, 768 * GIB)}}
    free = {"G2": 4400, "G3": 300}
    mix = PodMix(refit_every=10, free_capacity=lambda: free, host_shapes=lambda: shapes)
    small = Demand(percent=50, cpu_milli=8_000, host_memory_bytes=32 * GIB)
    for _ in range(40):
        mix.observe(small)
    assert mix.workload.prices == {}
    anywhere = Demand(percent=100, gpus=8, cpu_milli=64_000, host_memory_bytes=256 * GIB)
    assert not mix.observe(anywhere)  # every 8-GPU node holds it: no refit before its time
    big = Demand(percent=100, gpus=8, cpu_milli=120_000, host_memory_bytes=720 * GIB)
    generation = mix.generation
    assert mix.observe(big)
    assert mix.generation == generation + 1
    assert set(mix.workload.prices) == {"G3"}
    # Once the mix holds such a class, the next new one waits for the refit that is due.
    bigger = Demand(percent=100, gpus=8, cpu_milli=124_000, host_memory_bytes=720 * GIB)
    assert not mix.observe(bigger)
