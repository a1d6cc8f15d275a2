"""Which claims gpushare places, where its placer puts them, and the allocation it writes: one
the node agent's own strict reader takes back as the same device, share and configuration."""

import itertools
from collections.abc import Callable, Mapping

import pytest

from gpushare.api.dra import DEVICE_CLASS, DRIVER, MpsConfig, device_name
from gpushare.api.names import CLASS_LATENCY
from gpushare.cluster.dra import placement
from gpushare.cluster.dra.devices import DraDevices
from gpushare.cluster.dra.placement import Choice, ClaimAsk
from gpushare.node.dra.claims import ClaimRef, parse_claim
from gpushare.packing.model import Demand
from gpushare.packing.placer import Placer
from tests.unit.cluster.dra.helpers import (
    GIB,
    Obj,
    allocated_claim,
    gated_pod,
    gpu_info,
    ledger,
    mps_config,
    node_slice,
    opaque,
    share_claim,
)


def ask_of(claim: Obj) -> ClaimAsk:
    ask = placement.read_ask(claim, device_class=DEVICE_CLASS)
    assert isinstance(ask, ClaimAsk), ask
    return ask


def by_namespace(namespace: str) -> str:
    return namespace


no_host_limit: dict[str, tuple[int, int]] = {}
"""No node's status says what it offers."""


def choose(
    devices: DraDevices,
    claim: Obj,
    *,
    cpu_milli: int = 0,
    host_free: Mapping[str, tuple[int, int]] = no_host_limit,
) -> Choice | dict[str, int]:
    namespace = claim["metadata"]["namespace"]
    want = placement.demand(
        ask_of(claim), cpu_milli=cpu_milli, memory_bytes=0, tenancy=by_namespace(namespace)
    )
    return placement.choose(Placer(), devices, want, tenancy_of=by_namespace, host_free=host_free)


def chosen(
    devices: DraDevices,
    claim: Obj,
    *,
    cpu_milli: int = 0,
    host_free: Mapping[str, tuple[int, int]] = no_host_limit,
) -> tuple[str, str]:
    """(pool, device) the claim is placed on."""
    choice = choose(devices, claim, cpu_milli=cpu_milli, host_free=host_free)
    assert isinstance(choice, Choice), choice
    (gpu,) = choice.gpus
    return gpu.pool, gpu.device


def counting_ids() -> Callable[[], str]:
    numbers = itertools.count(1)
    return lambda: f"share-{next(numbers)}"


# ---- read_ask ------------------------------------------------------------------------------


def test_a_plain_share_claim_is_read_completely() -> None:
    claim = share_claim(
        "c1", percent="30", memory="4Gi", config=mps_config(**{"class": "latency", "limit": 50})
    )
    assert ask_of(claim) == ClaimAsk(
        request="gpu",
        count=1,
        percent=30,
        memory="4Gi",
        memory_bytes=4 * GIB,
        config=MpsConfig(gpu_class=CLASS_LATENCY, limit=50),
    )


def test_a_claim_naming_no_capacity_asks_for_a_whole_gpu() -> None:
    ask = ask_of(share_claim("c1", percent=None))
    assert (ask.percent, ask.memory, ask.memory_bytes, ask.config) == (100, None, None, MpsConfig())


def test_whole_gpus_of_a_multi_device_claim_are_placed_by_gpushare() -> None:
    ask = ask_of(share_claim("c1", percent="100", count=2))
    assert (ask.count, ask.percent) == (2, 100)


def _first_available(claim: Obj) -> None:
    request = claim["spec"]["devices"]["requests"][0]
    request["firstAvailable"] = [{"name": "a", **request.pop("exactly")}]


def _two_requests(claim: Obj) -> None:
    requests = claim["spec"]["devices"]["requests"]
    requests.append({**requests[0], "name": "second"})


