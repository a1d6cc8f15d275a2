"""What the extender and the webhook read of the view: :class:`ViewReads`.

Nodes, GPUs and their tenants, each node's version (a cache key), host room, the binds in
progress, workload marks and GpuShare rules. The reads the extender makes per node and per GPU
(``node``, ``node_for``, ``node_versions``, ``tenancy``, ``gpu``...) use the parts' indexes
bound in ``ViewParts``, so they cost what they would in one class.
"""

from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

from gpushare.api.label_selector import LabelSelector
from gpushare.api.request import GpuRequest
from gpushare.cluster.state.pod_facts import PodFacts
from gpushare.cluster.state.reservations import Reservation
from gpushare.cluster.state.share_rules import ShareRules
from gpushare.cluster.state.view_parts import ViewParts
from gpushare.packing.model import Demand, GpuState, NodeState, Tenant

TENANTED_KEPT = 4096
"""Demands :meth:`ViewReads.with_tenancy` keeps with their tenancy before all are dropped."""
_tenanted: dict[tuple[Demand, str | None], Demand] = {}


class ViewReads(ViewParts):
    """The view's reads for placing pods (the extender) and admitting them (the webhook)."""

    def node(self, name: str) -> NodeState | None:
        return self._nodes.get(name)

    def node_names(self) -> list[str]:
        return list(self._nodes)

    def nodes(self) -> Mapping[str, NodeState]:
        return self._nodes

    def empty_node(self, name: str) -> NodeState | None:
        """The node's GPUs with no tenants: what fits after preempting everyone."""
        return self._empty_nodes.get(name)

    def node_version(self, name: str) -> int:
        """Changes whenever the node's GPUs or their tenants change: a cache key for anything
        computed from ``node(name)``."""
        return self._node_versions.get(name, 0)

    @property
    def change_seq(self) -> int:
        """A mark of the node changes so far (see :meth:`changed_since`)."""
        return self._inventory.change_seq

    def changed_since(self, seq: int) -> list[str] | None:
        """Nodes whose version moved since :attr:`change_seq` was ``seq``; None when that is
        too long ago to say (every node may have changed)."""
        return self._inventory.changed_since(seq)

    @property
    def node_versions(self) -> Mapping[str, int]:
        """Every node's version (``node_version``), for callers checking many nodes at once."""
        return self._node_versions

    def node_problem(self, name: str) -> str | None:
        """Why a node's inventory annotation could not be read, if it could not."""
        return self._inventory.problems.get(name)

    def host_free(self, name: str) -> tuple[int, int] | None:
        """(milli-CPU, memory bytes) node ``name`` has left for pods, any node (hosts)."""
        return self._hosts.free(name)

    @property
    def host_free_room(self) -> Mapping[str, tuple[int, int]]:
        """:meth:`host_free` of every node whose status says (read-only; kept current)."""
        return self._hosts.free_room

    def node_for(self, name: str, pod_key: str) -> NodeState | None:
        """The node as pod ``pod_key`` sees it: its own share (a stale or earlier placement of
        the same pod) does not count against it."""
        node = self._nodes.get(name)
        if node is None:
            return None
        own = self._tenancy.get(pod_key)
        host = self._host_of.get(pod_key)
        own_host = host is not None and host[0] == name
        if not own_host and (not own or not any(self._gpu_node.get(u) == name for u in own)):
            return node
        own = own or {}
        gpus = [
            replace(g, tenants=[t for t in g.tenants if t.key != pod_key]) if g.uuid in own else g
            for g in node.gpus
        ]
        cpu, memory = node.cpu_milli_free, node.memory_free_bytes
        if host is not None and own_host:
            cpu = None if cpu is None else cpu + host[1]
            memory = None if memory is None else memory + host[2]
        return NodeState(name=node.name, gpus=gpus, cpu_milli_free=cpu, memory_free_bytes=memory)

    def own_nodes(self, pod_key: str) -> set[str]:
        """Nodes where :meth:`node_for` shows pod ``pod_key`` another node than :meth:`node`:
        it holds a share of a GPU there, or host resources."""
        out = {n for u in self._tenancy.get(pod_key, {}) if (n := self._gpu_node.get(u))}
        host = self._host_of.get(pod_key)
        if host is not None:
            out.add(host[0])
        return out

    def gpu(self, uuid: str) -> GpuState | None:
        return self._gpus.get(uuid)

    def node_of_gpu(self, uuid: str) -> str | None:
        return self._gpu_node.get(uuid)

    def opportunistic_gpus(self) -> list[tuple[str, GpuState]]:
        """(node, GPU) of every known GPU with an opportunistic or a paused tenant, by node
        and GPU index: the promotion and resumption rounds' GPUs, without a scan of every
        GPU."""
        return self._indexed(self._placements.opportunistic)

    def opportunistic_pods(self) -> list[str]:
        """Keys of the pods placed beyond their GPU's guaranteed capacity, paused or not."""
        return sorted(
            {t.key for _, g in self.opportunistic_gpus() for t in g.tenants if t.opportunistic}
        )

    def governed_gpus(self) -> list[tuple[str, GpuState]]:
        """(node, GPU) of every known GPU with an opportunistic tenant or two profiled ones:
        the governor's GPUs."""
        return self._indexed(self._placements.governed)

    def _indexed(self, uuids: set[str]) -> list[tuple[str, GpuState]]:
        out = []
        for uuid in uuids:
            gpu, node = self._gpus.get(uuid), self._gpu_node.get(uuid)
            if gpu is not None and node is not None:
                out.append((node, gpu))
        out.sort(key=lambda pair: (pair[0], pair[1].index))
        return out

    def pod(self, key: str) -> PodFacts | None:
        return self._pods.get(key)

    def pods(self) -> Mapping[str, PodFacts]:
        return self._pods

    def tenancy(self, key: str) -> Mapping[str, Tenant]:
        """GPU uuid -> the tenant this pod holds there now."""
        return self._tenancy.get(key, {})

    def reservation(self, key: str) -> Reservation | None:
        return self._reserved.get(key)

    def awaiting_allocation(self, node: str, *, exclude: str = "") -> list[str]:
        """Pods on ``node`` whose Allocate is still to come (bound, or being bound)."""
        return self._reservations.awaiting_allocation(node, exclude=exclude)

    def pending_on(self, node: str) -> Iterator[str]:
        """Pods on ``node`` waiting for their Allocate, being bound, or held there by filter."""
        return self._reservations.pending_on(node)

    def held_on(self, node: str) -> set[str]:
        """Pods holding a share on ``node`` from filter whose bind has not come yet."""
        return self._reservations.held_on(node)

    def allocations_seen(self, node: str) -> int:
        """How many pods on ``node`` stopped waiting for their Allocate since this process
        began (``Reservations.allocations_seen``)."""
        return self._reservations.allocations_seen(node)

    @property
    def max_gpu_memory(self) -> int:
        """Memory of the largest healthy GPU in the cluster (0 before any inventory)."""
        return self._inventory.max_gpu_memory

    @property
    def max_gpus_per_node(self) -> int:
        """Most healthy GPUs on one node (0 before any inventory); the webhook reads it for
        every pod, so it is kept up to date as inventories change, not counted per call."""
        return self._inventory.max_gpus_per_node

    def separation(
        self, workload_uid: str, namespace: str | None = None
    ) -> tuple[frozenset[str], str] | None:
        """(GPUs the workload's new pods keep off, why) when some node's agent separated it
        (marks of ``namespace`` only, when given)."""
        return self._marks.separation(workload_uid, namespace)

    def exclusive_reason(self, workload_uid: str, namespace: str | None = None) -> str | None:
        """Why the workload (a pod's controller UID) must run on a GPU of its own, if it must
        (marks of ``namespace`` only, when given)."""
        return self._marks.exclusive_reason(workload_uid, namespace)

    def pod_rules(self) -> Mapping[str, ShareRules]:
        """Pod key -> GpuShare rules, for the pods that have any."""
        return self._rules.by_pod

    @property
    def any_blockers(self) -> bool:
        """True while some pod keeps other pods off its GPU (profiling, exclusive policy)."""
        return bool(self._rules.blockers)

    def share_status(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The GpuShare's ``status`` as last watched; None when the share is unknown."""
        return self._shares.statuses.get(f"{namespace}/{name}")

    def share_statuses(self) -> Mapping[str, Mapping[str, Any]]:
        """Every known GpuShare's ``status`` by ``namespace/name`` (for the metrics)."""
        return self._shares.statuses

    def share_request(self, namespace: str, name: str) -> GpuRequest | None:
        """The request a GpuShare stands for (``ShareRegistry.request``)."""
        return self._shares.request(namespace, name)

    @property
    def lookups_version(self) -> tuple[int, int]:
        """Moves whenever a GpuShare or a namespace's grants change: what the webhook's
        lookups read (the admission process forgets the answers it kept then)."""
        return self._shares.version, self.tenancies.version

    def share_selectors(self, namespace: str) -> list[tuple[str, LabelSelector]]:
        """(name, selector) of the valid GpuShares of ``namespace`` that have a selector."""
        return self._shares.selectors(namespace)

    def share_selectors_enabled(self, namespace: str) -> bool:
        """Do selectors link new pods of ``namespace`` (``Tenancies.share_selectors``)?"""
        return self.tenancies.share_selectors(namespace)

    def share_skips_profiling(self, namespace: str, name: str) -> bool:
        """The GpuShare asks for no profiling (``spec.profiling.mode: skip``)."""
        return self._shares.skips_profiling(namespace, name)

    def with_tenancy(self, demand: Demand, namespace: str) -> Demand:
        """The demand of a pod of ``namespace``, carrying its tenancy (the boundary fit checks):
        one object per (demand, tenancy), as :func:`gpu_requests.demand_of` keeps one per pod
        shape (each pod event and filter call asks; docs/scale.md)."""
        tenancy = self.tenancies.tenancy(namespace)
        if demand.tenancy == tenancy:
            return demand
        key = (demand, tenancy)
        known = _tenanted.get(key)
        if known is None:
            if len(_tenanted) >= TENANTED_KEPT:
                _tenanted.clear()
            known = _tenanted[key] = replace(demand, tenancy=tenancy)
        return known
