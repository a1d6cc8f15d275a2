"""The controller's DRA ledger: GPUs from the node agents' ResourceSlices, tenants from the
allocated claims, and hostile objects kept as problems instead of breaking the watch."""

import copy
from collections.abc import Callable

import pytest

from gpushare.api.names import CLASS_BATCH, CLASS_LATENCY
from gpushare.cluster.dra.devices import DraDevices
from gpushare.node.dra.slices import build_slice
from gpushare.packing.model import Tenant
from tests.unit.cluster.dra.helpers import (
    GIB,
    Obj,
    allocated_claim,
    gpu_info,
    ledger,
    mps_config,
    node_slice,
    share_claim,
)


def same_tenancy(namespace: str) -> str:
    return f"tenancy-of-{namespace}"


def tenants(devices: DraDevices, node: str = "n1", index: int = 0) -> list[Tenant]:
    return devices.node_state(node, tenancy_of=same_tenancy).gpus[index].tenants


def test_a_gpushare_slice_gives_the_node_its_gpus_in_index_order() -> None:
    obj = build_slice(
        node_name="n1",
        gpus=[gpu_info(0, uuid="GPU-a", memory_gib=80), gpu_info(1, uuid="GPU-b", memory_gib=40)],
        generation=1,
    )
    obj["spec"]["devices"].reverse()  # the API server keeps no order we could rely on
    devices = ledger(obj)
    state = devices.node_state("n1", tenancy_of=same_tenancy)
    assert devices.node_names() == ["n1"]
    assert [(g.uuid, g.index, g.memory_bytes) for g in state.gpus] == [
        ("GPU-a", 0, 80 * GIB),
        ("GPU-b", 1, 40 * GIB),
    ]
    assert state.gpus[0].model == "NVIDIA H100 80GB HBM3"
    assert all(g.idle for g in state.gpus)
    found = devices.gpu("n1", "GPU-b")
    assert found is not None
    assert (found.pool, found.device) == ("n1", "gpu-1")


def test_a_slice_of_another_driver_gives_no_gpus() -> None:
    obj = node_slice("n1")
    obj["spec"]["driver"] = "gpu.nvidia.com"
    devices = ledger(obj)
    assert devices.node_names() == []
    assert devices.problems == {}


@pytest.mark.parametrize(
    "damage",
    [
        lambda s: s["spec"].pop("nodeName"),
        lambda s: s["spec"].update(pool="not-an-object"),
        lambda s: s["spec"]["devices"][0]["capacity"].pop("memory"),
        lambda s: s["spec"]["devices"][0]["capacity"]["memory"].update(value="lots"),
    ],
    ids=["no-node", "no-pool", "no-memory", "bad-memory"],
)
def test_a_malformed_slice_is_a_problem_not_an_exception(damage: Callable[[Obj], object]) -> None:
    bad = node_slice("n1")
    damage(bad)
    devices = ledger(bad, node_slice("n2"))
    assert devices.node_names() == ["n2"]
    assert list(devices.problems) == [f"slice {bad['metadata']['name']}"]
    devices.upsert_slice(node_slice("n1"))  # the agent writes it again, correctly
    assert devices.node_names() == ["n1", "n2"]
    assert devices.problems == {}


def test_a_slice_that_turns_malformed_takes_its_gpus_away() -> None:
    devices = ledger(node_slice("n1"))
    bad = node_slice("n1")
    bad["spec"]["devices"][0]["capacity"]["memory"]["value"] = "lots"
    devices.upsert_slice(bad)
    assert devices.node_names() == []


def test_replacing_the_slices_drops_the_ones_not_listed() -> None:
    devices = DraDevices()
    devices.upsert_slice(node_slice("n1"))
    devices.upsert_slice(node_slice("n2"))
    assert not devices.slices_synced
    devices.replace_slices([node_slice("n2")])
    assert devices.node_names() == ["n2"]
    assert devices.slices_synced


def test_an_allocated_claim_is_a_tenant_of_its_gpu() -> None:
    claim = allocated_claim(
        "c1",
        namespace="team",
        device="gpu-1",
        consumed={"gpuPercent": "30", "memory": "4Gi"},
        config=mps_config(**{"class": "latency", "limit": 60}),
    )
    devices = ledger(node_slice("n1", 2), claims=[claim])
    assert tenants(devices, index=0) == []
    assert tenants(devices, index=1) == [
        Tenant(
            key="team/c1",
            percent=30,
            memory_bytes=4 * GIB,
            gpu_class=CLASS_LATENCY,
            tenancy="tenancy-of-team",
            thread_percent=100,  # the driver runs a latency claim uncapped
        )
    ]
    assert devices.node_state("n1", tenancy_of=same_tenancy).gpus[1].free_percent == 70


