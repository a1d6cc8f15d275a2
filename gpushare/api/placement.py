"""Placement annotations written by the extender at bind and read by the device plugin."""

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from gpushare.api.bounds import MAX_BYTES, bounded_int, check_length
from gpushare.api.errors import InvalidInputError
from gpushare.api.names import (
    ANN_BIND_TIME,
    ANN_GPU_UUID,
    ANN_MEMORY_LIMIT,
    ANN_REQUEST_PERCENT,
    ANN_STATE,
    ANN_THREAD_PERCENT,
    ANN_TIER,
    STATE_ALLOCATED,
    STATE_ASSUMED,
    TIER_GUARANTEED,
    TIER_OPPORTUNISTIC,
    TIERS,
)

_FIX = "placement annotations are written by gpushare-scheduler; delete the pod and recreate it"
MAX_PLACED_GPUS = 64
"""Most GPUs one placement names."""


@dataclass(frozen=True)
class Placement:
    """Where the scheduler put a pod: which GPU(s), what compute share and memory cap."""

    gpu_uuids: tuple[str, ...]
    """One UUID for a fractional pod, several for a multi-GPU pod."""
    thread_percent: int
    """MPS active-thread percentage (1..100)."""
    memory_limit_bytes: int
    """MPS pinned device memory limit, per GPU."""
    bind_time: datetime
    state: str
    request_percent: int | None = None
    """Guaranteed GPU-percent per GPU the scheduler accounted for (``thread_percent`` is the
    effective limit and may be larger); None on placements written before it was recorded."""
    tier: str = TIER_GUARANTEED
    """``opportunistic``: placed beyond the GPU's guaranteed capacity (its request is not
    counted there until the controller promotes it); ``guaranteed`` otherwise."""

    @property
    def opportunistic(self) -> bool:
        return self.tier == TIER_OPPORTUNISTIC

    @property
    def guaranteed_percent(self) -> int:
        """The request, or the thread cap for placements that do not record one."""
        return self.request_percent if self.request_percent is not None else self.thread_percent

    def to_annotations(self) -> dict[str, str]:
        out = {
            ANN_GPU_UUID: ",".join(self.gpu_uuids),
            ANN_THREAD_PERCENT: str(self.thread_percent),
            ANN_MEMORY_LIMIT: str(self.memory_limit_bytes),
            ANN_BIND_TIME: format_time(self.bind_time),
            ANN_STATE: self.state,
        }
        if self.request_percent is not None:
            out[ANN_REQUEST_PERCENT] = str(self.request_percent)
        if self.opportunistic:
            out[ANN_TIER] = self.tier
        return out


def format_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_placement(annotations: Mapping[str, str]) -> Placement | None:
    """Read a pod's placement; None when the pod carries none. Raises InvalidInputError naming the
    annotation when one is present but malformed."""
    if ANN_GPU_UUID not in annotations:
        return None
    raw_uuids = check_length(annotations[ANN_GPU_UUID], field=ANN_GPU_UUID, fix=_FIX, limit=8192)
    uuids = tuple(u.strip() for u in raw_uuids.split(",") if u.strip())
    if not uuids:
        raise InvalidInputError(ANN_GPU_UUID, "is empty", _FIX)
    if len(uuids) > MAX_PLACED_GPUS:
        raise InvalidInputError(ANN_GPU_UUID, f"names {len(uuids)} GPUs", _FIX)
    threads = bounded_int(
        annotations.get(ANN_THREAD_PERCENT, "100"),
        field=ANN_THREAD_PERCENT,
        fix=_FIX,
        low=1,
        high=100,
    )
    request = _percent(annotations.get(ANN_REQUEST_PERCENT), ANN_REQUEST_PERCENT)
    memory = bounded_int(
        annotations.get(ANN_MEMORY_LIMIT, "0"),
        field=ANN_MEMORY_LIMIT,
        fix=_FIX,
        low=0,
        high=MAX_BYTES,
    )
    raw_time = check_length(
        annotations.get(ANN_BIND_TIME, ""), field=ANN_BIND_TIME, fix=_FIX, limit=64
    )
    try:
        bind_time = datetime.fromisoformat(raw_time.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidInputError(
            ANN_BIND_TIME, f"{raw_time!r} is not an RFC 3339 time", _FIX
        ) from None
    if bind_time.tzinfo is None:
        bind_time = bind_time.replace(tzinfo=UTC)
    state = annotations.get(ANN_STATE, STATE_ASSUMED)
    if state not in (STATE_ASSUMED, STATE_ALLOCATED):
        raise InvalidInputError(
            ANN_STATE, f"unknown state {state!r}", f"{_FIX} (states: assumed, allocated)"
        )
    tier = annotations.get(ANN_TIER, TIER_GUARANTEED)
    if tier not in TIERS:
        raise InvalidInputError(
            ANN_TIER, f"unknown tier {tier[:32]!r}", f"{_FIX} (tiers: {', '.join(TIERS)})"
        )
    return Placement(uuids, threads, memory, bind_time, state, request, tier)


def _percent(text: str | None, field: str) -> int | None:
    """A 1..100 GPU-percent written by the scheduler (at most 3 digits); None when absent."""
    if text is None:
        return None
    value = text.strip()
    if not (value.isascii() and value.isdigit()) or len(value) > 3 or not 1 <= int(value) <= 100:
        raise InvalidInputError(field, f"{text[:16]!r} is not a percent 1..100", _FIX)
    return int(value)
