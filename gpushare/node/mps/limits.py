"""The limits each GPU's MPS daemon and servers enforce, whatever a client's environment says.

A client's ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` and ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` can
only lower what its server allows, and the container owns its environment: a client that
re-exports 100 ran a bf16 GEMM at 765 TFLOP/s instead of 234 and allocated past its memory cap
(H100, driver 580). The daemon's defaults (``set_default_active_thread_percentage``,
``set_default_device_pinned_mem_limit``) bind servers started later, and
``set_active_thread_percentage <server pid>`` / ``set_device_pinned_mem_limit <server pid>``
bind a running server's new clients. So the node agent sets both to the largest share placed on
the GPU: no client gets more than any placement there promised (docs/security.md).
"""

from collections.abc import Iterable
from dataclasses import dataclass

MIB = 2**20


@dataclass(frozen=True)
class ServerLimits:
    """What an MPS server of one GPU may give any client."""

    thread_percent: int
    """Active-thread percentage, 1..100."""
    memory_bytes: int
    """Pinned device memory limit per client (device ordinal 0: the daemon sees one GPU)."""

    def commands(self, server_pids: Iterable[int] = ()) -> list[str]:
        """The control commands: the daemon's defaults, then each running server's limits."""
        memory = f"{max(1, self.memory_bytes // MIB)}M"
        out = [
            f"set_default_active_thread_percentage {self.thread_percent}",
            f"set_default_device_pinned_mem_limit 0 {memory}",
        ]
        for pid in server_pids:
            out.append(f"set_active_thread_percentage {pid} {self.thread_percent}")
            out.append(f"set_device_pinned_mem_limit {pid} 0 {memory}")
        return out


def largest(shares: Iterable[tuple[int, int]], *, floor: ServerLimits) -> ServerLimits:
    """The limits that let every (thread percent, memory bytes) placement on a GPU run as
    placed and no client go beyond the largest of them; ``floor`` when there is none."""
    threads = memories = 0
    for thread_percent, memory_bytes in shares:
        threads = max(threads, min(max(thread_percent, 1), 100))
        memories = max(memories, memory_bytes)
    if threads == 0:
        return floor
    return ServerLimits(threads, max(memories, MIB))