def test_a_tenants_thread_cap_is_the_one_the_driver_gives_its_claim() -> None:
    """docs/dra.md, "Requests and limits": a batch claim without a limit may use the whole
    GPU, one with a limit gets it, and beside a latency claim at most max(share, 50)."""
    alone = allocated_claim("alone", device="gpu-0", consumed={"gpuPercent": "30"})
    limited = allocated_claim(
        "limited", device="gpu-0", consumed={"gpuPercent": "20"}, config=mps_config(limit=40)
    )
    beside = allocated_claim("beside", device="gpu-1", consumed={"gpuPercent": "30"})
    web = allocated_claim(
        "web",
        device="gpu-1",
        consumed={"gpuPercent": "30"},
        config=mps_config(**{"class": "latency"}),
    )
    devices = ledger(node_slice("n1", 2), claims=[alone, limited, beside, web])
    caps = {
        t.key: t.thread_percent
        for g in devices.node_state("n1", tenancy_of=same_tenancy).gpus
        for t in g.tenants
    }
    assert caps == {"ns/alone": 100, "ns/limited": 40, "ns/beside": 50, "ns/web": 100}


def test_memory_consumed_as_zero_is_the_share_of_the_gpus_memory() -> None:
    claim = allocated_claim("c1", consumed={"gpuPercent": "25", "memory": "0"})
    (tenant,) = tenants(ledger(node_slice("n1", memory_gib=80), claims=[claim]))
    assert (tenant.percent, tenant.memory_bytes, tenant.gpu_class) == (25, 20 * GIB, CLASS_BATCH)


def test_a_claim_without_consumed_capacity_holds_the_whole_gpu() -> None:
    """Feature gate DRAConsumableCapacity off: kube-scheduler allocated the device whole."""
    (tenant,) = tenants(ledger(node_slice("n1"), claims=[allocated_claim("c1")]))
    assert (tenant.percent, tenant.memory_bytes) == (100, 80 * GIB)


def test_claims_that_are_not_ours_or_not_allocated_are_no_tenants() -> None:
    other = allocated_claim("other", driver="gpu.nvidia.com", consumed={"gpuPercent": "30"})
    devices = ledger(node_slice("n1"), claims=[other, share_claim("pending")])
    assert tenants(devices) == []
    assert devices.claim("ns/pending") is not None  # kept for the allocator to look up
    assert devices.problems == {}


def test_a_claim_seen_before_its_gpus_slice_counts_once_the_slice_comes() -> None:
    devices = ledger(claims=[allocated_claim("c1", consumed={"gpuPercent": "40"})])
    devices.upsert_slice(node_slice("n1"))
    assert [t.key for t in tenants(devices)] == ["ns/c1"]


def test_deleting_a_claim_or_listing_without_it_frees_its_share() -> None:
    one = allocated_claim("one", consumed={"gpuPercent": "30"})
    two = allocated_claim("two", consumed={"gpuPercent": "20"})
    devices = ledger(node_slice("n1"), claims=[one, two])
    devices.delete_claim(one)
    assert [t.key for t in tenants(devices)] == ["ns/two"]
    assert devices.claim("ns/one") is None
    devices.replace_claims([])
    assert tenants(devices) == []
    assert devices.claim("ns/two") is None


def test_version_moves_when_a_gpu_or_a_share_changes_and_only_then() -> None:
    devices = ledger(node_slice("n1"))
    start = devices.version
    devices.upsert_slice(node_slice("n1"))  # a resync: nothing new
    devices.upsert_claim(share_claim("pending"))  # not allocated: no share
    assert devices.version == start
    claim = allocated_claim("c1", consumed={"gpuPercent": "30"})
    devices.upsert_claim(claim)
    after_claim = devices.version
    assert after_claim > start
    devices.upsert_claim(copy.deepcopy(claim))  # the same share again
    assert devices.version == after_claim
    devices.delete_claim(claim)
    assert devices.version > after_claim
    after_delete = devices.version
    devices.upsert_slice(node_slice("n1", 2))
    assert devices.version > after_delete


def test_node_state_is_kept_until_its_node_changes() -> None:
    devices = ledger(node_slice("n1"), node_slice("n2"))
    n1 = devices.node_state("n1", tenancy_of=same_tenancy)
    n2 = devices.node_state("n2", tenancy_of=same_tenancy)
    assert devices.node_state("n1", tenancy_of=same_tenancy) is n1
    devices.upsert_claim(allocated_claim("c1", pool="n1", consumed={"gpuPercent": "30"}))
    rebuilt = devices.node_state("n1", tenancy_of=same_tenancy)
    assert rebuilt is not n1
    assert rebuilt.gpus[0].used_percent == 30
    assert devices.node_state("n2", tenancy_of=same_tenancy) is n2


def test_forget_states_rebuilds_tenancies() -> None:
    devices = ledger(node_slice("n1"), claims=[allocated_claim("c1", consumed={})])
    assert tenants(devices)[0].tenancy == "tenancy-of-ns"
    devices.forget_states()
    (tenant,) = devices.node_state("n1", tenancy_of=lambda ns: "group:g").gpus[0].tenants
    assert tenant.tenancy == "group:g"


def test_listeners_hear_the_key_of_each_claim_event() -> None:
    devices = ledger(node_slice("n1"))
    heard: list[str] = []
    devices.listeners.append(heard.append)
    claim = share_claim("c1", namespace="team")
    devices.upsert_claim(claim)
    devices.delete_claim(claim)
    devices.replace_claims([share_claim("c2")])
    assert heard == ["team/c1", "team/c1", "ns/c2"]


