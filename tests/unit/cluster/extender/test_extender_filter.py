"""Extender filter and prioritize decisions, in kube-scheduler's exact JSON shapes."""

import asyncio
from datetime import UTC, datetime

from gpushare.api.names import (
    AGENT_MODE_DRA,
    ANN_AGENT_MODE,
    ANN_AGENT_READY,
    ANN_CLASS,
    ANN_MEMORY,
    STATE_ALLOCATED,
    STATE_ASSUMED,
)
from gpushare.api.placement import Placement
from gpushare.cluster.extender.args import BindingArgs, ExtenderArgs, parse_extender_args
from gpushare.cluster.extender.verbs import Extender
from gpushare.cluster.state.view import ClusterView
from gpushare.packing.model import Demand
from gpushare.packing.policy import Policy
from tests.fixtures.builders import GIB, PodStore, gpu, node_json, pod_json

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def on(uuid: str, percent: int, memory_gib: int = 8) -> Placement:
    return Placement((uuid,), percent, memory_gib * GIB, NOW, STATE_ALLOCATED)


def view_with(*, policy: Policy = Policy.BINPACK) -> Extender:
    """half: two GPUs each 50% used; busy: one GPU at 80%; empty: an idle GPU; bare: no
    inventory."""
    view = ClusterView(clock=lambda: NOW)
    view.replace_nodes(
        [
            node_json("half", [gpu("H0"), gpu("H1", index=1)]),
            node_json("busy", [gpu("B0")]),
            node_json("empty", [gpu("E0")]),
            node_json("bare", None),
        ]
    )
    view.replace_pods(
        [
            pod_json("h0", fraction="0.5", node="half", placement=on("H0", 50)),
            pod_json("h1", fraction="0.5", node="half", placement=on("H1", 50)),
            pod_json("b0", fraction="0.8", node="busy", placement=on("B0", 80)),
        ]
    )
    return Extender(view=view, writer=None, policy=policy)


def args(pod: dict[str, object], names: list[str]) -> ExtenderArgs:
    return parse_extender_args({"Pod": pod, "NodeNames": names})


ALL = ["half", "busy", "empty", "bare"]


def test_filter_answers_with_the_go_field_names_of_extender_filter_result() -> None:
    result = view_with().filter(args(pod_json("p", fraction="0.2"), ALL))
    assert set(result) == {
        "Nodes",
        "NodeNames",
        "FailedNodes",
        "FailedAndUnresolvableNodes",
        "Error",
    }
    assert result["Error"] == ""
    assert result["Nodes"] is None


def test_a_pod_that_needs_more_than_any_single_gpu_has_free_skips_a_node_with_enough_in_total() -> (
    None
):
    result = view_with().filter(args(pod_json("p", fraction="0.6"), ALL))
    assert result["NodeNames"] == ["empty"]
    # 100% free in total on "half", but 50% on each GPU: fixable by preemption, so FailedNodes.
    assert "half" in result["FailedNodes"]
    # Spelled out: kube-scheduler formats these messages printf-style, mangling "%".
    assert "needs 60 percent compute" in result["FailedNodes"]["half"]
    assert not any("%" in m for m in result["FailedNodes"].values())
    assert "busy" in result["FailedNodes"]
    assert result["FailedAndUnresolvableNodes"]["bare"].startswith("gpushare: node has no GPUs")


def test_a_pod_bigger_than_any_gpu_is_unresolvable_everywhere() -> None:
    pod = pod_json("p", fraction="0.5", annotations={ANN_MEMORY: "100Gi"})
    result = view_with().filter(args(pod, ALL))
    assert result["NodeNames"] == []
    assert set(result["FailedAndUnresolvableNodes"]) == set(ALL)
    assert "100Gi" in result["FailedAndUnresolvableNodes"]["empty"]
    assert result["FailedNodes"] == {}


def test_memory_is_checked_per_gpu() -> None:
    pod = pod_json("p", fraction="0.1", annotations={ANN_MEMORY: "75Gi"})
    result = view_with().filter(args(pod, ["half", "empty"]))
    assert result["NodeNames"] == ["empty"]
    assert "memory" in result["FailedNodes"]["half"]


def test_latency_pods_do_not_share_a_gpu_with_another_latency_pod() -> None:
    ext = view_with()
    ext.view.upsert_pod(
        pod_json(
            "lat",
            fraction="0.2",
            annotations={ANN_CLASS: "latency"},
            node="empty",
            placement=on("E0", 20),
        )
    )
    pod = pod_json("p", fraction="0.2", annotations={ANN_CLASS: "latency"})
    result = ext.filter(args(pod, ["empty", "half"]))
    assert result["NodeNames"] == ["half"]
    assert "latency" in result["FailedNodes"]["empty"]


