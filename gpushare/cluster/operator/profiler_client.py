"""HTTP client for the node agent's profiler endpoint (the operator's only node-side call)."""

from pathlib import Path

import aiohttp

from gpushare.api.bounds import load_json
from gpushare.api.endpoints import AGENT_TOKEN_FILE
from gpushare.api.errors import InvalidInputError
from gpushare.api.profile import GpuProfile
from gpushare.cluster.operator.readings import ProfilerError, agent_url, parse_reading

MAX_ANSWER_BYTES = 64 * 1024
"""A /profile answer is a few hundred bytes; anything far larger is refused unread."""
MAX_TOKEN_BYTES = 16 * 1024


def bearer_header(token_file: Path | None) -> dict[str, str]:
    """``Authorization: Bearer <token>`` from ``token_file``, read afresh (the kubelet rotates
    a projected token); no header when the file is missing or unreadable."""
    if token_file is None:
        return {}
    try:
        with token_file.open("rb") as f:
            token = f.read(MAX_TOKEN_BYTES).decode(errors="replace").strip()
    except OSError:
        return {}
    return {"Authorization": f"Bearer {token}"} if token else {}


class ProfilerClient:
    """One aiohttp session for all node agents; create and close it inside the event loop."""

    def __init__(
        self,
        *,
        url_template: str,
        timeout_s: float,
        token_file: Path | None = Path(AGENT_TOKEN_FILE),
    ) -> None:
        """``token_file``: the token presented to agents (gpushare.kube.access: /profile
        answers only a token bound to the audience gpushare.io/node-agent); by default the
        one the chart mounts, so every reader of /profile (the operator, the opportunistic
        governor) presents it."""
        self._template = url_template
        self._token_file = token_file
        self._timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None

    async def fetch(
        self, *, node: str, node_ip: str | None, gpu_uuid: str, window_s: int
    ) -> GpuProfile:
        """Windowed averages of ``gpu_uuid``'s counters over the last ``window_s`` seconds.

        The agent may sample for the window before answering, so the timeout covers it."""
        if self._session is None:
            self._session = aiohttp.ClientSession()
        url = f"{agent_url(self._template, node=node, node_ip=node_ip)}/profile"
        timeout = aiohttp.ClientTimeout(total=self._timeout_s + window_s)
        try:
            async with self._session.get(
                url,
                params={"gpu": gpu_uuid, "window": str(window_s)},
                timeout=timeout,
                headers=bearer_header(self._token_file),
            ) as response:
                if response.status != 200:
                    text = (await response.text())[:200]
                    raise ProfilerError(f"{url} answered {response.status}: {text}")
                raw = await response.content.read(MAX_ANSWER_BYTES + 1)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise ProfilerError(f"{url}: {exc.__class__.__name__}: {exc}") from None
        if len(raw) > MAX_ANSWER_BYTES:
            raise ProfilerError(f"{url} answered more than {MAX_ANSWER_BYTES} bytes")
        try:
            payload = load_json(
                raw.decode(errors="replace"),
                field=f"{url} answer",
                fix="check the node agent",
                max_chars=MAX_ANSWER_BYTES,
            )
        except InvalidInputError as exc:
            raise ProfilerError(str(exc)) from None
        return parse_reading(payload)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
