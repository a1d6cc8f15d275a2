"""Simulated GPU load follows what pods reserved, also when thread caps overlap."""

from gpushare.api.inventory import GpuInfo
from gpushare.node.simload import PIPE_WEIGHTS, Share, simulated_load

GPU = GpuInfo("GPU-sim-0", 0, "H100-80GB", 80 * 2**30, 132, "9.0", simulated=True)


def test_an_uncapped_latency_pod_counts_its_guaranteed_share_not_the_whole_gpu() -> None:
    latency = Share(thread_percent=100, memory_limit_bytes=2**30, guaranteed_percent=30)
    batch = Share(thread_percent=50, memory_limit_bytes=2**30, guaranteed_percent=40)
    load = simulated_load(GPU, [latency, batch])
    assert load.pipes["tensor"] == round(PIPE_WEIGHTS["tensor"] * 0.70, 4)


def test_without_a_known_share_the_thread_cap_counts() -> None:
    load = simulated_load(GPU, [Share(thread_percent=60, memory_limit_bytes=2**30)])
    assert load.pipes["tensor"] == round(PIPE_WEIGHTS["tensor"] * 0.60, 4)
