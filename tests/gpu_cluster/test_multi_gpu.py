"""Two GPUs on one node: fractional pods that cannot share a GPU land on both GPUs, each through
its own GPU's MPS daemon, and a pod asking two whole GPUs gets both. Skips, saying so, on a node
with one GPU (bench/results/gpu-cluster.md has a two-GPU run).
"""

import pytest

from gpushare.api.names import ANN_GPU_UUID
from tests.gpu_cluster.harness import GpuCluster, node_gpus

pytestmark = [pytest.mark.gpu_cluster]


def seen(gc: GpuCluster, name: str) -> tuple[list[str], dict[str, str]]:
    """The GPUs a pod's container used (NVML UUIDs) and the CUDA_* environment it was given."""
    lines = gc.logs(name)
    env = lines[0].get("env", {}) if lines else {}
    gpus = next((line["gpus"] for line in lines if "gpus" in line), [])
    return list(gpus), env


def test_pods_spread_over_both_gpus_and_a_two_gpu_pod_gets_both(gc: GpuCluster) -> None:
    gpus = node_gpus(gc)
    if len(gpus) < 2:
        gc.record("two GPUs: pods on both, a two-GPU pod gets both", "one GPU", "two GPUs", None)
        pytest.skip(f"TWO-GPU CHECKS NOT RUN: the node has {len(gpus)} GPU; they need two")
    # 60% + 60% cannot share one GPU, so the two pods must land on different GPUs.
    split = ["split-a", "split-b"]
    gc.delete_pods(*split, "both-gpus")
    gc.create(*(gc.cuda_pod(n, ["devices"], fraction="0.6") for n in split))
    try:
        done = gc.wait_phase(split, {"Succeeded"}, timeout_s=180)
        placed = {n: done[n]["metadata"]["annotations"][ANN_GPU_UUID] for n in split}
        used = {n: seen(gc, n) for n in split}
    finally:
        gc.delete_pods(*split)
    pipes = {n: env.get("CUDA_MPS_PIPE_DIRECTORY", "") for n, (_, env) in used.items()}
    spread = len(set(placed.values())) == 2 and set(placed.values()) == set(gpus)
    gc.record("two 60% pods: GPUs placed", placed, "one on each GPU", spread)
    assert spread, placed
    if gc.real_gpu:
        ran_where_placed = all(used[n][0] == [placed[n]] for n in split)
        gc.record(
            "two 60% pods: the GPU each container used (NVML UUID)",
            {n: used[n][0] for n in split},
            "its placed GPU, and only it",
            ran_where_placed,
        )
        assert ran_where_placed, (placed, used)
    # Every container sees its GPU's pipe directory at one fixed path; which daemon is behind it
    # shows in the GPU an MPS client can use (a client of one GPU's daemon sees that GPU only).
    under_mps = all(pipes.values())
    gc.record(
        "two 60% pods: under MPS (CUDA_MPS_PIPE_DIRECTORY set)",
        pipes,
        "set for both (each its own GPU's daemon, as the GPUs used show)",
        under_mps,
    )
    assert under_mps, pipes

    # A pod asking two whole GPUs gets both, without MPS (one process cannot use two daemons).
    gc.create(gc.cuda_pod("both-gpus", ["devices"], fraction="2"))
    try:
        pod = gc.wait_phase(["both-gpus"], {"Succeeded"}, timeout_s=180)["both-gpus"]
        placed_both = sorted(pod["metadata"]["annotations"][ANN_GPU_UUID].split(","))
        used_both, env = seen(gc, "both-gpus")
    finally:
        gc.delete_pods("both-gpus")
    ok = placed_both == gpus and "CUDA_MPS_PIPE_DIRECTORY" not in env
    if gc.real_gpu:
        ok = ok and sorted(used_both) == gpus
    gc.record(
        "two-whole-GPU pod: GPUs placed / used, MPS",
        {"placed": placed_both, "used": sorted(used_both), "mps": "CUDA_MPS_PIPE_DIRECTORY" in env},
        "both GPUs, no MPS",
        ok,
    )
    assert ok, (placed_both, used_both, env)
