"""The node agent against the local cluster's real kubelet (simulated GPUs)."""

import json
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import grpc
import pytest

from gpushare.api.names import (
    ANN_BIND_TIME,
    ANN_CLASS,
    ANN_GPU_UUID,
    ANN_MEMORY_LIMIT,
    ANN_STATE,
    ANN_THREAD_PERCENT,
    LABEL_MPS_CAPABLE,
    LABEL_SIMULATED,
    RESOURCE_GPU_PERCENT,
)
from gpushare.api.placement import format_time
from gpushare.node.core.serving import socket_identity
from gpushare.node.deviceplugin.holdings import kubelet_allocatable, kubelet_held
from tests.fixtures.node_agent import (
    DEVICE_PLUGIN_DIR,
    PLUGIN_SOCKET,
    POD_RESOURCES_SOCKET,
    NodeAgentProcess,
    wait_until,
)

# Each test leaves the node as it found it (``clean_node``), so the file passes in any order
# (``--test-order``; hack/run-pytest.sh shuffles it on every run).
pytestmark = [pytest.mark.cluster, pytest.mark.order_independent]

GIB = 2**30
# The admission webhook leaves kube-system alone, so the test can play gpushare-scheduler's
# part (write the placement, bind) whether or not the controller runs on the cluster.
NAMESPACE = "kube-system"
TEST_LABEL = "gpushare.io/test=deviceplugin"
MANUAL_SCHEDULER = "gpushare-test-manual-binding"


@pytest.fixture(scope="module")
def namespace(cluster: Any) -> Iterator[str]:
    yield NAMESPACE
    cluster.kubectl("delete", "pod", "-n", NAMESPACE, "-l", TEST_LABEL, "--wait=false", check=False)


@pytest.fixture(autouse=True)
def clean_node(cluster: Any, node_agent: NodeAgentProcess) -> Iterator[None]:
    """After each test, its pods are gone and the kubelet holds no slice it did not hold
    before: the kubelet's own choice of slices depends on what is free, so what one test
    left behind would steer the next one's."""
    before = held_slices()
    yield
    cluster.kubectl(
        "delete",
        "pod",
        "-n",
        NAMESPACE,
        "-l",
        TEST_LABEL,
        "--wait=true",
        "--timeout=90s",
        check=False,
    )

    def gone() -> bool:
        listed = cluster.kubectl("get", "pod", "-n", NAMESPACE, "-l", TEST_LABEL, "-o", "name")
        return not listed.strip()

    wait_until(gone, timeout_s=90, what="the test's pods to be gone")
    wait_until(
        lambda: held_slices() <= before,
        timeout_s=60,
        what="the kubelet to hold no slice it did not hold before the test (pod-resources)",
    )


def held_slices() -> frozenset[str]:
    """Every gpu-percent slice the kubelet holds for some pod (its pod-resources List)."""

    def answer() -> dict[str, tuple[str, ...]] | None:
        try:
            return kubelet_held(socket_path=POD_RESOURCES_SOCKET) or {"": ()}
        except grpc.RpcError:  # a kubelet restarting does not answer yet
            return None

    held = wait_until(answer, timeout_s=30, what="the kubelet's pod-resources answer")
    return frozenset(d for ids in held.values() for d in ids)


def pod_manifest(
    name: str,
    *,
    image: str,
    slices: int,
    command: str = "env | sort; echo ---; cat /dev/shm/marker 2>/dev/null; echo; sleep 3600",
    run_as_user: int | None = None,
) -> str:
    container: dict[str, Any] = {
        "name": "main",
        "image": image,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", command],
        "resources": {"limits": {RESOURCE_GPU_PERCENT: str(slices)}},
    }
    if run_as_user is not None:
        container["securityContext"] = {"runAsUser": run_as_user}
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": NAMESPACE,
                "labels": dict([TEST_LABEL.split("=")]),
            },
            "spec": {
                # No scheduler serves this name: the test binds the pod itself, as
                # gpushare-scheduler's extender does after writing the placement.
                "schedulerName": MANUAL_SCHEDULER,
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 1,
                "containers": [container],
            },
        }
    )


