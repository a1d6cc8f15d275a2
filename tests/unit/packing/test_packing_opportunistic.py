"""Opportunistic placement (the sharing contract): an opted-in batch pod beyond a GPU's
guaranteed capacity only where that is predicted to pay and keeps everyone within bound; a
guaranteed pod makes room (pausing and evicting: tests/unit/packing/test_packing_pausing.py);
promotion once the request fits."""

import math
from dataclasses import replace

import pytest

from gpushare.api.names import CLASS_LATENCY
from gpushare.packing.admission import DEFAULT_BOUNDS, Admission, admit_reason
from gpushare.packing.corrections import (
    K_RANGE,
    K_WEIGHT,
    MIN_WINDOWS,
    Corrections,
    corrected,
    members,
)
from gpushare.packing.interference import load_default
from gpushare.packing.model import Assignment, Demand, GpuState, NodeState, PipeProfile, Tenant
from gpushare.packing.opportunistic import (
    EVICT_CLIENTS,
    EVICT_MEMORY,
    MIN_GAIN,
    OPPORTUNISTIC_COST,
    Member,
    Opportunism,
    guaranteed_gpu,
    rates,
    reservation_reason,
)
from gpushare.packing.opportunistic_memory import memory_for, memory_steps
from gpushare.packing.placer import Placer
from gpushare.packing.promotion import MAX_CHECKS, Waiting, promoted
from gpushare.packing.share_floor import floor_rate
from tests.unit.packing import h200_profiles as h200

GIB = 2**30
# Solo profiles measured on an H100 by the GPU benchmark (run 20).
SMALL = PipeProfile(
    fp32=0.007, tensor=0.022, sm_occupancy=0.06, dram_bandwidth=0.05, sm_utilization=0.19
)
LSTM = PipeProfile(tensor=0.07, sm_occupancy=0.04, dram_bandwidth=0.09, sm_utilization=0.27)
BIG = PipeProfile(
    fp32=0.02, tensor=0.25, sm_occupancy=0.41, dram_bandwidth=0.48, sm_utilization=0.79
)
GEMM = PipeProfile(tensor=0.96, sm_occupancy=0.12, dram_bandwidth=0.15, sm_utilization=0.98)


def tenant(
    key: str, percent: int, profile: PipeProfile | None, *, gib: int | None = None, **kw: object
) -> Tenant:
    """A tenant with its request's share of an 80 GiB GPU's memory, or ``gib``."""
    memory = (gib * GIB) if gib is not None else 80 * GIB * percent // 100
    return Tenant(key, percent, memory, profile=profile, **kw)  # type: ignore[arg-type]


def gpu(*tenants: Tenant, uuid: str = "GPU-0") -> GpuState:
    return GpuState(uuid=uuid, memory_bytes=80 * GIB, model="H100", tenants=list(tenants))


def opted(percent: int, profile: PipeProfile | None, **kw: object) -> Demand:
    return Demand(percent=percent, profile=profile, opportunistic=True, **kw)  # type: ignore[arg-type]


def placer() -> Placer:
    return Placer(admission=Admission(), opportunism=Opportunism())


def test_an_opportunistic_tenant_holds_no_guaranteed_share_but_its_memory_counts() -> None:
    g = gpu(tenant("ns/a", 60, SMALL), tenant("ns/o", 60, SMALL, opportunistic=True))
    assert g.used_percent == 60
    assert g.used_memory == 2 * 48 * GIB
    assert guaranteed_gpu(g).tenants == [g.tenants[0]]
    assert guaranteed_gpu(gpu(tenant("ns/a", 60, SMALL))).tenants[0].key == "ns/a"