def test_a_malformed_annotation_fails_every_node_naming_the_annotation() -> None:
    result = view_with().filter(args(pod_json("p", fraction="banana"), ALL))
    assert result["NodeNames"] == []
    assert all(
        "gpushare.io/gpu-fraction" in m for m in result["FailedAndUnresolvableNodes"].values()
    )


def test_pods_that_ask_for_no_gpu_share_pass_every_node() -> None:
    result = view_with().filter(args(pod_json("p"), ALL))
    assert result["NodeNames"] == ALL


def test_whole_gpu_pods_need_idle_gpus() -> None:
    result = view_with().filter(args(pod_json("p", fraction="1"), ALL))
    assert result["NodeNames"] == ["empty"]
    result = view_with().filter(args(pod_json("p", fraction="2"), ALL))
    assert result["NodeNames"] == []
    assert "half" in result["FailedNodes"]  # preempting its two pods would free two GPUs
    assert "empty" in result["FailedAndUnresolvableNodes"]  # one GPU can never hold two


def test_full_node_lists_are_filtered_when_the_scheduler_is_not_node_cache_capable() -> None:
    nodes = {"items": [{"metadata": {"name": n}} for n in ALL]}
    parsed = parse_extender_args({"Pod": pod_json("p", fraction="0.6"), "Nodes": nodes})
    result = view_with().filter(parsed)
    assert result["NodeNames"] is None
    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["empty"]


def test_prioritize_scores_binpack_fuller_nodes_higher_within_0_to_10() -> None:
    result = view_with().prioritize(args(pod_json("p", fraction="0.1"), ALL))
    scores = {h["Host"]: h["Score"] for h in result}
    assert set(result[0]) == {"Host", "Score"}
    assert all(0 <= s <= 10 for s in scores.values())
    assert scores["busy"] > scores["half"] > scores["empty"]
    assert scores["bare"] == 0


def test_prioritize_with_spread_prefers_the_emptiest_node() -> None:
    result = view_with(policy=Policy.SPREAD).prioritize(args(pod_json("p", fraction="0.1"), ALL))
    scores = {h["Host"]: h["Score"] for h in result}
    assert scores["empty"] > scores["half"] > scores["busy"]


def test_cached_answers_follow_every_change_of_a_node() -> None:
    ext = view_with()
    pod = pod_json("p", fraction="0.5")
    assert ext.filter(args(pod, ["empty"]))["NodeNames"] == ["empty"]
    before = ext.prioritize(args(pod, ["empty"]))[0]["Score"]
    ext.view.upsert_pod(pod_json("e0", fraction="0.6", node="empty", placement=on("E0", 60)))
    result = ext.filter(args(pod, ["empty"]))
    assert result["NodeNames"] == [] and "empty" in result["FailedNodes"]
    ext.view.delete_pod("default/e0")
    assert ext.filter(args(pod, ["empty"]))["NodeNames"] == ["empty"]
    assert ext.prioritize(args(pod, ["empty"]))[0]["Score"] == before
    ext.view.upsert_node(node_json("empty", [gpu("E0", healthy=False)]))
    assert "empty" in ext.filter(args(pod, ["empty"]))["FailedAndUnresolvableNodes"]


def test_hold_in_filter_offers_one_node_and_the_next_pod_sees_the_held_share() -> None:
    ext = view_with()
    ext.hold_in_filter = True
    pod = pod_json("a", fraction="0.5", scheduled=True)
    # A filter call for a pod the watch never showed (a forged one) holds nothing.
    forged = ext.filter(args(pod, ["half", "empty"]))
    assert len(forged["NodeNames"]) == 2 and ext.view.reservation("default/a") is None
    ext.view.upsert_pod(pod)
    first = ext.filter(args(pod, ["half", "empty"]))
    assert len(first["NodeNames"]) == 1
    held_on = first["NodeNames"][0]
    # Reasons for the nodes left out are only read when none is left: none are sent.
    assert first["FailedNodes"] == {} and first["FailedAndUnresolvableNodes"] == {}
    assert ext.view.awaiting_allocation(held_on) == []  # nothing bound there yet
    # A second pod filtered before the first one's bind arrives cannot take the held GPU.
    held_gpu = ext.view.reservation("default/a").assignment.gpu_uuids[0]  # type: ignore[union-attr]
    assert ext.view.gpu(held_gpu).used_percent == 100  # type: ignore[union-attr]
    # The hold lapses when no bind comes.
    assert ext.view.expire_holds(now=float("inf")) == ["default/a"]
    assert ext.view.reservation("default/a") is None


