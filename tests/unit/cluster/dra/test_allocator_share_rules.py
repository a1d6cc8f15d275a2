"""The claim allocator honours a pod's GpuShare rules as the extender does in device-plugin
mode: a governed pod waits gated while its share elects or profiles another pod, a profiling
pod gets a GPU to itself, and measured profiles (the pod's and its neighbours') reach the
interference check (docs/dra.md, "GpuShares and profiles")."""

import json
from typing import Any

import pytest

from gpushare.api.dra import ANN_DRA_GPU, DEVICE_CLASS
from gpushare.api.gpushare_crd import (
    ANN_PACKING_POLICY,
    ANN_PROFILE,
    ANN_PROFILING,
    PHASE_PACKED,
    PHASE_PENDING,
    PHASE_PROFILING,
    POLICY_EXCLUSIVE,
    PROFILING_ACTIVE,
)
from gpushare.api.names import ANN_SHARE, LABEL_NEIGHBOUR_RULES, NEIGHBOUR_RULES_GRANTED
from gpushare.cluster.dra import allocator as allocator_module
from gpushare.cluster.dra.allocator import ClaimAllocator
from gpushare.cluster.dra.devices import DraDevices
from gpushare.cluster.state.view import ClusterView
from gpushare.packing.admission import Admission
from gpushare.packing.placer import Placer
from gpushare.packing.policy import Policy
from tests.unit.cluster.dra.helpers import (
    Obj,
    allocated_claim,
    gated_pod,
    ledger,
    mps_config,
    node_slice,
    share_claim,
)
from tests.unit.cluster.dra.test_allocator import FakeKube, place, tenant_keys

HEAVY = {
    "gpuModel": "NVIDIA H100 80GB HBM3",
    "fp16": 0.0,
    "fp32": 0.77,
    "fp64": 0.0,
    "tensor": 0.0,
    "smOccupancy": 0.95,
    "dramBandwidth": 0.25,
    "sampledSeconds": 60,
    "time": "2026-01-01T00:00:00Z",
}
SERVICE = {**HEAVY, "fp32": 0.05, "tensor": 0.15, "smOccupancy": 0.3, "dramBandwidth": 0.15}


@pytest.fixture(autouse=True)
def no_recheck_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    """A held pod is looked at again on the next pass (the loop waits HOLD_RECHECK_S)."""
    monkeypatch.setattr(allocator_module, "HOLD_RECHECK_S", 0.0)


def share(name: str, phase: str, profiling_pod: str | None = None) -> Obj:
    status: dict[str, Any] = {"phase": phase}
    if profiling_pod is not None:
        status["profilingPod"] = profiling_pod
    return {"metadata": {"name": name, "namespace": "ns"}, "status": status}


def setup(
    *slices: Obj,
    shares: list[Obj] = (),
    admission: Admission | None = None,  # type: ignore[assignment]
) -> tuple[ClaimAllocator, FakeKube, DraDevices]:
    """An allocator whose namespace ``ns`` may keep others off its GPUs (an admin's grant)."""
    view = ClusterView()
    labels = {LABEL_NEIGHBOUR_RULES: NEIGHBOUR_RULES_GRANTED}
    view.replace_namespaces([{"metadata": {"name": "ns", "labels": labels}}])
    view.replace_nodes([])
    view.replace_pods([])
    view.replace_shares(list(shares))
    devices = ledger(*slices)
    kube = FakeKube(devices)
    placer = Placer(Policy.GPUSHARE, admission=admission)
    allocator = ClaimAllocator(
        view=view, devices=devices, placer=placer, writer=kube, device_class=DEVICE_CLASS
    )
    return allocator, kube, devices


def governed(name: str, claim: str, share_name: str, **extra: str) -> Obj:
    return gated_pod(name, claim=claim, annotations={ANN_SHARE: share_name, **extra})


