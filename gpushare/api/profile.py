"""The one GPU profile record, its list of counters and its codecs.

A profile is time-weighted averages of one GPU's counters over a window. The node agent
averages a window of its sampler's readings (``node.exporter.profiler``) into a
:class:`GpuProfile` and answers ``GET /profile`` with :meth:`GpuProfile.to_json`; the operator
(and the GPU benchmark) read it back with :meth:`GpuProfile.from_json`, keep it with its time
and source (:meth:`GpuProfile.stored`) in GpuShare status, the profile cache and the pod
annotation ``gpushare.io/profile`` (:meth:`GpuProfile.to_status`,
:meth:`GpuProfile.from_status`), and the placer reads it as its ``PipeProfile``
(``packing.stored_profile``). A counter the GPU cannot measure is ``None`` (JSON ``null``, and
absent from status) and listed in ``unavailable``, so that no reader mistakes "not measured"
for "idle". See docs/architecture.md, "The path of one profile".
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from gpushare.api.bounds import MAX_BYTES, format_rfc3339, parse_rfc3339
from gpushare.api.errors import InvalidInputError

_FIX = "check the node agent's version and health (its /profile answer is malformed)"
_REPROFILE = "re-profile"
PIPES = ("fp16", "fp32", "fp64", "tensor", "tensor_hmma", "tensor_dmma", "tensor_imma", "integer")
"""The GPU's pipes of record: the GPM per-pipe counters, and the values of the metrics' ``pipe``
label (docs/observability.md)."""
RATIOS = (*PIPES, "sm_utilization", "sm_occupancy", "dram_bandwidth", "utilization")
"""The counters a profile averages, each a share 0..1 of the GPU's peak: the pipes, then SM
utilization and occupancy, DRAM bandwidth and NVML's coarse utilization."""
WORK_PIPES = PIPES[:4]
"""The pipes the packing policy weighs (fp16, fp32, fp64, tensor): the ``tensor_*`` counters
split ``tensor`` by precision, and integer work is not modelled."""
ACTIVITY = (*WORK_PIPES, "dram_bandwidth")
"""The counters that measure work done (SM occupancy and utilization measure residency, not
progress: a stalled warp is resident); a GPU is saturated when one of them is near 1."""
PLACEMENT_COUNTERS = (*WORK_PIPES, "sm_occupancy", "dram_bandwidth")
"""The counters a measurement must have to place a job by it: the policy's ``PipeProfile``."""
STORED = tuple(r for r in RATIOS if r != "integer")
"""The counters a stored profile keeps (GpuShare status, the cache, the pod annotation). NVML's
utilization is among them: alone, it is the share of its time a job has a kernel on the GPU,
which tells a job that sleeps between bursts from one of small kernels (the interference
model's ``PipeProfile.utilization``; docs/packing.md, "Jobs that sleep")."""


def status_key(counter: str) -> str:
    """A counter's camel-case key in status: ``tensor_hmma`` is ``tensorHmma``."""
    head, *rest = counter.split("_")
    return head + "".join(part.title() for part in rest)


