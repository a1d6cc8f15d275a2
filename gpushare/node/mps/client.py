"""What an MPS client process is told through its environment: its active-thread cap, its
client priority and its pinned device memory limit.

The device plugin writes these into a container's environment from the pod's placement
annotations; the GPU benchmark starts its jobs with the same function, so both run a job with
the settings the scheduler decided (docs/node-agent.md, "Allocate").
"""

from gpushare.api.names import MPS_PRIORITY_BY_CLASS, SLICES_PER_GPU

MiB = 2**20


def runs_under_mps(*, gpus: int, thread_percent: int, requested_percent: int) -> bool:
    """Whether a pod's processes go through its GPU's MPS daemon: a single GPU shared by a
    fraction (capped, or asking less than a whole GPU). Whole GPUs go without MPS: one process
    cannot use several daemons, and a whole GPU needs none."""
    return gpus == 1 and (thread_percent < SLICES_PER_GPU or 0 < requested_percent < SLICES_PER_GPU)


def pinned_memory_limit(limit_bytes: int) -> str:
    """``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` for device ordinal 0, in whole MiB (at least 1)."""
    return f"0={max(1, limit_bytes // MiB)}M"


def client_limits_env(
    *,
    thread_percent: int,
    gpu_class: str,
    memory_limit_bytes: int,
    gpu_memory_bytes: int,
    request_percent: int | None = None,
) -> dict[str, str]:
    """The ``CUDA_MPS_*`` limits of one client: ``thread_percent`` is the placement's effective
    cap (the pod's limit), the priority comes from its class (0 latency, 1 batch), and the
    memory limit is the placement's, else the request's share of the GPU's memory
    (``request_percent``, the cap when a placement records no request)."""
    if not 1 <= thread_percent <= SLICES_PER_GPU:
        raise ValueError(f"thread_percent must be 1..100, got {thread_percent}")
    env = {
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(thread_percent),
        "CUDA_MPS_CLIENT_PRIORITY": str(MPS_PRIORITY_BY_CLASS[gpu_class]),
    }
    share = thread_percent if request_percent is None else request_percent
    limit = memory_limit_bytes or gpu_memory_bytes * share // SLICES_PER_GPU
    if limit > 0:
        # The client sees exactly one GPU, so device ordinal 0 is this GPU.
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = pinned_memory_limit(limit)
    return env