def test_an_opted_in_pod_runs_beyond_guaranteed_capacity_beside_light_tenants() -> None:
    node = NodeState("n", [gpu(tenant("ns/a", 70, SMALL, gib=30), tenant("ns/b", 20, LSTM))])
    demand = opted(60, SMALL)
    assignment = placer().choose_gpus(node, demand)
    assert assignment is not None and assignment.opportunistic
    assert assignment.predicted_gain >= MIN_GAIN
    assert assignment.thread_percent == 100  # its own cap: the default limit
    # Its request's share of the memory does not fit beside the tenants' caps; half of it does.
    assert assignment.memory_limit_bytes == memory_steps(demand, 80 * GIB)[1]
    # With every tenant's cap its share, nothing is left: it waits.
    held = NodeState("n", [gpu(tenant("ns/a", 70, SMALL), tenant("ns/b", 25, LSTM))])
    assert placer().choose_gpus(held, demand) is None
    cost = placer().node_cost(node, demand)
    assert cost is not None and cost > OPPORTUNISTIC_COST - 100
    # Not opted in, the same pod waits.
    assert placer().choose_gpus(node, replace(demand, opportunistic=False)) is None


def test_a_guaranteed_option_anywhere_costs_less_than_any_opportunistic_one() -> None:
    full = NodeState("full", [gpu(tenant("ns/a", 70, SMALL, gib=30), tenant("ns/b", 20, LSTM))])
    room = NodeState("room", [gpu(tenant("ns/c", 90, BIG), uuid="GPU-1"), gpu(uuid="GPU-2")])
    demand = opted(60, SMALL)
    beyond, guaranteed = placer().node_cost(full, demand), placer().node_cost(room, demand)
    assert beyond is not None and guaranteed is not None and guaranteed < beyond
    chosen = placer().choose_gpus(room, demand)
    assert chosen is not None and not chosen.opportunistic and chosen.gpu_uuids == ("GPU-2",)


def test_no_opportunistic_tenant_where_a_neighbour_would_be_pushed_past_its_bound() -> None:
    node = NodeState("n", [gpu(tenant("ns/a", 60, SMALL))])
    refusal = placer().refusal(node, opted(100, GEMM))
    assert placer().choose_gpus(node, opted(100, GEMM)) is None
    assert refusal is not None and "not opportunistically either" in refusal
    assert "bound" in refusal


XL = PipeProfile(
    fp32=0.03, tensor=0.11, sm_occupancy=0.53, dram_bandwidth=0.56, sm_utilization=0.90
)  # ResNet-50 at batch 256 on the H100 (run 22): keeps 90% of the SMs busy alone


def test_an_opportunistic_pod_is_held_to_the_gain_it_brings_not_to_its_own_bound() -> None:
    # The sharing contract: running now, however slowly, beats waiting. A notebook beside a
    # saturating guaranteed GEMM is predicted past the batch bound itself, but the GPU does
    # more work with it and the GEMM keeps its share's speed, so it runs.
    g = gpu(tenant("ns/gemm", 95, GEMM, gib=20))
    demand = opted(30, h200.NOTEBOOK, peak_memory_bytes=4 * GIB)
    own = Admission().gpu_reason(g, replace(demand, opportunistic=False))
    assert own is not None and "for this batch pod" in own and "2.00x bound" in own
    option = Opportunism().gpu_option(g, demand)
    assert not isinstance(option, str) and option.gain >= MIN_GAIN
    # What it brings still decides: a small job there is starved and adds nothing.
    refusal = Opportunism().gpu_option(g, opted(60, SMALL, peak_memory_bytes=4 * GIB))
    assert isinstance(refusal, str) and refusal.startswith("predicted gain")