def run_pod(
    cluster: Any,
    name: str,
    *,
    slices: int,
    annotations: dict[str, str] | None = None,
    run_as_user: int | None = None,
    command: str | None = None,
) -> None:
    """Create the pod, write its placement annotations and bind it to the node, in the order
    the extender does; the kubelet then admits it and calls the device plugin."""
    extra = {"command": command} if command is not None else {}
    manifest = pod_manifest(
        name, image=cluster.busybox_image, slices=slices, run_as_user=run_as_user, **extra
    )
    cluster.kubectl("apply", "-f", "-", input=manifest)
    if annotations:
        pairs = [f"{k}={v}" for k, v in annotations.items()]
        cluster.kubectl("annotate", "pod", name, "-n", NAMESPACE, "--overwrite", *pairs)
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "target": {"apiVersion": "v1", "kind": "Node", "name": cluster.node_name},
    }
    cluster.kubectl(
        "create",
        "--raw",
        f"/api/v1/namespaces/{NAMESPACE}/pods/{name}/binding",
        "-f",
        "-",
        input=json.dumps(binding),
    )


def placement(gpu: str, *, threads: int, memory: int, cls: str) -> dict[str, str]:
    return {
        ANN_GPU_UUID: gpu,
        ANN_THREAD_PERCENT: str(threads),
        ANN_MEMORY_LIMIT: str(memory),
        ANN_BIND_TIME: format_time(datetime.now(UTC)),
        ANN_STATE: "assumed",
        ANN_CLASS: cls,
    }


def get_pod(cluster: Any, name: str) -> dict[str, Any]:
    return json.loads(cluster.kubectl("get", "pod", name, "-n", NAMESPACE, "-o", "json"))


def wait_running(cluster: Any, name: str) -> dict[str, Any]:
    def running() -> dict[str, Any] | None:
        pod = get_pod(cluster, name)
        phase = pod["status"].get("phase")
        if phase == "Failed":
            pytest.fail(f"pod {name} failed: {pod['status'].get('message')}")
        return pod if phase == "Running" else None

    return wait_until(running, timeout_s=90, what=f"pod {name} to run")  # type: ignore[no-any-return]


def container_env(cluster: Any, name: str) -> tuple[dict[str, str], str]:
    def logged() -> str:
        text = cluster.kubectl("logs", name, "-n", NAMESPACE, check=False)
        return text if "---" in text else ""

    text = wait_until(logged, timeout_s=30, what=f"the environment in {name}'s log")
    env_part, _, rest = text.partition("---")
    env = dict(line.split("=", 1) for line in env_part.splitlines() if "=" in line)
    return env, rest.strip()


def delete(cluster: Any, *names: str) -> None:
    cluster.kubectl("delete", "pod", *names, "-n", NAMESPACE, "--wait=false", check=False)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def test_kubelet_advertises_100_slices_per_simulated_gpu(node_agent: NodeAgentProcess) -> None:
    gpus = node_agent.gpus()
    assert len(gpus) == 2 and all(g.simulated and g.mps_ready and g.healthy for g in gpus)
    assert node_agent.advertised() == (200, 200)
    labels = node_agent.node()["metadata"]["labels"]
    assert labels[LABEL_SIMULATED] == "true" and labels[LABEL_MPS_CAPABLE] == "true"
    assert PLUGIN_SOCKET.is_socket()


def test_placed_pod_starts_with_its_gpu_mps_share_and_memory_limit(
    cluster: Any, node_agent: NodeAgentProcess, namespace: str
) -> None:
    gpu = node_agent.gpus()[1].uuid
    shm = node_agent.mps_root / gpu / "shm"
    (shm / "marker").write_text(f"daemon-shm-of-{gpu}")
    (node_agent.mps_root / gpu / "pipe" / "marker").write_text(f"daemon-pipe-of-{gpu}")
    name = unique("placed")
    run_pod(
        cluster,
        name,
        slices=30,
        annotations=placement(gpu, threads=30, memory=10 * GIB, cls="latency"),
        command=(
            "env | sort; echo ---; cat /dev/shm/marker 2>/dev/null; echo; "
            "cat /tmp/nvidia-mps/marker 2>/dev/null; echo; "
            "ls /run/gpushare/node/mps/log >/dev/null 2>&1 && echo log-visible; sleep 3600"
        ),
    )
    try:
        pod = wait_running(cluster, name)
        env, shm_seen = container_env(cluster, name)
        assert env["CUDA_VISIBLE_DEVICES"] == gpu
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M"
        assert env["CUDA_MPS_CLIENT_PRIORITY"] == "0"
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/gpushare/node/mps/pipe"
        assert "CUDA_MPS_LOG_DIRECTORY" not in env
        # The container's /dev/shm is the GPU's MPS daemon shm directory; its pipe directory is
        # also where CUDA looks without CUDA_MPS_PIPE_DIRECTORY; the log directory the node
        # agent reads is not in the container at all.
        seen = shm_seen.splitlines()
        assert seen[0] == f"daemon-shm-of-{gpu}"
        assert seen[1] == f"daemon-pipe-of-{gpu}"
        assert "log-visible" not in seen
        pod = get_pod(cluster, name)
        assert pod["metadata"]["annotations"][ANN_STATE] == "allocated"
    finally:
        delete(cluster, name)


