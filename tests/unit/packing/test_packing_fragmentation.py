"""FGD's fragmentation measure on hand-built nodes, checked against the paper's definitions."""

import pytest

from gpushare.packing.fragmentation import (
    TaskClass,
    Workload,
    fgd_option,
    fgd_score,
    node_fragmentation,
    placement_options,
)
from gpushare.packing.model import Demand, GpuState, NodeState, Tenant

HALF_AND_WHOLE = Workload([TaskClass(1, 50), TaskClass(1, 100)])


def node(*used: int, model: str = "T4", cpu: int | None = None) -> NodeState:
    gpus = [
        GpuState(f"g{i}", 16 << 30, model=model, tenants=[Tenant("x", u, 0)] if u else [])
        for i, u in enumerate(used)
    ]
    return NodeState("n", gpus, cpu_milli_free=cpu)


@pytest.mark.parametrize(
    ("used", "expected"),
    [
        ((0, 0), 0.0),  # both GPUs fit both tasks
        ((50, 0), 25.0),  # the half-free GPU is a fragment for whole-GPU tasks
        ((100, 0), 0.0),  # a full GPU is not a fragment, the idle one fits everything
        ((70, 70), 60.0),  # 30% + 30% free: nobody fits
        ((100, 100), 0.0),  # nothing free, nothing fragmented
    ],
)
def test_fragmentation_is_the_free_share_the_workload_cannot_use(
    used: tuple[int, ...], expected: float
) -> None:
    assert node_fragmentation(node(*used), HALF_AND_WHOLE) == pytest.approx(expected)


def test_free_gpu_share_is_a_fragment_for_tasks_without_gpus_and_for_other_models() -> None:
    cpu_only = Workload([TaskClass(1, 0, gpus=0)])
    assert node_fragmentation(node(0, 0), cpu_only) == pytest.approx(200.0)
    a100_only = Workload([TaskClass(1, 50, gpu_model="A100")])
    assert node_fragmentation(node(0, 0, model="T4"), a100_only) == pytest.approx(200.0)
    assert node_fragmentation(node(0, 0, model="A100"), a100_only) == pytest.approx(0.0)


def test_node_short_of_cpu_strands_all_its_free_gpu_share() -> None:
    needs_cpu = Workload([TaskClass(1, 50, cpu_milli=8000)])
    assert node_fragmentation(node(0, 0, cpu=4000), needs_cpu) == pytest.approx(200.0)
    assert node_fragmentation(node(0, 0, cpu=8000), needs_cpu) == pytest.approx(0.0)


def test_multi_gpu_task_sees_partly_used_gpus_as_fragments() -> None:
    two_gpus = Workload([TaskClass(1, 100, gpus=2)])
    assert node_fragmentation(node(0, 0, 30), two_gpus) == pytest.approx(70.0)
    assert node_fragmentation(node(0, 30, 30), two_gpus) == pytest.approx(240.0)


def test_fgd_fills_the_half_free_gpu_rather_than_break_an_idle_one() -> None:
    n = node(50, 0)
    best = fgd_option(n, Demand(percent=50), HALF_AND_WHOLE)
    assert best is not None and best.gpus == (0,)
    assert best.frag_delta == pytest.approx(-25.0)


def test_placement_options_are_one_per_distinct_free_share() -> None:
    n = node(50, 50, 0, 0)
    options = placement_options(n, Demand(percent=30), HALF_AND_WHOLE)
    assert sorted(o.gpus for o in options) == [(0,), (2,)]
    every = placement_options(n, Demand(percent=30), HALF_AND_WHOLE, every_gpu=True)
    assert sorted(o.gpus for o in every) == [(0,), (1,), (2,)]


def test_published_fgd_score_is_an_integer_sigmoid_of_one_gpu() -> None:
    assert fgd_score(0.0) == 50
    assert fgd_score(-100.0) == 73  # fragmentation fell by one GPU
    assert fgd_score(100.0) == 26
    assert fgd_score(-1e6) == 100 and fgd_score(1e6) == 0


