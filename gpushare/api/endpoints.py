"""Where the operator finds node agents and its profile cache: defaults and their checks.

The controller (``--agent-url``, ``--profile-cache-name``), the standalone operator of the
tests (``python -m tests.fixtures.standalone_operator``) and the chart (``controller.agentURL``,
derived from ``node.metrics.port`` when empty) share these, so a changed agent port or release
name reaches the operator (docs/chart.md, "Operator").
"""

import re
import string
from typing import Final
from urllib.parse import urlsplit

from gpushare.api.errors import InvalidInputError
from gpushare.api.names import AGENT_METRICS_PORT

DEFAULT_AGENT_URL: Final = f"http://{{node_ip}}:{AGENT_METRICS_PORT}"
"""A node agent's metrics server (``/profile`` below it), on the node's InternalIP: the chart
publishes the agent's metrics port as a host port."""
AGENT_TOKEN_AUDIENCE: Final = "gpushare.io/node-agent"
"""The audience of the token the operator presents to node agents for ``/profile``; the API
server itself refuses such a token, so one read off the node network opens nothing else."""
AGENT_TOKEN_FILE: Final = "/var/run/secrets/gpushare.io/node-agent/token"
"""Where the chart mounts the controller's projected token of that audience."""
DEFAULT_PROFILE_CACHE: Final = "gpushare-profile-cache"
"""The profile cache ConfigMap in the operator's namespace (the chart's:
``<release>-profile-cache``)."""

AGENT_URL_FIELDS: Final = ("node", "node_ip")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def check_agent_url(template: str, *, flag: str = "--agent-url") -> str:
    """Refuse a template that cannot become an agent's base URL; return it without a trailing
    slash. ``{node}`` and ``{node_ip}`` are the only placeholders."""
    fix = "write it like http://{node_ip}:9445 or https://{node}.agents.example:9445"
    try:
        names = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as exc:
        problem = f"{template!r} is not a valid template ({exc})"
        raise InvalidInputError(flag, problem, fix) from None
    unknown = sorted(names - set(AGENT_URL_FIELDS))
    if unknown:
        raise InvalidInputError(
            flag, f"unknown placeholder(s) {unknown}; only {{node}} and {{node_ip}} exist", fix
        )
    parts = urlsplit(template.format(node="node", node_ip="192.0.2.1"))
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidInputError(flag, f"{template!r} is not an http(s) URL", fix)
    try:
        _ = parts.port
    except ValueError:
        raise InvalidInputError(flag, f"{template!r} has no valid port", fix) from None
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise InvalidInputError(
            flag, f"{template!r} has a path or query", "give the base URL; /profile is appended"
        )
    return template.rstrip("/")


def check_configmap_name(name: str, *, flag: str = "--profile-cache-name") -> str:
    """Refuse a name the API server would refuse for a ConfigMap (RFC 1123 subdomain)."""
    if len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        raise InvalidInputError(
            flag,
            f"{name!r} is not a valid ConfigMap name",
            "use lower-case letters, digits, '-' and '.', e.g. gpushare-profile-cache",
        )
    return name