def test_the_bind_gate_waits_only_for_pods_the_node_agent_could_mistake_for_this_one() -> None:
    # The node agent tells pods waiting for Allocate apart by GPU and slice count.
    ext = view_with()
    waiting = Placement(("E0",), 30, 8 * GIB, NOW, STATE_ASSUMED)
    ext.view.upsert_pod(pod_json("w30", fraction="0.3", node="empty", placement=waiting))
    ext.view.upsert_pod(pod_json("same", fraction="0.3"))
    ext.view.upsert_pod(pod_json("other", fraction="0.4"))
    assert ext.view.awaiting_allocation("empty") == ["default/w30"]
    assert ext._ambiguous("empty", "default/same", ext._size("default/same")) == ["default/w30"]
    assert ext._ambiguous("empty", "default/other", ext._size("default/other")) == []
    assert ext._ambiguous("empty", "default/unknown", ext._size("default/unknown")) == [
        "default/w30"
    ]


def test_hold_in_filter_steers_a_pod_only_between_equally_good_nodes_to_skip_a_bind_wait() -> None:
    # "t1" and "t2" are alike (one GPU, a 30 % pod on it), but t1's pod still waits for its
    # Allocate: a second 30 % pod bound there would wait at the bind gate behind it (the node
    # agent could confuse the two), so of the two equally good nodes it gets t2. A 25 % pod
    # cannot be confused with it and keeps the ranking's own tie-break (the name that sorts
    # first). A node the ranking likes better is never given up for this: "busy" (80 % used)
    # is binpack's best for a 20 % pod even while a 20 % pod waits there.
    view = ClusterView(clock=lambda: NOW)
    view.replace_nodes(
        [node_json("t1", [gpu("T1")]), node_json("t2", [gpu("T2")]), node_json("busy", [gpu("B")])]
    )
    waiting = Placement(("T1",), 30, 8 * GIB, NOW, STATE_ASSUMED)
    view.replace_pods(
        [
            pod_json("w1", fraction="0.3", node="t1", placement=waiting),
            pod_json("r2", fraction="0.3", node="t2", placement=on("T2", 30), phase="Running"),
            pod_json("b0", fraction="0.6", node="busy", placement=on("B", 60), phase="Running"),
            pod_json("w3", fraction="0.2", node="busy", placement=on("B", 20)),
        ]
    )
    ext = Extender(view=view, writer=None, policy=Policy.BINPACK, hold_in_filter=True)
    for name, fraction in (("a", "0.3"), ("c", "0.25"), ("d", "0.2")):
        ext.view.upsert_pod(pod_json(name, fraction=fraction, scheduled=True))
    for name, fraction, nodes, held in (
        ("a", "0.3", ["t1", "t2"], "t2"),
        ("c", "0.25", ["t1", "t2"], "t1"),
        ("d", "0.2", ["t1", "busy"], "busy"),
    ):
        pod = pod_json(name, fraction=fraction, scheduled=True)
        assert ext.filter(args(pod, nodes))["NodeNames"] == [held]
        ext.view.expire_holds(now=float("inf"))  # each pod alone against the same nodes


# ---- pods without GPUs sent to gpushare-scheduler ------------------------------------------------


def cpu_pod(name: str, cpu: str) -> dict[str, object]:
    containers = [{"name": "main", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}]
    return pod_json(name, containers=containers, extra_spec={"schedulerName": "gpushare-scheduler"})


def cpu_cluster(policy: Policy = Policy.GPUSHARE) -> Extender:
    """roomy and tight: one idle GPU each, 64 and 12 CPUs; the pods seen so far bring 8 CPUs
    per whole GPU (the mix the policy learned)."""
    view = ClusterView(clock=lambda: NOW)
    nodes = []
    for name, cpu in (("roomy", "64"), ("tight", "12")):
        node = node_json(name, [gpu(f"{name}-0")])
        node["status"] = {"allocatable": {"cpu": cpu, "memory": "256Gi"}}
        nodes.append(node)
    view.replace_nodes(nodes)
    view.replace_pods([])
    for _ in range(view.mix.refit_every):
        view.mix.observe(Demand(percent=100, cpu_milli=8000))
    return Extender(view=view, writer=None, policy=policy, hold_in_filter=True)


