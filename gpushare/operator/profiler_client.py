"""HTTP client for the node agent's profiler endpoint (the operator's only node-side call).

``GET <node agent>/profile?gpu=<uuid>&window=<s>`` answers windowed averages of one GPU's
counters: ``{fp16, fp32, fp64, tensor, sm_occupancy, dram_bandwidth, memory_used_bytes,
sampled_seconds, gpu_model, simulated}``; a counter the GPU lacks is null, never 0.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from gpushare.operator.protection import Reading


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
    )


def agent_url(template: str, *, node: str, node_ip: str | None) -> str:
    """The node agent's base URL from a template with ``{node}`` / ``{node_ip}``."""
    if "{node_ip}" in template and not node_ip:
        raise ProfilerError(f"node {node} has no address to reach its node agent")
    return template.format(node=node, node_ip=node_ip or "").rstrip("/")


class ProfilerClient:
    """One aiohttp session for all node agents; create and close it inside the event loop."""

    def __init__(self, *, url_template: str, timeout_s: float) -> None:
        self._template = url_template
        self._timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None

    async def fetch(
        self, *, node: str, node_ip: str | None, gpu_uuid: str, window_s: int
    ) -> ProfileReading:
        """Windowed averages of ``gpu_uuid``'s counters over the last ``window_s`` seconds.

        The agent may sample for the window before answering, so the timeout covers it."""
        if self._session is None:
            self._session = aiohttp.ClientSession()
        url = f"{agent_url(self._template, node=node, node_ip=node_ip)}/profile"
        timeout = aiohttp.ClientTimeout(total=self._timeout_s + window_s)
        try:
            async with self._session.get(
                url, params={"gpu": gpu_uuid, "window": str(window_s)}, timeout=timeout
            ) as response:
                if response.status != 200:
                    text = (await response.text())[:200]
                    raise ProfilerError(f"{url} answered {response.status}: {text}")
                payload = await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise ProfilerError(f"{url}: {exc.__class__.__name__}: {exc}") from None
        return parse_reading(payload)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
