"""The operator's reads of the one cluster state: which pods a GpuShare governs, each pod's GPU
container, the GPU models and agent address of each node."""

from typing import Any

from gpushare.api.inventory import GpuInfo, dump_inventory
from gpushare.api.names import ANN_CONTAINER, ANN_NODE_GPUS, ANN_SHARE, RESOURCE_GPU_PERCENT
from gpushare.cluster.state.pod_facts import facts
from gpushare.cluster.state.view import ClusterView
from tests.fixtures.builders import node_json, pod_json

GPU_A = "GPU-aaaaaaaa-0000-4000-8000-000000000000"


def pod_body(
    name: str, *, labels: dict[str, str] | None = None, gpu: bool = True, **ann: str
) -> dict[str, Any]:
    limits = {RESOURCE_GPU_PERCENT: "25"} if gpu else {}
    return {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "labels": labels or {},
            "annotations": dict(ann),
            "creationTimestamp": "2025-03-01T12:00:00Z",
        },
        "spec": {
            "containers": [
                {"name": "sidecar", "image": "proxy:1", "command": ["proxy"]},
                {"name": "main", "image": "train:1", "command": ["python"],
                 "args": ["t.py", "--lr=1"], "resources": {"limits": limits}},
            ]
        },
        "status": {"phase": "Pending"},
    }  # fmt: skip


def share_body(name: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ml"}, "spec": {"fraction": "0.25", **spec}}


def scheduled_pod(name: str, *, share: str | None = None) -> dict[str, Any]:
    """A pod of namespace ml naming gpushare-scheduler, linked to ``share`` by annotation."""
    annotations = {ANN_SHARE: share} if share else {}
    return pod_json(name, namespace="ml", annotations=annotations, scheduled=True)


def test_gpu_container_named_by_annotation_gives_image_and_command() -> None:
    pod = facts(pod_body("p", **{ANN_CONTAINER: "main"}))
    assert pod.image == "train:1"
    assert pod.command == ("python", "t.py", "--lr=1")
    assert pod.gpu_pod


def test_the_annotation_links_a_pod_and_a_matching_label_alone_links_none() -> None:
    """A selector links a pod only when it is created (the webhook writes gpushare.io/share):
    a pod that only carries a matching label, or got it later, is not governed."""
    view = ClusterView()
    view.upsert_share(share_body("train", selector={"matchLabels": {"app": "train"}}))
    view.upsert_pod(pod_body("labelled", labels={"app": "train"}))
    view.upsert_pod(pod_body("cpu-only", labels={"app": "train"}, gpu=False))
    view.upsert_pod(pod_body("linked", gpu=False, **{ANN_SHARE: "train"}))
    view.upsert_pod(pod_body("other", labels={"app": "web"}, **{ANN_SHARE: "infer"}))
    share = view.share("ml/train")
    assert share is not None
    assert [p.name for p in view.governed_pods(share)] == ["linked"]


def test_a_pod_naming_gpushare_scheduler_without_a_request_is_neither_governed_nor_placed() -> None:
    view = ClusterView()
    view.upsert_share(share_body("train", selector={"matchLabels": {"app": "train"}}))
    body = scheduled_pod("bare")
    body["metadata"]["labels"] = {"app": "train"}
    view.upsert_pod(body)
    share = view.share("ml/train")
    assert share is not None
    assert view.governed_pods(share) == []  # the operator reports it (operator.unlinked)
    assert view.pod("ml/bare") is None


def test_deleted_objects_leave_the_view() -> None:
    view = ClusterView()
    body = pod_body("p")
    view.upsert_pod(body)
    view.delete_pod("ml/p")
    assert view.pods() == {}
    assert list(view.kept_pods()) == []


def test_node_inventory_gives_gpu_models_and_agent_address() -> None:
    view = ClusterView()
    gpu = GpuInfo(GPU_A, 0, "NVIDIA H200", 141 * 2**30, 132, "9.0")
    view.upsert_node(
        {
            "metadata": {"name": "n1", "annotations": {ANN_NODE_GPUS: dump_inventory([gpu])}},
            "status": {"addresses": [{"type": "Hostname", "address": "n1"},
                                     {"type": "InternalIP", "address": "10.0.0.5"}]},
        }
    )  # fmt: skip
    info = view.node_info("n1")
    assert info is not None and info.address == "10.0.0.5"
    assert view.gpu_model("n1", GPU_A) == "NVIDIA H200"
    assert view.gpu_models() == {"NVIDIA H200"}


def test_gpu_models_stay_while_the_node_agent_is_not_registered() -> None:
    """A node whose kubelet lost the device plugin takes no pods, but its GPUs are still there:
    the operator's cache lookups and eviction series keep them."""
    view = ClusterView()
    gpu = GpuInfo(GPU_A, 0, "NVIDIA H200", 141 * 2**30, 132, "9.0")
    view.upsert_node(
        {
            "metadata": {"name": "n1", "annotations": {ANN_NODE_GPUS: dump_inventory([gpu])}},
            "status": {"allocatable": {RESOURCE_GPU_PERCENT: "0"}},
        }
    )
    assert view.node("n1") is None
    assert view.gpu_model("n1", GPU_A) == "NVIDIA H200"


def test_not_synced_until_nodes_and_pods_were_both_listed() -> None:
    view = ClusterView()
    told: list[bool] = []
    view.sync_listeners.append(lambda: told.append(True))
    view.replace_nodes([node_json("n1", None)])
    assert not view.synced and not told  # a pod not listed yet must not read as deleted
    view.replace_pods([scheduled_pod("a"), scheduled_pod("b")])
    assert view.synced and told == [True]
    assert sorted(p.key for p in view.kept_pods()) == ["ml/a", "ml/b"]
    assert list(view.node_infos()) == ["n1"]


def test_a_relist_forgets_what_went_away_while_the_watch_was_down() -> None:
    view = ClusterView()
    view.replace_pods([scheduled_pod("a"), scheduled_pod("b")])
    view.replace_pods([scheduled_pod("b")])
    assert [p.key for p in view.kept_pods()] == ["ml/b"]


def test_node_events_update_the_gpu_models_the_operator_reads() -> None:
    view = ClusterView()
    body: dict[str, Any] = node_json("n1", None)
    view.upsert_node(body)
    info = view.node_info("n1")
    assert info is not None and info.gpu_models == {}
    view.delete_node("n1")
    assert view.node_info("n1") is None


def test_a_one_off_listing_keeps_newer_watch_events_and_syncs_the_view() -> None:
    view = ClusterView()
    newer = scheduled_pod("a", share="train")
    view.upsert_pod(newer)
    view.add_listed(nodes=[node_json("n1", None)], pods=[scheduled_pod("a"), scheduled_pod("b")])
    assert view.synced
    kept = view.kept_pod("ml/a")
    assert kept is not None and kept.annotations.get(ANN_SHARE) == "train"
    assert view.kept_pod("ml/b") is not None
