"""examples/ applied as they are, on the chart installed in the local cluster.

``kubectl apply -f examples/`` creates a GpuShare, a training Job governed by it and an
inference Deployment beside it. Then: the inference replicas are placed by gpushare-scheduler
with a quarter of a GPU each, latency class, and get Ready; the operator elects the Job's pod to
profile it; the Job's pod gets half a GPU and completes; each container saw the CUDA and MPS
settings of its placement. ``kubectl delete -f examples/`` then leaves nothing behind.

The examples name NVIDIA's PyTorch image, which this cluster cannot pull (no registry, no
GPU): a stand-in is imported under that exact name, like ``hack/build-image.sh`` does for
kube-scheduler. Its ``python`` (``tests/cluster/data/examples_python.sh``) prints the CUDA
environment it was given and behaves like each script over time (training ends, the server
answers /healthz). Everything else, manifests included, is what a user applies.
"""

import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from gpushare.api.names import ANN_CLASS, ANN_FRACTION, ANN_GPU_UUID, ANN_STATE, ANN_THREAD_PERCENT
from tests.fixtures.chart_release import (
    NAMESPACE,
    RELEASE,
    check_nothing_left,
    container_env,
    diagnostics,
    exclusive_node,
    helm,
    kjson,
    remove_release,
    wait_for,
    wait_ready_release_pods,
    wait_webhook_serving,
)
from tests.fixtures.cluster import REPO, LocalCluster
from tests.fixtures.helm_chart import CHART, LOCAL_VALUES

# The chart takes the node over (exclusive_node): run before host agents and controllers start.
pytestmark = [pytest.mark.cluster, pytest.mark.whole_node]

EXAMPLES = REPO / "examples"
NS = "gpushare-examples"
STAND_IN = REPO / "tests" / "cluster" / "data" / "examples_python.sh"


def example_images() -> set[str]:
    images = set()
    for path in EXAMPLES.glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            spec = ((doc or {}).get("spec") or {}).get("template", {}).get("spec", {})
            images.update(c["image"] for c in spec.get("containers", []))
    return images