def test_a_pod_without_gpus_goes_where_its_cpu_strands_no_gpu_and_holds_it() -> None:
    ext = cpu_cluster()
    # On tight, 8 of 12 CPUs taken would leave the idle GPU without the CPU its pods bring.
    result = ext.filter(args(cpu_pod("c1", "8"), ["tight", "roomy"]))
    assert result["NodeNames"] == ["roomy"]
    node = ext.view.node("roomy")
    assert node is not None and node.cpu_milli_free == 56000  # held until the bind
    # Prioritize ranks the same way (kube-scheduler calls it without filter-time holds).
    ext.view.expire_holds(now=float("inf"))
    scores = {
        s["Host"]: s["Score"] for s in ext.prioritize(args(cpu_pod("c1", "8"), ["tight", "roomy"]))
    }
    assert scores["roomy"] == 10 > scores["tight"]
    # Too big for tight: refused there with the reason.
    result = ext.filter(args(cpu_pod("c2", "16"), ["tight"]))
    assert result["NodeNames"] == [] and "needs 16000m CPU" in result["FailedNodes"]["tight"]


def test_binpack_and_spread_leave_pods_without_gpus_to_the_scheduler() -> None:
    ext = cpu_cluster(Policy.BINPACK)
    assert ext.filter(args(cpu_pod("c1", "8"), ["tight", "roomy"]))["NodeNames"] == [
        "tight",
        "roomy",
    ]


def test_a_pod_without_gpus_binds_without_waiting_at_the_gate() -> None:
    ext = cpu_cluster()
    store = PodStore()
    ext.writer = store
    pod = store.add(cpu_pod("c1", "8"))
    assert ext.filter(args(pod, ["tight", "roomy"]))["NodeNames"] == ["roomy"]
    meta = pod["metadata"]
    assert isinstance(meta, dict)
    binding = BindingArgs(meta["name"], meta["namespace"], meta["uid"], "roomy")
    assert asyncio.run(asyncio.wait_for(ext.bind(binding), timeout=1.0)) == {"Error": ""}
    assert store.pods["default/c1"]["spec"]["nodeName"] == "roomy"


def test_a_pod_without_gpus_binds_only_to_the_node_filter_offered() -> None:
    # The extender binds with the controller's cluster-wide right: a bind to a node its filter
    # did not offer (a forged call, or one after the offer expired) is refused, and the hold
    # filter took is given back.
    ext = cpu_cluster()
    store = PodStore()
    ext.writer = store
    pod = store.add(cpu_pod("c1", "8"))
    assert ext.filter(args(pod, ["tight", "roomy"]))["NodeNames"] == ["roomy"]
    meta = pod["metadata"]
    assert isinstance(meta, dict)
    binding = BindingArgs(meta["name"], meta["namespace"], meta["uid"], "tight")
    answer = asyncio.run(asyncio.wait_for(ext.bind(binding), timeout=1.0))
    assert "was not offered" in answer["Error"]
    assert store.pods["default/c1"]["spec"].get("nodeName") is None
    node = ext.view.node("roomy")
    assert node is not None and node.cpu_milli_free == 64000


def test_a_pod_without_gpus_of_another_scheduler_is_never_held_or_bound() -> None:
    ext = cpu_cluster()
    store = PodStore()
    ext.writer = store
    containers = [{"name": "main", "image": "busybox", "resources": {"requests": {"cpu": "8"}}}]
    pod = store.add(pod_json("other", containers=containers))  # default-scheduler's pod
    ext.filter(args(pod, ["tight", "roomy"]))
    assert ext.view.node("roomy") is not None
    assert ext.view.held_on("roomy") == set()
    meta = pod["metadata"]
    assert isinstance(meta, dict)
    binding = BindingArgs(meta["name"], meta["namespace"], meta["uid"], "roomy")
    answer = asyncio.run(asyncio.wait_for(ext.bind(binding), timeout=1.0))
    assert "not gpushare-scheduler" in answer["Error"]
    assert store.pods["default/other"]["spec"].get("nodeName") is None


