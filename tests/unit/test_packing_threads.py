"""assign_thread_percent: cautiously aggressive MPS thread caps."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpushare.packing.model import Demand, GpuState, PipeProfile
from gpushare.packing.threads import assign_thread_percent, cap_beside_latency

H100 = GpuState("g0", 80 << 30, model="H100")


def test_without_a_profile_a_pod_gets_its_guaranteed_share() -> None:
    assert assign_thread_percent(Demand(percent=40), H100) == 40
    assert assign_thread_percent(Demand(percent=100, gpus=2), H100) == 100


def test_small_profiled_batch_pod_gets_half_the_gpu_in_threads_not_its_small_share() -> None:
    # Measured on an H200: ResNet-18 (occupancy 0.12) keeps 0.88 of its speed at 50% threads,
    # 0.62 at 25%; a 15% share must not become a 15% cap.
    small = PipeProfile(fp32=0.015, tensor=0.05, sm_occupancy=0.12, dram_bandwidth=0.07)
    assert assign_thread_percent(Demand(percent=15, profile=small), H100) == 50
    idle = PipeProfile(sm_occupancy=0.01)
    assert assign_thread_percent(Demand(percent=60, profile=idle), H100) == 60


def test_latency_pod_is_never_capped() -> None:
    tiny = PipeProfile(sm_occupancy=0.01)
    latency = Demand(percent=25, gpu_class="latency", profile=tiny)
    assert assign_thread_percent(latency, H100) == 100
    assert assign_thread_percent(Demand(percent=25, gpu_class="latency"), H100) == 100


def test_pod_that_uses_its_share_keeps_it() -> None:
    heavy = PipeProfile(tensor=0.78, sm_occupancy=0.95)
    assert assign_thread_percent(Demand(percent=70, profile=heavy), H100) == 70
    gemm = PipeProfile(tensor=0.97, sm_occupancy=0.12)  # FP64 GEMM: never uncapped beside others
    assert assign_thread_percent(Demand(percent=30, profile=gemm), H100) == 50


def test_profile_measured_on_another_gpu_model_is_not_trusted() -> None:
    light = PipeProfile(sm_occupancy=0.05, gpu_model="T4")
    assert assign_thread_percent(Demand(percent=40, profile=light), H100) == 40


@given(
    percent=st.integers(min_value=1, max_value=100),
    values=st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=6, max_size=6),
)
def test_batch_thread_percent_never_below_the_share_and_at_most_half_beyond_it(
    percent: int, values: list[float]
) -> None:
    profile = PipeProfile(*values)
    threads = assign_thread_percent(Demand(percent=percent, profile=profile), H100)
    assert max(percent, 1) <= threads <= max(percent, 50)


def test_cap_beside_a_latency_pod_is_the_largest_that_kept_its_p99() -> None:
    assert cap_beside_latency({50: 1.10, 40: 1.02}, bound=1.15) == 50
    assert cap_beside_latency({50: 1.22, 40: 1.08}, bound=1.15) == 40
    # None kept it: protect the latency pod with the smallest cap measured.
    assert cap_beside_latency({50: 1.30, 40: 1.21}, bound=1.15) == 40
    with pytest.raises(ValueError, match="p99_ratio_by_threads"):
        cap_beside_latency({}, bound=1.15)
    with pytest.raises(ValueError, match=r"outside 1\.\.100"):
        cap_beside_latency({150: 1.0}, bound=1.15)