def test_an_opportunistic_pod_never_takes_a_guaranteed_pod_below_what_its_share_gives() -> None:
    # A second GPT-2 beside a guaranteed 60% one keeps it within the 2.0x class bound, but
    # takes it to half its speed alone: less than its 60% share alone would give it, for a
    # small gain (the heavy trace's pairs: both jobs finished later than one after the other).
    g = gpu(tenant("ns/gpt2", 60, h200.GPT2, gib=20))
    demand = opted(55, h200.GPT2, peak_memory_bytes=4 * GIB)
    trial = replace(demand, percent=99)
    assert admit_reason(g, trial, model=load_default(), bounds=DEFAULT_BOUNDS,
                        newcomer_bound=False) is None  # fmt: skip
    refusal = Opportunism().gpu_option(g, demand)
    assert isinstance(refusal, str)
    assert "guaranteed pod ns/gpt2" in refusal and "60% share alone" in refusal
    # A light job beside it costs it little and runs.
    option = Opportunism().gpu_option(g, opted(30, h200.RESNET18, peak_memory_bytes=4 * GIB))
    assert not isinstance(option, str)
    # The floor guards guaranteed shares only: the same GPT-2 running opportunistically itself
    # is the newcomer's equal, held to its class bound alone.
    equal = gpu(tenant("ns/gpt2", 60, h200.GPT2, gib=20, opportunistic=True))
    assert not isinstance(Opportunism().gpu_option(equal, demand), str)


def test_a_guaranteed_pod_without_a_profile_is_held_to_its_share_of_the_gpu() -> None:
    # Nothing measured says what its share alone gives it, so the floor is the share itself:
    # capped at 60%, it keeps 0.9 of 60% of the GPU, and a GEMM may run beside it (the
    # pause tests' pair on the local cluster and on a GPU).
    holder = tenant("ns/holder", 60, None, gib=8, thread_percent=60)
    assert floor_rate(holder, load_default()) == pytest.approx(0.6)
    option = Opportunism().gpu_option(gpu(holder), opted(50, GEMM, peak_memory_bytes=4 * GIB))
    assert not isinstance(option, str) and option.gain >= MIN_GAIN


@pytest.mark.parametrize(
    ("demand", "why"),
    [
        (opted(60, None), "needs the pod's measured profile"),
        (opted(60, SMALL, gpu_class=CLASS_LATENCY), "not an opted-in batch pod"),
        (opted(100, SMALL, gpus=2), "not an opted-in batch pod"),
    ],
)
def test_only_profiled_batch_pods_of_one_gpu_run_opportunistically(
    demand: Demand, why: str
) -> None:
    g = gpu(tenant("ns/a", 70, SMALL))
    option = Opportunism().gpu_option(g, demand)
    assert isinstance(option, str) and why in option


def test_a_pod_with_its_own_memory_cap_runs_only_where_that_cap_fits() -> None:
    g = gpu(tenant("ns/a", 80, SMALL))
    assert isinstance(Opportunism().gpu_option(g, opted(40, SMALL, memory_bytes=20 * GIB)), str)
    option = Opportunism().gpu_option(g, opted(40, SMALL, memory_bytes=4 * GIB))
    assert not isinstance(option, str) and option.memory_bytes == 4 * GIB


def test_a_guaranteed_pod_short_of_memory_evicts_the_newest_opportunistic_tenants_for_it() -> None:
    g = gpu(
        tenant("ns/a", 30, SMALL),
        tenant("ns/old", 50, SMALL, gib=20, opportunistic=True, placed_at=1.0),
        tenant("ns/new", 50, SMALL, gib=20, opportunistic=True, placed_at=2.0),
    )
    # 24 GiB held by a, 20 + 20 by the two opportunistic tenants: 48 for a 60% pod needs both
    # gone (a pause frees no memory), 8 for a 10% pod fits beside them.
    assignment = placer().choose_gpus(NodeState("n", [g]), Demand(percent=60, profile=SMALL))
    assert assignment is not None and not assignment.opportunistic
    assert assignment.evict == ("ns/new", "ns/old")
    assert assignment.evict_reason == EVICT_MEMORY
    assert assignment.pause == ()
    small = placer().choose_gpus(NodeState("n", [g]), Demand(percent=10, profile=SMALL))
    assert small is not None and small.displaces == ()


