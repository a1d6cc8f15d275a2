"""gpushare.io/opportunistic-gpu-percent on the node: 300 device IDs per GPU (``<UUID>::oNNN``)
that the kubelet admits beside full guaranteed shares; Allocate gives an opportunistic pod its
own placement (GPU, thread cap, memory cap), never a share derived from the slice count
(docs/node-agent.md, "Device IDs"; docs/packing.md, "The sharing contract")."""

from dataclasses import replace
from pathlib import Path

import pytest

from gpushare.api.errors import InvalidInputError
from gpushare.api.names import ANN_TIER, RESOURCE_GPU_OPPORTUNISTIC, TIER_OPPORTUNISTIC
from gpushare.api.pod import PodInfo, pod_info
from gpushare.node.core.answer import AllocationError
from gpushare.node.deviceplugin.devices import (
    opportunistic_slice_ids,
    parse_device_id,
    slice_ids,
)
from gpushare.node.deviceplugin.holdings import AnswerBook
from gpushare.node.deviceplugin.steering import steer
from tests.unit.node.deviceplugin.test_deviceplugin_allocation import GPU_A, GPU_B, pod
from tests.unit.node.deviceplugin.test_deviceplugin_reallocate import ApiServer, Kubelet, make


def opportunistic(p: PodInfo) -> PodInfo:
    """``p`` asking for the opportunistic resource, placed as the extender places it."""
    extra = {ANN_TIER: TIER_OPPORTUNISTIC} if p.annotations else {}
    return replace(p, opportunistic=True, annotations={**p.annotations, **extra})


def test_each_gpu_advertises_300_opportunistic_ids_that_parse_back() -> None:
    ids = opportunistic_slice_ids(GPU_A)
    assert len(ids) == len(set(ids)) == 300
    assert [parse_device_id(i) for i in (ids[0], ids[-1])] == [(GPU_A, 0), (GPU_A, 299)]
    # Distinct from the guaranteed slices, so the kubelet counts them as another resource.
    assert not set(ids) & set(slice_ids(GPU_A))


@pytest.mark.parametrize(
    "value", [f"{GPU_A}::o300", f"{GPU_A}::o1000", f"{GPU_A}::o", f"{GPU_A}::o-1", f"{GPU_A}::100"]
)
def test_ids_outside_the_advertised_ranges_are_refused(value: str) -> None:
    with pytest.raises(InvalidInputError, match="device ID"):
        parse_device_id(value)


def test_a_pod_asking_for_the_opportunistic_resource_counts_its_slices() -> None:
    manifest = {
        "metadata": {"namespace": "team", "name": "opp", "uid": "u1"},
        "spec": {
            "containers": [
                {"name": "main", "resources": {"limits": {RESOURCE_GPU_OPPORTUNISTIC: "40"}}}
            ]
        },
    }
    info = pod_info(manifest)
    assert info.requested_slices == (40,) and info.opportunistic


def test_opportunistic_slices_are_steered_to_the_gpu_the_scheduler_chose() -> None:
    waiting = [opportunistic(pod("opp", GPU_B, slices=(40,)))]
    available = opportunistic_slice_ids(GPU_A) + opportunistic_slice_ids(GPU_B)
    chosen, steered = steer(available, [], 40, waiting)
    assert steered == "team/opp"
    assert len(chosen) == 40 and {parse_device_id(i)[0] for i in chosen} == {GPU_B}


def test_allocate_gives_an_opportunistic_pod_its_own_placement(tmp_path: Path) -> None:
    """GPU A's guaranteed slices are all taken; the pod placed beyond them runs with the thread
    and memory caps the extender wrote, not 40% of anything."""
    opp = opportunistic(pod("opp", GPU_A, slices=(40,), threads="35", memory=str(8 * 2**30)))
    api = ApiServer([opp])
    allocator = make(tmp_path, api, Kubelet(), AnswerBook())
    ids = allocator.preferred(
        opportunistic_slice_ids(GPU_A) + opportunistic_slice_ids(GPU_B), [], 40
    )
    envs = allocator.allocate([ids])[0].envs
    assert envs["CUDA_VISIBLE_DEVICES"] == GPU_A
    assert envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "35"
    assert envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8192M"
    assert api.pods[opp.uid].annotations["gpushare.io/state"] == "allocated"


def test_opportunistic_slices_for_a_pod_gpushare_did_not_place_are_refused(
    tmp_path: Path,
) -> None:
    """A guaranteed slice count becomes a safe derived share; an opportunistic one is no share
    at all, so Allocate refuses it, naming the resource and the fix."""
    stray = pod("stray", GPU_A, slices=(40,))
    stray = opportunistic(replace(stray, annotations={}))
    allocator = make(tmp_path, ApiServer([stray]), Kubelet(), AnswerBook())
    with pytest.raises(AllocationError, match=RESOURCE_GPU_OPPORTUNISTIC):
        allocator.allocate([opportunistic_slice_ids(GPU_A)[:40]])


def test_each_resource_s_devices_go_to_a_pod_asking_for_that_resource(tmp_path: Path) -> None:
    """A guaranteed pod and an opportunistic one of the same size wait on the same GPU (the
    extender binds them concurrently: different resources): the kubelet's Allocate for
    opportunistic devices is for the opportunistic pod, even though the other is older."""
    older = pod("guaranteed", GPU_A, bind_s=0, slices=(40,), threads="40")
    newer = opportunistic(pod("opp", GPU_A, bind_s=5, slices=(40,), threads="25"))
    api = ApiServer([older, newer])
    allocator = make(tmp_path, api, Kubelet(), AnswerBook())
    ids = allocator.preferred(opportunistic_slice_ids(GPU_A), [], 40)
    assert allocator.allocate([ids])[0].envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert api.pods[newer.uid].annotations["gpushare.io/state"] == "allocated"
    ids = allocator.preferred(slice_ids(GPU_A), [], 40)
    assert allocator.allocate([ids])[0].envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "40"
    assert api.pods[older.uid].annotations["gpushare.io/state"] == "allocated"
