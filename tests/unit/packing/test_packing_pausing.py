"""Pause, don't kill (docs/packing.md, "The sharing contract"): a guaranteed pod that needs an
opportunistic tenant's compute pauses it, and it keeps its GPU memory; it runs again when the
room frees and never where it would push a guaranteed neighbour past its class bound; an
opted-in pod never pauses or evicts another opted-in pod."""

from dataclasses import replace

from gpushare.api.names import CLASS_LATENCY
from gpushare.api.pause import REASON_GUARANTEED, REASON_HARM
from gpushare.packing.admission import Admission
from gpushare.packing.model import Demand, GpuState, NodeState, Pause, Tenant
from gpushare.packing.opportunistic import Opportunism
from gpushare.packing.placer import Placer
from tests.unit.packing.test_packing_opportunistic import (
    BIG,
    GEMM,
    GIB,
    LSTM,
    SMALL,
    gpu,
    opted,
    placer,
    tenant,
)


def busy_gpu(*extra: Tenant) -> GpuState:
    """A light guaranteed tenant and an opportunistic GEMM that keeps the tensor pipe full."""
    return gpu(
        tenant("ns/a", 20, SMALL, gib=10),
        tenant("ns/gemm", 60, GEMM, gib=10, opportunistic=True, placed_at=5.0, workload="gemm"),
        *extra,
    )


def arrived(g: GpuState, key: str, demand: Demand, *, paused: tuple[str, ...]) -> GpuState:
    """``g`` once ``demand`` (as tenant ``key``) is placed and the ``paused`` pods are frozen."""
    return replace(
        g,
        tenants=[
            replace(t, pause=Pause(REASON_GUARANTEED, 10.0, frozenset({key})))
            if t.key in paused
            else t
            for t in g.tenants
        ]
        + [Tenant(key, demand.percent, 48 * GIB, profile=demand.profile, placed_at=10.0)],
    )


def left(g: GpuState, key: str) -> GpuState:
    return replace(g, tenants=[t for t in g.tenants if t.key != key])


def test_a_guaranteed_pod_needing_compute_pauses_the_opportunistic_pod_which_keeps_memory() -> None:
    g = busy_gpu()
    demand = Demand(percent=60, profile=BIG)
    assignment = placer().choose_gpus(NodeState("n", [g]), demand)
    assert assignment is not None and not assignment.opportunistic
    assert assignment.pause == ("ns/gemm",) and assignment.evict == ()
    # Paused, the GEMM still holds its 10 GiB, and no prediction counts its compute.
    after = arrived(g, "ns/big", demand, paused=assignment.pause)
    assert after.used_memory == (10 + 10 + 48) * GIB
    assert [t.key for t in after.running().tenants] == ["ns/a", "ns/big"]


def test_a_paused_pod_resumes_when_the_guaranteed_pod_that_needed_the_room_leaves() -> None:
    g = busy_gpu()
    demand = Demand(percent=60, profile=BIG)
    assignment = placer().choose_gpus(NodeState("n", [g]), demand)
    assert assignment is not None
    after = arrived(g, "ns/big", demand, paused=assignment.pause)
    rules = Opportunism()
    # While the guaranteed pod is there, running the GEMM would push it past its bound.
    assert rules.resumptions(after) == []
    why = rules.resume_reason(after, after.tenants[1])
    assert why is not None and "bound" in why
    # Without it, the GEMM would still take the light guaranteed pod below what its 20% share
    # alone gives it; once that one leaves too, it runs again.
    gone = left(after, "ns/big")
    assert rules.resumptions(gone) == []
    floor = rules.resume_reason(gone, gone.tenants[1])
    assert floor is not None and "guaranteed pod ns/a" in floor and "20% share alone" in floor
    assert rules.resumptions(left(gone, "ns/a")) == ["ns/gemm"]


def test_a_pod_paused_for_measured_harm_waits_until_the_pods_it_harmed_have_left() -> None:
    harmed = Pause(REASON_HARM, 10.0, frozenset({"ns/a"}))
    g = gpu(
        tenant("ns/a", 20, SMALL, gib=10),
        tenant("ns/b", 20, SMALL, gib=10),
        tenant("ns/o", 40, LSTM, gib=10, opportunistic=True, pause=harmed),
    )
    rules = Opportunism()
    # The model predicts no harm, but the governor measured it: only a's leaving lifts it.
    assert rules.resume_reason(left(g, "ns/o"), replace(g.tenants[2], pause=None)) is None
    assert rules.resumptions(g) == []
    assert rules.resumptions(left(g, "ns/a")) == ["ns/o"]


def test_paused_pods_resume_oldest_first_while_each_keeps_guaranteed_pods_within_bound() -> None:
    g = gpu(
        tenant("ns/a", 30, SMALL, gib=10),
        tenant("ns/old", 50, LSTM, gib=10, opportunistic=True, placed_at=1.0),
        tenant("ns/new", 50, GEMM, gib=10, opportunistic=True, placed_at=2.0),
        tenant("ns/big", 60, BIG, gib=10, placed_at=3.0),
    )
    paused = gpu(
        *(
            replace(t, pause=Pause(REASON_GUARANTEED, 3.0)) if t.opportunistic else t
            for t in g.tenants
        )
    )
    # The light LSTM runs again beside the guaranteed pods; the GEMM would push BIG past 2x.
    assert Opportunism().resumptions(paused) == ["ns/old"]


