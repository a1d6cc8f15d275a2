"""The operator's view: which pods a GpuShare governs, and who sits on which GPU."""

from typing import Any

from gpushare.cluster.operator.view import ClusterView, pod_summary

from gpushare.api.inventory import GpuInfo, dump_inventory
from gpushare.api.names import ANN_CONTAINER, ANN_NODE_GPUS, ANN_SHARE, RESOURCE_GPU_PERCENT

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


def test_gpu_container_named_by_annotation_gives_image_and_command() -> None:
    pod = pod_summary(pod_body("p", **{ANN_CONTAINER: "main"}))
    assert pod.image == "train:1"
    assert pod.command == ("python", "t.py", "--lr=1")
    assert pod.gpu_pod


def test_selector_governs_only_gpu_pods_and_annotation_links_any() -> None:
    view = ClusterView()
    view.put_share(share_body("train", selector={"matchLabels": {"app": "train"}}))
    view.put_pod(pod_body("gpu", labels={"app": "train"}))
    view.put_pod(pod_body("cpu-only", labels={"app": "train"}, gpu=False))
    view.put_pod(pod_body("linked", gpu=False, **{ANN_SHARE: "train"}))
    view.put_pod(pod_body("other", labels={"app": "web"}))
    share = view.shares["ml/train"]
    assert sorted(p.name for p in view.governed_pods(share)) == ["gpu", "linked"]


def test_deleted_objects_leave_the_view() -> None:
    view = ClusterView()
    body = pod_body("p")
    view.put_pod(body)
    view.put_pod(body, deleted=True)
    assert view.pods == {}


def test_node_inventory_gives_gpu_models_and_agent_address() -> None:
    view = ClusterView()
    gpu = GpuInfo(GPU_A, 0, "NVIDIA H200", 141 * 2**30, 132, "9.0")
    view.put_node(
        {
            "metadata": {"name": "n1", "annotations": {ANN_NODE_GPUS: dump_inventory([gpu])}},
            "status": {"addresses": [{"type": "Hostname", "address": "n1"},
                                     {"type": "InternalIP", "address": "10.0.0.5"}]},
        }
    )  # fmt: skip
    assert view.nodes["n1"].address == "10.0.0.5"
    assert view.gpu_model("n1", GPU_A) == "NVIDIA H200"
    assert view.gpu_models() == {"NVIDIA H200"}
