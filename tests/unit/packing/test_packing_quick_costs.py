"""The quick node cost (gpushare.packing.quick_costs) against the reference, Placer.node_cost:
the same float, bit for bit, or the same "does not fit", on random nodes and pod shapes, as
nodes change and the pod mix is refit; and it leaves to the reference what it cannot read
(issue 47: the two paths never disagree silently)."""

import random
from dataclasses import replace

import pytest

from gpushare.api.names import CLASS_BATCH, CLASS_LATENCY
from gpushare.packing.admission import Admission
from gpushare.packing.mix import PodMix
from gpushare.packing.model import Demand, GpuState, NodeState, PipeProfile, Tenant
from gpushare.packing.opportunistic import Opportunism
from gpushare.packing.placer import Placer
from gpushare.packing.policy import Policy, node_cost
from gpushare.packing.quick_costs import UNKNOWN, QuickCosts

GIB = 1 << 30
MODELS = ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB")


def _tenant(rng: random.Random, k: int, room: int) -> Tenant | None:
    percent = rng.choice((5, 10, 20, 25, 30, 40, 50, 81, 100))
    if percent > room:
        return None
    return Tenant(
        key=f"ns/t{k}",
        percent=percent,
        memory_bytes=rng.choice((percent * 800_000_000, 4 * GIB, 20 * GIB)),
        gpu_class=rng.choice((CLASS_BATCH, CLASS_BATCH, CLASS_LATENCY)),
        processes=rng.choice((1, 1, 2, 16)),
        tenancy=rng.choice((None, "ns", "ns", "other")),
    )


def _node(rng: random.Random, name: str) -> NodeState:
    model = rng.choice(MODELS)
    memory = 80 * GIB if "80GB" in model else 40 * GIB
    gpus = []
    for i in range(rng.choice((1, 2, 4, 8, 8))):
        tenants: list[Tenant] = []
        used = 0
        while rng.random() < 0.7:
            t = _tenant(rng, len(tenants), 100 - used)
            if t is None:
                break
            tenants.append(t)
            used += t.percent
        gpus.append(
            GpuState(
                uuid=f"{name}-gpu{i}",
                memory_bytes=memory,
                model=model,
                index=i,
                healthy=rng.random() > 0.05,
                tenants=tenants,
                max_clients=rng.choice((48, 48, 4)),
            )
        )
    cpu = rng.choice((None, rng.randrange(0, 96_000, 500)))
    host = rng.choice((None, rng.randrange(0, 384 * 1024, 512) * (1 << 20)))
    return NodeState(name=name, gpus=gpus, cpu_milli_free=cpu, memory_free_bytes=host)


def _demand(rng: random.Random) -> Demand:
    if rng.random() < 0.1:  # no GPU: placed by its CPU and memory
        return Demand(
            percent=0,
            gpus=0,
            cpu_milli=rng.choice((0, 1000, 8000, 32000)),
            host_memory_bytes=rng.choice((0, 2 * GIB, 64 * GIB)),
        )
    whole = rng.random() < 0.2
    return Demand(
        percent=100 if whole else rng.choice((5, 10, 15, 25, 30, 50, 70, 81, 99)),
        gpus=rng.choice((1, 1, 2, 4)) if whole else 1,
        memory_bytes=rng.choice((None, None, 4 * GIB, 30 * GIB)),
        gpu_class=rng.choice((CLASS_BATCH, CLASS_LATENCY)),
        processes=rng.choice((1, 1, 4)),
        gpu_model=rng.choice((None, None, MODELS[1])),
        cpu_milli=rng.choice((0, 1000, 4000, 8000, 16000, 32000)),
        host_memory_bytes=rng.choice((0, 2 * GIB, 16 * GIB, 64 * GIB)),
        tenancy=rng.choice((None, "ns", "other")),
    )


def _placer(mix: PodMix) -> Placer:
    return Placer(Policy.GPUSHARE, mix=mix, admission=Admission(), opportunism=Opportunism())


