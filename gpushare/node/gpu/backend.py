"""The interface every GPU backend implements (NVML for real GPUs, simulated elsewhere).

The device plugin, MPS manager, exporter and profiler only see this interface, so they are
tested without a GPU. A simulated backend must say so: ``simulated`` is True and it logs,
labels and exports that fact.
"""

from dataclasses import dataclass, field
from typing import Protocol

from gpushare.api.inventory import GpuInfo
from gpushare.api.profile import PIPES


@dataclass(frozen=True)
class GpuProcess:
    """A process holding a context on a GPU (an MPS client, or the MPS server itself)."""

    pid: int
    used_memory_bytes: int
    mps_client: bool = False


@dataclass(frozen=True)
class GpuSample:
    """One reading of a GPU's counters, with its time once the sampler keeps it. None means
    "not available on this GPU", never 0.

    A reading, not a second profile record: the node agent's profiler averages a window of
    readings, counter by counter of ``api.profile.RATIOS`` (:meth:`counter`), into the one
    record, ``api.profile.GpuProfile``. A reading keeps what the record has no place for (total
    memory, the times the exporter's staleness and the profiler's weights need) in the shape
    its backends read and the exporter exports (a pipe map and ``<counter>_ratio`` fields)."""

    uuid: str
    timestamp: float
    utilization_ratio: float | None
    """NVML's coarse "GPU utilization" (share of time any kernel ran)."""
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    pipes: dict[str, float | None] = field(default_factory=dict)
    """Per-pipe utilization 0-1 from GPM, keyed by ``api.profile.PIPES``; missing key =
    unavailable."""
    sm_utilization_ratio: float | None = None
    sm_occupancy_ratio: float | None = None
    dram_bandwidth_ratio: float | None = None
    at: float = 0.0
    """Monotonic time the reading returned, on the sampler's clock (0 before it keeps it)."""
    span_s: float = 0.0
    """Seconds of GPU time the reading's rates cover: the gap since the previous reading, set
    by the sampler (0 before it keeps it)."""

    def counter(self, name: str) -> float | None:
        """One counter of ``api.profile.RATIOS`` by its name of record: a pipe, else the
        ``<name>_ratio`` field."""
        if name in PIPES:
            return self.pipes.get(name)
        value: float | None = getattr(self, f"{name}_ratio")
        return value


@dataclass(frozen=True)
class HealthEvent:
    """A change in a GPU's health (XID error, ECC, fallen off the bus)."""

    uuid: str
    healthy: bool
    reason: str
    xid: int | None = None


class GpuBackend(Protocol):
    @property
    def name(self) -> str:
        """``nvml`` or ``simulated``."""

    @property
    def simulated(self) -> bool: ...

    def inventory(self) -> list[GpuInfo]:
        """All GPUs on this node, in index order."""

    def processes(self, uuid: str) -> list[GpuProcess]:
        """Processes with a context on this GPU (MPS clients included)."""

    def sample(self, uuid: str) -> GpuSample:
        """Read the GPU's counters now. GPM rates need two readings >= 100 ms apart: the
        backend keeps the previous reading and returns rates over the interval since."""

    def wait_health_events(self, timeout_s: float) -> list[HealthEvent]:
        """Block up to ``timeout_s`` for health changes; [] when none."""

    def close(self) -> None: ...