async def test_a_governed_pod_waits_gated_until_its_share_is_packed() -> None:
    allocator, kube, _ = setup(node_slice("n1"), shares=[share("train", PHASE_PENDING)])
    kube.create(share_claim("c1"))
    allocator.pod_event(governed("p1", "c1", "train"))

    await place(allocator)
    await place(allocator)
    assert kube.calls == []
    (event,) = kube.events  # said once, not a warning: the share is working on it
    assert event[0] == "GpushareHeld" and not event[2]
    assert "GpuShare train is electing a pod to profile" in event[1]

    allocator.view.upsert_share(share("train", PHASE_PACKED))
    await place(allocator)
    assert kube.placed_on("ns/c1") == [("n1", "gpu-0", "30")]
    assert kube.ungated == [("ns/p1", 0)]
    # The GPU goes on the pod with the gate's removal: its share's profiler reads it.
    assert kube.annotated == {"ns/p1": {ANN_DRA_GPU: "n1-GPU-0"}}


async def test_pods_of_no_gpushare_get_no_annotation_with_the_gate() -> None:
    allocator, kube, _ = setup(node_slice("n1"))
    kube.create(share_claim("c1"))
    allocator.pod_event(gated_pod("p1", claim="c1"))
    await place(allocator)
    assert kube.ungated == [("ns/p1", 0)]
    assert kube.annotated == {}  # one write per pod as before: nothing to record


async def test_the_profiling_pod_gets_a_gpu_alone_and_keeps_others_off_it() -> None:
    shares = [share("train", PHASE_PROFILING, profiling_pod="prof"), share("other", PHASE_PACKED)]
    allocator, kube, devices = setup(node_slice("n1", 2), shares=shares)
    kube.create(allocated_claim("busy", consumed={"gpuPercent": "20"}))  # on gpu-0
    kube.create(share_claim("c-prof", percent="50"))
    allocator.pod_event(governed("prof", "c-prof", "train", **{ANN_PROFILING: PROFILING_ACTIVE}))
    # A pod of the same share, not the one being profiled, waits.
    kube.create(share_claim("c-next", percent="20"))
    allocator.pod_event(governed("next", "c-next", "train"))
    await place(allocator)
    assert kube.placed_on("ns/c-prof") == [("n1", "gpu-1", "50")]  # the GPU with no tenants
    assert kube.placed_on("ns/c-next") == []

    # Another share's pods fill gpu-0; the third, which fits only on gpu-1 by share, waits:
    # gpu-1 is the profiling pod's alone.
    for i in range(3):
        kube.create(share_claim(f"c-o{i}", percent="40"))
        allocator.pod_event(governed(f"o{i}", f"c-o{i}", "other"))
    await place(allocator)
    assert [kube.placed_on(f"ns/c-o{i}") for i in range(3)] == [
        [("n1", "gpu-0", "40")],
        [("n1", "gpu-0", "40")],
        [],
    ]
    assert tenant_keys(devices, index=1) == ["ns/c-prof"]
    held = [m for r, m, _ in kube.events if "c-o2" in m]
    assert held and "GpuShare train is profiling pod prof alone on this GPU" in held[0]

    # The profile is stored: the mark becomes done and the GPU takes neighbours again.
    allocator.pod_event(governed("prof", "c-prof", "train", **{ANN_PROFILING: "done"}))
    await place(allocator)
    assert kube.placed_on("ns/c-o2") == [("n1", "gpu-1", "40")]


async def test_an_exclusive_share_keeps_other_shares_off_its_gpus() -> None:
    allocator, kube, _ = setup(
        node_slice("n1", 2), shares=[share("solo", PHASE_PACKED), share("other", PHASE_PACKED)]
    )
    kube.create(share_claim("c-solo", percent="30"))
    allocator.pod_event(
        governed("solo", "c-solo", "solo", **{ANN_PACKING_POLICY: POLICY_EXCLUSIVE})
    )
    await place(allocator)
    kube.create(share_claim("c-x", percent="30"))
    allocator.pod_event(governed("x", "c-x", "other"))
    await place(allocator)
    (solo,), (x,) = kube.placed_on("ns/c-solo"), kube.placed_on("ns/c-x")
    assert solo[1] != x[1]  # binpack would have put both 30 % claims on one GPU