def _quick(placer: Placer, node: NodeState, demand: Demand) -> float | None:
    facts = placer.node_facts(node)
    assert facts is not None
    return placer.quick_cost(facts, demand)


def _same(a: float | None, b: float | None) -> bool:
    return a == b and type(a) is type(b)


def test_quick_costs_are_the_reference_costs_on_random_nodes_and_shapes() -> None:
    rng = random.Random(47)
    mix = PodMix()
    placer, reference = _placer(mix), _placer(mix)
    nodes = [_node(rng, f"n{i}") for i in range(120)]
    demands = [_demand(rng) for _ in range(60)]
    compared = fits = 0
    for round_ in range(4):
        for demand in demands:
            assert placer.quick_reads(demand)
            for node in nodes:
                quick = _quick(placer, node, demand)
                ref = reference.node_cost(node, demand)
                assert _same(quick, ref), (round_, node.name, demand, quick, ref)
                facts = placer.node_facts(node)
                assert facts is not None
                words = placer.quick_refusal(facts, node, demand)
                assert words == reference.refusal(node, demand), (node.name, demand)
                assert (words is None) == (ref is not None) or not demand.gpus
                compared += 1
                fits += quick is not None
        # Nodes change (a tenant more or less, CPU taken), and the mix is refit.
        for node in rng.sample(nodes, 40):
            gpu = rng.choice(node.gpus)
            if gpu.tenants and rng.random() < 0.5:
                gpu.tenants = gpu.tenants[1:]
            else:
                t = _tenant(rng, 99, gpu.free_percent)
                if t is not None:
                    gpu.tenants = [*gpu.tenants, t]
            if node.cpu_milli_free is not None:
                node.cpu_milli_free = max(0, node.cpu_milli_free - 1000)
        mix.observe_all(rng.sample(demands, 20))
        mix.refit()
    assert compared == 4 * 60 * 120 and fits > compared // 5


def test_the_reference_keeps_what_the_quick_path_cannot_read() -> None:
    mix = PodMix()
    placer = _placer(mix)
    plain = Demand(percent=25)
    assert placer.quick_reads(plain)
    assert not placer.quick_reads(replace(plain, profile=PipeProfile(fp32=0.5)))
    assert not placer.quick_reads(replace(plain, avoid_gpus=frozenset({"g"})))
    assert not placer.quick_reads(replace(plain, opportunistic=True))
    assert placer.quick_reads(Demand(percent=0, gpus=0, cpu_milli=1000))
    assert not placer.quick_reads(Demand(percent=30, gpus=0))
    assert not placer.quick_reads(Demand(percent=0, gpus=1))
    assert not placer.quick_reads(Demand(percent=50, gpus=2))
    assert not Placer(Policy.BINPACK, mix=mix).quick_reads(plain)
    assert Placer(Policy.GPUSHARE, mix=mix).quick_reads(replace(plain, opportunistic=True))
    profiled = Tenant(key="ns/p", percent=20, memory_bytes=GIB, profile=PipeProfile(fp32=0.5))
    beyond = Tenant(key="ns/o", percent=20, memory_bytes=GIB, opportunistic=True)
    for tenant in (profiled, beyond):
        node = NodeState(
            name="n", gpus=[GpuState(uuid="g", memory_bytes=80 * GIB, tenants=[tenant])]
        )
        assert placer.node_facts(node) is None
    assert placer.node_facts(NodeState(name="n", gpus=[])) is None