def test_eviction_goes_no_further_than_the_newcomer_needs() -> None:
    g = gpu(
        tenant("ns/a", 30, SMALL),
        tenant("ns/old", 20, SMALL, opportunistic=True, placed_at=1.0),
        tenant("ns/new", 40, SMALL, opportunistic=True, placed_at=2.0),
    )
    out = Opportunism().preemptions(g, Demand(percent=40, profile=SMALL))
    assert out is not None and out.evict == ("ns/new",) and out.pause == ()
    # Newest first, but an older tenant whose memory alone is enough spares the newer ones.
    g = gpu(
        tenant("ns/a", 30, SMALL),
        tenant("ns/big", 40, SMALL, opportunistic=True, placed_at=1.0),
        tenant("ns/small", 10, SMALL, opportunistic=True, placed_at=2.0),
    )
    out = Opportunism().preemptions(g, Demand(percent=40, profile=SMALL))
    assert out is not None and out.evict == ("ns/big",)


def test_a_pod_short_of_mps_clients_evicts_for_them_a_pause_keeps_its_client() -> None:
    g = replace(
        gpu(
            tenant("ns/a", 30, SMALL, gib=8),
            tenant("ns/o", 20, SMALL, gib=8, opportunistic=True, processes=4),
        ),
        max_clients=6,
    )
    out = Opportunism().preemptions(g, Demand(percent=20, profile=SMALL, processes=2))
    assert out is not None and out.evict == ("ns/o",) and out.evict_reason == EVICT_CLIENTS


def test_promotion_takes_the_oldest_first_and_only_what_fits() -> None:
    g = gpu(
        tenant("ns/a", 50, SMALL),
        tenant("ns/second", 30, SMALL, opportunistic=True, placed_at=2.0),
        tenant("ns/first", 40, SMALL, opportunistic=True, placed_at=1.0),
        tenant("ns/third", 10, SMALL, opportunistic=True, placed_at=3.0),
    )
    assert Opportunism().promotions(g) == ["ns/first", "ns/third"]


def test_promotion_leaves_the_room_to_a_pod_that_waited_longer_for_its_guarantee() -> None:
    """First come, first served: a guaranteed pod refused for room since t=1 keeps the room
    that frees from an opportunistic tenant placed at t=2; one that came later does not."""
    g = gpu(
        tenant("ns/a", 30, SMALL, gib=8),
        tenant("ns/o", 60, SMALL, gib=8, opportunistic=True, placed_at=2.0),
    )
    older = Waiting("ns/g", Demand(percent=50, profile=SMALL, memory_bytes=8 * GIB), since=1.0)
    assert Opportunism().promotions(g) == ["ns/o"]
    assert Opportunism().promotions(g, [older]) == []
    assert Opportunism().promotions(g, [replace(older, since=3.0)]) == ["ns/o"]
    # It asks for more than is free: the room goes to the tenant as before.
    too_big = replace(older, demand=replace(older.demand, percent=80))
    assert Opportunism().promotions(g, [too_big]) == ["ns/o"]
    # What is left after the waiting pod's share still promotes a smaller tenant.
    small = tenant("ns/s", 20, SMALL, gib=8, opportunistic=True, placed_at=2.5)
    assert Opportunism().promotions(gpu(*g.tenants, small), [older]) == ["ns/s"]


def test_a_waiting_pod_that_would_evict_does_not_hold_back_a_promotion() -> None:
    """Its share would have to evict the tenant (it needs memory the tenant holds): the tenant
    is promoted, and keeps its work, rather than be thrown away for an older pod."""
    g = gpu(
        tenant("ns/a", 30, SMALL, gib=30), tenant("ns/o", 60, SMALL, gib=40, opportunistic=True)
    )
    g = replace(g, tenants=[g.tenants[0], replace(g.tenants[1], placed_at=2.0)])
    needs_memory = Waiting("ns/g", Demand(percent=50, profile=SMALL, memory_bytes=20 * GIB), 1.0)
    assert Opportunism().promotions(g, [needs_memory]) == ["ns/o"]


