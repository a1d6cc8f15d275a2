"""The extender honours the annotations a GpuShare puts on its pods, in filter and in bind."""

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

from gpushare.api.gpushare_crd import (
    ANN_MAX_PODS_PER_GPU,
    ANN_PACKING_POLICY,
    ANN_PROFILE,
    ANN_PROFILING,
    PHASE_PACKED,
    PHASE_PENDING,
    PHASE_PROFILING,
    POLICY_AGGRESSIVE,
    POLICY_EXCLUSIVE,
    PROFILING_ACTIVE,
    PROFILING_DONE,
)
from gpushare.api.names import (
    ANN_CLASS,
    ANN_SHARE,
    LABEL_NEIGHBOUR_RULES,
    NEIGHBOUR_RULES_GRANTED,
    SCHEDULER_NAME,
    STATE_ALLOCATED,
)
from gpushare.api.placement import Placement
from gpushare.cluster.extender.args import BindingArgs, parse_extender_args
from gpushare.cluster.extender.verbs import Extender
from gpushare.cluster.state.view import ClusterView
from gpushare.packing.admission import Admission
from gpushare.packing.policy import Policy
from tests.fixtures.builders import GIB, PodStore, gpu, node_json, pod_json

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def on(uuid: str, percent: int) -> Placement:
    return Placement((uuid,), percent, 8 * GIB, NOW, STATE_ALLOCATED)