def test_a_paused_compute_hog_does_not_keep_a_guaranteed_pod_out() -> None:
    frozen = replace(
        busy_gpu().tenants[1], pause=Pause(REASON_GUARANTEED, 1.0, frozenset({"ns/x"}))
    )
    g = gpu(tenant("ns/a", 20, SMALL, gib=10), frozen)
    demand = Demand(percent=60, profile=BIG)
    assert Admission().gpu_reason(busy_gpu(), demand) is not None  # running, it is in the way
    assert Admission().gpu_reason(g, demand) is None
    assignment = placer().choose_gpus(NodeState("n", [g]), demand)
    assert assignment is not None and assignment.displaces == ()


def test_an_opted_in_pod_never_pauses_or_evicts_an_opportunistic_one() -> None:
    # Not opted in, a 60% BIG pod pauses the GEMM (above); opted in, it may not: its request
    # is placed beside everyone or not at all, and then it waits or runs beyond capacity.
    g = busy_gpu()
    demand = opted(60, BIG)
    assignment = placer().choose_gpus(NodeState("n", [g]), demand)
    assert assignment is None or assignment.displaces == ()
    assert Opportunism().preemptions(g, demand) is None
    # Memory: 60 GiB free is not enough for its 48 GiB share plus what an eviction would free.
    tight = gpu(
        tenant("ns/a", 30, SMALL),
        tenant("ns/o", 50, SMALL, gib=20, opportunistic=True),
    )
    assert (
        Placer(admission=Admission()).choose_gpus(NodeState("n", [tight]), opted(60, SMALL)) is None
    )
    plain = Placer(admission=Admission()).choose_gpus(
        NodeState("n", [tight]), Demand(percent=60, profile=SMALL)
    )
    assert plain is not None and plain.evict == ("ns/o",)


def test_no_opportunistic_pod_is_paused_for_an_opted_in_neighbours_bound() -> None:
    # An opted-in pod holding a guaranteed share (placed by it, or promoted) is an equal: a
    # guaranteed newcomer that did not opt in is still protected, the equal's bound is not.
    equal = tenant("ns/e", 20, SMALL, gib=10, opted_in=True)
    g = gpu(equal, tenant("ns/gemm", 60, GEMM, gib=10, opportunistic=True, placed_at=5.0))
    light = Demand(percent=10, profile=SMALL)
    out = Opportunism().preemptions(g, light)
    assert out is not None and out.pause == ()
    protected = gpu(replace(equal, opted_in=False), g.tenants[1])
    out = Opportunism().preemptions(protected, light)
    assert out is not None and out.pause == ("ns/gemm",)


def test_a_pause_on_a_pod_holding_a_guaranteed_share_is_left_to_whoever_wrote_it() -> None:
    # gpushare pauses only opportunistic pods; an admin's pause of a guaranteed one stands,
    # and counts as paused (it uses no compute).
    held = tenant("ns/g", 40, BIG, gib=10, pause=Pause(REASON_GUARANTEED, 1.0))
    g = gpu(tenant("ns/a", 20, SMALL, gib=10), held)
    assert Opportunism().resumptions(g) == []
    assert [t.key for t in g.running().tenants] == ["ns/a"]


def test_a_paused_pod_is_not_promoted_until_it_runs_again() -> None:
    g = gpu(
        tenant("ns/a", 30, SMALL),
        tenant("ns/o", 40, SMALL, opportunistic=True, pause=Pause(REASON_GUARANTEED, 1.0)),
    )
    assert Opportunism().promotions(g) == []
    assert Opportunism().promotions(gpu(g.tenants[0], replace(g.tenants[1], pause=None))) == [
        "ns/o"
    ]


def test_a_latency_pod_pauses_an_opportunistic_neighbour_running_over_the_cap_it_would_get() -> (
    None
):
    # Both opted-in LSTMs started before any latency pod: one uncapped (100% threads), one at
    # the 50% a batch pod beside a latency pod gets. MPS keeps a cap for a process's life, so
    # the uncapped one gives way to the service by a pause; the capped one keeps running.
    uncapped = tenant(
        "ns/wide", 30, LSTM, gib=10, opportunistic=True, placed_at=1.0, thread_percent=100
    )
    capped = tenant(
        "ns/narrow", 30, LSTM, gib=10, opportunistic=True, placed_at=2.0, thread_percent=50
    )
    g = gpu(tenant("ns/a", 20, SMALL, gib=10), uncapped, capped)
    service = Demand(percent=25, profile=SMALL, gpu_class=CLASS_LATENCY)
    out = Opportunism().preemptions(g, service)
    assert out is not None and out.pause == ("ns/wide",) and out.evict == ()
    assignment = placer().choose_gpus(NodeState("n", [g]), service)
    assert assignment is not None and assignment.pause == ("ns/wide",)
    # A batch pod of the same size pauses no one: the cap protects a latency pod's tail.
    batch = Opportunism().preemptions(g, Demand(percent=25, profile=SMALL))
    assert batch is not None and batch.pause == ()
    # While the service is there the uncapped LSTM stays paused, saying why; it runs again
    # once the service has left.
    after = arrived(g, "ns/svc", service, paused=out.pause)
    after = replace(
        after,
        tenants=[
            replace(t, gpu_class=CLASS_LATENCY) if t.key == "ns/svc" else t for t in after.tenants
        ],
    )
    rules = Opportunism()
    assert rules.resumptions(after) == []
    why = rules.resume_reason(after, next(t for t in after.tenants if t.key == "ns/wide"))
    assert why is not None and "100% threads" in why and "latency" in why
    assert rules.resumptions(left(after, "ns/svc")) == ["ns/wide"]