@pytest.mark.parametrize(
    "consumed",
    [
        {"gpuPercent": "500"},
        {"gpuPercent": "abc"},
        {"gpuPercent": "0"},
        {"gpuPercent": "-5"},
        {"gpuPercent": "1" * 40},
        {"gpuPercent": "30", "memory": "lots"},
    ],
)
def test_hostile_consumed_capacity_is_a_problem_not_an_exception(consumed: Obj) -> None:
    devices = ledger(node_slice("n1"))
    devices.upsert_claim(allocated_claim("c1", consumed=consumed))
    assert "claim ns/c1" in devices.problems
    assert tenants(devices) == []
    devices.upsert_claim(allocated_claim("c1", consumed={"gpuPercent": "30"}))
    assert "claim ns/c1" not in devices.problems
    assert [t.percent for t in tenants(devices)] == [30]


def test_a_hostile_config_is_a_problem_not_an_exception() -> None:
    claim = allocated_claim("c1", consumed={"gpuPercent": "30"}, config=mps_config(threads=99))
    devices = ledger(node_slice("n1"), claims=[claim])
    assert "threads" in devices.problems["claim ns/c1"]
    devices.delete_claim(claim)
    assert devices.problems == {}


def test_nodes_in_equal_states_share_a_signature_until_one_changes() -> None:
    devices = ledger(node_slice("n1"), node_slice("n2"))

    def signature(node: str) -> tuple[object, ...] | None:
        return devices.signature(node, devices.node_state(node, tenancy_of=same_tenancy))

    assert signature("n1") == signature("n2") is not None
    claim = allocated_claim("c1", pool="n1", consumed={"gpuPercent": "30"})
    devices.upsert_claim(claim)
    assert signature("n1") != signature("n2")
    devices.delete_claim(claim)
    assert signature("n1") == signature("n2")


def reserved(claim: Obj, *pods: str) -> Obj:
    """``claim`` reserved for ``pods`` (uid ``uid-<name>``), made at a known time."""
    out = copy.deepcopy(claim)
    out["metadata"]["creationTimestamp"] = "2026-11-24T10:00:00Z"
    out["metadata"]["resourceVersion"] = str(int(out["metadata"]["resourceVersion"]) + 1)
    out["status"]["reservedFor"] = [
        {"resource": "pods", "name": p, "uid": f"uid-{p}"} for p in pods
    ]
    return out


def test_holders_place_each_reserved_pod_on_its_claims_gpu_at_the_drivers_thread_cap() -> None:
    """What the operator reads of DRA-mode pods (status.placements, latency protection): the
    GPU, the cap the driver gives (a batch claim beside a latency claim at 50 %), the memory."""
    devices = ledger(
        node_slice("n1", gpus=2),
        claims=[
            reserved(
                allocated_claim(
                    "infer-gpu",
                    consumed={"gpuPercent": "30", "memory": "10Gi"},
                    config=mps_config(**{"class": "latency"}),
                ),
                "infer",
            ),
            reserved(allocated_claim("train-gpu", consumed={"gpuPercent": "40"}), "train"),
            reserved(allocated_claim("alone-gpu", device="gpu-1"), "alone"),
            allocated_claim("unreserved", device="gpu-1"),
        ],
    )
    holders = devices.holders()
    assert sorted(holders) == ["ns/alone", "ns/infer", "ns/train"]
    infer, train, alone = holders["ns/infer"], holders["ns/train"], holders["ns/alone"]
    assert (infer.node, infer.pod_uid, infer.gpu_class) == ("n1", "uid-infer", CLASS_LATENCY)
    assert infer.placement.gpu_uuids == train.placement.gpu_uuids == ("n1-GPU-0",)
    assert alone.placement.gpu_uuids == ("n1-GPU-1",)
    assert (infer.placement.thread_percent, infer.placement.memory_limit_bytes) == (100, 10 * GIB)
    # 40 % of 80 GiB in proportion; capped at 50 % beside the latency claim; 100 % alone.
    assert (train.placement.thread_percent, train.placement.memory_limit_bytes) == (50, 32 * GIB)
    assert train.placement.request_percent == 40
    assert alone.placement.thread_percent == 100
    assert train.placement.bind_time.isoformat() == "2026-11-24T10:00:00+00:00"


def test_holders_follow_reservations_and_ignore_other_drivers_and_hostile_entries() -> None:
    claim = allocated_claim("c", consumed={"gpuPercent": "40"})
    other = reserved(allocated_claim("nv", driver="gpu.nvidia.com"), "nv-pod")
    devices = ledger(node_slice("n1"), claims=[claim, other])
    assert devices.holders() == {}
    hostile = reserved(claim, "ok")
    hostile["status"]["reservedFor"] += [
        "not-an-object",
        {"resource": "jobs", "name": "j"},
        {"resource": "pods", "apiGroup": "example.com", "name": "x"},
        {"resource": "pods"},
    ]
    devices.upsert_claim(hostile)
    assert list(devices.holders()) == ["ns/ok"]
    devices.delete_claim(hostile)
    assert devices.holders() == {}