def test_holding_an_assignment_checks_what_its_tier_needs() -> None:
    g = gpu(tenant("ns/a", 90, SMALL), tenant("ns/o", 40, SMALL, gib=4, opportunistic=True))
    beyond = Assignment("n", ("GPU-0",), 100, 4 * GIB, opportunistic=True)
    assert reservation_reason(g, Demand(percent=60), beyond) is None
    too_big = replace(beyond, memory_limit_bytes=60 * GIB)
    assert reservation_reason(g, Demand(percent=60), too_big) is not None
    # 10% guaranteed fits in compute, its memory only once the opportunistic tenant is gone.
    guaranteed = Assignment("n", ("GPU-0",), 100, 8 * GIB)
    memory_hog = gpu(
        tenant("ns/a", 90, SMALL), tenant("ns/o", 40, SMALL, gib=8, opportunistic=True)
    )
    assert reservation_reason(memory_hog, Demand(percent=10), guaranteed) is not None
    # A pause keeps the tenant's memory: only its eviction makes room.
    paused = replace(guaranteed, pause=("ns/o",))
    assert reservation_reason(memory_hog, Demand(percent=10), paused) is not None
    freed = replace(guaranteed, evict=("ns/o",))
    assert reservation_reason(memory_hog, Demand(percent=10), freed) is None


def test_corrections_scale_the_predicted_slowdown_of_the_workloads_measured() -> None:
    model = load_default()
    members = [Member(BIG, 100, workload="ns/big"), Member(SMALL, 100, workload="ns/small")]
    raw = rates(members, model)
    learned = Corrections()
    learned.learn(["ns/big", "ns/small"], 0.5)
    # Damped (weight K_WEIGHT), and not used before MIN_WINDOWS windows taught it.
    assert learned.factors["ns/big"] == pytest.approx(1 - K_WEIGHT * 0.5)
    assert learned.k("ns/big") == 1.0 and learned.k("other") == 1.0
    for _ in range(MIN_WINDOWS - 1):
        learned.learn(["ns/big", "ns/small"], 0.5)
    assert learned.k("ns/big") < 1.0 and learned.k("other") == 1.0
    better = rates(members, corrected(model, [(BIG, "ns/big"), (SMALL, "ns/small")], learned))
    assert all(b > r for b, r in zip(better, raw, strict=True))
    for _ in range(20):
        learned.learn(["ns/big"], 100.0)  # bounded: wild measurements cannot run off
    assert learned.k("ns/big") <= K_RANGE[1]


def test_a_latency_pods_prediction_is_never_loosened_by_corrections() -> None:
    service = tenant("ns/svc", 25, SMALL, gpu_class=CLASS_LATENCY, workload="ns/svc")
    trainer = tenant("ns/train", 60, BIG, workload="ns/train")
    corrections = Corrections({"ns/svc": 0.25, "ns/train": 0.25})
    model = corrected(load_default(), members([service, trainer]), corrections)
    raw = load_default()
    # The trainer's predicted slowdown is corrected; the service's is the model's own.
    assert model.predict(BIG, 100, [(SMALL, 100)]) < raw.predict(BIG, 100, [(SMALL, 100)])
    assert model.predict(SMALL, 100, [(BIG, 100)]) == raw.predict(SMALL, 100, [(BIG, 100)])