def test_typical_workload_keeps_the_most_popular_shapes_up_to_the_coverage() -> None:
    tasks = [TaskClass(1, 50)] * 5 + [TaskClass(1, 100)] * 3 + [TaskClass(1, 25)] * 2
    typical = Workload.typical(tasks, coverage=0.8)
    assert [(t.percent, round(t.weight, 3)) for t in typical.tasks] == [(50, 0.625), (100, 0.375)]
    assert len(Workload.typical(tasks, coverage=1.0).tasks) == 3


def test_stranded_share_is_what_free_cpu_cannot_feed() -> None:
    workload = Workload([TaskClass(1, 100, cpu_milli=10_000)])  # 100 milli-CPU per percent
    assert workload.stranded(200, 10_000, None) == pytest.approx(100.0)
    assert workload.stranded(200, 50_000, None) == 0.0
    assert workload.stranded(200, None, None) == 0.0


# Roughly the openb default mix: whole GPUs, 81% pods that strand 19%, and fractions.
OPENB_LIKE = Workload(
    [
        TaskClass(48, 100),
        TaskClass(13, 81),
        TaskClass(9, 47),
        TaskClass(4, 32),
        TaskClass(3, 65),
        TaskClass(1, 16),
    ]
)


def test_gap_a_popular_task_fills_wastes_less_than_one_only_rare_tasks_fit() -> None:
    waste = OPENB_LIKE.waste_table("T4")
    assert waste[0] == 0.0
    assert waste[10] == 10.0  # nothing fits 10%: it stays free for good
    # 36% free: the 32% tasks fill it to 4%. 21% free: only the rare 16% tasks fit.
    assert waste[36] < 0.5 * waste[21]
    # FGD's one-task measure ranks them the other way round (21% hurts fewer tasks than 36%).
    assert node_fragmentation(node(64, 100, model="T4"), OPENB_LIKE) > node_fragmentation(
        node(79, 100, model="T4"), OPENB_LIKE
    )
    # Tasks that may not use the GPU model do not fill its gaps.
    t4_only = Workload([TaskClass(1, 50, gpu_model="T4")])
    assert t4_only.waste_table("V100M16")[50] == 50.0
    assert t4_only.waste_table("T4")[50] == 0.0


def test_options_carry_the_change_of_lookahead_waste() -> None:
    options = placement_options(node(47, 32, model="T4"), Demand(percent=32), OPENB_LIKE)
    by_gpu = {o.gpus: o for o in options}
    beside_47, beside_32 = by_gpu[(0,)], by_gpu[(1,)]
    # FGD alone prefers leaving 21% beside the 47% pod; the look-ahead sees that 36% beside
    # the 32% pod gets used and 21% does not.
    assert beside_47.frag_delta < beside_32.frag_delta
    assert beside_32.waste_delta < 0 < beside_47.waste_delta
    whole = placement_options(node(0, 0, model="T4"), Demand(percent=100, gpus=2), OPENB_LIKE)
    assert whole[0].waste_delta == pytest.approx(-2 * OPENB_LIKE.waste_table("T4")[100])


def test_remembered_fragmentation_equals_a_fresh_evaluation_for_every_free_cpu() -> None:
    """Fragmentation is remembered by where the node's free CPU falls among the tasks' CPU
    demands, not by its exact value (docs/scale.md): a node with a CPU figure never asked about
    must get exactly what a workload that never saw any node computes."""
    tasks = [
        TaskClass(0.3, 50, 1, cpu_milli=4000),
        TaskClass(0.2, 25, 1, cpu_milli=8000),
        TaskClass(0.2, 100, 1, cpu_milli=16000),
        TaskClass(0.2, 100, 2, cpu_milli=32000),
        TaskClass(0.1, 0, 0, cpu_milli=2000),
    ]
    remembered = Workload(tasks)
    frees = [(0, 50, 75, 100), (25, 25, 100, 100), (100, 100, 100, 100), (10, 20, 30, 40)]
    for cpu in [
        None,
        0,
        1999,
        2000,
        2001,
        3999,
        4000,
        7999,
        8000,
        12000,
        16000,
        31999,
        32000,
        10**6,
    ]:
        for free in frees:
            fresh = Workload(tasks).fragmentation(free, cpu, "H100")
            assert remembered.fragmentation(free, cpu, "H100") == fresh, (free, cpu)
