"""Placer: the one placement decision the extender and the simulator share."""

import random
from dataclasses import replace
from typing import Any

import pytest

from gpushare.packing.admission import Admission
from gpushare.packing.fit import node_fit_reason
from gpushare.packing.fragmentation import TaskClass, Workload
from gpushare.packing.mix import PodMix
from gpushare.packing.model import Demand, GpuState, NodeState, Tenant
from gpushare.packing.placer import Placer, best_node, rank_scores
from gpushare.packing.policy import DEFAULT_POLICY, Policy, node_cost

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


def _random_node(rng: random.Random, name: str) -> NodeState:
    """A node in a random state: tenants of several sizes, classes, tenancies and memory."""
    gpus: list[GpuState] = []
    for i in range(rng.choice([1, 2, 4, 8])):
        tenants: list[Tenant] = []
        used = 0
        for k in range(rng.randint(0, 3)):
            percent = rng.choice([5, 10, 25, 30, 50])
            if used + percent > 100:
                break
            used += percent
            tenants.append(
                Tenant(
                    f"ns/{name}-{i}-{k}",
                    percent,
                    rng.choice([percent * 80 * GIB // 100, 40 * GIB]),
                    gpu_class=rng.choice(["batch", "batch", "latency"]),
                    processes=rng.choice([1, 1, 20]),
                    tenancy=rng.choice(["a", "a", "b", None]),
                )
            )
        gpus.append(
            GpuState(
                f"{name}-{i}",
                80 * GIB,
                model="H100",
                index=i,
                healthy=rng.random() > 0.05,
                tenants=tenants,
                max_clients=48,
            )
        )
    return NodeState(
        name,
        gpus,
        cpu_milli_free=rng.choice([None, 0, 4000, 16000]),
        memory_free_bytes=rng.choice([None, 8 * GIB, 64 * GIB]),
    )


def _random_demand(rng: random.Random) -> Demand:
    whole = rng.random() < 0.25
    return Demand(
        percent=100 if whole else rng.choice([5, 20, 30, 45, 60]),
        gpus=rng.choice([1, 2, 4]) if whole else 1,
        gpu_class=rng.choice(["batch", "latency"]),
        memory_bytes=rng.choice([None, 30 * GIB]),
        processes=rng.choice([1, 10]),
        tenancy=rng.choice([None, "a", "b"]),
        cpu_milli=rng.choice([0, 2000, 8000]),
        host_memory_bytes=rng.choice([0, 16 * GIB]),
    )


@pytest.mark.parametrize("policy", list(Policy))
def test_remembered_answers_are_the_answers_computed_afresh(policy: Policy) -> None:
    """The placer answers a pod once per node state (docs/packing.md, "Speed"): every state
    it tells apart must really give one answer. Nodes are made in pairs of the same state
    with GPUs in another order, so each pair's second node is answered from memory."""
    rng = random.Random(7)
    placer = Placer(policy, admission=Admission())
    fresh = Placer(policy, admission=Admission())
    checked = 0
    for n in range(300):
        first = _random_node(rng, f"n{n}")
        twin = NodeState(
            f"t{n}",
            [replace(g, uuid=f"t{n}-{g.index}", tenants=list(g.tenants)) for g in first.gpus[::-1]],
            first.cpu_milli_free,
            first.memory_free_bytes,
        )
        for _ in range(4):
            demand = _random_demand(rng)
            for state in (first, twin):
                want_cost = node_cost(
                    Admission().admitted(state, demand),
                    demand,
                    policy=policy,
                    workload=fresh.workload,
                    model=fresh.model,
                )
                assert placer.node_cost(state, demand) == want_cost, (state, demand)
                assert placer.refusal(state, demand) == node_fit_reason(state, demand)
                assert (placer.refusal(state, demand) is None) == (want_cost is not None)
                checked += 1
    assert checked == 2400


@pytest.mark.parametrize("policy", list(Policy))
def test_each_thing_placement_reads_of_a_gpu_tells_node_states_apart(policy: Policy) -> None:
    """Nodes differing in one thing a pod's fit reads (a neighbour's tenancy, MPS clients,
    class or memory; the GPU's health, model or client limit) must not share a remembered
    answer: the pod fits on the first and not on any of the others."""

    def one_gpu(name: str, tenant: Tenant, **gpu: Any) -> NodeState:
        fields: dict[str, Any] = {"model": "H100", "healthy": True, "max_clients": 48, **gpu}
        return NodeState(name, [GpuState(f"{name}-0", 80 * GIB, tenants=[tenant], **fields)])

    tenant = Tenant("ns/a", 50, 40 * GIB, tenancy="a")
    states = [
        one_gpu("fits", tenant),
        one_gpu("tenancy", replace(tenant, tenancy="b")),
        one_gpu("clients", replace(tenant, processes=48)),
        one_gpu("latency", replace(tenant, gpu_class="latency")),
        one_gpu("memory", replace(tenant, memory_bytes=70 * GIB)),
        one_gpu("health", tenant, healthy=False),
        one_gpu("model", tenant, model="A100"),
        one_gpu("limit", tenant, max_clients=1),
    ]
    demand = Demand(
        percent=30, gpu_class="latency", memory_bytes=20 * GIB, tenancy="a", gpu_model="H100"
    )
    placer = Placer(policy)
    costs = {s.name: placer.node_cost(s, demand) for s in states}
    reasons = {s.name: placer.refusal(s, demand) for s in states}
    assert costs["fits"] is not None and reasons["fits"] is None
    refused = {name for name, cost in costs.items() if cost is None}
    assert refused == {s.name for s in states} - {"fits"}
    assert all(reasons[name] for name in refused)
