"""assign_thread_percent: cautiously aggressive MPS thread caps."""

from hypothesis import given
from hypothesis import strategies as st

from gpushare.packing.model import Demand, GpuState, PipeProfile
from gpushare.packing.threads import assign_thread_percent

H100 = GpuState("g0", 80 << 30, model="H100")


def test_without_a_profile_a_pod_gets_its_guaranteed_share() -> None:
    assert assign_thread_percent(Demand(percent=40), H100) == 40
    assert assign_thread_percent(Demand(percent=100, gpus=2), H100) == 100


def test_low_demand_pod_gets_fewer_threads_but_never_below_half_its_share() -> None:
    light = PipeProfile(fp32=0.10, sm_occupancy=0.12, dram_bandwidth=0.05)  # needs ~15%
    assert assign_thread_percent(Demand(percent=40, profile=light), H100) == 20
    idle = PipeProfile(sm_occupancy=0.01)
    assert assign_thread_percent(Demand(percent=60, profile=idle), H100) == 30


def test_pod_that_uses_its_share_keeps_it() -> None:
    heavy = PipeProfile(tensor=0.78, sm_occupancy=0.95)
    assert assign_thread_percent(Demand(percent=50, profile=heavy), H100) == 50
    medium = PipeProfile(fp32=0.30, sm_occupancy=0.36)  # 36% x 1.25 headroom = 45%
    assert assign_thread_percent(Demand(percent=50, profile=medium), H100) == 45


def test_profile_measured_on_another_gpu_model_is_not_trusted() -> None:
    light = PipeProfile(sm_occupancy=0.05, gpu_model="T4")
    assert assign_thread_percent(Demand(percent=40, profile=light), H100) == 40


@given(
    percent=st.integers(min_value=1, max_value=100),
    values=st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=6, max_size=6),
)
def test_thread_percent_is_always_between_1_and_the_share(
    percent: int, values: list[float]
) -> None:
    profile = PipeProfile(*values)
    threads = assign_thread_percent(Demand(percent=percent, profile=profile), H100)
    assert 1 <= threads <= percent
