"""What an MPS client process is told through its environment: its active-thread cap, its
client priority and its pinned device memory limit.

The device plugin writes these into a container's environment from the pod's placement
annotations; the GPU benchmark starts its jobs with the same function, so both run a job with
the settings the scheduler decided (docs/node-agent.md, "Allocate").
"""

from dataclasses import dataclass

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


@dataclass(frozen=True)
class ClientLimits:
    """The limits one MPS client runs with, kept as numbers until its environment is written
    (:meth:`env`); the agent raises its GPU's server limits from the same record."""

    thread_percent: int
    """Active-thread cap, 1..100."""
    priority: int
    """MPS client priority (0 normal, 1 below normal)."""
    memory_limit_bytes: int
    """Pinned device memory limit; 0: none."""

    @property
    def pinned_bytes(self) -> int:
        """The memory limit as the client is told it (whole MiB, at least 1; 0: none)."""
        return max(1, self.memory_limit_bytes // MiB) * MiB if self.memory_limit_bytes > 0 else 0

    def env(self) -> dict[str, str]:
        """The client's ``CUDA_MPS_*`` environment."""
        env = {
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(self.thread_percent),
            "CUDA_MPS_CLIENT_PRIORITY": str(self.priority),
        }
        if self.memory_limit_bytes > 0:
            # The client sees exactly one GPU, so device ordinal 0 is this GPU.
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = pinned_memory_limit(self.memory_limit_bytes)
        return env


def client_limits(
    *,
    thread_percent: int,
    gpu_class: str,
    memory_limit_bytes: int,
    gpu_memory_bytes: int,
    request_percent: int | None = None,
) -> ClientLimits:
    """The limits of one client: ``thread_percent`` is the placement's effective cap (the
    pod's limit), the priority comes from its class (0 latency, 1 batch), and the memory limit
    is the placement's, else the request's share of the GPU's memory (``request_percent``, the
    cap when a placement records no request)."""
    if not 1 <= thread_percent <= SLICES_PER_GPU:
        raise ValueError(f"thread_percent must be 1..100, got {thread_percent}")
    share = thread_percent if request_percent is None else request_percent
    return ClientLimits(
        thread_percent=thread_percent,
        priority=MPS_PRIORITY_BY_CLASS[gpu_class],
        memory_limit_bytes=max(0, memory_limit_bytes or gpu_memory_bytes * share // SLICES_PER_GPU),
    )


def client_limits_env(
    *,
    thread_percent: int,
    gpu_class: str,
    memory_limit_bytes: int,
    gpu_memory_bytes: int,
    request_percent: int | None = None,
) -> dict[str, str]:
    """The ``CUDA_MPS_*`` environment of :func:`client_limits` (the GPU benchmark starts its
    jobs with it)."""
    return client_limits(
        thread_percent=thread_percent,
        gpu_class=gpu_class,
        memory_limit_bytes=memory_limit_bytes,
        gpu_memory_bytes=gpu_memory_bytes,
        request_percent=request_percent,
    ).env()
