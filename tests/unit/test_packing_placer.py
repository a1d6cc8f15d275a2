"""Placer: the one placement decision the extender and the simulator share."""

from gpushare.packing.fragmentation import TaskClass, Workload
from gpushare.packing.mix import PodMix
from gpushare.packing.model import Demand, GpuState, NodeState, Tenant
from gpushare.packing.placer import Placer, best_node, rank_scores
from gpushare.packing.policy import DEFAULT_POLICY, Policy

GIB = 1 << 30


def node(name: str, *used: int, cpu: int | None = None) -> NodeState:
    gpus = [
        GpuState(
            f"{name}-{i}",
            80 * GIB,
            model="H100",
            index=i,
            tenants=[Tenant(f"t{i}", u, 80 * GIB * u // 100)] if u else [],
        )
        for i, u in enumerate(used)
    ]
    return NodeState(name, gpus, cpu_milli_free=cpu, memory_free_bytes=None)


def test_the_default_is_the_fragmentation_aware_policy() -> None:
    assert DEFAULT_POLICY is Policy.GPUSHARE
    assert Placer().policy is Policy.GPUSHARE


def test_ties_go_to_the_name_that_sorts_first_whatever_the_order_offered() -> None:
    assert best_node([("b", 1.0), ("a", 1.0), ("c", 0.5)]) == "c"
    assert best_node([("b", 1.0), ("a", 1.0)]) == "a"
    assert best_node([("a", 1.0), ("b", 1.0)]) == "a"
    assert best_node([]) is None


def test_prioritize_scores_follow_the_ranking_and_the_cheapest_gets_ten() -> None:
    scores = rank_scores({"a": 3.0, "b": -2.0, "c": None, "d": 3.0, "e": 10.0})
    assert scores["b"] == 10
    assert scores["a"] == scores["d"] < 10
    assert scores["e"] < scores["a"]
    assert scores["e"] >= 1 and scores["c"] == 0
    assert rank_scores({"only": 5.0}) == {"only": 10}


def test_the_cost_is_measured_against_the_mix_learned_so_far() -> None:
    # Two nodes: one GPU half used, one idle GPU. Against a mix of 50 % pods the 50 % pod fills
    # the exact hole; against a mix of whole-GPU pods too (the idle GPU stays whole).
    demand = Demand(percent=50)
    nodes = {"half": node("half", 50), "idle": node("idle", 0)}
    placer = Placer(mix=PodMix(refit_every=4))
    for _ in range(4):
        placer.mix.observe(Demand(percent=100))
    version = placer.version
    costs = {n: placer.node_cost(s, demand) for n, s in nodes.items()}
    assert best_node((n, c) for n, c in costs.items() if c is not None) == "half"
    for _ in range(4):
        placer.mix.observe(Demand(percent=30))
    assert placer.version != version  # cached answers must be dropped
    assignment = placer.choose_gpus(nodes["half"], demand)
    assert assignment is not None and assignment.gpu_uuids == ("half-0",)


def test_cpu_left_on_a_node_weighs_in_through_the_learned_mix() -> None:
    # Each GPU task brings 8 CPUs per whole GPU. A 25 % pod asking for 8 CPUs on a node left
    # with 8 CPUs and an idle GPU strands that GPU; on a node with 64 CPUs it strands nothing.
    placer = Placer(mix=PodMix(refit_every=1))
    placer.mix.observe(Demand(percent=100, cpu_milli=8000))
    demand = Demand(percent=25, cpu_milli=8000)
    tight, roomy = node("tight", 0, 0, cpu=16_000), node("roomy", 0, 0, cpu=64_000)
    cost_tight, cost_roomy = placer.node_cost(tight, demand), placer.node_cost(roomy, demand)
    assert cost_tight is not None and cost_roomy is not None
    assert cost_roomy < cost_tight


def test_binpack_and_spread_stay_available() -> None:
    nodes = [node("full", 70), node("idle", 0)]
    demand = Demand(percent=20)
    for policy, best in ((Policy.BINPACK, "full"), (Policy.SPREAD, "idle")):
        placer = Placer(policy)
        costs = [(n.name, placer.node_cost(n, demand)) for n in nodes]
        assert best_node((n, c) for n, c in costs if c is not None) == best
        assert placer.version == 0
    workload = Workload([TaskClass(1, 100)])
    assert Placer(Policy.BINPACK, mix=PodMix(prior=workload)).workload is workload
