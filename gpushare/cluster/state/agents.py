"""Which nodes' agents are alive, from their Leases (gpushare.api.agent_lease).

A node agent renews its Lease every few seconds. The controller does not compare the Lease's
``renewTime`` with its own clock (the two hosts' clocks may disagree): it notes, on its own
monotonic clock, when it last saw ``renewTime`` change, and calls the agent dead once that is
longer ago than the Lease's ``leaseDurationSeconds`` (bounded to 1 s..``max_duration_s``, 60 s by
default, the controller's ``--agent-lease-max-seconds``: a Lease is input).
A Lease first seen counts as renewed then, so a restarted controller gives every agent one
duration before judging it. A node with no Lease is not judged at all: its agent predates the
rule or runs without one, and the node's annotations and allocatable count decide as before.
Only Leases of the agents' namespace count: a tenant may write Leases in its own namespace, and
one named like an agent's there must neither revive a dead agent's node nor, deleted, take a
node out of the rule (docs/security.md, "A node agent reaches one node").

``check`` (every second, from the controller) and each Lease event return the nodes whose
verdict flipped; between them a node's verdict and its reason text stay the same, so answers
cached per node state stay valid.
"""

import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpushare.api.agent_lease import lease_node

MIN_DURATION_S = 1.0
MAX_DURATION_S = 60.0
"""The default bound on a Lease's duration: the longest a Lease written once keeps a node whose
agent is gone (docs/security.md, "A node agent reaches one node")."""


@dataclass
class _Seen:
    name: str
    renew: object
    at: float
    duration_s: float


def _duration(spec: Mapping[str, Any], bound: float) -> float:
    written = spec.get("leaseDurationSeconds")
    if isinstance(written, bool) or not isinstance(written, int | float) or math.isnan(written):
        return bound
    return min(bound, max(MIN_DURATION_S, float(written)))


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


class AgentLeases:
    """Node agents' Leases in one namespace and the verdict on each node's agent."""

    def __init__(
        self,
        *,
        namespace: str = "",
        clock: Callable[[], float] = time.monotonic,
        max_duration_s: float = MAX_DURATION_S,
    ) -> None:
        self.namespace = namespace
        """Where the agents' Leases live (the release namespace); named in refusals."""
        self.clock = clock
        self.max_duration_s = max_duration_s
        """The longest ``leaseDurationSeconds`` believed (a longer one, or none, counts as
        this)."""
        self._seen: dict[str, _Seen] = {}
        self._down: dict[str, str] = {}
        self.generation = 0
        """Moves whenever a node's verdict flips."""

    def down(self, node: str) -> str | None:
        """Why ``node``'s agent counts as gone (its Lease expired), None when it is alive or
        never had a Lease. Stable between ``check`` calls and Lease events."""
        return self._down.get(node)

    def leased(self, node: str) -> bool:
        """True when ``node``'s agent keeps a Lease (alive or not)."""
        return node in self._seen

    @property
    def nodes_down(self) -> Mapping[str, str]:
        return self._down

    def _node(self, lease: Mapping[str, Any]) -> tuple[str, str] | None:
        """(node, Lease name) of an agent's Lease of this namespace, else None."""
        meta = _mapping(lease.get("metadata"))
        name = meta.get("name")
        if self.namespace and meta.get("namespace") != self.namespace:
            return None
        node = lease_node(name) if isinstance(name, str) else None
        return None if node is None or not isinstance(name, str) else (node, name)

    def upsert(self, lease: Mapping[str, Any]) -> set[str]:
        """A Lease was written: a renewal revives its node's agent at once."""
        found = self._node(lease)
        if found is None:
            return set()
        node, name = found
        spec = _mapping(lease.get("spec"))
        renew = (spec.get("renewTime"), spec.get("holderIdentity"))
        old = self._seen.get(node)
        if old is None or old.renew != renew:
            duration = _duration(spec, self.max_duration_s)
            self._seen[node] = _Seen(name, renew, self.clock(), duration)
        else:
            old.duration_s = _duration(spec, self.max_duration_s)
        return self._judge({node})

    def delete(self, lease: Mapping[str, Any]) -> set[str]:
        """A Lease is gone: its node counts as one whose agent never had a Lease."""
        found = self._node(lease)
        if found is None or self._seen.pop(found[0], None) is None:
            return set()
        return self._judge({found[0]})

    def replace(self, leases: Iterable[Mapping[str, Any]]) -> set[str]:
        """A full list: Leases missing from it are gone."""
        before = set(self._seen)
        touched: set[str] = set()
        listed: set[str] = set()
        for lease in leases:
            found = self._node(lease)
            if found is not None:
                listed.add(found[0])
            touched |= self.upsert(lease)
        for node in before - listed:
            self._seen.pop(node, None)
        return touched | self._judge(before - listed)

    def check(self) -> set[str]:
        """Judge every node again now (the clock moved): the nodes whose verdict flipped."""
        return self._judge(set(self._seen) | set(self._down))

    def _judge(self, nodes: Iterable[str]) -> set[str]:
        now = self.clock()
        flipped: set[str] = set()
        for node in nodes:
            seen = self._seen.get(node)
            expired = seen is not None and now - seen.at > seen.duration_s
            if expired and node not in self._down:
                assert seen is not None
                self._down[node] = self._reason(node, seen)
                flipped.add(node)
            elif not expired and self._down.pop(node, None) is not None:
                flipped.add(node)
        self.generation += len(flipped)
        return flipped

    def _reason(self, node: str, seen: _Seen) -> str:
        where = f"{self.namespace}/{seen.name}" if self.namespace else seen.name
        ns = f"-n {self.namespace} " if self.namespace else ""
        return (
            f"the gpushare node agent of node {node} is gone: its Lease {where} was not "
            f"renewed for more than {seen.duration_s:.0f} s (the agent was killed, is "
            "restarting or cannot reach the API server); new gpushare pods wait until an agent "
            f"runs there again (fix: kubectl {ns}get pods -o wide "
            f"--field-selector spec.nodeName={node}, and that agent's logs)"
        )