async def test_measured_profiles_keep_a_latency_claim_off_a_heavy_jobs_gpu() -> None:
    # A profiled FP32 GEMM holds half of gpu-0 (allocated by anyone; its pod's annotation
    # carries the profile). A profiled latency service fits there by share, but the shipped
    # model predicts the GEMM slows it past its 1.15x bound: it goes to gpu-1.
    shares = [share("heavy", PHASE_PACKED), share("web", PHASE_PACKED)]
    allocator, kube, devices = setup(node_slice("n1", 2), shares=shares, admission=Admission())
    kube.create(allocated_claim("c-gemm", consumed={"gpuPercent": "50"}))
    bound = governed("gemm", "c-gemm", "heavy", **{ANN_PROFILE: json.dumps(HEAVY)})
    bound["spec"] = {**bound["spec"], "schedulingGates": [], "nodeName": "n1"}
    allocator.pod_event(bound)
    (tenant,) = devices.node_state("n1", tenancy_of=str).gpus[0].tenants
    assert tenant.profile is not None and tenant.profile.fp32 == pytest.approx(0.77)

    kube.create(share_claim("c-web", percent="30", config=mps_config(**{"class": "latency"})))
    allocator.pod_event(governed("web", "c-web", "web", **{ANN_PROFILE: json.dumps(SERVICE)}))
    await place(allocator)
    assert kube.placed_on("ns/c-web") == [("n1", "gpu-1", "30")]


async def test_without_profiles_the_same_latency_claim_binpacks_beside_the_job() -> None:
    # The control for the test above: the same claims, nobody profiled.
    allocator, kube, _ = setup(node_slice("n1", 2), admission=Admission())
    kube.create(allocated_claim("c-gemm", consumed={"gpuPercent": "50"}))
    kube.create(share_claim("c-web", percent="30", config=mps_config(**{"class": "latency"})))
    allocator.pod_event(gated_pod("web", claim="c-web"))
    await place(allocator)
    assert kube.placed_on("ns/c-web") == [("n1", "gpu-0", "30")]


async def test_an_unreadable_profile_keeps_the_pod_gated_with_a_warning_naming_it() -> None:
    allocator, kube, _ = setup(node_slice("n1"), shares=[share("train", PHASE_PACKED)])
    kube.create(share_claim("c1"))
    allocator.pod_event(governed("p1", "c1", "train", **{ANN_PROFILE: "{oops"}))
    await place(allocator)
    assert kube.calls == []
    (event,) = kube.events
    assert event[0] == "GpushareHeld" and event[2]
    assert ANN_PROFILE in event[1]


async def test_a_deleted_profiling_pod_no_longer_keeps_others_off_its_gpu() -> None:
    shares = [share("train", PHASE_PROFILING, profiling_pod="prof"), share("other", PHASE_PACKED)]
    allocator, kube, devices = setup(node_slice("n1"), shares=shares)
    kube.create(share_claim("c-prof", percent="50"))
    allocator.pod_event(governed("prof", "c-prof", "train", **{ANN_PROFILING: PROFILING_ACTIVE}))
    await place(allocator)
    kube.create(share_claim("c-x", percent="20"))
    allocator.pod_event(governed("x", "c-x", "other"))
    await place(allocator)
    assert kube.placed_on("ns/c-x") == []

    allocator.pod_gone("ns/prof", deleted=True)  # its claim stays allocated until unprepared
    assert devices.blockers == set()
    await place(allocator)
    assert kube.placed_on("ns/c-x") == [("n1", "gpu-0", "20")]


async def test_a_pod_placed_before_it_inherits_the_profile_is_placed_with_its_shares() -> None:
    # The hold lifts as the share is Packed; the operator may not have annotated the pod yet.
    web_share = share("web", PHASE_PACKED)
    web_share["status"]["profile"] = SERVICE
    shares = [share("heavy", PHASE_PACKED), web_share]
    allocator, kube, _ = setup(node_slice("n1", 2), shares=shares, admission=Admission())
    kube.create(allocated_claim("c-gemm", consumed={"gpuPercent": "50"}))
    bound = governed("gemm", "c-gemm", "heavy", **{ANN_PROFILE: json.dumps(HEAVY)})
    bound["spec"] = {**bound["spec"], "schedulingGates": [], "nodeName": "n1"}
    allocator.pod_event(bound)

    kube.create(share_claim("c-web", percent="30", config=mps_config(**{"class": "latency"})))
    allocator.pod_event(governed("web", "c-web", "web"))
    await place(allocator)
    assert kube.placed_on("ns/c-web") == [("n1", "gpu-1", "30")]