@pytest.fixture(scope="module")
def stand_in_image(
    cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The examples' image name, backed by the stand-in, in the cluster's containerd."""
    (image,) = example_images()
    busybox = shutil.which("busybox")
    assert busybox, "busybox missing: hack/install-prereqs.sh installs busybox-static"
    applets = ("sh", "sleep", "mkdir", "httpd", "cat", "env")
    archive = tmp_path_factory.mktemp("stand-in") / "image.tar"
    subprocess.run(
        [
            "python3", str(REPO / "hack" / "lib" / "image_archive.py"),
            "--ref", image, "--out", str(archive),
            "--add", f"{busybox}:/bin/busybox",
            "--add", f"{STAND_IN}:/usr/bin/python",
            *[arg for a in applets for arg in ("--symlink", f"/bin/{a}:busybox")],
        ],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    ctr = ["ctr", "--address", cluster.env["GPUSHARE_CONTAINERD_SOCKET"], "-n", "k8s.io"]
    subprocess.run([*ctr, "images", "import", str(archive)], check=True, capture_output=True)
    try:
        yield image
    finally:
        subprocess.run([*ctr, "images", "rm", image], capture_output=True, check=False)


def pods(cluster: LocalCluster, selector: str) -> list[dict[str, Any]]:
    return kjson(cluster, "get", "pods", "-n", NS, "-l", selector)["items"]  # type: ignore[no-any-return]


def placed_right(cluster: LocalCluster, pod: dict[str, Any], fraction: str) -> None:
    """Placed by gpushare on one GPU with a cap of at least its share, and the container saw
    that GPU and cap."""
    ann = pod["metadata"]["annotations"]
    assert ann[ANN_FRACTION] == fraction, ann
    assert ann[ANN_STATE] == "allocated", ann
    assert int(ann[ANN_THREAD_PERCENT]) >= round(float(fraction) * 100), ann
    assert pod["spec"]["schedulerName"] == "gpushare-scheduler"
    name = pod["metadata"]["name"]
    logs = cluster.kubectl("logs", "-n", NS, name)
    assert f"CUDA_VISIBLE_DEVICES={ann[ANN_GPU_UUID]}" in logs, logs
    assert f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={ann[ANN_THREAD_PERCENT]}" in logs, logs


def test_examples_apply_as_they_are_and_share_gpus(
    cluster: LocalCluster, images: None, stand_in_image: str
) -> None:
    with exclusive_node(cluster):
        remove_release(cluster)
        try:
            helm(
                cluster, "install", RELEASE, str(CHART), "--namespace", NAMESPACE,
                "--create-namespace", "--values", str(LOCAL_VALUES), "--wait", "--timeout", "5m",
            )  # fmt: skip
            wait_ready_release_pods(cluster, timeout_s=120)
            wait_webhook_serving(cluster)
            applied = cluster.kubectl("apply", "-f", str(EXAMPLES))
            assert "gpushare.gpushare.io/trainer created" in applied, applied

            # The inference replicas: a quarter of a GPU each, latency class, Ready.
            cluster.kubectl("rollout", "status", "-n", NS, "deployment/infer", "--timeout=180s")
            serving = pods(cluster, "app=infer")
            assert len(serving) == 2
            for pod in serving:
                assert pod["metadata"]["annotations"][ANN_CLASS] == "latency"
                placed_right(cluster, pod, "0.25")
            endpoints = kjson(cluster, "get", "endpoints", "infer", "-n", NS)
            assert sum(len(s.get("addresses", [])) for s in endpoints["subsets"]) == 2

            # The training Job: its GpuShare is accepted and its pod elected for profiling,
            # placed with half a GPU; the Job completes.
            def share_status() -> dict[str, Any]:
                return kjson(cluster, "get", "gpushare", "trainer", "-n", NS).get("status") or {}

            wait_for(
                lambda: share_status().get("phase") in ("Profiling", "Packed"),
                timeout_s=120,
                what="the GpuShare to start profiling its first pod",
            )
            conditions = {c["type"]: c["status"] for c in share_status().get("conditions", [])}
            assert conditions.get("Accepted") == "True", share_status()

            def complete() -> bool:
                job = kjson(cluster, "get", "job", "train", "-n", NS)
                conditions = job.get("status", {}).get("conditions") or []
                return any(c["type"] == "Complete" and c["status"] == "True" for c in conditions)

            wait_for(complete, timeout_s=240, what="the training Job to complete")
            (trainer,) = pods(cluster, "app=trainer")
            assert trainer["metadata"]["annotations"].get("gpushare.io/profiling") in (
                "true",
                "done",
            )
            placed_right(cluster, trainer, "0.5")
            assert "training done" in cluster.kubectl("logs", "-n", NS, trainer["metadata"]["name"])
            # The running server's environment, read from inside.
            served = container_env(cluster, NS, serving[0]["metadata"]["name"])
            uuid = serving[0]["metadata"]["annotations"][ANN_GPU_UUID]
            assert served["CUDA_VISIBLE_DEVICES"] == uuid

            # Removing the examples as they were applied leaves nothing of them.
            cluster.kubectl("delete", "-f", str(EXAMPLES), "--wait=true", "--timeout=120s")
            assert not cluster.kubectl("get", "namespace", NS, "--ignore-not-found").strip()
            helm(
                cluster, "uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout", "5m"
            )
            check_nothing_left(cluster)
        except BaseException:
            print(diagnostics(cluster))
            print(cluster.kubectl("get", "all,gpushares,events", "-n", NS, check=False))
            raise
        finally:
            cluster.kubectl(
                "delete", "-f", str(EXAMPLES), "--ignore-not-found", "--wait=true",
                "--timeout=120s", check=False,
            )  # fmt: skip
            remove_release(cluster)
            cluster.kubectl(
                "delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=false", check=False
            )