@dataclass(frozen=True, kw_only=True)
class GpuProfile:
    """Time-weighted averages of one GPU's counters over the last ``window_seconds``; stored
    (:meth:`stored`) with the time the operator measured it and where it came from."""

    gpu_uuid: str = ""
    gpu_model: str = ""
    simulated: bool = False
    window_seconds: float = 0.0
    sampled_seconds: float = 0.0
    """GPU time the readings actually cover (less than the window right after start)."""
    samples: int = 0
    fp16: float | None = None
    fp32: float | None = None
    fp64: float | None = None
    tensor: float | None = None
    tensor_hmma: float | None = None
    """Half/bf16 matrix (HMMA) share of the tensor pipe; tells bf16 from fp64 tensor work."""
    tensor_dmma: float | None = None
    """Double-precision matrix (DMMA) tensor work: an fp64 GEMM lands here, not in fp64."""
    tensor_imma: float | None = None
    """Integer matrix (IMMA) tensor work: int8 inference."""
    integer: float | None = None
    sm_utilization: float | None = None
    """Share of SMs busy (GPM SM_UTIL); launch-bound jobs keep it well below their thread
    cap, which is what lets the interference model pack them (absent in older profiles)."""
    sm_occupancy: float | None = None
    dram_bandwidth: float | None = None
    utilization: float | None = None
    """NVML's coarse utilization: the share of the time at least one kernel ran. For a job
    alone, the share of its time it has work on the GPU (a notebook between cells: near 0)."""
    memory_used_bytes: float | None = None
    """Average memory in use over the window."""
    memory_used_bytes_max: int | None = None
    """Peak memory in use over the window: what a memory cap must allow."""
    unavailable: tuple[str, ...] = ()
    time: datetime | None = None
    """When the operator stored it; None for a fresh measurement."""
    source: str = "measured"
    """``measured`` by the profiler, or ``cache`` when reused from an earlier measurement."""

    def ratio(self, counter: str) -> float | None:
        """One counter of :data:`RATIOS` by name."""
        value: float | None = getattr(self, counter)
        return value

    @property
    def peak_memory_bytes(self) -> int | None:
        """The window's peak, else its average (an agent that did not report the peak)."""
        if self.memory_used_bytes_max is not None:
            return self.memory_used_bytes_max
        return None if self.memory_used_bytes is None else round(self.memory_used_bytes)

    def stored(self, *, now: datetime, source: str = "measured") -> "GpuProfile":
        """The profile as the operator keeps it: the counters of :data:`STORED`, the peak
        memory, the measurement's time and source."""
        kept: dict[str, Any] = {name: getattr(self, name) for name in _KEPT}
        return GpuProfile(
            **kept, memory_used_bytes_max=self.peak_memory_bytes, time=now, source=source
        )

    def to_json(self) -> dict[str, Any]:
        """The ``/profile`` answer (snake-case keys, nulls kept)."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name in _WIRE_FIELDS}
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
        ratios: dict[str, Any] = {key: _wire_ratio(payload, key) for key in RATIOS}
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

    def to_status(self) -> dict[str, Any]:
        """The stored profile in GpuShare status, the cache and the pod annotation (camel-case
        keys; a counter not measured is left out)."""
        if self.time is None:
            raise ValueError("only a stored profile (GpuProfile.stored) has a status")
        out: dict[str, Any] = {
            "gpuModel": self.gpu_model,
            "sampledSeconds": round(self.sampled_seconds, 3),
            "time": format_rfc3339(self.time),
            "simulated": self.simulated,
            "source": self.source,
        }
        for counter in STORED:
            value = self.ratio(counter)
            if value is not None:
                out[status_key(counter)] = round(value, 4)
        if self.memory_used_bytes_max is not None:
            out["memoryBytes"] = self.memory_used_bytes_max
        return out

    @classmethod
    def from_status(cls, raw: Mapping[str, Any], *, path: str = "status.profile") -> "GpuProfile":
        """Read a stored profile back (status, cache entry or annotation); raises
        InvalidInputError naming the bad field."""
        model = raw.get("gpuModel")
        if not isinstance(model, str) or not model:
            raise InvalidInputError(f"{path}.gpuModel", "is missing", _REPROFILE)
        memory = raw.get("memoryBytes")
        if memory is not None and (
            isinstance(memory, bool) or not isinstance(memory, int) or not 0 <= memory <= MAX_BYTES
        ):
            raise InvalidInputError(f"{path}.memoryBytes", "is not a byte count", _REPROFILE)
        sampled = raw.get("sampledSeconds", 0)
        if (
            isinstance(sampled, bool)
            or not isinstance(sampled, int | float)
            or not 0 <= sampled <= 10**9
        ):
            raise InvalidInputError(
                f"{path}.sampledSeconds", "is not a number of seconds", _REPROFILE
            )
        return cls(
            gpu_model=model,
            sampled_seconds=float(sampled),
            memory_used_bytes_max=memory,
            time=parse_rfc3339(str(raw.get("time", "")), field=f"{path}.time"),
            simulated=bool(raw.get("simulated", False)),
            source=str(raw.get("source", "measured")),
            **_status_ratios(raw, path),
        )

    @classmethod
    def from_counters(
        cls, values: Mapping[str, float | None], *, gpu_model: str = ""
    ) -> "GpuProfile":
        """A profile from counters keyed by :data:`RATIOS` names (a benchmark's measurement or
        trace); other keys are ignored."""
        counters: dict[str, Any] = {c: _optional_float(values.get(c)) for c in RATIOS}
        return cls(gpu_model=gpu_model, **counters)


_KEPT = ("gpu_model", "simulated", "sampled_seconds", *STORED)
"""What a stored profile keeps of a measurement, besides its peak memory."""
_WIRE_FIELDS = frozenset(f.name for f in fields(GpuProfile)) - {"time", "source"}
"""The fields of the ``/profile`` answer: all but what the operator adds when it stores one."""


def _optional_float(value: float | None) -> float | None:
    return None if value is None else float(value)


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


def _wire_ratio(payload: Mapping[str, Any], key: str) -> float | None:
    value = payload.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInputError(f"profile.{key}", f"is {value!r}, not a number", _FIX)
    # Counters can overshoot 1 by rounding; anything far outside is a broken agent.
    if not -0.01 <= value <= 1.05:
        raise InvalidInputError(f"profile.{key}", f"is {value}, outside 0..1", _FIX)
    return min(max(float(value), 0.0), 1.0)


def _status_ratios(raw: Mapping[str, Any], path: str) -> dict[str, Any]:
    return {c: _status_ratio(raw, status_key(c), path) for c in STORED}


def _status_ratio(raw: Mapping[str, Any], key: str, path: str) -> float | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise InvalidInputError(f"{path}.{key}", f"{value!r} is not a ratio 0..1", _REPROFILE)
    return float(value)
