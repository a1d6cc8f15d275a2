"""Which claims gpushare places and the allocation it writes for them: one
the node agent's own strict reader takes back as the same device, share and configuration."""

import itertools
from collections.abc import Callable

import pytest

from gpushare.api.dra import DEVICE_CLASS, DRIVER, MpsConfig, device_name
from gpushare.api.names import CLASS_LATENCY
from gpushare.cluster.dra import placement
from gpushare.cluster.dra.devices import DraDevices
from gpushare.cluster.dra.placement import ClaimAsk
from gpushare.cluster.dra.search import Choice
from gpushare.node.dra.claims import ClaimRef, parse_claim
from gpushare.packing.model import Demand
from tests.unit.cluster.dra.helpers import (
    GIB,
    Obj,
    allocated_claim,
    ask_of,
    by_namespace,
    choose,
    gated_pod,
    gpu_info,
    ledger,
    mps_config,
    node_slice,
    opaque,
    share_claim,
)


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
