"""Readings of the node agent's profiler (pure).

``GET <node agent>/profile?gpu=<uuid>&window=<s>`` answers a
:class:`gpushare.api.profile.GpuProfile` (windowed averages of one GPU's counters; a counter
the GPU lacks is null, never 0). Kept apart from the HTTP client so tools without aiohttp (the
GPU check) read profiles exactly as the operator does.
"""

from gpushare.api.errors import InvalidInputError
from gpushare.api.profile import GpuProfile


class ProfilerError(Exception):
    """The node agent could not be reached or answered something unusable."""


def parse_reading(payload: object) -> GpuProfile:
    """A ``/profile`` answer through the profile's one codec; a malformed answer is the
    agent's fault (ProfilerError), not the share's."""
    try:
        return GpuProfile.from_json(payload)
    except InvalidInputError as exc:
        raise ProfilerError(str(exc)) from None


def agent_url(template: str, *, node: str, node_ip: str | None) -> str:
    """The node agent's base URL from a template with ``{node}`` / ``{node_ip}``."""
    if "{node_ip}" in template and not node_ip:
        raise ProfilerError(f"node {node} has no address to reach its node agent")
    return template.format(node=node, node_ip=node_ip or "").rstrip("/")
