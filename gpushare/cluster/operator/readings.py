"""Readings of the node agent's profiler, parsed and turned into stored profiles (pure).

``GET <node agent>/profile?gpu=<uuid>&window=<s>`` answers windowed averages of one GPU's
counters: ``{fp16, fp32, fp64, tensor, tensor_hmma, tensor_dmma, tensor_imma, sm_occupancy,
dram_bandwidth, memory_used_bytes, sampled_seconds, gpu_model, simulated}``; a counter the GPU
lacks is null, never 0. Kept apart from the HTTP client so tools without aiohttp (the GPU
check) store profiles exactly as the operator does.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpushare.api.gpushare_crd import ShareProfile
from gpushare.cluster.operator.protection import Reading


class ProfilerError(Exception):
    """The node agent could not be reached or answered something unusable."""


@dataclass(frozen=True)
class ProfileReading:
    fp16: float | None
    fp32: float | None
    fp64: float | None
    tensor: float | None
    sm_occupancy: float | None
    dram_bandwidth: float | None
    memory_used_bytes: int | None
    sampled_seconds: float
    gpu_model: str
    simulated: bool
    tensor_hmma: float | None = None
    """Half/bf16 matrix (HMMA) share of the tensor pipe; tells bf16 from fp64 tensor work."""
    tensor_dmma: float | None = None
    """Double-precision matrix (DMMA) tensor work."""
    tensor_imma: float | None = None
    """Integer matrix (IMMA) tensor work."""
    sm_utilization: float | None = None
    """Share of SMs busy (GPM SM_UTIL)."""

    def as_reading(self) -> Reading:
        return Reading(
            fp16=self.fp16,
            fp32=self.fp32,
            fp64=self.fp64,
            tensor=self.tensor,
            sm_occupancy=self.sm_occupancy,
            dram_bandwidth=self.dram_bandwidth,
        )


def _ratio(payload: Mapping[str, Any], key: str) -> float | None:
    value = payload.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProfilerError(f"profile field {key!r} is {value!r}, not a number")
    # Counters can overshoot 1 by rounding; anything far outside is a broken agent.
    if not -0.01 <= value <= 1.05:
        raise ProfilerError(f"profile field {key!r} is {value}, outside 0..1")
    return min(max(float(value), 0.0), 1.0)


def parse_reading(payload: object) -> ProfileReading:
    if not isinstance(payload, Mapping):
        raise ProfilerError("profile answer is not a JSON object")
    # Peak memory is what a cap must allow; the window's average is the fallback.
    memory_raw = payload.get("memory_used_bytes_max", payload.get("memory_used_bytes"))
    if memory_raw is not None and (
        isinstance(memory_raw, bool) or not isinstance(memory_raw, int | float) or memory_raw < 0
    ):
        raise ProfilerError(f"profile field 'memory_used_bytes' is {memory_raw!r}")
    memory = None if memory_raw is None else round(memory_raw)
    sampled = payload.get("sampled_seconds")
    if isinstance(sampled, bool) or not isinstance(sampled, int | float) or sampled < 0:
        raise ProfilerError(f"profile field 'sampled_seconds' is {sampled!r}")
    model = payload.get("gpu_model")
    if not isinstance(model, str) or not model:
        raise ProfilerError("profile answer has no 'gpu_model'")
    return ProfileReading(
        fp16=_ratio(payload, "fp16"),
        fp32=_ratio(payload, "fp32"),
        fp64=_ratio(payload, "fp64"),
        tensor=_ratio(payload, "tensor"),
        sm_occupancy=_ratio(payload, "sm_occupancy"),
        dram_bandwidth=_ratio(payload, "dram_bandwidth"),
        memory_used_bytes=memory,
        sampled_seconds=float(sampled),
        gpu_model=model,
        simulated=bool(payload.get("simulated", False)),
        tensor_hmma=_ratio(payload, "tensor_hmma"),
        tensor_dmma=_ratio(payload, "tensor_dmma"),
        tensor_imma=_ratio(payload, "tensor_imma"),
        sm_utilization=_ratio(payload, "sm_utilization"),
    )


def agent_url(template: str, *, node: str, node_ip: str | None) -> str:
    """The node agent's base URL from a template with ``{node}`` / ``{node_ip}``."""
    if "{node_ip}" in template and not node_ip:
        raise ProfilerError(f"node {node} has no address to reach its node agent")
    return template.format(node=node, node_ip=node_ip or "").rstrip("/")


def profile_from_reading(reading: ProfileReading, *, now: datetime) -> ShareProfile:
    """The profile the operator stores in status and in the cache for this reading."""
    return ShareProfile(
        gpu_model=reading.gpu_model,
        fp16=reading.fp16,
        fp32=reading.fp32,
        fp64=reading.fp64,
        tensor=reading.tensor,
        sm_occupancy=reading.sm_occupancy,
        dram_bandwidth=reading.dram_bandwidth,
        memory_bytes=reading.memory_used_bytes,
        sampled_seconds=reading.sampled_seconds,
        time=now,
        simulated=reading.simulated,
        source="measured",
        tensor_hmma=reading.tensor_hmma,
        tensor_dmma=reading.tensor_dmma,
        tensor_imma=reading.tensor_imma,
        sm_utilization=reading.sm_utilization,
    )
