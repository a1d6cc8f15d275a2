"""Allocate decisions: which pod a set of slice IDs is for, and what its container gets."""

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpushare.api.inventory import GpuInfo
from gpushare.api.names import (
    ANN_BIND_TIME,
    ANN_CLASS,
    ANN_GPU_UUID,
    ANN_MEMORY_LIMIT,
    ANN_REQUEST_PERCENT,
    ANN_STATE,
    ANN_THREAD_PERCENT,
)
from gpushare.api.placement import parse_placement
from gpushare.api.pod import PodInfo
from gpushare.node.core.answer import (
    CONTAINER_PIPE_DIR,
    AllocationContext,
    AllocationError,
    check_uid,
)
from gpushare.node.deviceplugin.devices import group_by_gpu, slice_ids
from gpushare.node.deviceplugin.matching import MalformedPlacementError, select_pod
from gpushare.node.deviceplugin.response import (
    allocated_neighbours,
    allocation_for_pod,
    derived_allocation,
)
from gpushare.node.deviceplugin.steering import steer
from gpushare.node.mps.client import pinned_memory_limit
from gpushare.node.mps.manager import MpsManager

GIB = 2**30
GPU_A = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
GPU_B = "GPU-bbbbbbbb-0000-0000-0000-000000000000"
T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def gpu(uuid: str, index: int) -> GpuInfo:
    return GpuInfo(uuid, index, "NVIDIA H100 80GB HBM3", 80 * GIB, 132, "9.0", simulated=True)


def pod(
    name: str,
    gpus: str,
    *,
    bind_s: int = 0,
    threads: str = "25",
    memory: str = str(20 * GIB),
    state: str = "assumed",
    slices: tuple[int, ...] = (25,),
    uid_user: int | None = None,
    phase: str = "Pending",
    extra: dict[str, str] | None = None,
) -> PodInfo:
    annotations = {
        ANN_GPU_UUID: gpus,
        ANN_THREAD_PERCENT: threads,
        ANN_MEMORY_LIMIT: memory,
        ANN_BIND_TIME: (T0 + timedelta(seconds=bind_s)).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        ANN_STATE: state,
        **(extra or {}),
    }
    return PodInfo(
        namespace="team",
        name=name,
        uid=f"uid-{name}",
        annotations=annotations,
        phase=phase,
        run_as_user=uid_user,
        requested_slices=slices,
        created=T0,
    )


@pytest.fixture
def ctx(tmp_path: Path) -> AllocationContext:
    return AllocationContext(
        node_name="node-1",
        gpus={GPU_A: gpu(GPU_A, 0), GPU_B: gpu(GPU_B, 1)},
        mps=MpsManager(root=tmp_path / "mps", simulated=True),
    )


def test_the_oldest_waiting_pod_on_the_gpu_of_the_slices_gets_them() -> None:
    pods = [
        pod("newer", GPU_A, bind_s=30),
        pod("older", GPU_A, bind_s=10),
        pod("other-gpu", GPU_B, bind_s=0),
        pod("done", GPU_A, bind_s=-50, state="allocated"),
    ]
    found = select_pod(pods, gpus={GPU_A}, sizes=(25,))
    assert found is not None
    assert found[0].name == "older"


def test_only_a_pod_of_the_requested_size_is_chosen() -> None:
    pods = [pod("small", GPU_A, bind_s=0, slices=(10,)), pod("big", GPU_A, bind_s=5, slices=(40,))]
    found = select_pod(pods, gpus={GPU_A}, sizes=(40,))
    assert found is not None and found[0].name == "big"
    # The kubelet asks for what one container requested: a 10-slice pod is never the one.
    assert select_pod(pods[:1], gpus={GPU_A}, sizes=(40,)) is None


def test_slices_taken_from_another_gpu_go_to_the_pod_of_that_size_waiting_elsewhere() -> None:
    """After a kubelet restart its free slices need not match the placements: it may take a
    40-slice request from GPU A for the pod placed on GPU B. That pod, with its own placement,
    is the answer; a pod of another size on A is not."""
    pods = [pod("other-size", GPU_A, bind_s=0, slices=(10,)), pod("b", GPU_B, slices=(40,))]
    found = select_pod(pods, gpus={GPU_A}, sizes=(40,))
    assert found is not None and found[0].name == "b" and found[1].gpu_uuids == (GPU_B,)


def test_pods_already_handled_or_finished_are_skipped() -> None:
    pods = [pod("first", GPU_A, bind_s=0), pod("failed", GPU_A, bind_s=-5, phase="Failed")]
    found = select_pod(pods, gpus={GPU_A}, sizes=(25,), skip={"uid-first"})
    assert found is None