def test_a_pod_without_any_requests_passes_every_node_and_binds_to_one_of_them() -> None:
    # A BestEffort pod of gpushare-scheduler (no GPU, no CPU or memory request) and, under
    # binpack, a pod with CPU only: filter passes every node, so bind may use any of them.
    for pod_of, policy in (
        (
            lambda n: pod_json(n, extra_spec={"schedulerName": "gpushare-scheduler"}),
            Policy.GPUSHARE,
        ),
        (lambda n: cpu_pod(n, "8"), Policy.BINPACK),
    ):
        ext = cpu_cluster(policy)
        store = PodStore()
        ext.writer = store
        pod = store.add(pod_of("p"))
        assert ext.filter(args(pod, ["tight", "roomy"]))["NodeNames"] == ["tight", "roomy"]
        meta = pod["metadata"]
        assert isinstance(meta, dict)
        binding = BindingArgs(meta["name"], meta["namespace"], meta["uid"], "tight")
        assert asyncio.run(asyncio.wait_for(ext.bind(binding), timeout=1.0)) == {"Error": ""}
        assert store.pods["default/p"]["spec"]["nodeName"] == "tight"


def test_a_node_whose_agent_is_not_ready_waits_and_takes_pods_again_once_ready() -> None:
    """While the node agent re-registers with the kubelet (its own or the kubelet's restart) a
    pod bound to the node would fail the kubelet's admission; the node is refused, saying why,
    until the agent publishes that the kubelet has its devices again."""
    extender = view_with()
    node = node_json("empty", [gpu("E0")])
    node["metadata"]["annotations"][ANN_AGENT_READY] = "false"
    extender.view.upsert_node(node)
    result = extender.filter(args(pod_json("p", fraction="0.2"), ["empty"]))
    assert result["NodeNames"] == []
    refused = {**result["FailedNodes"], **result["FailedAndUnresolvableNodes"]}
    assert "node agent is not ready" in refused["empty"]
    node["metadata"]["annotations"][ANN_AGENT_READY] = "true"
    extender.view.upsert_node(node)
    assert extender.filter(args(pod_json("p", fraction="0.2"), ["empty"]))["NodeNames"] == ["empty"]


def test_an_unreadable_agent_ready_annotation_is_refused_naming_it() -> None:
    extender = view_with()
    node = node_json("empty", [gpu("E0")])
    node["metadata"]["annotations"][ANN_AGENT_READY] = "maybe"
    extender.view.upsert_node(node)
    result = extender.filter(args(pod_json("p", fraction="0.2"), ["empty"]))
    refused = {**result["FailedNodes"], **result["FailedAndUnresolvableNodes"]}
    assert ANN_AGENT_READY in refused["empty"]


def test_a_dra_mode_node_is_refused_saying_why_and_keeps_what_the_operator_reads() -> None:
    """Both modes in one cluster (docs/dra.md): the agent of a DRA node publishes its GPUs for
    the operator, but the extender places annotated pods on device-plugin nodes only, and the
    node's GPUs are not counted as the extender's capacity."""
    extender = view_with()
    gpus_before = sum(len(n.gpus) for n in extender.view.nodes().values())
    node = node_json("dra-node", [gpu("D0")])
    node["metadata"]["annotations"][ANN_AGENT_MODE] = AGENT_MODE_DRA
    extender.view.upsert_node(node)
    result = extender.filter(args(pod_json("p", fraction="0.2"), ["dra-node"]))
    assert result["NodeNames"] == []
    refused = {**result["FailedNodes"], **result["FailedAndUnresolvableNodes"]}
    assert "agent mode dra" in refused["dra-node"]
    assert sum(len(n.gpus) for n in extender.view.nodes().values()) == gpus_before
    info = extender.view.node_info("dra-node")
    assert info is not None and info.gpu_models == {"D0": gpu("D0").model}
    node["metadata"]["annotations"][ANN_AGENT_MODE] = "deviceplugin"
    extender.view.upsert_node(node)
    assert extender.filter(args(pod_json("p", fraction="0.2"), ["dra-node"]))["NodeNames"] == [
        "dra-node"
    ]


def test_a_node_named_twice_is_answered_once() -> None:
    """A forged filter call naming nodes twice gets one answer per node: never passed twice,
    never both passed and failed (found by the fuzz suite)."""
    result = view_with().filter(
        args(pod_json("p", fraction="0.6"), ["empty", "empty", "busy", "busy"])
    )
    answered = [*result["NodeNames"], *result["FailedNodes"], *result["FailedAndUnresolvableNodes"]]
    assert sorted(answered) == ["busy", "empty"]
    items = [{"metadata": {"name": n}} for n in ("empty", "busy", "empty")]
    doc = parse_extender_args({"Pod": pod_json("q", fraction="0.6"), "Nodes": {"items": items}})
    assert doc.node_names == ["empty", "busy"] and doc.nodes is not None and len(doc.nodes) == 2
