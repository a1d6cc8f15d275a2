"""The controller's claim allocator: gated pods get their claims allocated on the GPU the placer
chose and are then ungated; what gpushare cannot place goes to kube-scheduler, what fits nowhere
waits gated with one event, and an API error never stops the loop."""

import asyncio
import copy
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from gpushare.api.dra import DEVICE_CLASS, PLACEMENT_GATE
from gpushare.api.names import ANN_AVOID_GPUS
from gpushare.cluster.dra import allocator as allocator_module
from gpushare.cluster.dra import writes as writes_module
from gpushare.cluster.dra.allocator import ClaimAllocator
from gpushare.cluster.dra.devices import DraDevices
from gpushare.cluster.dra.placement import FINALIZER
from gpushare.cluster.state.view import ClusterView
from gpushare.kube.errors import ConflictError, KubeError, NotFoundError, UnprocessableError
from gpushare.node.dra.slices import build_slice
from gpushare.packing.placer import Placer
from tests.fixtures.builders import apply_patch
from tests.unit.cluster.dra.helpers import (
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

OTHER_GATE = "example.com/other"


class FakeKube:
    """The API server for the allocator's calls: claims by key with resourceVersions checked
    as the server checks them (a stale one is a 409), each write delivered to the ledger as the
    claim watch would (unless ``watch_lags``); every call recorded."""

    def __init__(self, devices: DraDevices) -> None:
        self.devices = devices
        self.claims: dict[str, Obj] = {}
        self.calls: list[str] = []
        self.ungated: list[tuple[str, int]] = []
        """(pod key, gate index) of each gate removed."""
        self.events: list[tuple[str, str, bool]] = []
        self.pinned: dict[str, list[dict[str, Any]]] = {}
        """Pod key -> the node pin written with its gate's removal."""
        self.refuse_pin = False
        """(reason, message, warning) of each pod event."""
        self.device_class: Obj | None = None
        self.fail_gate: KubeError | None = None
        self.refuse_claims: KubeError | None = None
        """When set, protect_claim raises it (a claim the API server will not take)."""
        self.deleted_pods: set[str] = set()
        self.hold: asyncio.Event | None = None
        """When set, allocate_claim waits for it (a slow API server)."""
        self.watch_lags = False
        self.annotated: dict[str, dict[str, str]] = {}
        """Pod key -> the annotations set with its gate's removal."""
        self._version = 100

    def create(self, claim: Obj) -> None:
        """A claim written by its user; the claim watch delivers it to the ledger."""
        key = f"{claim['metadata']['namespace']}/{claim['metadata']['name']}"
        self.claims[key] = copy.deepcopy(claim)
        self.devices.upsert_claim(copy.deepcopy(claim))

    def touch(self, key: str) -> None:
        """Someone else updates the claim; the watch has not delivered it yet."""
        self._version += 1
        self.claims[key]["metadata"]["resourceVersion"] = str(self._version)

    def _write(self, namespace: str, name: str, resource_version: str) -> Obj:
        stored = self.claims[f"{namespace}/{name}"]
        if stored["metadata"]["resourceVersion"] != resource_version:
            raise ConflictError(f"ResourceClaim {namespace}/{name}: conflict", status=409)
        self._version += 1
        stored["metadata"]["resourceVersion"] = str(self._version)
        return stored

    def _watched(self, stored: Obj) -> dict[str, Any]:
        if not self.watch_lags:
            self.devices.upsert_claim(copy.deepcopy(stored))
        return copy.deepcopy(stored)

    async def protect_claim(
        self, *, namespace: str, name: str, resource_version: str, finalizers: list[str]
    ) -> dict[str, Any]:
        self.calls.append(f"protect {namespace}/{name}")
        if self.refuse_claims is not None:
            raise self.refuse_claims
        stored = self._write(namespace, name, resource_version)
        stored["metadata"]["finalizers"] = list(finalizers)
        return self._watched(stored)

    async def allocate_claim(
        self,
        *,
        namespace: str,
        name: str,
        resource_version: str,
        allocation: Mapping[str, Any],
        reserved_for: Sequence[Mapping[str, str]] = (),
    ) -> dict[str, Any]:
        self.calls.append(f"allocate {namespace}/{name}")
        if self.hold is not None:
            await self.hold.wait()
        stored = self._write(namespace, name, resource_version)
        stored.setdefault("status", {})["allocation"] = copy.deepcopy(dict(allocation))
        if reserved_for:
            stored["status"]["reservedFor"] = [dict(r) for r in reserved_for]
        return self._watched(stored)

    async def get_device_class(self, name: str) -> dict[str, Any] | None:
        assert name == DEVICE_CLASS
        return copy.deepcopy(self.device_class)

    async def remove_scheduling_gate(
        self,
        *,
        namespace: str,
        name: str,
        index: int,
        gate: str,
        annotations: Mapping[str, str] | None = None,
        ops: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        assert gate == PLACEMENT_GATE
        key = f"{namespace}/{name}"
        if ops and self.refuse_pin:
            self.calls.append(f"ungate+pin {key} refused")
            raise UnprocessableError("Unprocessable Entity: nodeAffinity", status=422)
        if ops:
            self.pinned[key] = [dict(op) for op in ops]
        if annotations:
            self.annotated[key] = dict(annotations)
        self.calls.append(f"ungate {key}")
        if key in self.deleted_pods:
            raise NotFoundError(f"pods {name!r} not found", status=404)
        if self.fail_gate is not None:
            raise self.fail_gate
        self.ungated.append((key, index))

    async def pod_event(
        self, *, pod: Mapping[str, Any], reason: str, message: str, warning: bool
    ) -> None:
        self.events.append((reason, message, warning))

    def placed_on(self, key: str) -> list[tuple[str, str, str]]:
        """(pool, device, gpuPercent) of each device the claim was allocated."""
        allocation = self.claims[key].get("status", {}).get("allocation")
        if allocation is None:
            return []
        return [
            (r["pool"], r["device"], r["consumedCapacity"]["gpuPercent"])
            for r in allocation["devices"]["results"]
        ]


def host(name: str, *, cpu: str = "16") -> Obj:
    """A DRA-mode node: no GPU inventory annotation, only what it offers pods."""
    return {"metadata": {"name": name}, "status": {"allocatable": {"cpu": cpu, "memory": "64Gi"}}}


def setup(
    *slices: Obj, hosts: list[Obj] | None = None
) -> tuple[ClaimAllocator, FakeKube, DraDevices]:
    view = ClusterView()
    view.replace_nodes(hosts if hosts is not None else [])
    view.replace_pods([])
    devices = ledger(*slices)
    kube = FakeKube(devices)
    allocator = ClaimAllocator(
        view=view, devices=devices, placer=Placer(), writer=kube, device_class=DEVICE_CLASS
    )
    return allocator, kube, devices


async def place(allocator: ClaimAllocator) -> int:
    """One pass of the allocator's loop, its API writes run to the end."""
    tried = await allocator.place_ready()
    await allocator.settle()
    return tried


def tenant_keys(devices: DraDevices, node: str = "n1", index: int = 0) -> list[str]:
    return [t.key for t in devices.node_state(node, tenancy_of=str).gpus[index].tenants]


async def test_a_gated_pods_claim_is_allocated_and_the_pod_ungated() -> None:
    allocator, kube, devices = setup(node_slice("n1", 2))
    kube.create(share_claim("c1", percent="30", memory="4Gi"))
    allocator.pod_event(gated_pod("p1", claim="c1", gates=(OTHER_GATE, PLACEMENT_GATE)))

    # Another gate (a queue's) is on: nothing may schedule the pod, so no GPU share is taken.
    assert await place(allocator) == 1
    assert kube.calls == [] and kube.placed_on("ns/c1") == []
    ((reason, message, warning),) = kube.events
    assert (reason, warning) == ("GpushareHeld", False)
    assert OTHER_GATE in message and "other scheduling gates to go" in message
    assert allocator.waiting_pods() == []  # it waits for its queue, not for a GPU

    # The queue admits it: its gate goes, which is a pod update.
    allocator.pod_event(gated_pod("p1", claim="c1", gates=(PLACEMENT_GATE,)))
    assert await place(allocator) == 1

    stored = kube.claims["ns/c1"]
    assert FINALIZER in stored["metadata"]["finalizers"]
    assert kube.placed_on("ns/c1") == [("n1", "gpu-0", "30")]
    (result,) = stored["status"]["allocation"]["devices"]["results"]
    assert result["consumedCapacity"]["memory"] == "4Gi"
    # Reserved for its pod in the same write, so kube-scheduler binds without another.
    assert stored["status"]["reservedFor"] == [{"resource": "pods", "name": "p1", "uid": "uid-p1"}]
    assert kube.ungated == [("ns/p1", 0)]
    assert kube.calls == ["protect ns/c1", "allocate ns/c1", "ungate ns/p1"]
    assert allocator.placed == 1
    assert tenant_keys(devices) == ["ns/c1"]
    assert await place(allocator) == 0  # no longer waiting


async def test_a_claims_own_finalizers_are_kept_and_ours_not_added_twice() -> None:
    allocator, kube, _ = setup(node_slice("n1"))
    claim = share_claim("c1")
    claim["metadata"]["finalizers"] = ["example.com/keep"]
    kube.create(claim)
    protected = share_claim("c2")
    protected["metadata"]["finalizers"] = [FINALIZER]
    kube.create(protected)
    allocator.pod_event(gated_pod("p1", claim="c1"))
    allocator.pod_event(gated_pod("p2", claim="c2"))
    await place(allocator)
    assert kube.claims["ns/c1"]["metadata"]["finalizers"] == ["example.com/keep", FINALIZER]
    assert [c for c in kube.calls if c.endswith("c2")] == ["allocate ns/c2"]
    assert kube.claims["ns/c2"]["metadata"]["finalizers"] == [FINALIZER]


async def test_the_device_class_config_reaches_the_allocation() -> None:
    allocator, kube, devices = setup(node_slice("n1"))
    kube.device_class = {"spec": {"config": [opaque(mps_config(**{"class": "latency"}))]}}
    await allocator.refresh_class_configs()
    kube.create(share_claim("c1"))
    allocator.pod_event(gated_pod("p1", claim="c1"))
    await place(allocator)
    (config,) = kube.claims["ns/c1"]["status"]["allocation"]["devices"]["config"]
    assert (config["source"], config["requests"]) == ("FromClass", ["gpu"])
    (tenant,) = devices.node_state("n1", tenancy_of=str).gpus[0].tenants
    assert tenant.gpu_class == "latency"


async def test_a_claim_with_selectors_is_left_to_kube_scheduler() -> None:
    allocator, kube, _ = setup(node_slice("n1"))
    kube.create(share_claim("c1", selectors=[{"cel": {"expression": "true"}}]))
    allocator.pod_event(gated_pod("p1", claim="c1"))
    await place(allocator)
    assert kube.calls == ["ungate ns/p1"]
    assert kube.placed_on("ns/c1") == []
    assert (allocator.left_to_scheduler, allocator.placed) == (1, 0)


async def test_a_claim_kube_scheduler_already_allocated_is_not_allocated_again() -> None:
    allocator, kube, _ = setup(node_slice("n1"))
    kube.create(allocated_claim("c1", consumed={"gpuPercent": "30"}))
    allocator.pod_event(gated_pod("p1", claim="c1"))
    await place(allocator)
    assert kube.calls == ["ungate ns/p1"]


async def test_a_template_claim_is_placed_once_it_is_made_and_seen() -> None:
    allocator, kube, _ = setup(node_slice("n1"))
    allocator.pod_event(gated_pod("p1", template="tmpl"))
    await place(allocator)
    assert kube.calls == []  # not made yet: waiting

    allocator.pod_event(gated_pod("p1", template="tmpl", made="p1-gpu-x7"))
    await place(allocator)
    assert kube.calls == []  # named, but the claim watch has not delivered it

    kube.create(share_claim("p1-gpu-x7"))
    await place(allocator)
    assert kube.placed_on("ns/p1-gpu-x7") == [("n1", "gpu-0", "30")]
    assert kube.ungated == [("ns/p1", 0)]


async def test_a_claim_that_fits_nowhere_waits_with_one_event_until_room_frees() -> None:
    allocator, kube, devices = setup(node_slice("n1"))
    holder = allocated_claim("holder", consumed={"gpuPercent": "80"})
    kube.create(holder)
    kube.create(share_claim("c1", percent="50"))
    allocator.pod_event(gated_pod("p1", claim="c1"))

    assert await place(allocator) == 1
    assert await place(allocator) == 0  # nothing changed: not tried again
    devices.upsert_claim(copy.deepcopy(kube.claims["ns/c1"]))  # a resync wakes it
    assert await place(allocator) == 1

    assert kube.placed_on("ns/c1") == []
    assert kube.ungated == []
    assert len(kube.events) == 1
    reason, message, warning = kube.events[0]
    assert (reason, warning) == ("GpushareNoRoom", True)
    assert "ns/c1" in message

    devices.delete_claim(holder)  # the other claim's pod ended
    assert await place(allocator) == 1
    assert kube.placed_on("ns/c1") == [("n1", "gpu-0", "50")]
    assert kube.ungated == [("ns/p1", 0)]
    assert len(kube.events) == 1


async def test_two_pods_placed_back_to_back_do_not_oversubscribe_a_gpu() -> None:
    allocator, kube, devices = setup(node_slice("n1", 2))
    kube.hold = asyncio.Event()  # no write lands before both are decided
    for name in ("a", "b"):
        kube.create(share_claim(f"c-{name}", percent="60"))
        allocator.pod_event(gated_pod(f"p-{name}", claim=f"c-{name}"))
    assert await allocator.place_ready() == 2
    assert [tenant_keys(devices, index=i) for i in (0, 1)] == [["ns/c-a"], ["ns/c-b"]]
    kube.hold.set()
    await allocator.settle()
    assert {kube.placed_on(key)[0][1] for key in ("ns/c-a", "ns/c-b")} == {"gpu-0", "gpu-1"}


async def test_a_second_pod_waits_when_the_only_gpu_is_taken() -> None:
    allocator, kube, _ = setup(node_slice("n1"))
    for name in ("a", "b"):
        kube.create(share_claim(f"c-{name}", percent="60"))
        allocator.pod_event(gated_pod(f"p-{name}", claim=f"c-{name}"))
    await place(allocator)
    assert (kube.placed_on("ns/c-a"), kube.placed_on("ns/c-b")) == ([("n1", "gpu-0", "60")], [])
    assert kube.ungated == [("ns/p-a", 0)]
    assert [e[0] for e in kube.events] == ["GpushareNoRoom"]


async def test_an_older_claim_version_during_the_write_does_not_free_the_share() -> None:
    allocator, kube, devices = setup(node_slice("n1"))
    kube.hold = asyncio.Event()
    kube.create(share_claim("c1", percent="60"))
    allocator.pod_event(gated_pod("p1", claim="c1"))
    await allocator.place_ready()
    while "allocate ns/c1" not in kube.calls:  # the finalizer's watch event has come
        await asyncio.sleep(0)
    assert tenant_keys(devices) == ["ns/c1"]
    kube.create(share_claim("c2", percent="60"))
    allocator.pod_event(gated_pod("p2", claim="c2"))
    await allocator.place_ready()
    kube.hold.set()
    await allocator.settle()
    assert kube.placed_on("ns/c2") == []


async def test_the_gate_goes_only_once_the_claim_watch_delivered_the_allocation() -> None:
    allocator, kube, devices = setup(node_slice("n1"))
    kube.watch_lags = True
    kube.create(share_claim("c1"))
    allocator.pod_event(gated_pod("p1", claim="c1"))
    await allocator.place_ready()
    for _ in range(20):
        await asyncio.sleep(0)
    # Allocated, but kube-scheduler could not have seen it yet: the pod stays gated.
    assert kube.placed_on("ns/c1") == [("n1", "gpu-0", "30")]
    assert kube.ungated == []
    devices.upsert_claim(copy.deepcopy(kube.claims["ns/c1"]))  # the watch delivers it
    await allocator.settle()
    assert kube.ungated == [("ns/p1", 0)]


async def test_an_older_claim_version_after_the_write_does_not_free_the_share(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(writes_module, "WATCH_WAIT_S", 0.05)
    allocator, kube, devices = setup(node_slice("n1", gpus=1))
    kube.watch_lags = True  # the watch delivers each write only later, as on a busy server
    kube.create(share_claim("c1", percent="60"))
    kube.create(share_claim("c2", percent="60"))
    protected: list[Obj] = []
    protect = kube.protect_claim

    async def record(**kwargs: Any) -> dict[str, Any]:
        answer = await protect(**kwargs)
        protected.append(answer)
        return answer

    kube.protect_claim = record  # type: ignore[method-assign]
    allocator.pod_event(gated_pod("p1", claim="c1"))
    await place(allocator)
    assert tenant_keys(devices) == ["ns/c1"]

    # The finalizer's update (no allocation yet) arrives after the allocation's answer.
    devices.upsert_claim(protected[0])
    assert tenant_keys(devices) == ["ns/c1"]
    allocator.pod_event(gated_pod("p2", claim="c2"))
    await place(allocator)
    assert kube.placed_on("ns/c2") == []  # 60 + 60 > 100: it waits


async def test_pods_placed_but_not_bound_count_against_their_nodes_cpu() -> None:
    allocator, kube, _ = setup(
        node_slice("n1", 2), node_slice("n2", 2), hosts=[host("n1", cpu="4"), host("n2", cpu="4")]
    )
    for name in ("a", "b"):
        kube.create(share_claim(f"c-{name}", percent="30"))
        allocator.pod_event(gated_pod(f"p-{name}", claim=f"c-{name}", cpu="3"))
    await place(allocator)
    pools = sorted(kube.placed_on(key)[0][0] for key in ("ns/c-a", "ns/c-b"))
    assert pools == ["n1", "n2"]  # 3 + 3 CPUs do not fit one 4-CPU node


async def test_a_conflict_frees_the_share_and_the_pod_is_placed_on_retry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(allocator_module, "RETRY_S", 0.2)
    allocator, kube, devices = setup(node_slice("n1"))
    claim = share_claim("c1")
    claim["metadata"]["finalizers"] = [FINALIZER]
    kube.create(claim)
    kube.touch("ns/c1")  # updated meanwhile: the ledger's resourceVersion is stale
    allocator.pod_event(gated_pod("p1", claim="c1"))

    assert await place(allocator) == 1  # does not raise
    assert kube.calls == ["allocate ns/c1"]
    assert (kube.placed_on("ns/c1"), kube.ungated) == ([], [])
    assert tenant_keys(devices) == []  # the refused allocation no longer counts
    assert await place(allocator) == 0  # not before the retry delay

    devices.upsert_claim(copy.deepcopy(kube.claims["ns/c1"]))  # the watch catches up
    await asyncio.sleep(0.25)
    assert await place(allocator) == 1
    assert kube.placed_on("ns/c1") == [("n1", "gpu-0", "30")]
    assert kube.ungated == [("ns/p1", 0)]


async def test_a_failed_gate_removal_is_retried_without_allocating_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(allocator_module, "RETRY_S", 0.0)
    allocator, kube, devices = setup(node_slice("n1"))
    kube.create(share_claim("c1"))
    allocator.pod_event(gated_pod("p1", claim="c1"))
    kube.fail_gate = UnprocessableError("pod: unprocessable", status=422)
    await place(allocator)
    assert kube.ungated == []
    assert tenant_keys(devices) == ["ns/c1"]  # written, so still counted

    kube.fail_gate = None
    await place(allocator)
    assert kube.ungated == [("ns/p1", 0)]
    assert kube.calls.count("allocate ns/c1") == 1


async def test_a_claim_the_api_server_will_not_take_is_left_to_kube_scheduler() -> None:
    allocator, kube, devices = setup(node_slice("n1"))
    kube.create(share_claim("c1"))
    allocator.pod_event(gated_pod("p1", claim="c1"))
    kube.refuse_claims = UnprocessableError(
        "ResourceClaim ns/c1: spec: field is immutable", status=422
    )

    await place(allocator)

    # Not retried forever with the pod gated: ungated without an allocation, nothing counted.
    assert kube.ungated == [("ns/p1", 0)]
    assert kube.placed_on("ns/c1") == []
    assert tenant_keys(devices) == []
    assert allocator.left_to_scheduler == 1
    assert await place(allocator) == 0


async def test_a_pod_with_two_unallocated_claims_is_left_to_kube_scheduler() -> None:
    allocator, kube, devices = setup(node_slice("n1"), node_slice("n2"))
    kube.create(share_claim("c1"))
    kube.create(share_claim("c2"))
    pod = gated_pod("p1", claim="c1")
    pod["spec"]["resourceClaims"].append({"name": "gpu2", "resourceClaimName": "c2"})

    allocator.pod_event(pod)
    await place(allocator)

    # Allocated one by one, the two claims could name two nodes and the pod fit nowhere.
    assert (kube.placed_on("ns/c1"), kube.placed_on("ns/c2")) == ([], [])
    assert kube.ungated == [("ns/p1", 0)]
    assert allocator.left_to_scheduler == 2
    assert tenant_keys(devices, "n1") == tenant_keys(devices, "n2") == []


async def test_a_deleted_pod_is_not_placed() -> None:
    allocator, kube, _ = setup(node_slice("n1"))
    kube.create(share_claim("c1"))
    allocator.pod_event(gated_pod("p1", claim="c1"))
    allocator.pod_gone("ns/p1", deleted=True)
    assert await place(allocator) == 0
    assert kube.calls == []


async def test_a_pod_being_deleted_or_ungated_elsewhere_is_not_placed() -> None:
    allocator, kube, _ = setup(node_slice("n1"))
    kube.create(share_claim("c1"))
    kube.create(share_claim("c2"))
    deleting = gated_pod("p1", claim="c1")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    allocator.pod_event(gated_pod("p1", claim="c1"))
    allocator.pod_event(deleting)
    allocator.pod_event(gated_pod("p2", claim="c2"))
    allocator.pod_event(gated_pod("p2", claim="c2", gates=()))
    assert await place(allocator) == 0
    assert kube.calls == []


async def test_a_pod_deleted_while_its_placement_is_written_is_not_tried_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(allocator_module, "RETRY_S", 0.0)
    allocator, kube, _ = setup(node_slice("n1"))
    kube.hold = asyncio.Event()
    kube.create(share_claim("c1"))
    allocator.pod_event(gated_pod("p1", claim="c1"))
    await allocator.place_ready()
    while "allocate ns/c1" not in kube.calls:
        await asyncio.sleep(0)
    kube.deleted_pods.add("ns/p1")
    allocator.pod_gone("ns/p1", deleted=True)  # the pod watch says it is gone
    kube.hold.set()
    await allocator.settle()  # the gate's removal fails: 404
    assert await place(allocator) == 0


async def test_a_device_class_latency_config_keeps_two_latency_claims_apart() -> None:
    allocator, kube, devices = setup(node_slice("n1", 2))
    kube.device_class = {"spec": {"config": [opaque(mps_config(**{"class": "latency"}))]}}
    await allocator.refresh_class_configs()
    for name in ("a", "b"):
        kube.create(share_claim(f"c-{name}", percent="30"))
        allocator.pod_event(gated_pod(f"p-{name}", claim=f"c-{name}"))
    await place(allocator)
    # at most one latency-class tenant per GPU, as with the class in the claim's own config
    assert [tenant_keys(devices, index=i) for i in (0, 1)] == [["ns/c-a"], ["ns/c-b"]]


async def test_latency_claims_are_kept_apart() -> None:
    allocator, kube, devices = setup(node_slice("n1", 2))
    for name in ("a", "b"):
        kube.create(
            share_claim(f"c-{name}", percent="30", config=mps_config(**{"class": "latency"}))
        )
        allocator.pod_event(gated_pod(f"p-{name}", claim=f"c-{name}"))
    await place(allocator)
    assert [tenant_keys(devices, index=i) for i in (0, 1)] == [["ns/c-a"], ["ns/c-b"]]


async def test_a_separated_workloads_pod_is_kept_off_the_gpu_where_it_faulted() -> None:
    """gpushare.io/avoid-gpus, which the webhook writes for a workload the node agents moved
    away after faults (docs/reliability.md), holds in DRA mode too: binpacking would put the
    claim beside the one on gpu-0, but it goes to gpu-1."""
    gpus = [gpu_info(0, uuid="GPU-faulted0"), gpu_info(1, uuid="GPU-other111")]
    allocator, kube, _ = setup(build_slice(node_name="n1", gpus=gpus, generation=1))
    kube.create(share_claim("c0", percent="30"))
    allocator.pod_event(gated_pod("p0", claim="c0"))
    await place(allocator)
    assert kube.placed_on("ns/c0") == [("n1", "gpu-0", "30")]
    kube.create(share_claim("c1", percent="30"))
    allocator.pod_event(gated_pod("p1", claim="c1", annotations={ANN_AVOID_GPUS: "GPU-faulted0"}))
    await place(allocator)
    assert kube.placed_on("ns/c1") == [("n1", "gpu-1", "30")]


async def test_an_unreadable_avoid_gpus_keeps_the_pod_gated_with_a_warning_naming_it() -> None:
    allocator, kube, _ = setup(node_slice("n1"))
    kube.create(share_claim("c1"))
    allocator.pod_event(gated_pod("p1", claim="c1", annotations={ANN_AVOID_GPUS: "gpu 0"}))
    await place(allocator)
    assert kube.calls == []
    (event,) = kube.events
    assert event[0] == "GpushareHeld" and event[2] and ANN_AVOID_GPUS in event[1]


async def test_the_gates_removal_pins_the_pod_to_its_claims_node() -> None:
    """kube-scheduler then filters that one node, not every node (gpushare.cluster.dra.pin)."""
    allocator, kube, _ = setup(node_slice("n1"), node_slice("n2"))
    kube.create(share_claim("c1"))
    body = gated_pod("p1", claim="c1")
    allocator.pod_event(body)
    await place(allocator)
    (node,) = {pool for pool, _, _ in kube.placed_on("ns/c1")}
    pinned = apply_patch(body, kube.pinned["ns/p1"])
    terms = pinned["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    ]


async def test_a_refused_pin_still_lets_the_pod_go() -> None:
    allocator, kube, _ = setup(node_slice("n1"))
    kube.refuse_pin = True
    kube.create(share_claim("c1"))
    allocator.pod_event(gated_pod("p1", claim="c1"))
    await place(allocator)
    assert kube.calls[-2:] == ["ungate+pin ns/p1 refused", "ungate ns/p1"]
    assert kube.ungated == [("ns/p1", 0)] and kube.pinned == {}