def test_batch_pod_runs_at_below_normal_priority_on_its_gpu(
    cluster: Any, node_agent: NodeAgentProcess, namespace: str
) -> None:
    gpu = node_agent.gpus()[0].uuid
    name = unique("batch")
    run_pod(
        cluster,
        name,
        slices=20,
        annotations=placement(gpu, threads=25, memory=8 * GIB, cls="batch"),
    )
    try:
        wait_running(cluster, name)
        env, _ = container_env(cluster, name)
        assert env["CUDA_VISIBLE_DEVICES"] == gpu
        assert env["CUDA_MPS_CLIENT_PRIORITY"] == "1"
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    finally:
        delete(cluster, name)


def test_pod_without_placement_gets_a_derived_share_and_an_event(
    cluster: Any, node_agent: NodeAgentProcess, namespace: str
) -> None:
    name = unique("unplaced")
    run_pod(cluster, name, slices=15)
    try:
        wait_running(cluster, name)
        env, _ = container_env(cluster, name)
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "15"
        assert env["CUDA_VISIBLE_DEVICES"] in {g.uuid for g in node_agent.gpus()}
        events = json.loads(
            cluster.kubectl(
                "get",
                "events",
                "-n",
                "default",
                "--field-selector",
                "reason=GpushareAllocationDerived",
                "-o",
                "json",
            )
        )["items"]
        assert any(env["CUDA_VISIBLE_DEVICES"] in e["message"] for e in events)
    finally:
        delete(cluster, name)


def test_malformed_annotation_fails_only_that_pod_naming_the_annotation(
    cluster: Any, node_agent: NodeAgentProcess, namespace: str
) -> None:
    """A pod on the other GPU makes that one the kubelet's own best fit for 10 slices: the
    malformed pod is still refused (it once ran with a derived share when the slices came
    from another GPU than its annotation names), and its neighbours are undisturbed."""
    gpu, other = node_agent.gpus()[0].uuid, node_agent.gpus()[1].uuid
    bad, good, neighbour = unique("malformed"), unique("fine"), unique("neighbour")
    run_pod(
        cluster,
        neighbour,
        slices=30,
        annotations=placement(other, threads=30, memory=GIB, cls="batch"),
    )
    wait_running(cluster, neighbour)
    annotations = placement(gpu, threads=20, memory=GIB, cls="batch")
    annotations[ANN_THREAD_PERCENT] = "a lot"
    run_pod(cluster, bad, slices=10, annotations=annotations)
    try:

        def failed() -> str:
            status = get_pod(cluster, bad)["status"]
            return str(status.get("message", "")) if status.get("phase") == "Failed" else ""

        message = wait_until(failed, timeout_s=60, what=f"pod {bad} to fail admission")
        assert ANN_THREAD_PERCENT in message
        run_pod(
            cluster,
            good,
            slices=10,
            annotations=placement(gpu, threads=10, memory=GIB, cls="batch"),
        )
        wait_running(cluster, good)
        env, _ = container_env(cluster, good)
        assert env["CUDA_VISIBLE_DEVICES"] == gpu
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "10"
        assert get_pod(cluster, neighbour)["status"]["phase"] == "Running"
    finally:
        delete(cluster, bad, good, neighbour)


