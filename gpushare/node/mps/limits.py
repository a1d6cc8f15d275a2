"""The limits each GPU's MPS daemon and servers enforce, whatever a client's environment says.

A client's ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` and ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` can
only lower what its server allows, and the container owns its environment: a client that
re-exports 100 ran a bf16 GEMM at 765 TFLOP/s instead of 234 and allocated past its memory cap
(H100, driver 580). The daemon's defaults (``set_default_active_thread_percentage``,
``set_default_device_pinned_mem_limit``) bind servers started later, and
``set_active_thread_percentage <server pid>`` / ``set_device_pinned_mem_limit <server pid>``
bind a running server's new clients. So the node agent sets both to the largest share placed on
the GPU: no client gets more than any placement there promised (docs/security.md).

``MpsLimitKeeper`` keeps them there: raised by Allocate (or a DRA prepare) before a container
starts (``raise_for``); recomputed from the pods bound to the node every pod refresh
(``sync``), which lowers them again once large pods are gone, but never within ``hold_s`` of a
raise (the pod list may not show the pod just allocated yet).
"""

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from gpushare.api.names import STATE_ALLOCATED, STATE_ASSUMED
from gpushare.api.pod import PodInfo

log = logging.getLogger(__name__)

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


FLOOR = ServerLimits(thread_percent=1, memory_bytes=MIB)
"""A GPU with no placement: nothing may connect with more (a client there is not gpushare's)."""


def placed_shares(
    pods: Iterable[PodInfo], gpu_memory: Mapping[str, int]
) -> dict[str, list[tuple[int, int]]]:
    """GPU uuid -> (thread percent, memory bytes) of each MPS placement on it (single-GPU
    placements of live pods; memory as Allocate computes it when the placement names none).
    A pod whose placement is malformed places nothing (its ``placement`` is None)."""
    out: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for pod in pods:
        if pod.finished:
            continue
        placement = pod.placement
        if (
            placement is None
            or len(placement.gpu_uuids) != 1
            or placement.state not in (STATE_ASSUMED, STATE_ALLOCATED)
        ):
            continue
        uuid = placement.gpu_uuids[0]
        memory = placement.memory_limit_bytes or (
            gpu_memory.get(uuid, 0) * placement.guaranteed_percent // 100
        )
        out[uuid].append((placement.thread_percent, memory))
    return out


class LimitedDaemons(Protocol):
    """The GPUs' MPS daemons as the keeper sets them (gpushare.node.mps.manager.MpsManager)."""

    def limits(self, uuid: str) -> ServerLimits | None: ...

    def apply_limits(self, uuid: str, limits: ServerLimits) -> object: ...


class MpsLimitKeeper:
    """The GPUs' server limits, kept by the node agent. Thread-safe."""

    def __init__(
        self,
        *,
        mps: LimitedDaemons,
        gpu_memory: Callable[[], Mapping[str, int]],
        hold_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        claimed: Callable[[], Mapping[str, Iterable[tuple[int, int]]]] | None = None,
    ) -> None:
        """``claimed``: GPU uuid -> (thread percent, memory bytes) of shares placed by other
        means than pod annotations (the DRA plugin's prepared claims), counted by ``sync``."""
        self.mps = mps
        self.claimed = claimed
        self.gpu_memory = gpu_memory
        self.hold_s = hold_s
        self.clock = clock
        self._raised: dict[str, float] = {}
        self._lock = threading.Lock()

    def raise_for(self, uuid: str, thread_percent: int, memory_bytes: int) -> None:
        """An Allocate answer gives a container these limits on ``uuid``: let the server allow
        them (never lowering what others were placed with)."""
        with self._lock:
            current = self.mps.limits(uuid) or FLOOR
            wanted = ServerLimits(
                max(current.thread_percent, thread_percent),
                max(current.memory_bytes, memory_bytes),
            )
            self._raised[uuid] = self.clock()
            if wanted != current or self.mps.limits(uuid) is None:
                self.mps.apply_limits(uuid, wanted)

    def sync(self, pods: Iterable[PodInfo]) -> dict[str, ServerLimits]:
        """Set every GPU to the largest share placed on it now; returns what each has."""
        memory = self.gpu_memory()
        shares = placed_shares(pods, memory)
        if self.claimed is not None:
            for uuid, claimed in self.claimed().items():
                shares[uuid].extend(claimed)
        out: dict[str, ServerLimits] = {}
        with self._lock:
            for uuid in memory:
                wanted = largest(shares.get(uuid, ()), floor=FLOOR)
                current = self.mps.limits(uuid)
                lower = current is not None and (
                    wanted.thread_percent < current.thread_percent
                    or wanted.memory_bytes < current.memory_bytes
                )
                if lower and self.clock() - self._raised.get(uuid, -1e18) < self.hold_s:
                    assert current is not None
                    wanted = ServerLimits(
                        max(current.thread_percent, wanted.thread_percent),
                        max(current.memory_bytes, wanted.memory_bytes),
                    )
                if wanted != current:
                    self.mps.apply_limits(uuid, wanted)
                out[uuid] = self.mps.limits(uuid) or wanted
        return out