def test_a_running_pod_with_a_stale_assumed_state_captures_nothing() -> None:
    pods = [
        pod("running", GPU_A, bind_s=-60, phase="Running"),
        pod("new", GPU_A, bind_s=0),
    ]
    found = select_pod(pods, gpus={GPU_A}, sizes=(25,))
    assert found is not None and found[0].name == "new"


def test_malformed_annotation_fails_that_pod_naming_the_annotation() -> None:
    broken = pod("broken", GPU_A, bind_s=0, threads="lots")
    with pytest.raises(MalformedPlacementError, match=ANN_THREAD_PERCENT) as err:
        select_pod([broken, pod("fine", GPU_A, bind_s=9)], gpus={GPU_A}, sizes=(25,))
    assert err.value.pod.name == "broken"


def test_malformed_pod_elsewhere_disturbs_no_other_pod() -> None:
    pods = [pod("broken", GPU_B, bind_s=0, memory="ten gigs"), pod("fine", GPU_A, bind_s=5)]
    found = select_pod(pods, gpus={GPU_A}, sizes=(25,))
    assert found is not None and found[0].name == "fine"
    # Once the broken pod was refused (kubelet fails it), the next pod on its GPU goes through.
    pods.append(pod("next", GPU_B, bind_s=7))
    found = select_pod(pods, gpus={GPU_B}, sizes=(25,), skip={"uid-broken"})
    assert found is not None and found[0].name == "next"


def test_a_malformed_pod_is_refused_whichever_gpu_the_kubelet_took_the_slices_from() -> None:
    """The kubelet may take the slices from another GPU than the malformed annotation names
    (its own best fit): the pod is still the one asking and must be refused, not served a
    placement nobody chose (issue seen on a fresh machine, order-dependent)."""
    broken = pod("broken", GPU_A, bind_s=0, threads="a lot", slices=(10,))
    with pytest.raises(MalformedPlacementError, match=ANN_THREAD_PERCENT) as err:
        select_pod([broken], gpus={GPU_B}, sizes=(10,))
    assert err.value.pod.name == "broken"
    # A well-formed pod of that size waiting elsewhere goes first: it may be the one.
    fine = pod("fine", GPU_A, bind_s=5, slices=(10,))
    found = select_pod([broken, fine], gpus={GPU_B}, sizes=(10,))
    assert found is not None and found[0].name == "fine"


def test_slices_are_steered_to_the_gpu_a_malformed_pod_names() -> None:
    """GetPreferredAllocation offers the kubelet slices of the GPU the malformed pod's
    annotation names, so Allocate sees them there and refuses that pod."""
    broken = pod("broken", GPU_B, threads="a lot", slices=(10,))
    fuller = pod("neighbour", GPU_A, state="allocated", slices=(30,))
    available = slice_ids(GPU_A)[30:] + slice_ids(GPU_B)
    chosen, steered = steer(available, [], 10, [broken, fuller])
    assert steered == broken.key
    assert set(group_by_gpu(chosen)) == {GPU_B}


def test_fractional_pod_gets_its_gpu_mps_pipe_threads_memory_and_priority(
    ctx: AllocationContext, tmp_path: Path
) -> None:
    latency = pod("svc", GPU_B, threads="30", memory=str(10 * GIB), extra={ANN_CLASS: "latency"})
    placement = parse_placement(latency.annotations)
    assert placement is not None
    allocation, warning = allocation_for_pod(ctx, latency, placement, [])
    assert warning is None
    assert allocation.envs == {
        "CUDA_VISIBLE_DEVICES": GPU_B,
        "CUDA_MPS_PIPE_DIRECTORY": CONTAINER_PIPE_DIR,
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=10240M",
        "CUDA_MPS_CLIENT_PRIORITY": "0",
    }
    mounts = {m.container_path: m.host_path for m in allocation.mounts}
    # The pipe also where CUDA looks when CUDA_MPS_PIPE_DIRECTORY is unset (a container that
    # unsets it still reaches its MPS server and its limits); never the log directory the
    # node agent reads to judge faults.
    assert mounts == {
        "/run/gpushare/node/mps/pipe": str(tmp_path / "mps" / GPU_B / "pipe"),
        "/tmp/nvidia-mps": str(tmp_path / "mps" / GPU_B / "pipe"),
        "/dev/shm": str(tmp_path / "mps" / GPU_B / "shm"),
    }
    assert allocation.devices == []  # simulated backend: no /dev/nvidia* nodes