def test_pod_with_another_uid_than_its_gpu_serves_is_refused(
    cluster: Any, node_agent: NodeAgentProcess, namespace: str
) -> None:
    gpu = node_agent.gpus()[1].uuid
    first, second = unique("uid-a"), unique("uid-b")
    run_pod(
        cluster,
        first,
        slices=10,
        annotations=placement(gpu, threads=10, memory=GIB, cls="batch"),
        run_as_user=1000,
    )
    try:
        wait_running(cluster, first)
        run_pod(
            cluster,
            second,
            slices=10,
            annotations=placement(gpu, threads=10, memory=GIB, cls="batch"),
            run_as_user=2000,
        )

        def failed() -> str:
            status = get_pod(cluster, second)["status"]
            return str(status.get("message", "")) if status.get("phase") == "Failed" else ""

        message = wait_until(failed, timeout_s=60, what=f"pod {second} to be refused")
        assert "runAsUser" in message and "UID 1000" in message
    finally:
        delete(cluster, first, second)


def test_kubelet_restart_reregisters_within_5s_and_restores_capacity(
    cluster: Any, node_agent: NodeAgentProcess, namespace: str
) -> None:
    gpu = node_agent.gpus()[0].uuid
    name = unique("survivor")
    run_pod(
        cluster, name, slices=10, annotations=placement(gpu, threads=10, memory=GIB, cls="batch")
    )
    try:
        before = wait_running(cluster, name)
        registrations = node_agent.registrations()
        kubelet_sock = DEVICE_PLUGIN_DIR / "kubelet.sock"
        old_identity = socket_identity(kubelet_sock)
        restart = threading.Thread(target=cluster.harness, args=("restart-kubelet",))
        restart.start()

        # Watch for the new kubelet's socket while the harness restarts it.
        def new_socket() -> float | None:
            current = socket_identity(kubelet_sock)
            return time.monotonic() if current not in (None, old_identity) else None

        appeared = wait_until(new_socket, timeout_s=60, what="the new kubelet.sock", every_s=0.02)
        wait_until(
            lambda: node_agent.registrations() > registrations,
            timeout_s=30,
            what="the node agent to register again",
            every_s=0.05,
        )
        reregistered = time.monotonic()
        restart.join(timeout=120)
        assert reregistered - appeared < 5.0, f"re-registered {reregistered - appeared:.1f}s late"
        # The kubelet's own count (what it admits pods against) has every slice again; the
        # node object follows on the kubelet's status period.
        wait_until(
            lambda: kubelet_allocatable(socket_path=POD_RESOURCES_SOCKET) == 200,
            timeout_s=30,
            what="the kubelet to count all 200 slices allocatable (pod-resources)",
            every_s=0.05,
        )
        wait_until(
            lambda: node_agent.advertised() == (200, 200),
            timeout_s=60,
            what="capacity and allocatable restored to 200",
        )
        after = get_pod(cluster, name)
        assert after["status"]["phase"] == "Running"
        assert (
            after["status"]["containerStatuses"][0]["containerID"]
            == before["status"]["containerStatuses"][0]["containerID"]
        )
    finally:
        delete(cluster, name)


def test_agent_restart_leaves_running_pods_untouched(
    cluster: Any, node_agent: NodeAgentProcess, namespace: str
) -> None:
    gpu = node_agent.gpus()[1].uuid
    name, later = unique("steady"), unique("after-restart")
    run_pod(
        cluster, name, slices=20, annotations=placement(gpu, threads=20, memory=GIB, cls="batch")
    )
    try:
        before = wait_running(cluster, name)
        shm_dir = node_agent.mps_root / gpu / "shm"
        (shm_dir / "still-here").write_text("x")
        old_pid = node_agent.pid
        assert node_agent.stop() in (0, None)  # exit code known when this session started it
        assert not PLUGIN_SOCKET.exists()  # a clean SIGTERM shutdown removes its socket
        node_agent.start()
        assert node_agent.pid != old_pid
        after = get_pod(cluster, name)
        assert after["status"]["phase"] == "Running"
        status_before = before["status"]["containerStatuses"][0]
        status_after = after["status"]["containerStatuses"][0]
        assert status_after["containerID"] == status_before["containerID"]
        assert status_after["restartCount"] == 0
        assert (shm_dir / "still-here").exists()  # the GPU's MPS directories were kept
        assert after["metadata"]["annotations"][ANN_STATE] == "allocated"
        # And the restarted agent admits new pods.
        run_pod(
            cluster,
            later,
            slices=10,
            annotations=placement(gpu, threads=10, memory=GIB, cls="batch"),
        )
        wait_running(cluster, later)
        env, _ = container_env(cluster, later)
        assert env["CUDA_VISIBLE_DEVICES"] == gpu
    finally:
        delete(cluster, name, later)
