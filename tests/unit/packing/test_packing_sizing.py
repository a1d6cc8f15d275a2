"""``fraction: auto``: the share gpushare suggests from a job's measured solo profile."""

from hypothesis import given
from hypothesis import strategies as st

from gpushare.api.quantities import parse_fraction
from gpushare.packing.model import PipeProfile
from gpushare.packing.sizing import as_fraction, suggested_percent

# Solo profiles measured on an H200 in the GPU benchmark (run 16).
RESNET18 = PipeProfile(tensor=0.03, fp32=0.01, sm_occupancy=0.08, dram_bandwidth=0.05,
                       sm_utilization=0.26)  # fmt: skip
RESNET50 = PipeProfile(tensor=0.12, fp32=0.03, sm_occupancy=0.47, dram_bandwidth=0.41,
                       sm_utilization=0.84)  # fmt: skip
FP64_GEMM = PipeProfile(tensor=0.97, sm_occupancy=0.12, dram_bandwidth=0.10, sm_utilization=0.98)


def test_a_launch_bound_job_asks_for_a_small_share() -> None:
    assert suggested_percent(RESNET18, gpu_class="batch") == 10


def test_busy_sms_alone_do_not_make_a_job_ask_for_the_whole_gpu() -> None:
    # 84% of the SMs busy, but occupancy 0.47 and DRAM 0.41: it asks 0.47 x 1.25 -> 60%,
    # leaving room for a small neighbour (the pair did 1.51 jobs' work a second on the H200).
    assert suggested_percent(RESNET50, gpu_class="batch") == 60


def test_a_pipe_saturating_job_asks_for_the_whole_gpu() -> None:
    assert suggested_percent(FP64_GEMM, gpu_class="batch") == 100


def test_latency_jobs_ask_a_quarter_and_unprofiled_jobs_the_whole_gpu() -> None:
    assert suggested_percent(RESNET18, gpu_class="latency") == 25
    assert suggested_percent(None, gpu_class="latency") == 25
    assert suggested_percent(None, gpu_class="batch") == 100


def test_an_idle_profile_still_asks_for_the_smallest_share() -> None:
    assert suggested_percent(PipeProfile(), gpu_class="batch") == 5


ratios = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


@given(ratios, ratios, ratios, ratios)
def test_suggestions_are_5_percent_steps_that_cover_the_demand(
    occupancy: float, tensor: float, fp32: float, dram: float
) -> None:
    profile = PipeProfile(tensor=tensor, fp32=fp32, sm_occupancy=occupancy, dram_bandwidth=dram)
    percent = suggested_percent(profile, gpu_class="batch")
    assert 5 <= percent <= 100 and percent % 5 == 0
    assert percent >= min(100, round(100 * max(occupancy, tensor, fp32, dram)))
    # ... and what the operator writes as status.request reads back as the same request.
    assert parse_fraction(as_fraction(percent), field="status.request") == percent
