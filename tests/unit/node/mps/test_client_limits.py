"""A client's MPS limits stay numbers until its environment is written: what the container is
told and what its GPU's server must allow come from one record."""

from gpushare.api.names import CLASS_BATCH, CLASS_LATENCY
from gpushare.node.mps.client import client_limits

GIB = 2**30


def test_the_container_is_told_in_whole_mib_what_the_server_is_raised_to() -> None:
    limits = client_limits(
        thread_percent=30,
        gpu_class=CLASS_LATENCY,
        memory_limit_bytes=10 * GIB + 5,
        gpu_memory_bytes=80 * GIB,
    )
    assert limits.env() == {
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
        "CUDA_MPS_CLIENT_PRIORITY": "0",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=10240M",
    }
    assert (limits.thread_percent, limits.pinned_bytes) == (30, 10 * GIB)


def test_without_a_memory_limit_the_request_share_of_the_gpu_is_the_cap() -> None:
    limits = client_limits(
        thread_percent=50,
        gpu_class=CLASS_BATCH,
        memory_limit_bytes=0,
        gpu_memory_bytes=80 * GIB,
        request_percent=25,
    )
    assert limits.priority == 1 and limits.pinned_bytes == 20 * GIB