def test_batch_pods_run_at_below_normal_mps_priority(ctx: AllocationContext) -> None:
    batch = pod("train", GPU_A)
    placement = parse_placement(batch.annotations)
    assert placement is not None
    allocation, _ = allocation_for_pod(ctx, batch, placement, [])
    assert allocation.envs["CUDA_MPS_CLIENT_PRIORITY"] == "1"


def test_a_burstable_pod_runs_at_its_limit_with_memory_of_its_request(
    ctx: AllocationContext,
) -> None:
    # Request 25% (what the scheduler accounted for), limit 100% (its thread cap); with no
    # memory limit written the pinned memory follows the request, not the cap.
    burst = pod("burst", GPU_A, threads="100", memory="0", extra={ANN_REQUEST_PERCENT: "25"})
    placement = parse_placement(burst.annotations)
    assert placement is not None
    allocation, _ = allocation_for_pod(ctx, burst, placement, [])
    assert allocation.envs["CUDA_VISIBLE_DEVICES"] == GPU_A
    assert allocation.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "100"
    assert allocation.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={20 * 1024}M"
    assert allocation.envs["CUDA_MPS_CLIENT_PRIORITY"] == "1"


def test_malformed_class_fails_naming_the_annotation(ctx: AllocationContext) -> None:
    bad = pod("x", GPU_A, extra={ANN_CLASS: "urgent"})
    placement = parse_placement(bad.annotations)
    assert placement is not None
    with pytest.raises(AllocationError, match=ANN_CLASS):
        allocation_for_pod(ctx, bad, placement, [])


def test_whole_gpus_go_without_mps(ctx: AllocationContext) -> None:
    two = pod("ddp", f"{GPU_A},{GPU_B}", threads="100", memory="0", slices=(200,))
    placement = parse_placement(two.annotations)
    assert placement is not None
    allocation, _ = allocation_for_pod(ctx, two, placement, [])
    assert allocation.envs == {"CUDA_VISIBLE_DEVICES": f"{GPU_A},{GPU_B}"}
    assert allocation.mounts == []


def test_no_pod_found_derives_a_safe_placement_from_the_slice_ids(
    ctx: AllocationContext,
) -> None:
    group = group_by_gpu(slice_ids(GPU_A)[:20])
    allocation, message = derived_allocation(ctx, group)
    assert allocation.pod is None
    assert allocation.envs["CUDA_VISIBLE_DEVICES"] == GPU_A
    assert allocation.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "20"
    assert allocation.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=16384M"  # 20% of 80 GiB
    assert allocation.envs["CUDA_MPS_CLIENT_PRIORITY"] == "1"
    assert "no pod waiting" in message and GPU_A in message


def test_slices_split_across_gpus_stay_on_one_mps_daemon(ctx: AllocationContext) -> None:
    group = group_by_gpu(slice_ids(GPU_A)[:10] + slice_ids(GPU_B)[:30])
    allocation, _ = derived_allocation(ctx, group)
    assert allocation.envs["CUDA_VISIBLE_DEVICES"] == GPU_B
    assert allocation.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"


def test_pod_with_another_uid_than_the_gpu_serves_is_refused() -> None:
    running = [pod("a", GPU_A, state="allocated", uid_user=1000, phase="Running")]
    newcomer = pod("b", GPU_A, uid_user=2000)
    neighbours = allocated_neighbours(newcomer, GPU_A, running)
    with pytest.raises(AllocationError, match="runAsUser") as err:
        check_uid(newcomer, neighbours, GPU_A)
    assert "UID 1000" in str(err.value) and "team/a" in str(err.value)
    assert check_uid(pod("c", GPU_A, uid_user=1000), neighbours, GPU_A) is None


def test_unknown_uids_are_warned_about_not_refused() -> None:
    running = [pod("a", GPU_A, state="allocated", uid_user=1000, phase="Running")]
    newcomer = pod("b", GPU_A, uid_user=None)
    warning = check_uid(newcomer, allocated_neighbours(newcomer, GPU_A, running), GPU_A)
    assert warning is not None and "runAsUser" in warning
    # Finished pods no longer hold the server.
    gone = [pod("a", GPU_A, state="allocated", uid_user=1000, phase="Succeeded")]
    assert allocated_neighbours(pod("b", GPU_A, uid_user=2000), GPU_A, gone) == []


def test_pinned_memory_limit_is_whole_mebibytes_for_ordinal_zero() -> None:
    assert pinned_memory_limit(10 * GIB) == "0=10240M"
    assert pinned_memory_limit(1) == "0=1M"
