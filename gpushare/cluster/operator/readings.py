"""Readings of the node agent's profiler turned into stored profiles (pure).

``GET <node agent>/profile?gpu=<uuid>&window=<s>`` answers a
:class:`gpushare.api.profile.GpuProfile` (windowed averages of one GPU's counters; a counter
the GPU lacks is null, never 0). Kept apart from the HTTP client so tools without aiohttp (the
GPU check) store profiles exactly as the operator does.
"""

from datetime import datetime

from gpushare.api.errors import InvalidInputError
from gpushare.api.gpushare_crd import ShareProfile
from gpushare.api.profile import GpuProfile
from gpushare.cluster.operator.protection import Reading


class ProfilerError(Exception):
    """The node agent could not be reached or answered something unusable."""


def parse_reading(payload: object) -> GpuProfile:
    """A ``/profile`` answer through the profile's one codec; a malformed answer is the
    agent's fault (ProfilerError), not the share's."""
    try:
        return GpuProfile.from_json(payload)
    except InvalidInputError as exc:
        raise ProfilerError(str(exc)) from None


def protection_reading(measured: GpuProfile) -> Reading:
    """What the latency protection compares against its bounds."""
    return Reading(
        fp16=measured.fp16,
        fp32=measured.fp32,
        fp64=measured.fp64,
        tensor=measured.tensor,
        sm_occupancy=measured.sm_occupancy,
        dram_bandwidth=measured.dram_bandwidth,
    )


def agent_url(template: str, *, node: str, node_ip: str | None) -> str:
    """The node agent's base URL from a template with ``{node}`` / ``{node_ip}``."""
    if "{node_ip}" in template and not node_ip:
        raise ProfilerError(f"node {node} has no address to reach its node agent")
    return template.format(node=node, node_ip=node_ip or "").rstrip("/")


def profile_from_reading(reading: GpuProfile, *, now: datetime) -> ShareProfile:
    """The profile the operator stores in status and in the cache for this reading."""
    return ShareProfile(
        gpu_model=reading.gpu_model,
        fp16=reading.fp16,
        fp32=reading.fp32,
        fp64=reading.fp64,
        tensor=reading.tensor,
        sm_occupancy=reading.sm_occupancy,
        dram_bandwidth=reading.dram_bandwidth,
        memory_bytes=reading.peak_memory_bytes,
        sampled_seconds=reading.sampled_seconds,
        time=now,
        simulated=reading.simulated,
        source="measured",
        tensor_hmma=reading.tensor_hmma,
        tensor_dmma=reading.tensor_dmma,
        tensor_imma=reading.tensor_imma,
        sm_utilization=reading.sm_utilization,
    )
