"""One GPU profile from the node agent's sampler to the operator, with its one JSON codec.

The node agent averages a GPU's counters over a window (``node.exporter.profiler``) into a
:class:`GpuProfile` and answers ``GET /profile`` with :meth:`GpuProfile.to_json`; the operator
(and the GPU benchmark) read the answer back with :meth:`GpuProfile.from_json`. The operator
stores it as a ``ShareProfile`` (``api.gpushare_crd``: status and cache, with its time and
source), which the placer reads as its ``PipeProfile`` (``packing.stored_profile``). A counter
the GPU cannot measure is ``None`` (JSON ``null``) and listed in ``unavailable``, so that no
reader mistakes "not measured" for "idle". See docs/architecture.md, "The path of one profile".
"""

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from gpushare.api.errors import InvalidInputError

_FIX = "check the node agent's version and health (its /profile answer is malformed)"
PIPES = ("fp16", "fp32", "fp64", "tensor", "tensor_hmma", "tensor_dmma", "tensor_imma", "integer")
"""The GPU's pipes of record: the GPM per-pipe counters, and the values of the metrics' ``pipe``
label (docs/observability.md)."""
RATIOS = (*PIPES, "sm_utilization", "sm_occupancy", "dram_bandwidth", "utilization")
"""The counters a profile averages, each a share 0..1 of the GPU's peak: the pipes, then SM
utilization and occupancy, DRAM bandwidth and NVML's coarse utilization."""


@dataclass(frozen=True)
class GpuProfile:
    """Time-weighted averages of one GPU's counters over the last ``window_seconds``."""

    gpu_uuid: str
    gpu_model: str
    simulated: bool
    window_seconds: float
    sampled_seconds: float
    """GPU time the readings actually cover (less than the window right after start)."""
    samples: int
    fp16: float | None
    fp32: float | None
    fp64: float | None
    tensor: float | None
    tensor_hmma: float | None
    """Half/bf16 matrix (HMMA) share of the tensor pipe; tells bf16 from fp64 tensor work."""
    tensor_dmma: float | None
    """Double-precision matrix (DMMA) tensor work: an fp64 GEMM lands here, not in fp64."""
    tensor_imma: float | None
    """Integer matrix (IMMA) tensor work: int8 inference."""
    integer: float | None
    sm_utilization: float | None
    """Share of SMs busy (GPM SM_UTIL)."""
    sm_occupancy: float | None
    dram_bandwidth: float | None
    utilization: float | None
    memory_used_bytes: float | None
    """Average memory in use over the window."""
    memory_used_bytes_max: int | None
    """Peak memory in use over the window: what a memory cap must allow."""
    unavailable: tuple[str, ...] = ()

    @property
    def peak_memory_bytes(self) -> int | None:
        """The window's peak, else its average (an agent that did not report the peak)."""
        if self.memory_used_bytes_max is not None:
            return self.memory_used_bytes_max
        return None if self.memory_used_bytes is None else round(self.memory_used_bytes)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["unavailable"] = list(self.unavailable)
        return data

    @classmethod
    def from_json(cls, payload: object) -> "GpuProfile":
        """Read a ``/profile`` answer; raises InvalidInputError naming the bad field. Fields
        an older agent does not send read as not measured (counters) or unknown (zero)."""
        if not isinstance(payload, Mapping):
            raise InvalidInputError("profile", "is not a JSON object", _FIX)
        model = payload.get("gpu_model")
        if not isinstance(model, str) or not model:
            raise InvalidInputError("profile.gpu_model", "is missing", _FIX)
        ratios = {key: _ratio(payload, key) for key in RATIOS}
        memory = _number(payload, "memory_used_bytes")
        peak = _number(payload, "memory_used_bytes_max")
        unavailable = payload.get("unavailable", ())
        if not isinstance(unavailable, list | tuple) or not all(
            isinstance(u, str) for u in unavailable
        ):
            raise InvalidInputError("profile.unavailable", "is not a list of names", _FIX)
        return cls(
            gpu_uuid=str(payload.get("gpu_uuid", "")),
            gpu_model=model,
            simulated=bool(payload.get("simulated", False)),
            window_seconds=_number(payload, "window_seconds") or 0.0,
            sampled_seconds=_number(payload, "sampled_seconds", required=True) or 0.0,
            samples=round(_number(payload, "samples") or 0),
            **ratios,
            memory_used_bytes=memory,
            memory_used_bytes_max=None if peak is None else round(peak),
            unavailable=tuple(unavailable),
        )


def _number(payload: Mapping[str, Any], key: str, *, required: bool = False) -> float | None:
    value = payload.get(key)
    if value is None and not required:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
    ):
        raise InvalidInputError(f"profile.{key}", f"is {value!r}, not a number >= 0", _FIX)
    return float(value)


def _ratio(payload: Mapping[str, Any], key: str) -> float | None:
    value = payload.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInputError(f"profile.{key}", f"is {value!r}, not a number", _FIX)
    # Counters can overshoot 1 by rounding; anything far outside is a broken agent.
    if not -0.01 <= value <= 1.05:
        raise InvalidInputError(f"profile.{key}", f"is {value}, outside 0..1", _FIX)
    return min(max(float(value), 0.0), 1.0)