def share(name: str, phase: str, profiling_pod: str | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if profiling_pod is not None:
        status["profilingPod"] = profiling_pod
    return {"metadata": {"name": name, "namespace": "default"}, "status": status}


def governed(share_name: str, **extra: str) -> dict[str, str]:
    return {ANN_SHARE: share_name, **extra}


def setup(
    placed: list[dict[str, Any]],
    shares: list[dict[str, Any]] = (),  # type: ignore[assignment]
    policy: Policy = Policy.BINPACK,
    *,
    granted: bool = True,
    admission: Admission | None = None,
) -> tuple[Extender, PodStore]:
    """Nodes a (GPU A0) and b (GPU B0), each 80 GiB; ``placed`` pods already run there. With
    ``granted`` an admin let namespace default keep others off its GPUs."""
    view = ClusterView(clock=lambda: NOW)
    labels = {LABEL_NEIGHBOUR_RULES: NEIGHBOUR_RULES_GRANTED} if granted else {}
    view.replace_namespaces([{"metadata": {"name": "default", "labels": labels}}])
    view.replace_nodes([node_json("a", [gpu("A0")]), node_json("b", [gpu("B0")])])
    view.replace_pods(placed)
    view.replace_shares(shares)
    store = PodStore()
    for pod in placed:
        store.add(pod)
    return Extender(view=view, writer=store, policy=policy, admission=admission), store


def filter_pod(ext: Extender, pod: dict[str, Any]) -> dict[str, Any]:
    return ext.filter(parse_extender_args({"Pod": pod, "NodeNames": ["a", "b"]}))


def bind(ext: Extender, store: PodStore, pod: dict[str, Any], node: str) -> str:
    pod["spec"]["schedulerName"] = SCHEDULER_NAME
    store.add(pod)
    ext.view.upsert_pod(pod)
    ext.offers.offer(f"{pod['metadata']['namespace']}/{pod['metadata']['name']}", "", [node])
    meta = pod["metadata"]
    args = BindingArgs(meta["name"], meta["namespace"], meta["uid"], node)
    return asyncio.run(ext.bind(args))["Error"]


# ---- 1. hold while the GpuShare elects or profiles another pod -------------------------------


def test_a_pod_of_a_share_still_electing_its_profiling_pod_waits_on_every_node() -> None:
    ext, store = setup([], [share("trainer", PHASE_PENDING)])
    pod = pod_json("trainer-1", fraction="0.25", annotations=governed("trainer"))
    result = filter_pod(ext, pod)
    assert result["NodeNames"] == []
    assert set(result["FailedAndUnresolvableNodes"]) == {"a", "b"}
    assert (
        "GpuShare trainer is electing a pod to profile" in result["FailedAndUnresolvableNodes"]["a"]
    )
    assert "electing" in bind(ext, store, pod, "a")
    assert "nodeName" not in store.pods["default/trainer-1"]["spec"]


def test_pods_of_a_share_that_skips_profiling_are_never_held() -> None:
    """A GpuShare with ``profiling.mode: skip`` has nothing to profile: its pods go straight
    to placement, even before the operator has written any status."""
    skipping = {
        "metadata": {"name": "infer", "namespace": "default"},
        "spec": {"profiling": {"mode": "skip"}},
    }
    ext, store = setup([], [skipping])
    pod = pod_json("infer-1", fraction="0.25", annotations=governed("infer"))
    result = filter_pod(ext, pod)
    assert set(result["NodeNames"]) == {"a", "b"}
    assert bind(ext, store, pod, "a") == ""
    assert store.pods["default/infer-1"]["spec"]["nodeName"] == "a"


def test_while_profiling_only_the_elected_pod_is_placed_and_after_packing_all_are() -> None:
    ext, store = setup([], [share("trainer", PHASE_PROFILING, "trainer-0")])
    elected = pod_json(
        "trainer-0",
        fraction="0.25",
        annotations=governed("trainer", **{ANN_PROFILING: PROFILING_ACTIVE}),
    )
    other = pod_json("trainer-1", fraction="0.25", annotations=governed("trainer"))
    assert filter_pod(ext, elected)["NodeNames"] == ["a", "b"]
    held = filter_pod(ext, other)
    assert held["NodeNames"] == []
    assert "is profiling; this pod waits" in held["FailedAndUnresolvableNodes"]["b"]
    assert "profiling" in bind(ext, store, other, "b")

    ext.view.upsert_share(share("trainer", PHASE_PACKED))
    assert filter_pod(ext, other)["NodeNames"] == ["a", "b"]
    assert bind(ext, store, other, "b") == ""
    assert store.pods["default/trainer-1"]["spec"]["nodeName"] == "b"


# ---- 2. a profiling pod runs alone ----------------------------------------------------------


def profiling_pod(name: str, **extra: str) -> dict[str, Any]:
    return pod_json(
        name,
        fraction="0.25",
        annotations=governed("trainer", **{ANN_PROFILING: PROFILING_ACTIVE, **extra}),
    )


PROFILING = [share("trainer", PHASE_PROFILING, "trainer-0")]


def test_a_cautious_profiling_pod_only_fits_a_gpu_without_tenants() -> None:
    ext, store = setup([pod_json("x", fraction="0.1", node="a", placement=on("A0", 10))], PROFILING)
    pod = profiling_pod("trainer-0")
    result = filter_pod(ext, pod)
    assert result["NodeNames"] == ["b"]
    assert "profiles pod trainer-0 alone, on a GPU with no tenants" in result["FailedNodes"]["a"]
    assert "alone" in bind(ext, store, pod, "a")
    assert "nodeName" not in store.pods["default/trainer-0"]["spec"]


def test_an_aggressive_profiling_pod_fits_a_lightly_loaded_gpu_only() -> None:
    ext, _ = setup(
        [
            pod_json("x", fraction="0.2", node="a", placement=on("A0", 20)),
            pod_json("y", fraction="0.5", node="b", placement=on("B0", 50)),
        ],
        PROFILING,
    )
    result = filter_pod(ext, profiling_pod("trainer-0", **{ANN_PACKING_POLICY: POLICY_AGGRESSIVE}))
    assert result["NodeNames"] == ["a"]
    assert "lightly loaded GPU" in result["FailedNodes"]["b"]


def test_no_other_pod_joins_a_gpu_where_a_pod_is_profiled_until_its_profile_is_stored() -> None:
    running = profiling_pod("trainer-0")
    running["spec"]["nodeName"] = "a"
    running["metadata"]["annotations"].update(on("A0", 25).to_annotations())
    ext, store = setup([running], PROFILING)
    newcomer = pod_json("web", fraction="0.1")
    result = filter_pod(ext, newcomer)
    assert result["NodeNames"] == ["b"]
    assert result["FailedNodes"]["a"] == (
        "gpushare: GpuShare trainer is profiling pod trainer-0 alone on this GPU"
    )
    assert "profiling pod trainer-0 alone" in bind(ext, store, newcomer, "a")

    running["metadata"]["annotations"][ANN_PROFILING] = PROFILING_DONE
    ext.view.upsert_pod(running)
    again = pod_json("web2", fraction="0.1")
    assert filter_pod(ext, again)["NodeNames"] == ["a", "b"]


# ---- 3. exclusive policy ---------------------------------------------------------------------


def exclusive(name: str, share_name: str = "solo", **kw: Any) -> dict[str, Any]:
    return pod_json(
        name,
        fraction="0.25",
        annotations=governed(share_name, **{ANN_PACKING_POLICY: POLICY_EXCLUSIVE}),
        **kw,
    )


def test_an_exclusive_pod_shares_a_gpu_only_with_pods_of_its_own_gpushare() -> None:
    ext, store = setup(
        [
            exclusive("solo-0", node="a", placement=on("A0", 25)),
            pod_json("other", fraction="0.1", node="b", placement=on("B0", 10)),
        ],
        [share("solo", PHASE_PACKED)],
    )
    pod = exclusive("solo-1")
    result = filter_pod(ext, pod)
    assert result["NodeNames"] == ["a"]
    assert (
        "GpuShare solo (policy exclusive) shares a GPU only with its own pods"
        in (result["FailedNodes"]["b"])
    )
    assert "policy exclusive" in bind(ext, store, pod, "b")
    assert bind(ext, store, pod, "a") == ""


def test_no_pod_of_another_owner_joins_an_exclusive_share_gpu() -> None:
    ext, store = setup(
        [exclusive("solo-0", node="a", placement=on("A0", 25))],
        [share("solo", PHASE_PACKED), share("other", PHASE_PACKED)],
    )
    for pod in (pod_json("bare", fraction="0.1"), exclusive("o-0", share_name="other")):
        result = filter_pod(ext, pod)
        assert result["NodeNames"] == ["b"]
        assert (
            "GpuShare solo (policy exclusive) keeps this GPU to its own pods"
            in (result["FailedNodes"]["a"])
        )
    assert "keeps this GPU" in bind(ext, store, pod_json("late", fraction="0.1"), "a")


# ---- 4. max-pods-per-gpu ---------------------------------------------------------------------


def test_max_pods_per_gpu_counts_the_gpushare_pods_already_on_a_gpu() -> None:
    ext, store = setup(
        [
            pod_json("x", fraction="0.1", node="a", placement=on("A0", 10)),
            pod_json("y", fraction="0.1", node="a", placement=on("A0", 10)),
            pod_json("z", fraction="0.1", node="b", placement=on("B0", 10)),
        ],
        [share("capped", PHASE_PACKED)],
    )
    pod = pod_json(
        "capped-0", fraction="0.1", annotations=governed("capped", **{ANN_MAX_PODS_PER_GPU: "2"})
    )
    result = filter_pod(ext, pod)
    assert result["NodeNames"] == ["b"]
    assert "allows at most 2 pod(s) per GPU; this GPU holds 2" in result["FailedNodes"]["a"]
    assert "at most 2" in bind(ext, store, pod, "a")
    assert bind(ext, store, pod, "b") == ""


def test_a_bad_max_pods_annotation_is_refused_naming_it() -> None:
    ext, _ = setup([], [share("capped", PHASE_PACKED)])
    pod = pod_json(
        "c", fraction="0.1", annotations=governed("capped", **{ANN_MAX_PODS_PER_GPU: "lots"})
    )
    result = filter_pod(ext, pod)
    assert result["NodeNames"] == []
    assert ANN_MAX_PODS_PER_GPU in result["FailedAndUnresolvableNodes"]["a"]


# ---- 5. the stored profile reaches the interference check -------------------------------------

LIGHT = {
    "gpuModel": "NVIDIA H100 80GB HBM3",
    "fp32": 0.05,
    "tensor": 0.02,
    "smOccupancy": 0.1,
    "dramBandwidth": 0.05,
    "sampledSeconds": 60,
    "time": "2026-01-01T00:00:00Z",
}


def test_a_stored_profile_is_what_the_interference_check_sees_for_the_bound_pod() -> None:
    ext, store = setup([], [share("light", PHASE_PACKED)], policy=Policy.GPUSHARE)
    profiled = pod_json(
        "p", fraction="0.3", annotations=governed("light", **{ANN_PROFILE: json.dumps(LIGHT)})
    )
    assert bind(ext, store, profiled, "a") == ""
    a0 = ext.view.gpu("A0")
    assert a0 is not None
    (tenant,) = a0.tenants
    assert tenant.profile is not None
    assert (tenant.profile.tensor, tenant.profile.sm_occupancy) == (0.02, 0.1)
    assert tenant.profile.gpu_model == "NVIDIA H100 80GB HBM3"


HEAVY = {**LIGHT, "fp32": 0.77, "tensor": 0.0, "smOccupancy": 0.95, "dramBandwidth": 0.25}
SERVICE = {**LIGHT, "fp32": 0.05, "tensor": 0.15, "smOccupancy": 0.3, "dramBandwidth": 0.15}


def test_interference_admission_keeps_a_latency_pod_off_the_gpu_of_a_heavy_profiled_job() -> None:
    # A profiled FP32 GEMM runs uncapped on A0 (a batch pod alone is not capped). A profiled
    # latency service fits there by share, but the shipped model predicts the GEMM slows it
    # past its 1.15x bound: filter passes only b and says why not a; bind to a is refused.
    heavy = pod_json(
        "gemm",
        fraction="0.5",
        node="a",
        placement=Placement(("A0",), 100, 40 * GIB, NOW, STATE_ALLOCATED, request_percent=50),
        annotations=governed("heavy", **{ANN_PROFILE: json.dumps(HEAVY)}),
    )
    shares = [share("heavy", PHASE_PACKED), share("web", PHASE_PACKED)]
    ext, store = setup([heavy], shares, policy=Policy.GPUSHARE, admission=Admission())
    web = pod_json(
        "web",
        fraction="0.3",
        annotations=governed("web", **{ANN_PROFILE: json.dumps(SERVICE), ANN_CLASS: "latency"}),
    )
    result = filter_pod(ext, web)
    assert result["NodeNames"] == ["b"]
    assert "1.15x bound" in result["FailedNodes"]["a"]
    assert "1.15x bound" in bind(ext, store, web, "a")
    # Without admission (--no-interference-admission) the same pod may join the GEMM.
    ext, _ = setup([heavy], shares, policy=Policy.GPUSHARE)
    assert "a" in filter_pod(ext, web)["NodeNames"]


def test_a_malformed_profile_annotation_is_refused_naming_it() -> None:
    ext, _ = setup([], [share("light", PHASE_PACKED)])
    pod = pod_json("p", fraction="0.3", annotations=governed("light", **{ANN_PROFILE: "{oops"}))
    result = filter_pod(ext, pod)
    assert result["NodeNames"] == []
    assert f"{ANN_PROFILE}" in result["FailedAndUnresolvableNodes"]["b"]
    assert "not JSON" in result["FailedAndUnresolvableNodes"]["b"]


def test_pods_without_gpushare_rules_are_placed_as_before() -> None:
    ext, _ = setup([pod_json("x", fraction="0.5", node="a", placement=on("A0", 50))])
    result = filter_pod(ext, pod_json("plain", fraction="0.4"))
    assert result["NodeNames"] == ["a", "b"]


# ---- neighbour rules need an admin's grant --------------------------------------------------


def test_without_the_grant_an_exclusive_pod_is_refused_naming_the_label() -> None:
    ext, _ = setup([], granted=False)
    pod = pod_json("solo", fraction="0.25", annotations={ANN_PACKING_POLICY: POLICY_EXCLUSIVE})
    result = filter_pod(ext, pod)
    assert result["NodeNames"] == []
    message = {**result["FailedNodes"], **result["FailedAndUnresolvableNodes"]}["a"]
    assert "gpushare.io/neighbour-rules=granted" in message and "cautious" in message


def test_without_the_grant_an_exclusive_tenant_keeps_no_one_off_its_gpu() -> None:
    exclusive = pod_json(
        "solo",
        fraction="0.1",
        node="a",
        placement=on("A0", 10),
        annotations={ANN_PACKING_POLICY: POLICY_EXCLUSIVE},
    )
    ext, _ = setup([exclusive], granted=False)
    assert filter_pod(ext, pod_json("other", fraction="0.25"))["NodeNames"] == ["a", "b"]
    # The admin grants it: the same view now keeps the GPU to the exclusive pod.
    ext.view.upsert_namespace(
        {
            "metadata": {
                "name": "default",
                "labels": {LABEL_NEIGHBOUR_RULES: NEIGHBOUR_RULES_GRANTED},
            }
        }
    )
    assert filter_pod(ext, pod_json("other", fraction="0.25"))["NodeNames"] == ["b"]


def test_without_the_grant_a_profiling_pod_does_not_keep_its_gpu_alone() -> None:
    profiling = pod_json(
        "trainer-0",
        fraction="0.1",
        node="a",
        placement=on("A0", 10),
        annotations=governed("trainer", **{ANN_PROFILING: PROFILING_ACTIVE}),
    )
    ext, _ = setup([profiling], [share("trainer", PHASE_PROFILING, "trainer-0")], granted=False)
    assert filter_pod(ext, pod_json("other", fraction="0.25"))["NodeNames"] == ["a", "b"]
