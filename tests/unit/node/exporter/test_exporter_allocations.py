"""Reading a pod's GPU placement from its annotations, as the exporter counts allocations
(from the agent's projection of the pod, ``PodInfo``)."""

from typing import Any

from gpushare.api.pod import PodInfo, pod_info
from gpushare.node.exporter.allocations import allocation_from_pod, allocations_from_pods

GPU_A = "GPU-11111111-2222-3333-4444-555555555555"
GPU_B = "GPU-66666666-7777-8888-9999-000000000000"


def pod(name: str, annotations: dict[str, str], **extra: Any) -> PodInfo:
    return pod_info(
        {
            "metadata": {
                "name": name,
                "namespace": "ml",
                "uid": f"uid-{name}",
                "annotations": annotations,
            },
            "spec": {"nodeName": extra.get("node", "node-a")},
            "status": {
                "phase": extra.get("phase", "Running"),
                "containerStatuses": [
                    {"name": "main", "containerID": "containerd://" + "c" * 64},
                ],
            },
        }
    )


PLACED = {
    "gpushare.io/gpu-fraction": "0.25",
    "gpushare.io/gpu-uuid": GPU_A,
    "gpushare.io/active-thread-percentage": "40",
    "gpushare.io/memory-limit": str(10 * 2**30),
    "gpushare.io/bind-time": "2026-01-01T00:00:00.000000Z",
    "gpushare.io/state": "allocated",
    "gpushare.io/class": "latency",
}


def test_fractional_pod_gets_its_guaranteed_share_and_thread_cap() -> None:
    a = allocation_from_pod(pod("p", PLACED))
    assert a is not None
    assert (a.compute_ratio, a.thread_percent, a.memory_limit_bytes) == (0.25, 40, 10 * 2**30)
    assert a.gpu_uuids == (GPU_A,)
    assert a.gpu_class == "latency"
    assert a.containers == {"c" * 64: "main"}


def test_two_gpu_pod_holds_each_gpu_whole() -> None:
    ann = {**PLACED, "gpushare.io/gpu-fraction": "2", "gpushare.io/gpu-uuid": f"{GPU_A},{GPU_B}"}
    a = allocation_from_pod(pod("p", ann))
    assert a is not None
    assert a.gpu_uuids == (GPU_A, GPU_B)
    assert a.compute_ratio == 1.0


def test_pod_of_a_gpushare_without_own_fraction_counts_its_thread_share() -> None:
    ann = {k: v for k, v in PLACED.items() if k != "gpushare.io/gpu-fraction"}
    a = allocation_from_pod(pod("p", {**ann, "gpushare.io/share": "team-a"}))
    assert a is not None
    assert a.compute_ratio == 0.4


def test_finished_and_unplaced_pods_hold_no_gpu() -> None:
    assert allocation_from_pod(pod("done", PLACED, phase="Succeeded")) is None
    assert allocation_from_pod(pod("pending", {"gpushare.io/gpu-fraction": "0.5"})) is None


def test_other_nodes_and_malformed_placements_are_skipped() -> None:
    bad = {**PLACED, "gpushare.io/active-thread-percentage": "lots"}
    pods = [pod("ok", PLACED), pod("elsewhere", PLACED, node="node-b"), pod("bad", bad)]
    assert [a.name for a in allocations_from_pods(pods, node_name="node-a")] == ["ok"]
