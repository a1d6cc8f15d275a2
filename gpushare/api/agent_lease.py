"""The node agent's Lease: how the controller tells a live agent from a dead one.

Each node agent renews a ``coordination.k8s.io/v1`` Lease named ``gpushare-agent-<node>`` in
its release namespace every ``AGENT_LEASE_RENEW_S`` seconds, saying it holds the node for
``AGENT_LEASE_DURATION_S``. The controller watches those Leases; a node whose agent's Lease went
unrenewed for longer than its duration gets no new gpushare pod (the extender refuses it, the
DRA claim allocator skips it) until an agent renews it again. A node whose agent never wrote a
Lease (an agent older than this rule, or one run without a Lease namespace) is judged as before,
by its annotations and the kubelet's allocatable count (docs/node-agent.md, "A dead agent").
"""

from typing import Final

AGENT_LEASE_PREFIX: Final = "gpushare-agent-"
AGENT_LEASE_RENEW_S: Final = 2.0
"""How often an agent renews its Lease."""
AGENT_LEASE_DURATION_S: Final = 6
"""How long a renewal holds: three renewals, so one slow API call does not read as death, and a
SIGKILLed agent's node is refused within 10 s (6 s + the controller's 1 s check + the watch)."""
_NAME_MAX = 253


def agent_lease_name(node: str) -> str | None:
    """The Lease of ``node``'s agent; None when the name would exceed a Lease name's 253
    characters (such a node's agent keeps no Lease and is judged as an older agent's)."""
    name = AGENT_LEASE_PREFIX + node
    return name if len(name) <= _NAME_MAX else None


def lease_node(lease_name: str) -> str | None:
    """The node a Lease name is for, None for a Lease that is not an agent's."""
    if not lease_name.startswith(AGENT_LEASE_PREFIX) or len(lease_name) > _NAME_MAX:
        return None
    node = lease_name[len(AGENT_LEASE_PREFIX) :]
    return node or None
