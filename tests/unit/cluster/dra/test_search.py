"""Where gpushare's search puts a claim: the cheapest node among as many as kube-scheduler
scores, tenancies kept apart, host room and placements not bound yet counted, costs kept across
claims only while their nodes are unchanged, and nodes whose agent is gone passed over."""

import pytest

from gpushare.cluster.dra import placement, search
from gpushare.cluster.dra.search import Choice
from gpushare.packing.placer import Placer
from tests.unit.cluster.dra.helpers import (
    GIB,
    allocated_claim,
    ask_of,
    by_namespace,
    choose,
    chosen,
    ledger,
    no_host_limit,
    node_slice,
    share_claim,
)


def test_a_claim_does_not_join_another_tenancys_gpu_while_one_is_free() -> None:
    held = allocated_claim("t", namespace="a", consumed={"gpuPercent": "30", "memory": "0"})
    devices = ledger(node_slice("n1", 2), claims=[held])
    # The same tenancy packs onto the shared GPU; another tenancy takes the free one.
    assert chosen(devices, share_claim("c", namespace="a")) == ("n1", "gpu-0")
    assert chosen(devices, share_claim("c", namespace="b")) == ("n1", "gpu-1")


def test_another_tenancy_waits_rather_than_share_the_only_gpu() -> None:
    held = allocated_claim("t", namespace="a", consumed={"gpuPercent": "30"})
    devices = ledger(node_slice("n1"), claims=[held])
    answer = choose(devices, share_claim("c", namespace="b"))
    assert isinstance(answer, dict)
    assert sum(answer.values()) == 1
    assert "tenancy" in next(iter(answer))


def test_when_nothing_fits_choose_counts_the_nodes_by_reason() -> None:
    full = [allocated_claim(f"t{n}", pool=f"n{n}", consumed={"gpuPercent": "80"}) for n in (1, 2)]
    devices = ledger(node_slice("n1"), node_slice("n2"), claims=full)
    answer = choose(devices, share_claim("c", percent="30"))
    assert isinstance(answer, dict)
    assert list(answer.values()) == [2]  # both nodes refuse for the same reason


def test_with_no_gpushare_node_choose_says_so() -> None:
    answer = choose(ledger(), share_claim("c"))
    assert answer == {"no node publishes gpushare GPUs (ResourceSlices)": 1}


def test_a_node_short_of_free_cpu_is_not_chosen() -> None:
    devices = ledger(node_slice("n1"), node_slice("n2"))
    claim = share_claim("c")
    assert chosen(devices, claim, cpu_milli=1000) == ("n1", "gpu-0")  # ties go to n1

    free = {"n1": (500, 64 * GIB), "n2": (4000, 64 * GIB)}

    assert chosen(devices, claim, cpu_milli=1000, host_free=free) == ("n2", "gpu-0")
    answer = choose(devices, claim, cpu_milli=8000, host_free=free)
    assert isinstance(answer, dict)
    assert sum(answer.values()) == 2
    assert all("CPU" in reason for reason in answer)


def test_room_held_by_a_placement_not_bound_yet_counts_against_its_node() -> None:
    devices = ledger(node_slice("n1"), node_slice("n2"))
    claim = share_claim("c")
    want = placement.demand(ask_of(claim), cpu_milli=1000, memory_bytes=0, tenancy="ns")
    free = {"n1": (4000, 64 * GIB), "n2": (4000, 64 * GIB)}
    held = {"n1": (3500, 0)}  # a pod placed on n1 whose bind the view has not seen
    choice = search.choose(
        Placer(), devices, want, tenancy_of=by_namespace, host_free=free, held=held
    )
    assert isinstance(choice, Choice)
    assert choice.assignment.node == "n2"


def test_a_cost_kept_for_a_node_does_not_outlive_room_held_on_it() -> None:
    """Room held by a placement not bound yet changes what a node offers without changing its
    GPUs or its free-room entry: a cost kept from before the hold must not be used."""
    devices = ledger(node_slice("n1"), node_slice("n2"))
    placer, memo = Placer(), search.CostMemo()
    want = placement.demand(ask_of(share_claim("c")), cpu_milli=1000, memory_bytes=0, tenancy="ns")
    free = {"n1": (4000, 64 * GIB), "n2": (4000, 64 * GIB)}

    def place(held: dict[str, tuple[int, int]]) -> str:
        choice = search.choose(
            placer, devices, want, tenancy_of=by_namespace, host_free=free, held=held, memo=memo
        )
        assert isinstance(choice, Choice), choice
        return choice.assignment.node

    assert place({}) == "n1"
    assert place({"n1": (3500, 0)}) == "n2"  # 500 milli-CPU left on n1
    assert place({}) == "n1"  # bound elsewhere meanwhile: n1 is whole again


