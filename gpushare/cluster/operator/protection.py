"""Latency protection as pure decisions: when a GPU holding a latency-class pod is in trouble,
and which batch pod to evict from it.

Priority first, caps second, eviction last (docs/operator.md): the device plugin already runs
latency pods at MPS client priority 0 and batch pods at 1, and the packing policy caps batch
neighbours. This module decides the last resort. A reading is *bad* when the GPU is saturated
(a pipe or DRAM bandwidth at or above the threshold) or when the interference model predicts
a latency tenant's slowdown past its bound. Hysteresis: only ``bad_readings`` bad readings in
a row evict, one pod at a time, and a GPU that just lost a pod waits ``cooldown_s`` before the
next eviction, so a burst or the eviction's own transient never evicts a second pod.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from gpushare.api.gpushare_crd import ANN_PROFILING, PROFILING_ACTIVE
from gpushare.api.names import CLASS_BATCH, CLASS_LATENCY
from gpushare.api.profile import ACTIVITY, GpuProfile
from gpushare.cluster.state.pod_facts import PodFacts


@dataclass(frozen=True)
class ProtectionPolicy:
    saturation_threshold: float = 0.9
    """A pipe (fp16/fp32/fp64/tensor) or DRAM bandwidth at or above this is saturation."""
    slowdown_bound: float = 1.5
    """Predicted latency-tenant slowdown (time with neighbours / time alone) allowed."""
    bad_readings: int = 3
    """Consecutive bad readings before an eviction."""
    cooldown_s: float = 60.0
    """Seconds after an eviction on a GPU before the next one there."""


def saturation(reading: GpuProfile) -> tuple[str, float] | None:
    """The busiest pipe (or DRAM bandwidth) of a windowed reading and its ratio; None when
    nothing is known (a counter the GPU lacks is None)."""
    known = [(name, value) for name in ACTIVITY if (value := reading.ratio(name)) is not None]
    return max(known, key=lambda nv: nv[1]) if known else None


@dataclass(frozen=True)
class Verdict:
    bad: bool
    why: str


def judge(
    reading: GpuProfile, *, policy: ProtectionPolicy, predicted_slowdown: float | None = None
) -> Verdict:
    busiest = saturation(reading)
    if busiest is not None and busiest[1] >= policy.saturation_threshold:
        return Verdict(
            True,
            f"{busiest[0]} at {busiest[1]:.0%} (threshold {policy.saturation_threshold:.0%})",
        )
    if predicted_slowdown is not None and predicted_slowdown > policy.slowdown_bound:
        return Verdict(
            True,
            f"predicted latency slowdown {predicted_slowdown:.2f}x "
            f"(bound {policy.slowdown_bound:.2f}x)",
        )
    if busiest is None:
        return Verdict(False, "no counters")
    return Verdict(False, f"busiest {busiest[0]} at {busiest[1]:.0%}")


@dataclass
class _GpuWatch:
    bad_in_row: int = 0
    last_eviction: float | None = None
    blocked_reported: bool = False


@dataclass
class ProtectionTracker:
    """Per-GPU hysteresis state. In memory only: after a restart the operator needs
    ``bad_readings`` fresh bad readings again, which errs on the side of not evicting."""

    policy: ProtectionPolicy
    _gpus: dict[str, _GpuWatch] = field(default_factory=dict)

    def observe(self, gpu_uuid: str, *, bad: bool, now: float) -> bool:
        """Record a reading; True when it is time to evict one pod from this GPU."""
        watch = self._gpus.setdefault(gpu_uuid, _GpuWatch())
        if not bad:
            watch.bad_in_row = 0
            watch.blocked_reported = False
            return False
        watch.bad_in_row += 1
        if watch.bad_in_row < self.policy.bad_readings:
            return False
        cooling = watch.last_eviction is not None and now - watch.last_eviction < (
            self.policy.cooldown_s
        )
        return not cooling

    def evicted(self, gpu_uuid: str, *, now: float) -> None:
        watch = self._gpus.setdefault(gpu_uuid, _GpuWatch())
        watch.last_eviction = now
        watch.bad_in_row = 0
        watch.blocked_reported = False

    def blocked(self, gpu_uuid: str) -> bool:
        """An eviction was refused (PDB): keep the streak, retry next reading. True the first
        time in a streak, so the refusal is reported once, not on every retry."""
        watch = self._gpus.setdefault(gpu_uuid, _GpuWatch())
        first = not watch.blocked_reported
        watch.blocked_reported = True
        return first

    def bad_in_row(self, gpu_uuid: str) -> int:
        watch = self._gpus.get(gpu_uuid)
        return watch.bad_in_row if watch else 0

    def forget_except(self, gpu_uuids: set[str]) -> None:
        """Drop GPUs that no longer hold a latency pod."""
        for uuid in list(self._gpus):
            if uuid not in gpu_uuids:
                del self._gpus[uuid]


_OLDEST = datetime(1970, 1, 1, tzinfo=UTC)


def choose_victim(tenants: Sequence[PodFacts]) -> PodFacts | None:
    """The most recently placed batch pod on the GPU (bind time, then creation): the pod whose
    arrival most likely tipped the GPU over, and the one that has lost the least work.

    Latency pods, pods already being deleted and a pod being profiled are never chosen.
    """
    candidates = [
        p
        for p in tenants
        if p.gpu_class == CLASS_BATCH
        and p.active
        and p.annotations.get(ANN_PROFILING) != PROFILING_ACTIVE
    ]
    if not candidates:
        return None
    return max(
        candidates,
        key=lambda p: (p.placement.bind_time if p.placement else _OLDEST, p.created, p.name),
    )


def latency_tenants(tenants: Sequence[PodFacts]) -> list[PodFacts]:
    return [p for p in tenants if p.gpu_class == CLASS_LATENCY and p.active]