@pytest.mark.parametrize("limit", [3, 7])
def test_numbers_starting_over_leave_costs_unchanged(
    monkeypatch: pytest.MonkeyPatch, limit: int
) -> None:
    """Past INTERN_LIMIT signatures everything kept is dropped: facts made before are stale
    (their epoch), fresh ones give the reference's cost again."""
    monkeypatch.setattr("gpushare.packing.quick_costs.INTERN_LIMIT", limit)
    monkeypatch.setattr("gpushare.packing.quick_costs.PARTS_LIMIT", limit)
    rng = random.Random(limit)
    placer, reference = _placer(PodMix()), _placer(PodMix())
    for _ in range(400):
        node, demand = _node(rng, "n"), _demand(rng)
        # As the filter reads them: the kept costs first, then the node's facts (which may
        # start the numbers over).
        kept = placer.quick_costs_kept(demand)
        facts = placer.node_facts(node)
        assert facts is not None and facts.epoch == placer.quick.epoch
        cost = kept.get(facts.state, UNKNOWN)
        ref = reference.node_cost(node, demand)
        assert _same(cost if cost is not UNKNOWN else placer.quick_cost(facts, demand), ref)
        assert _same(placer.quick_cost(facts, demand), ref)
    assert placer.quick.epoch > 0


@pytest.mark.parametrize("limit", [5, 400_000])
def test_nodes_in_one_state_share_a_cost_and_a_changed_node_gets_its_own(
    monkeypatch: pytest.MonkeyPatch, limit: int
) -> None:
    """Costs kept per node state (NodeFacts.state, read by the filter through
    Placer.quick_costs_kept): many nodes copied from a few, as a fresh cluster's are, get the
    reference's cost, before and after some of them change (a tenant, CPU taken) and the mix
    is refit; with a small STATE_COSTS_LIMIT too (all dropped, worked out again)."""
    monkeypatch.setattr("gpushare.packing.quick_costs.STATE_COSTS_LIMIT", limit)
    rng = random.Random(limit)
    mix = PodMix()
    placer, reference = _placer(mix), _placer(mix)
    templates = [_node(rng, f"t{i}") for i in range(5)]
    nodes = [
        replace(
            t := templates[i % 5],
            name=f"n{i}",
            gpus=[replace(g, uuid=f"n{i}-{g.uuid}", tenants=list(g.tenants)) for g in t.gpus],
        )
        for i in range(60)
    ]
    demands = [_demand(rng) for _ in range(30)]
    for round_ in range(3):
        for demand in demands:
            kept = placer.quick_costs_kept(demand)
            for node in nodes:
                facts = placer.node_facts(node)
                assert facts is not None
                cost = kept.get(facts.state, UNKNOWN)
                if cost is UNKNOWN:
                    cost = placer.quick_cost(facts, demand)
                ref = reference.node_cost(node, demand)
                assert _same(cost, ref), (round_, node.name, demand, cost, ref)
        for k, node in enumerate(rng.sample(nodes, 30)):
            if k % 3 == 0:  # a tenant more
                gpu = rng.choice(node.gpus)
                t = _tenant(rng, 99, gpu.free_percent)
                if t is not None:
                    gpu.tenants = [*gpu.tenants, t]
            # Only host CPU, or only memory, taken: the same GPUs in another state.
            elif k % 3 == 1 and node.cpu_milli_free is not None:
                node.cpu_milli_free = max(0, node.cpu_milli_free - 4000)
            elif node.memory_free_bytes is not None:
                node.memory_free_bytes = max(0, node.memory_free_bytes - 8 * GIB)
        mix.observe_all(rng.sample(demands, 10))
        mix.refit()


def test_costs_held_across_numbers_starting_over_do_not_answer_for_new_numbers() -> None:
    """A caller holding the kept costs while a node's facts start the numbers over (the
    filter's loop) reads no cost of the old numbers for a different node given the same one."""
    placer, reference = _placer(PodMix()), _placer(PodMix())
    demand = Demand(percent=60)
    empty = NodeState(
        name="a",
        gpus=[GpuState(uuid="a0", memory_bytes=80 * GIB)],
        cpu_milli_free=8000,
        memory_free_bytes=64 * GIB,
    )
    busy = Tenant(key="ns/t", percent=50, memory_bytes=GIB)
    full = replace(
        empty, name="b", gpus=[GpuState(uuid="b0", memory_bytes=80 * GIB, tenants=[busy])]
    )
    kept = placer.quick_costs_kept(demand)
    facts = placer.node_facts(empty)
    assert facts is not None and placer.quick_cost(facts, demand) is not None
    placer.quick.clear()  # what node_facts does past INTERN_LIMIT signatures
    facts = placer.node_facts(full)
    assert facts is not None and facts.key == 0  # the number the empty node had
    cost = kept.get(facts.state, UNKNOWN)
    assert cost is UNKNOWN and reference.node_cost(full, demand) is None