def test_a_measured_peak_lets_an_opportunistic_pod_take_what_it_was_seen_to_need() -> None:
    demand = opted(60, SMALL, peak_memory_bytes=3 * GIB)
    steps = memory_steps(demand, 80 * GIB)
    assert steps[0] == 48 * GIB and steps[-1] == math.ceil(3 * GIB * 1.25)
    # Never below its peak: a pod that needed more than half its share keeps its share.
    assert memory_steps(opted(60, SMALL, peak_memory_bytes=40 * GIB), 80 * GIB) == [48 * GIB]
    # Beside tenants whose caps leave 14 GiB (8 of them kept for a guaranteed pod), only the
    # measured step fits.
    node = NodeState("n", [gpu(tenant("ns/a", 70, SMALL, gib=66), tenant("ns/b", 20, LSTM, gib=0))])
    assignment = placer().choose_gpus(node, demand)
    assert assignment is not None and assignment.opportunistic
    assert assignment.memory_limit_bytes == steps[-1]
    assert placer().choose_gpus(node, opted(60, SMALL)) is None
    # On a GPU with room for its whole share it still takes only what it was seen to need,
    # so the next guaranteed pod finds the rest free instead of evicting it.
    roomy = gpu(tenant("ns/a", 70, SMALL, gib=20))
    assert memory_for(demand, roomy) == steps[-1]


def test_an_opportunistic_pod_leaves_room_for_a_small_guaranteed_one() -> None:
    # 40 GiB free: a 60% pod's half share (24 GiB) fits and leaves 16; beside caps leaving
    # 30 GiB, its quarter (12) fits where its half would leave less than a tenth of the GPU.
    roomy = gpu(tenant("ns/a", 70, SMALL, gib=40))
    assert memory_for(opted(60, SMALL), roomy) == 24 * GIB
    tight = gpu(tenant("ns/a", 70, SMALL, gib=50))
    assert memory_for(opted(60, SMALL), tight) == 12 * GIB
    full = gpu(tenant("ns/a", 70, SMALL, gib=68))
    assert memory_for(opted(60, SMALL), full) is None


def test_a_learned_correction_never_makes_the_model_less_careful_about_a_guaranteed_pod() -> None:
    # Run 35 (H200, light trace, marked rows): a guaranteed LSTM and ResNet-18 at half-GPU
    # caps, whose workloads had learned factors below 1 from their GPUs' total work (0.52 and
    # 0.57 by the run's end). Used as they are, such factors let an opted-in transformer in
    # beside them; the LSTM ran 2.46x its solo time. For the bounds of pods that did not opt
    # in, factors below 1 count as 1.
    learned = Corrections({"lstm": 0.52, "r18": 0.57})

    def guaranteed(opted_in: bool) -> GpuState:
        return gpu(
            tenant("ns/lstm", 15, h200.LSTM, gib=4, thread_percent=50, workload="lstm",
                   opportunistic=opted_in),
            tenant("ns/r18", 15, h200.RESNET18, gib=4, thread_percent=50, workload="r18",
                   opportunistic=opted_in),
        )  # fmt: skip

    demand = opted(55, h200.TRANSFORMER, peak_memory_bytes=8 * GIB)
    refusal = Opportunism(corrections=learned).gpu_option(guaranteed(False), demand)
    assert isinstance(refusal, str) and "ns/lstm to 2.41x" in refusal
    # The corrections still count where they may: beside pods that opted in themselves
    # (equals, not held to a bound) it goes in.
    option = Opportunism(corrections=learned).gpu_option(guaranteed(True), demand)
    assert not isinstance(option, str)


def test_pending_pods_any_tenant_can_create_never_set_the_promotion_rounds_work() -> None:
    """At most MAX_CHECKS waiting pods are asked about per GPU and round (each ask is an
    admission check), none when no tenant fits anyway; past them the tenant is promoted."""
    asked: list[Demand] = []

    def never(demand: Demand) -> bool:
        asked.append(demand)
        return False

    g = gpu(tenant("ns/a", 30, SMALL), tenant("ns/o", 60, SMALL, opportunistic=True, placed_at=9.0))
    crowd = [Waiting(f"ns/w{i}", Demand(percent=50), since=float(i) / 1000) for i in range(500)]
    assert promoted(g, crowd, never) == ["ns/o"]
    assert len(asked) == MAX_CHECKS
    asked.clear()
    full = gpu(tenant("ns/a", 50, SMALL), *g.tenants[1:])
    assert promoted(full, crowd, never) == [] and asked == []
