"""Is a node's agent ready to take a pod now? Asked by bind just before the Binding is written.

A pod the kubelet admits while the node agent's device plugin is gone fails for good
(``UnexpectedAdmissionError: no healthy devices present``): a killed agent's stream broke, and
the kubelet marks every device unhealthy at once. The controller learns of it from the agent's
Lease (unrenewed for its duration, 6 s) or the kubelet's next node status (up to 10 s); a pod
bound meanwhile was lost (docs/reliability.md). So bind asks the agent itself, over the URL the
operator reads profiles from (``--agent-url``): its ``/readyz`` answers 200 only while it is
registered with the kubelet, which has its healthy devices (docs/node-agent.md, "Readiness").

- 200: bind. 503: do not bind (the agent says why; the pod is retried).
- Connection refused at a URL where this agent answered before: do not bind (the agent is
  dead or restarting; nothing listens on its port).
- Anything else (a timeout, a URL that never answered: a network policy, a wrong
  ``--agent-url``): bind as before, and say so once per node in the log. A controller that
  cannot reach the agents must not stop every bind.
"""

import errno
import logging

import aiohttp

from gpushare.cluster.operator.readings import ProfilerError, agent_url

log = logging.getLogger(__name__)

TIMEOUT_S = 0.5
"""Longest a bind waits for the agent's answer (a live agent answers in about a millisecond)."""
REACHED_LIMIT = 100_000
"""Nodes whose agent URL is remembered as having answered."""


class AgentReadiness:
    """``/readyz`` of each node's agent, for :meth:`gpushare.cluster.extender.binding.BindVerbs`
    (it implements the extender's ``AgentCheck``)."""

    def __init__(self, *, url_template: str, timeout_s: float = TIMEOUT_S) -> None:
        self._template = url_template
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._reached: dict[str, str] = {}
        """Node -> the agent URL that answered there (a refusal there means the agent died)."""
        self._told: set[str] = set()

    async def not_ready(self, node: str, address: str | None) -> str | None:
        """Why a pod must not be bound to ``node`` now, or None (module doc)."""
        try:
            base = agent_url(self._template, node=node, node_ip=address)
        except ProfilerError as exc:
            self._unknown(node, str(exc))
            return None
        url = f"{base}/readyz"
        try:
            async with (
                aiohttp.ClientSession(timeout=self._timeout) as session,
                session.get(url, allow_redirects=False) as response,
            ):
                status = response.status
                said = (await response.content.read(300)).decode(errors="replace").strip()
        except aiohttp.ClientConnectorError as exc:
            if _refused(exc) and self._reached.get(node) == base:
                return (
                    f"the gpushare node agent of node {node} does not answer at {base} "
                    "(connection refused: killed or restarting); a pod bound now would fail "
                    "its admission there"
                )
            self._unknown(node, f"{url}: {exc}")
            return None
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            self._unknown(node, f"{url}: {exc.__class__.__name__} {exc}")
            return None
        self._remember(node, base)
        if status == 200:
            return None
        if status == 503:
            reason = said.removeprefix("not ready: ") or "no reason given"
            return f"the gpushare node agent of node {node} is not ready: {reason}"
        self._unknown(node, f"{url} answered HTTP {status}")
        return None

    def _remember(self, node: str, base: str) -> None:
        if self._reached.get(node) != base:
            if len(self._reached) >= REACHED_LIMIT:
                self._reached.clear()
            self._reached[node] = base
        self._told.discard(node)

    def _unknown(self, node: str, detail: str) -> None:
        """No verdict (bind as before): logged once per node until its agent answers."""
        if node not in self._told:
            if len(self._told) >= REACHED_LIMIT:
                self._told.clear()
            self._told.add(node)
            log.warning(
                "cannot ask the node agent whether it is ready; binding without it "
                "(check --agent-url and that the controller reaches the agents' port)",
                extra={"node": node, "detail": detail},
            )


def _refused(exc: aiohttp.ClientConnectorError) -> bool:
    return exc.os_error.errno == errno.ECONNREFUSED or isinstance(
        exc.os_error, ConnectionRefusedError
    )