@pytest.mark.parametrize(
    ("claim", "why"),
    [
        (
            share_claim("c", selectors=[{"cel": {"expression": "true"}}]),
            "its request has CEL selectors",
        ),
        (share_claim("c", device_class="gpu.nvidia.com"), "is not of DeviceClass"),
        (share_claim("c", percent="50", count=2), "a share of several devices"),
        (share_claim("c", percent="100", count=33), "its count is not 1..32"),
        (share_claim("c", percent="100", count=0), "its count is not 1..32"),
        (share_claim("c", percent="30", config=mps_config(limit=20)), "MpsConfig limit"),
        (share_claim("c", percent="abc"), "gpuPercent is not a whole 1..100"),
        (share_claim("c", percent="0"), "gpuPercent is not a whole 1..100"),
        (share_claim("c", percent="101"), "gpuPercent is not a whole 1..100"),
        (share_claim("c", percent="12.5"), "gpuPercent is not a whole 1..100"),
        (share_claim("c", memory="lots"), "it cannot be read"),
        (share_claim("c", config=mps_config(threads=9)), "it cannot be read"),
        (share_claim("c", adminAccess=True), "admin access"),
        (share_claim("c", allocationMode="All"), "allocationMode is not ExactCount"),
    ],
    ids=[
        "selectors",
        "another-class",
        "share-of-two",
        "count-33",
        "count-0",
        "limit-below-percent",
        "percent-abc",
        "percent-0",
        "percent-101",
        "percent-fraction",
        "bad-memory",
        "unknown-config-field",
        "admin-access",
        "allocation-mode-all",
    ],
)
def test_claims_gpushare_cannot_read_completely_are_left_to_kube_scheduler(
    claim: Obj, why: str
) -> None:
    answer = placement.read_ask(claim, device_class=DEVICE_CLASS)
    assert isinstance(answer, str)
    assert why in answer


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (_first_available, "firstAvailable"),
        (_two_requests, "more than one request"),
        (lambda c: c["spec"]["devices"].update(constraints=[{"matchAttribute": "x"}]), "constr"),
    ],
    ids=["first-available", "two-requests", "constraints"],
)
def test_claims_of_other_shapes_are_left_to_kube_scheduler(
    change: Callable[[Obj], object], why: str
) -> None:
    claim = share_claim("c")
    change(claim)
    answer = placement.read_ask(claim, device_class=DEVICE_CLASS)
    assert isinstance(answer, str)
    assert why in answer


# ---- demand --------------------------------------------------------------------------------


def test_the_demand_carries_the_share_class_limit_host_requests_and_tenancy() -> None:
    ask = ask_of(
        share_claim("c", percent="30", memory="4Gi", config=mps_config(**{"class": "latency"}))
    )
    assert placement.demand(ask, cpu_milli=500, memory_bytes=2 * GIB, tenancy="team") == Demand(
        percent=30,
        limit_percent=None,
        memory_bytes=4 * GIB,
        gpu_class=CLASS_LATENCY,
        gpus=1,
        cpu_milli=500,
        host_memory_bytes=2 * GIB,
        tenancy="team",
    )


def test_a_multi_device_demand_asks_for_whole_gpus() -> None:
    want = placement.demand(
        ask_of(share_claim("c", percent="100", count=2)), cpu_milli=0, memory_bytes=0, tenancy=None
    )
    assert (want.gpus, want.percent, want.memory_bytes) == (2, 100, None)


# ---- choose --------------------------------------------------------------------------------


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
    choice = placement.choose(
        Placer(), devices, want, tenancy_of=by_namespace, host_free=free, held=held
    )
    assert isinstance(choice, Choice)
    assert choice.assignment.node == "n2"


