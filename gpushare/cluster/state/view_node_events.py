"""Node and node agent Lease watch events into the view: :class:`NodeEvents`.

A node's inventory annotation gives its GPUs (``nodes``), its allocatable CPU and memory the
host room (``hosts``), its annotations the workload marks (``workload_marks``); a node whose
agent's Lease expired keeps none of its GPUs until the agent is back (``agents``).
"""

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from gpushare.api.inventory import GpuInfo
from gpushare.cluster.state.host_resources import node_allocatable
from gpushare.cluster.state.nodes import node_info, parse_inventory, read_gpus
from gpushare.cluster.state.view_parts import ViewParts

log = logging.getLogger("gpushare.cluster.state.view")  # the name the view's messages have


def _read_parts(ann: Mapping[str, Any], status: object) -> tuple[object, object, object]:
    """Copies of what ``upsert_node`` reads of a node (its annotations, addresses and
    allocatable): a caller that changes the node it passed in place and sends it again is
    not mistaken for a heartbeat."""
    addresses = status.get("addresses") if isinstance(status, Mapping) else None
    allocatable = status.get("allocatable") if isinstance(status, Mapping) else None
    return (
        dict(ann),
        [dict(a) if isinstance(a, Mapping) else a for a in addresses]
        if isinstance(addresses, list)
        else addresses,
        dict(allocatable) if isinstance(allocatable, Mapping) else allocatable,
    )


class NodeEvents(ViewParts):
    """The view's entry points for the node and agent Lease watches."""

    # ---- nodes ---------------------------------------------------------------------------

    def upsert_node(self, node: Mapping[str, Any]) -> None:
        meta = node.get("metadata") if isinstance(node.get("metadata"), Mapping) else {}
        assert isinstance(meta, Mapping)
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            return
        ann = meta.get("annotations") if isinstance(meta.get("annotations"), Mapping) else {}
        assert isinstance(ann, Mapping)
        inputs = _read_parts(ann, node.get("status"))
        self._mix_count.node(name, meta.get("labels"), self._inventory.about.get(name))
        if self._node_inputs.get(name) == inputs and name in self._inventory.about:
            # Nothing read below changed (a heartbeat: conditions and times); an agent's Lease
            # moving is taken in by its own path (_agents_flipped).
            return
        self._node_inputs.pop(name, None)
        self._marks.read(name, ann)
        parsed, problem = parse_inventory(name, ann)
        self._inventory.about[name] = node_info(node, name, parsed)
        self._mix_count.node(name, meta.get("labels"), self._inventory.about[name])
        self._hosts.set_allocatable(name, node_allocatable(node))
        inventory, unusable = read_gpus(node, parsed)
        read = (inventory, problem or unusable)
        if read == (None, None):
            self._read.pop(name, None)  # no gpushare GPUs on it: nothing for its agent to say
        else:
            self._read[name] = read
        self._take_gpus(name, *read)
        self._node_inputs[name] = inputs

    def _take_gpus(self, name: str, inventory: list[GpuInfo] | None, problem: str | None) -> None:
        """The node's GPUs as read from it, unless its agent is gone (that reason first: the
        kubelet's allocatable count drops too once it notices, saying less)."""
        gone = self.agents.down(name) if (inventory, problem) != (None, None) else None
        if gone is not None:
            inventory, problem = None, gone
        if inventory is None:
            if self._inventory.drop(name):
                self._changed("node", name)
            if problem is not None:
                self._inventory.problems[name] = problem
            return
        if self._inventory.problems.pop(name, None) is not None:
            self.nodes_back += 1
        changed = self._inventory.set_gpus(name, inventory, self._placements.by_gpu)
        self._hosts.sync(name)
        if changed:
            self._changed("node", name)

    def delete_node(self, name: str) -> None:
        self._mix_count.models.drop(name)
        self._node_inputs.pop(name, None)
        self._read.pop(name, None)
        self._inventory.about.pop(name, None)
        self._hosts.set_allocatable(name, None)
        if self._inventory.drop(name):
            self._changed("node", name)

    def replace_nodes(self, nodes: Iterable[Mapping[str, Any]]) -> None:
        """A full list: nodes missing from it are gone."""
        seen: set[str] = set()
        for node in nodes:
            meta = node.get("metadata")
            if isinstance(meta, Mapping) and isinstance(meta.get("name"), str):
                seen.add(meta["name"])
            self.quarantine.take("Node", node, self.upsert_node)
        for name in [n for n in {*self._nodes, *self._inventory.about} if n not in seen]:
            self.delete_node(name)
        self._marks.keep_only(seen)
        self.nodes_synced = True
        self._notify_synced()

    # ---- node agents' Leases ---------------------------------------------------------------

    def upsert_agent_lease(self, lease: Mapping[str, Any]) -> None:
        self._agents_flipped(self.agents.upsert(lease))

    def delete_agent_lease(self, lease: Mapping[str, Any]) -> None:
        self._agents_flipped(self.agents.delete(lease))

    def replace_agent_leases(self, leases: Iterable[Mapping[str, Any]]) -> None:
        self._agents_flipped(self.agents.replace(leases))

    def check_agent_leases(self) -> set[str]:
        """Judge the agents' Leases against the clock (the controller calls this every
        second); returns the nodes whose agent died or came back."""
        flipped = self.agents.check()
        self._agents_flipped(flipped)
        return flipped

    def _agents_flipped(self, nodes: Iterable[str]) -> None:
        for name in nodes:
            read = self._read.get(name)
            if read is None:
                continue  # no gpushare GPUs published there: nothing moves
            if self.agents.down(name) is not None:
                log.warning("node agent gone", extra={"node": name})
            else:
                log.info("node agent back", extra={"node": name})
                self.agents_back += 1
            self._take_gpus(name, *read)