def test_quick_costs_read_no_more_than_the_pod_shape_without_cpu_and_memory() -> None:
    """Pods that differ only in CPU and memory share what is kept for their GPU part."""
    quick = QuickCosts()
    node = NodeState(
        name="n",
        gpus=[GpuState(uuid=f"g{i}", memory_bytes=80 * GIB) for i in range(4)],
        cpu_milli_free=64_000,
        memory_free_bytes=256 * GIB,
    )
    facts = quick.facts(node)
    assert facts is not None
    mix = PodMix()
    costs = {quick.cost(facts, Demand(percent=30, cpu_milli=c), mix.workload) for c in (0, 1, 2)}
    assert len(quick._shapes) == 1 and None not in costs


def test_fragmentation_is_the_group_sum_worked_out_afresh() -> None:
    """Workload.fragmentation (terms kept per free-CPU rank, memoised) against
    fragmentation_reference, on the prior and on mixes learned from random pods."""
    rng = random.Random(4747)
    workloads = [PodMix().workload]
    for _ in range(3):
        mix = PodMix()
        mix.observe_all(_demand(rng) for _ in range(300))
        mix.refit()
        workloads.append(mix.workload)
    for workload in workloads:
        for _ in range(3000):
            free = tuple(sorted(rng.choice((0, 0, 5, 19, 20, 50, 70, 95, 100)) for _ in range(8)))
            cpu = rng.choice((None, rng.randrange(-2000, 96_000, 250)))
            model = rng.choice(MODELS)
            fast = workload.fragmentation(free, cpu, model)
            assert fast == workload.fragmentation_reference(free, cpu, model)
            assert workload.fragmentation(free, cpu, model) == fast  # from the memo


def test_quick_costs_are_the_reference_costs_with_scarce_models_priced() -> None:
    """Issue 69: with GPU models priced (pods limited to one model in the mix, prices moved by
    the free capacity between refits) the quick path still gives the reference's float; a
    reprice keeps the options' terms and drops the costs."""
    rng = random.Random(69)
    nodes = [_node(rng, f"n{i}") for i in range(80)]
    free = {MODELS[0]: 4000, MODELS[1]: 300}
    mix = PodMix(refit_every=10, free_capacity=lambda: free)
    placer, reference = _placer(mix), _placer(mix)
    demands = [_demand(rng) for _ in range(40)]
    mix.observe_all(replace(d, gpu_model=MODELS[1]) for d in demands[:10] if d.gpus)
    mix.observe_all(demands[10:])
    assert mix.workload.prices.get(MODELS[1], 0.0) > 0
    priced = 0
    for round_ in range(3):
        for demand in demands:
            for node in nodes:
                quick = _quick(placer, node, demand)
                assert _same(quick, reference.node_cost(node, demand)), (round_, node.name)
                # ... and the policy's cost afresh, the price added to every option.
                afresh = node_cost(
                    reference._admitted(node, demand),
                    demand,
                    policy=Policy.GPUSHARE,
                    workload=mix.workload,
                    model=reference.model,
                )
                assert _same(quick, afresh), (round_, node.name)
                priced += quick is not None and node.gpus[0].model == MODELS[1]
        parts = sum(len(s.parts) for s in placer.quick._shapes.values())
        free[MODELS[1]] //= 2
        assert mix.reprice()
        _quick(placer, nodes[0], demands[0])  # under the new prices: terms kept, costs not
        assert sum(len(s.parts) for s in placer.quick._shapes.values()) == parts
        assert sum(len(a.costs) for a in placer.quick._by_demand.values()) == 1
    assert priced > 100