def test_a_cost_kept_for_a_node_does_not_outlive_room_held_on_it() -> None:
    """Room held by a placement not bound yet changes what a node offers without changing its
    GPUs or its free-room entry: a cost kept from before the hold must not be used."""
    devices = ledger(node_slice("n1"), node_slice("n2"))
    placer, memo = Placer(), placement.CostMemo()
    want = placement.demand(ask_of(share_claim("c")), cpu_milli=1000, memory_bytes=0, tenancy="ns")
    free = {"n1": (4000, 64 * GIB), "n2": (4000, 64 * GIB)}

    def place(held: dict[str, tuple[int, int]]) -> str:
        choice = placement.choose(
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
    placer, memo = Placer(), placement.CostMemo()
    want = placement.demand(
        ask_of(share_claim("c", percent="60")), cpu_milli=1000, memory_bytes=0, tenancy="ns"
    )
    free = {"n1": (4000, 64 * GIB), "n2": (4000, 64 * GIB)}

    def place() -> str:
        choice = placement.choose(
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
    answer = placement.choose(
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
        choice = placement.choose(
            Placer(), devices, want, tenancy_of=by_namespace, host_free=no_host_limit
        )
        assert isinstance(choice, Choice)
        assert (choice.assignment.node, choice.examined) == ("n030", 130)


@pytest.mark.parametrize(
    ("nodes", "found"), [(1, 1), (99, 99), (100, 100), (1000, 420), (5000, 500)]
)
def test_the_search_collects_as_many_nodes_as_kube_scheduler_scores(nodes: int, found: int) -> None:
    assert placement.nodes_to_find(nodes) == found


def test_the_search_starts_where_the_last_one_left_off() -> None:
    devices = ledger(*(node_slice(f"n{i:03}") for i in range(150)))
    want = placement.demand(ask_of(share_claim("c")), cpu_milli=0, memory_bytes=0, tenancy="ns")
    first = placement.choose(
        Placer(), devices, want, tenancy_of=by_namespace, host_free=no_host_limit
    )
    assert isinstance(first, Choice)
    assert (first.assignment.node, first.examined) == ("n000", 100)
    later = placement.choose(
        Placer(), devices, want, tenancy_of=by_namespace, host_free=no_host_limit, start=100
    )
    assert isinstance(later, Choice)
    assert later.assignment.node == "n000"  # n100..n149 then n000..n049: ties go by name
    rotated = placement.choose(
        Placer(), devices, want, tenancy_of=by_namespace, host_free=no_host_limit, start=30
    )
    assert isinstance(rotated, Choice)
    assert rotated.assignment.node == "n030"  # n030..n129 looked at


# ---- allocation ----------------------------------------------------------------------------


def choice_for(devices: DraDevices, claim: Obj) -> Choice:
    answer = choose(devices, claim)
    assert isinstance(answer, Choice), answer
    return answer


def test_the_allocation_is_what_kube_scheduler_would_write() -> None:
    devices = ledger(node_slice("n1"))
    claim = share_claim("c", percent="30", memory="4Gi")
    body = placement.allocation(
        claim, ask_of(claim), choice_for(devices, claim), share_id=counting_ids()
    )
    assert body == {
        "devices": {
            "results": [
                {
                    "request": "gpu",
                    "driver": DRIVER,
                    "pool": "n1",
                    "device": "gpu-0",
                    "shareID": "share-1",
                    "consumedCapacity": {"gpuPercent": "30", "memory": "4Gi"},
                }
            ]
        },
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
            ]
        },
    }


def test_memory_not_asked_for_is_consumed_as_zero() -> None:
    devices = ledger(node_slice("n1"))
    claim = share_claim("c", percent="25")
    body = placement.allocation(claim, ask_of(claim), choice_for(devices, claim))
    (result,) = body["devices"]["results"]
    assert result["consumedCapacity"] == {"gpuPercent": "25", "memory": "0"}


def test_each_device_of_a_whole_gpu_claim_gets_its_own_share_id() -> None:
    devices = ledger(node_slice("n1", 2))
    claim = share_claim("c", percent="100", memory="4Gi", count=2)
    body = placement.allocation(
        claim, ask_of(claim), choice_for(devices, claim), share_id=counting_ids()
    )
    results = body["devices"]["results"]
    assert sorted(r["device"] for r in results) == ["gpu-0", "gpu-1"]
    assert [r["shareID"] for r in results] == ["share-1", "share-2"]
    assert all(r["consumedCapacity"] == {"gpuPercent": "100", "memory": "0"} for r in results)


def test_class_configs_come_first_then_the_claims_own() -> None:
    devices = ledger(node_slice("n1"))
    claim = share_claim("c", config=mps_config(**{"class": "latency"}))
    claim["spec"]["devices"]["config"].append(opaque(mps_config(limit=90), requests=["gpu"]))
    class_config = opaque(mps_config(**{"class": "batch"}))
    body = placement.allocation(
        claim, ask_of(claim), choice_for(devices, claim), class_configs=[class_config]
    )
    assert body["devices"]["config"] == [
        {"source": "FromClass", "requests": ["gpu"], "opaque": class_config["opaque"]},
        {"source": "FromClaim", "opaque": claim["spec"]["devices"]["config"][0]["opaque"]},
        {
            "source": "FromClaim",
            "requests": ["gpu"],
            "opaque": claim["spec"]["devices"]["config"][1]["opaque"],
        },
    ]


@pytest.mark.parametrize(
    ("memory", "limit_bytes"), [("4Gi", 4 * GIB), (None, 80 * GIB * 30 // 100)]
)
def test_the_node_agent_reads_the_allocation_back_as_placed(
    memory: str | None, limit_bytes: int
) -> None:
    """The honesty check: the body gpushare writes is what the driver prepares."""
    devices = ledger(node_slice("n1", 2))
    devices.upsert_claim(allocated_claim("t", consumed={"gpuPercent": "90"}))  # gpu-0 is full
    claim = share_claim(
        "c", percent="30", memory=memory, config=mps_config(**{"class": "latency", "limit": 60})
    )
    class_config = opaque(mps_config(**{"class": "batch", "limit": 40}))
    body = placement.allocation(
        claim, ask_of(claim), choice_for(devices, claim), class_configs=[class_config]
    )
    claim["status"] = {
        "allocation": body,
        "reservedFor": [{"resource": "pods", "name": "p1", "uid": "pod-uid"}],
    }
    plan = parse_claim(
        claim,
        ref=ClaimRef(namespace="ns", uid=claim["metadata"]["uid"], name="c"),
        pool="n1",
        gpus={device_name(i): gpu_info(i, uuid=f"n1-GPU-{i}") for i in range(2)},
    )
    (gpu,) = plan.gpus
    assert (gpu.device, gpu.gpu.uuid, gpu.percent) == ("gpu-1", "n1-GPU-1", 30)
    assert gpu.memory_limit_bytes == limit_bytes
    assert gpu.config == MpsConfig(gpu_class=CLASS_LATENCY, limit=60)  # the claim's wins
    assert (plan.pod, plan.pod_uid) == ("ns/p1", "pod-uid")

    devices.upsert_claim(claim)  # and the ledger counts it as the same share
    (tenant,) = devices.node_state("n1", tenancy_of=by_namespace).gpus[1].tenants
    assert (tenant.key, tenant.percent, tenant.memory_bytes) == ("ns/c", 30, limit_bytes)
    assert tenant.gpu_class == CLASS_LATENCY


# ---- pod_claim_names -----------------------------------------------------------------------


def test_pod_claim_names_of_direct_made_and_unmade_template_claims() -> None:
    pod = gated_pod("p", claim="direct")
    pod["spec"]["resourceClaims"] += [
        {"name": "made", "resourceClaimTemplateName": "t"},
        {"name": "unmade", "resourceClaimTemplateName": "t"},
    ]
    pod["status"]["resourceClaimStatuses"] = [
        {"name": "made", "resourceClaimName": "p-made-x1"},
        {"name": "unmade"},  # kube-controller-manager has not named it yet
    ]
    assert list(placement.pod_claim_names(pod)) == [
        ("gpu", "direct"),
        ("made", "p-made-x1"),
        ("unmade", None),
    ]


def test_a_pod_without_claims_names_none() -> None:
    pod = gated_pod("p", claim="c")
    del pod["spec"]["resourceClaims"]
    assert list(placement.pod_claim_names(pod)) == []


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
        choice = placement.choose(
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
    answer = placement.choose(
        Placer(),
        ledger(node_slice("n1")),
        want,
        tenancy_of=by_namespace,
        host_free=no_host_limit,
        gone=gone,
    )
    assert answer == {gone["n1"]: 1}