def test_costs_kept_across_claims_follow_the_nodes_the_claims_changed() -> None:
    """The memo is what makes the search fast at scale; a cost it kept for a node must not
    outlive the node's state: the second claim sees the first one's share and host room."""
    devices = ledger(node_slice("n1"), node_slice("n2"))
    placer, memo = Placer(), search.CostMemo()
    want = placement.demand(
        ask_of(share_claim("c", percent="60")), cpu_milli=1000, memory_bytes=0, tenancy="ns"
    )
    free = {"n1": (4000, 64 * GIB), "n2": (4000, 64 * GIB)}

    def place() -> str:
        choice = search.choose(
            placer, devices, want, tenancy_of=by_namespace, host_free=free, memo=memo
        )
        assert isinstance(choice, Choice), choice
        return choice.assignment.node

    assert place() == "n1"  # ties go to n1
    devices.upsert_claim(
        allocated_claim("first", pool="n1", device="gpu-0", consumed={"gpuPercent": "60"})
    )
    assert place() == "n2"  # 40 % left on n1: its remembered cost no longer applies
    devices.upsert_claim(
        allocated_claim("second", pool="n2", device="gpu-0", consumed={"gpuPercent": "30"})
    )
    free["n2"] = (500, 64 * GIB)  # and its CPU is taken
    answer = search.choose(
        placer, devices, want, tenancy_of=by_namespace, host_free=free, memo=memo
    )
    assert isinstance(answer, dict) and sum(answer.values()) == 2


def test_a_node_passed_over_as_full_is_looked_at_again_once_a_share_on_it_frees() -> None:
    """The search passes over a node from its GPUs' free shares alone (most nodes, once the
    cluster fills); what it reads must follow the claims, or a freed GPU would stay unused."""
    taken = allocated_claim("t", pool="n1", device="gpu-0", consumed={"gpuPercent": "80"})
    devices = ledger(node_slice("n1"), node_slice("n2"), claims=[taken])
    claim = share_claim("c", percent="50")
    assert chosen(devices, claim) == ("n2", "gpu-0")
    assert chosen(devices, claim) == ("n2", "gpu-0")  # n1 now passed over unasked
    devices.delete_claim(taken)
    assert chosen(devices, claim) == ("n1", "gpu-0")  # ties go to n1 again


def test_a_claim_for_two_gpus_passes_over_nodes_with_one_free() -> None:
    half = allocated_claim("t", pool="n1", device="gpu-1", consumed={"gpuPercent": "10"})
    devices = ledger(node_slice("n1", gpus=2), node_slice("n2", gpus=2), claims=[half])
    claim = share_claim("c", percent=None, count=2)
    for _ in range(2):  # the second time from what the first search read
        choice = choose(devices, claim)
        assert isinstance(choice, Choice), choice
        assert choice.assignment.node == "n2"
        assert sorted(g.device for g in choice.gpus) == ["gpu-0", "gpu-1"]


def test_nodes_passed_over_count_as_looked_at_for_where_the_next_search_starts() -> None:
    full = [
        allocated_claim(f"t{i}", pool=f"n{i:03}", consumed={"gpuPercent": "100"}) for i in range(30)
    ]
    devices = ledger(*(node_slice(f"n{i:03}") for i in range(150)), claims=full)
    want = placement.demand(ask_of(share_claim("c")), cpu_milli=0, memory_bytes=0, tenancy="ns")
    for _ in range(2):  # then from what the first search read
        choice = search.choose(
            Placer(), devices, want, tenancy_of=by_namespace, host_free=no_host_limit
        )
        assert isinstance(choice, Choice)
        assert (choice.assignment.node, choice.examined) == ("n030", 130)


@pytest.mark.parametrize(
    ("nodes", "found"), [(1, 1), (99, 99), (100, 100), (1000, 420), (5000, 500)]
)
def test_the_search_collects_as_many_nodes_as_kube_scheduler_scores(nodes: int, found: int) -> None:
    assert search.nodes_to_find(nodes) == found


def test_the_search_starts_where_the_last_one_left_off() -> None:
    devices = ledger(*(node_slice(f"n{i:03}") for i in range(150)))
    want = placement.demand(ask_of(share_claim("c")), cpu_milli=0, memory_bytes=0, tenancy="ns")
    first = search.choose(Placer(), devices, want, tenancy_of=by_namespace, host_free=no_host_limit)
    assert isinstance(first, Choice)
    assert (first.assignment.node, first.examined) == ("n000", 100)
    later = search.choose(
        Placer(), devices, want, tenancy_of=by_namespace, host_free=no_host_limit, start=100
    )
    assert isinstance(later, Choice)
    assert later.assignment.node == "n000"  # n100..n149 then n000..n049: ties go by name
    rotated = search.choose(
        Placer(), devices, want, tenancy_of=by_namespace, host_free=no_host_limit, start=30
    )
    assert isinstance(rotated, Choice)
    assert rotated.assignment.node == "n030"  # n030..n129 looked at


def test_a_node_whose_agent_is_gone_gets_no_claim_and_the_refusal_says_why() -> None:
    """The claim allocator skips a node whose agent's Lease expired (docs/node-agent.md, "A
    dead agent"), as the extender refuses it in device-plugin mode."""
    devices = ledger(node_slice("n1"), node_slice("n2"))
    claim = share_claim("c")
    want = placement.demand(
        ask_of(claim), cpu_milli=0, memory_bytes=0, tenancy=by_namespace("default")
    )
    gone = {"n1": "the gpushare node agent of node n1 is gone"}
    for start in (0, 1):
        choice = search.choose(
            Placer(),
            devices,
            want,
            tenancy_of=by_namespace,
            host_free=no_host_limit,
            start=start,
            gone=gone,
        )
        assert isinstance(choice, Choice)
        assert choice.assignment.node == "n2"
    answer = search.choose(
        Placer(),
        ledger(node_slice("n1")),
        want,
        tenancy_of=by_namespace,
        host_free=no_host_limit,
        gone=gone,
    )
    assert answer == {gone["n1"]: 1}
