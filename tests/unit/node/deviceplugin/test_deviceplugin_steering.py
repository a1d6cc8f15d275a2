"""GetPreferredAllocation: the kubelet is steered to slices of the GPU the scheduler chose."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from gpushare.api.errors import InvalidInputError
from gpushare.api.names import ANN_BIND_TIME, ANN_GPU_UUID, ANN_STATE, ANN_THREAD_PERCENT
from gpushare.api.pod import PodInfo
from gpushare.node.deviceplugin.devices import group_by_gpu, parse_device_id, slice_ids
from gpushare.node.deviceplugin.steering import steer

GPU_A = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
GPU_B = "GPU-bbbbbbbb-0000-0000-0000-000000000000"
GPU_C = "GPU-cccccccc-0000-0000-0000-000000000000"
T0 = datetime(2026, 11, 1, tzinfo=UTC)


def waiting(name: str, gpus: str, bind_s: int, *, state: str = "assumed") -> PodInfo:
    return PodInfo(
        namespace="ns",
        name=name,
        uid=name,
        annotations={
            ANN_GPU_UUID: gpus,
            ANN_THREAD_PERCENT: "30",
            ANN_BIND_TIME: (T0 + timedelta(seconds=bind_s)).isoformat(),
            ANN_STATE: state,
        },
    )


def gpus_of(ids: list[str]) -> set[str]:
    return set(group_by_gpu(ids))


def test_slices_come_from_the_gpu_chosen_for_the_oldest_waiting_pod() -> None:
    available = slice_ids(GPU_A) + slice_ids(GPU_B)
    pods = [waiting("late", GPU_A, 20), waiting("early", GPU_B, 5)]
    chosen, steered = steer(available, [], 30, pods)
    assert len(chosen) == 30 and gpus_of(chosen) == {GPU_B}
    assert steered == "ns/early"


def test_a_pod_that_no_longer_fits_its_gpu_is_passed_over() -> None:
    available = slice_ids(GPU_A)[:10] + slice_ids(GPU_B)
    pods = [waiting("early", GPU_A, 0), waiting("late", GPU_B, 9)]
    chosen, steered = steer(available, [], 30, pods)
    assert gpus_of(chosen) == {GPU_B} and steered == "ns/late"


def test_allocated_pods_do_not_steer() -> None:
    available = slice_ids(GPU_A) + slice_ids(GPU_B)
    chosen, steered = steer(available, [], 30, [waiting("done", GPU_A, 0, state="allocated")])
    assert steered is None
    assert len(gpus_of(chosen)) == 1


def test_without_a_pod_the_fullest_gpu_that_fits_is_used() -> None:
    # A has 40 free, B 100 free, C 20 free: a 30-slice request best fits A (keeps B whole).
    available = slice_ids(GPU_A)[60:] + slice_ids(GPU_B) + slice_ids(GPU_C)[80:]
    chosen, steered = steer(available, [], 30, [])
    assert steered is None and gpus_of(chosen) == {GPU_A}


def test_must_include_ids_are_kept_and_the_answer_has_the_requested_size() -> None:
    available = slice_ids(GPU_A) + slice_ids(GPU_B)
    must = [slice_ids(GPU_B)[7]]
    chosen, _ = steer(available, must, 10, [waiting("p", GPU_B, 0)])
    assert chosen[0] == must[0] and len(chosen) == 10 and len(set(chosen)) == 10
    assert gpus_of(chosen) == {GPU_B}


def test_multi_gpu_pods_get_whole_gpus() -> None:
    available = slice_ids(GPU_A)[50:] + slice_ids(GPU_B) + slice_ids(GPU_C)
    chosen, steered = steer(available, [], 200, [waiting("ddp", f"{GPU_B},{GPU_C}", 0)])
    assert steered == "ns/ddp"
    groups = group_by_gpu(chosen)
    assert set(groups) == {GPU_B, GPU_C} and all(len(s) == 100 for s in groups.values())


def test_device_ids_round_trip_and_bad_ids_name_the_format() -> None:
    assert parse_device_id(slice_ids(GPU_A)[42]) == (GPU_A, 42)
    assert all(len(i) <= 63 for i in slice_ids(GPU_A))
    with pytest.raises(InvalidInputError, match=r"00\.\.99"):
        parse_device_id(f"{GPU_A}::100")
    with pytest.raises(InvalidInputError, match="not a gpushare slice ID"):
        parse_device_id(GPU_A)


def test_a_waiting_pod_of_the_requested_size_is_steered_before_an_older_pod_of_another() -> None:
    available = slice_ids(GPU_A) + slice_ids(GPU_B)
    older = replace(waiting("big", GPU_A, 0), requested_slices=(50,))
    younger = replace(waiting("small", GPU_B, 9), requested_slices=(30,))
    chosen, steered = steer(available, [], 30, [older, younger])
    assert gpus_of(chosen) == {GPU_B} and steered == "ns/small"
    # With no pod of that size waiting, the oldest pod still decides.
    chosen, steered = steer(available, [], 20, [older, younger])
    assert gpus_of(chosen) == {GPU_A} and steered == "ns/big"
