"""HTTP client for the node agent's profiler endpoint (the operator's only node-side call)."""

import aiohttp

from gpushare.operator.readings import ProfileReading, ProfilerError, agent_url, parse_reading


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
