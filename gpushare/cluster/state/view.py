"""The controller's in-memory view of GPUs and the shares placed on them: :class:`ClusterView`.

Fed by watches of nodes (inventory annotation ``gpushare.io/gpus``) and pods (placement
annotations), plus the extender's in-flight reservations. Nothing here is state of record: every
tenant comes from a pod's placement annotations or from a bind in progress in this process, so a
restart rebuilds the same view from the API server.

The view is assembled from parts, one concern each (modules of this package):

- ``nodes``: the nodes' GPU inventories, each node's version (a cache key), and what the
  operator reads of every node (agent address, GPU models);
- ``placements``: which GPUs each pod holds (its tenancy), and so each GPU's tenants;
- ``hosts``: each node's free host CPU and memory (allocatable minus the requests of every pod
  bound there, gpushare's or not: the gpushare policy charges GPU share stranded by CPU or
  memory);
- ``reservations``: binds in progress and filter-time holds, and the pods waiting for their
  Allocate (the bind gate);
- ``shares``: the GpuShares (spec read once, status), and the rules their pods carry;
- ``governance``: which pods a GpuShare governs, and who sits on which GPU (the operator's
  reads);
- ``tenancy``: namespace grants (the tenancy boundary, who may keep others off a GPU);
- ``workload_marks``: workloads the node agents marked exclusive or separated;
- ``pod_mix``: which pods are counted in the pod mix the policy measures against.

This module keeps what ties them together: the pods as last watched (``pods.PodFacts``, the one
typed projection: the gpushare pods, and the pods naming gpushare-scheduler that a GpuShare may
govern), the watch entry points, which tell every part what changed, and the reads the
extender, the webhook and the operator make. The controller's informers feed it; the standalone
operator feeds the same class from its Kopf handlers.

All methods are synchronous and the process is single-threaded asyncio: a caller that checks a
fit and reserves without awaiting in between can never oversubscribe a GPU.
"""

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from gpushare.api.inventory import GpuInfo
from gpushare.api.request import GpuRequest
from gpushare.cluster.state import governance
from gpushare.cluster.state.agents import AgentLeases
from gpushare.cluster.state.claim_holders import ClaimHolder, with_claim_placements
from gpushare.cluster.state.host_resources import node_allocatable, pod_requests
from gpushare.cluster.state.hosts import HostUsage
from gpushare.cluster.state.nodes import (
    NodeInfo,
    NodeInventory,
    node_info,
    parse_inventory,
    read_gpus,
)
from gpushare.cluster.state.placements import Placements
from gpushare.cluster.state.pod_mix import MixCounter
from gpushare.cluster.state.pods import PodFacts, facts, frozen_demand, kept, ours, pod_key
from gpushare.cluster.state.quarantine import Quarantine
from gpushare.cluster.state.reservations import (
    Reservation,
    ReservationError,
    Reservations,
    per_gpu_demand,
)
from gpushare.cluster.state.share_rules import NO_RULES, ShareRules, with_profile
from gpushare.cluster.state.shares import PodRules, ShareRegistry, ShareSummary, read_pod_rules
from gpushare.cluster.state.tenancy import Tenancies
from gpushare.cluster.state.workload_marks import WorkloadMarks
from gpushare.packing.mix import PodMix
from gpushare.packing.model import Assignment, Demand, GpuState, NodeState, Tenant
from gpushare.packing.opportunistic import reservation_reason

log = logging.getLogger(__name__)


def _now() -> datetime:
    return datetime.now(UTC)


class ClusterView:
    """GPUs by node, tenants by GPU, gpushare pods by key: the one view the extender, the
    webhook and the operator share.

    A composition: each part (see the module docstring) owns its state and keeps it up to
    date; the view owns the pods and their tenancies and routes every watch event to the
    parts. The reads the extender makes per node and per GPU (``node``, ``node_for``,
    ``node_versions``, ``tenancy``, ``gpu``...) and ``reserve`` use the parts' dicts directly
    (bound in ``__init__``), so they cost what they would in one class.
    """

    def __init__(
        self,
        *,
        stale_assume_seconds: float = 120.0,
        clock: Callable[[], datetime] = _now,
        mix: PodMix | None = None,
    ) -> None:
        self.stale_assume_seconds = stale_assume_seconds
        self.mix = mix if mix is not None else PodMix()
        """The pod mix learned from the pods this view saw (the gpushare policy's workload)."""
        self.generation = 0
        """Bumped on every change; lets readers cache derived data."""
        self.nodes_synced = False
        self.pods_synced = False
        self.tenancies = Tenancies()
        """Namespace grants: the tenancy boundary and who may keep others off a GPU."""
        self.quarantine = Quarantine()
        """Watched objects the view could not take in, held out one by one (a full list
        never fails as a whole; the watches' events go through it too)."""
        self.listeners: list[Callable[[str, str], None]] = []
        """Called with (kind, key) after a node or pod changed; kind is "node" or "pod"."""
        self.allocation_listeners: list[Callable[[str], None]] = []
        """Called with a node name when a pod there stopped waiting for its Allocate (or a
        reservation there ended): wakes binds waiting on that node."""
        self.pod_listeners: list[Callable[[PodFacts], None]] = []
        """Called with a kept pod after each event about it (an upsert, or its deletion with
        the pod as last kept); not for the pods of a full list. The operator reconciles the
        GpuShare governing it."""
        self.sync_listeners: list[Callable[[], None]] = []
        """Called whenever a full list leaves the view synced (``synced``)."""
        self.claim_holders: Callable[[], Mapping[str, ClaimHolder]] | None = None
        """DRA mode: the pods holding claims on gpushare's DRA GPUs, by pod key (the
        controller's claim watch, ``DraDevices.holders``). The operator's reads
        (``governed_pods``, ``tenants_by_gpu``) place DRA-mode pods by them; nothing is
        counted in the device-plugin ledger."""

        self.agents = AgentLeases()
        """Node agents' Leases: a node whose agent's Lease expired gets no new pod
        (gpushare.cluster.state.agents)."""
        self.agents_back = 0
        """Counts nodes whose agent came back (its Lease renewed again): pods refused there
        meanwhile are asked to be retried."""
        self._read: dict[str, tuple[list[GpuInfo] | None, str | None]] = {}
        """Each node with gpushare GPUs: (its GPUs, or None and why not) as last read from it,
        before its agent's Lease is judged: what a node gets back once its agent is."""
        self._inventory = NodeInventory()
        self._marks = WorkloadMarks()
        self._reservations = Reservations(progress=self._allocation_progress)
        self._hosts = HostUsage(
            nodes=self._inventory.nodes,
            bump=self._inventory.bump,
            reservations=self._reservations.by_key,
        )
        self._shares = ShareRegistry()
        self._rules = PodRules()
        self._mix_count = MixCounter()

        self._placements = Placements(
            gpus=self._inventory.gpus,
            gpu_node=self._inventory.gpu_node,
            bump=self._inventory.bump,
            clock=clock,
        )
        self._pods: dict[str, PodFacts] = {}
        """The gpushare pods as the watch last said, by key."""
        self._governable: dict[str, PodFacts] = {}
        """Pods naming gpushare-scheduler without a request (not gpushare's to place): a
        GpuShare's selector may govern them, and the operator gives them its request."""
        self._listing = False

        # The parts' indexes the hot paths read, bound once (the parts never replace them).
        self._nodes = self._inventory.nodes
        self._empty_nodes = self._inventory.empty
        self._gpus = self._inventory.gpus
        self._gpu_node = self._inventory.gpu_node
        self._node_versions = self._inventory.versions
        self._bump = self._inventory.bump
        self._host_of = self._hosts.of
        self._reserved = self._reservations.by_key
        self._tenancy = self._placements.by_pod

    # ---- reading -------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        """True once the first full list of nodes and pods is in."""
        return self.nodes_synced and self.pods_synced

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

    def share_skips_profiling(self, namespace: str, name: str) -> bool:
        """The GpuShare asks for no profiling (``spec.profiling.mode: skip``)."""
        return self._shares.skips_profiling(namespace, name)

    def with_tenancy(self, demand: Demand, namespace: str) -> Demand:
        """The demand of a pod of ``namespace``, carrying its tenancy (the boundary fit checks)."""
        tenancy = self.tenancies.tenancy(namespace)
        return demand if demand.tenancy == tenancy else replace(demand, tenancy=tenancy)

    # ---- the operator's reads ------------------------------------------------------------

    def kept_pods(self) -> Iterator[PodFacts]:
        """Every pod the view keeps: the gpushare pods, then the governable others."""
        yield from self._pods.values()
        yield from self._governable.values()

    def kept_pod(self, key: str) -> PodFacts | None:
        """A kept pod by key (``pod`` has only the pods gpushare places)."""
        return self._pods.get(key) or self._governable.get(key)

    def share(self, key: str) -> ShareSummary | None:
        """A GpuShare by ``namespace/name``, as last watched."""
        return self._shares.by_key.get(key)

    def share_of(self, pod: PodFacts) -> ShareSummary | None:
        """The GpuShare governing a pod (``governance.share_of``)."""
        return governance.share_of(self._shares, pod)

    def governed_pods(self, share: ShareSummary) -> list[PodFacts]:
        """GPU pods of the share's namespace that it governs, oldest first; a DRA-mode pod
        with its claim's placement."""
        pods = governance.governed_pods(self._shares, self.kept_pods(), share)
        holders = self.claim_holders() if self.claim_holders is not None else None
        return with_claim_placements(pods, holders) if holders else pods

    def tenants_by_gpu(self) -> dict[tuple[str, str], list[PodFacts]]:
        """(node, GPU UUID) -> active pods placed on that GPU, DRA-mode pods included."""
        return governance.tenants_by_gpu(
            self.kept_pods(),
            holders=self.claim_holders() if self.claim_holders is not None else None,
            kept=self.kept_pod,
        )

    def node_info(self, name: str) -> NodeInfo | None:
        """What the operator reads of a node (any watched node, GPUs usable or not)."""
        return self._inventory.about.get(name)

    def node_infos(self) -> Mapping[str, NodeInfo]:
        return self._inventory.about

    def gpu_model(self, node: str | None, gpu_uuid: str | None) -> str | None:
        info = self._inventory.about.get(node) if node is not None else None
        if info is None or gpu_uuid is None:
            return None
        return info.gpu_models.get(gpu_uuid)

    def gpu_models(self) -> set[str]:
        """Every GPU model of the cluster's node inventories."""
        return {m for n in self._inventory.about.values() for m in n.gpu_models.values()}

    def mark_synced(self) -> None:
        """Both kinds are in (a full list of each, or no API server to list from)."""
        self.nodes_synced = self.pods_synced = True
        self._notify_synced()

    def add_listed(
        self, *, nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]
    ) -> None:
        """Take in a one-off listing (the standalone operator's, whose watches are Kopf's
        handlers): only the nodes and pods not seen yet, since watch events that came meanwhile
        are newer; no pod events. Then the view is synced."""
        for node in nodes:
            meta = node.get("metadata")
            name = meta.get("name") if isinstance(meta, Mapping) else None
            if isinstance(name, str) and name not in self._inventory.about:
                self.upsert_node(node)
        self._listing = True
        try:
            for pod in pods:
                if self.kept_pod(pod_key(pod)) is None:
                    self.upsert_pod(pod)
        finally:
            self._listing = False
        self.mark_synced()

    def _notify_synced(self) -> None:
        if not self.synced:
            return
        for listener in self.sync_listeners:
            try:
                listener()
            except Exception:
                log.exception("sync listener failed")

    def _pod_event(self, pod: PodFacts) -> None:
        if self._listing:
            return
        for listener in self.pod_listeners:
            try:
                listener(pod)
            except Exception:
                log.exception("pod listener failed", extra={"pod": pod.key})

    # ---- nodes ---------------------------------------------------------------------------

    def upsert_node(self, node: Mapping[str, Any]) -> None:
        meta = node.get("metadata") if isinstance(node.get("metadata"), Mapping) else {}
        assert isinstance(meta, Mapping)
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            return
        ann = meta.get("annotations") if isinstance(meta.get("annotations"), Mapping) else {}
        assert isinstance(ann, Mapping)
        self._marks.read(name, ann)
        parsed, problem = parse_inventory(name, ann)
        self._inventory.about[name] = node_info(node, name, parsed)
        self._hosts.set_allocatable(name, node_allocatable(node))
        inventory, unusable = read_gpus(node, parsed)
        read = (inventory, problem or unusable)
        if read == (None, None):
            self._read.pop(name, None)  # no gpushare GPUs on it: nothing for its agent to say
        else:
            self._read[name] = read
        self._take_gpus(name, *read)

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
        self._inventory.problems.pop(name, None)
        changed = self._inventory.set_gpus(name, inventory, self._placements.by_gpu)
        self._hosts.sync(name)
        if changed:
            self._changed("node", name)

    def delete_node(self, name: str) -> None:
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

    # ---- pods ----------------------------------------------------------------------------

    def upsert_pod(self, pod: Mapping[str, Any]) -> PodFacts | None:
        """Take a watched pod in; returns what was read (None for pods gpushare does not place
        on GPUs: of those only the host resources they take are kept)."""
        f = facts(pod)
        cpu, memory = pod_requests(pod)
        self._hosts.bind(f.key, None if f.finished else f.node, cpu, memory)
        placed = ours(f)
        self._mix_count.count(
            self.mix, pod, f, ours=placed, cpu=cpu, memory=memory, gpu_nodes=self._nodes
        )
        if not placed:
            self._forget(f.key)
            if kept(f):
                self._governable[f.key] = f
                self._pod_event(f)
            else:
                self._governable.pop(f.key, None)
            return None
        self._governable.pop(f.key, None)
        namespace = f.key.partition("/")[0]
        rules = read_pod_rules(pod, granted=self.tenancies.neighbour_rules(namespace))
        if f.demand is not None:
            demand = self.with_tenancy(with_profile(f.demand, rules), namespace)
            if demand is not f.demand:  # most pods: unchanged, and a copy of the facts costs
                f = replace(f, demand=demand)
        f = frozen_demand(self._pods.get(f.key), f)
        self._set_rules(f.key, rules)
        self._pods[f.key] = f
        self._reservations.track_awaiting(f.key, f)
        res = self._reserved.get(f.key)
        if res is not None and (
            f.uid != res.uid
            or f.finished
            or (
                f.node == res.node
                and f.placement is not None
                and f.placement.gpu_uuids == res.assignment.gpu_uuids
            )
        ):
            # Bound with our annotations (or gone): the annotations are the record now.
            self._reservations.drop(f.key)
        self._apply(f.key)
        self._pod_event(f)
        return f

    def delete_pod(self, key: str) -> None:
        last = self._pods.get(key) or self._governable.pop(key, None)
        self._hosts.unbind(key)
        self._mix_count.forget(key)
        self._forget(key)
        if last is not None:
            self._pod_event(last)

    def _forget(self, key: str) -> None:
        """Drop what the view keeps of a pod on GPUs (its host resources follow what
        ``delete_pod`` or ``upsert_pod`` told ``HostUsage``)."""
        had = key in self._pods or key in self._reserved
        self._pods.pop(key, None)
        self._placements.promoted.discard(key)
        self._set_rules(key, NO_RULES)
        self._reservations.track_awaiting(key, None)
        self._reservations.drop(key)
        self._apply(key)
        if had:
            self._changed("pod", key)

    def replace_pods(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """A full list: gpushare pods missing from it are gone."""
        seen: set[str] = set()
        self._listing = True
        try:
            for pod in pods:
                # A pod held out keeps what the view had of it (it is seen, so not gone).
                seen.add(pod_key(pod))
                self.quarantine.take("Pod", pod, self.upsert_pod)
            gone = {
                k
                for k in (
                    *self._pods,
                    *self._governable,
                    *self._hosts.bound,
                    *self._mix_count.counted,
                )
                if k not in seen
            }
            for key in gone:
                self.delete_pod(key)
        finally:
            self._listing = False
        self.pods_synced = True
        self._notify_synced()

    def expire_stale(self) -> list[str]:
        """Re-evaluate placements written but never bound; returns the keys that let go."""
        released: list[str] = []
        for key, f in list(self._pods.items()):
            if f.node is None and f.placement is not None and key not in self._reserved:
                before = bool(self._tenancy.get(key))
                self._apply(key)
                if before and not self._tenancy.get(key):
                    released.append(key)
        return released

    # ---- namespaces ----------------------------------------------------------------------

    def upsert_namespace(self, namespace: Mapping[str, Any]) -> None:
        changed = self.tenancies.upsert(namespace)
        if changed is not None:
            self._regrant({changed})

    def delete_namespace(self, namespace: Mapping[str, Any]) -> None:
        meta = namespace.get("metadata")
        name = meta.get("name") if isinstance(meta, Mapping) else None
        if isinstance(name, str) and self.tenancies.delete(name):
            self._regrant({name})

    def replace_namespaces(self, namespaces: Iterable[Mapping[str, Any]]) -> None:
        self._regrant(self.tenancies.replace(namespaces, take=self.quarantine.take))

    def _regrant(self, names: set[str]) -> None:
        """Namespace labels changed: its pods' tenancy and rule grants follow."""
        for key, f in list(self._pods.items()):
            namespace = key.partition("/")[0]
            if namespace not in names:
                continue
            rules = self._rules.by_pod.get(key)
            if rules is not None:
                self._set_rules(
                    key, replace(rules, granted=self.tenancies.neighbour_rules(namespace))
                )
            if f.demand is not None:
                self._pods[key] = replace(f, demand=self.with_tenancy(f.demand, namespace))
            self._apply(key)

    # ---- GpuShares -----------------------------------------------------------------------

    def upsert_share(self, share: Mapping[str, Any]) -> ShareSummary | None:
        """Take a watched GpuShare in; returns it as kept (None for an object with no name)."""
        return self._shares.upsert(share)

    def delete_share(self, share: Mapping[str, Any]) -> None:
        self._shares.delete(share)

    def replace_shares(self, shares: Iterable[Mapping[str, Any]]) -> None:
        """A full list: shares missing from it are gone."""
        self._shares.replace(shares, take=self.quarantine.take)

    # ---- reservations --------------------------------------------------------------------

    def reserve(
        self,
        *,
        key: str,
        uid: str,
        node: str,
        assignment: Assignment,
        demand: Demand,
        bind_time: datetime,
        hold_seconds: float | None = None,
    ) -> Reservation:
        """Hold the assignment's share now. Raises ReservationError (holding nothing) when a GPU
        is not on the node or would be oversubscribed; replaces the pod's earlier share.
        ``hold_seconds``: a filter-time hold that lapses unless a bind replaces it."""
        current = self.node_for(node, key)
        if current is None:
            raise ReservationError(f"node {node!r} has no GPUs shared by gpushare")
        per_gpu = per_gpu_demand(demand)
        for uuid in assignment.gpu_uuids:
            gpu = next((g for g in current.gpus if g.uuid == uuid), None)
            if gpu is None:
                raise ReservationError(f"GPU {uuid} is not on node {node}")
            reason = reservation_reason(gpu, per_gpu, assignment)
            if reason is not None:
                raise ReservationError(f"GPU {uuid} on {node}: {reason}")
        until = time.monotonic() + hold_seconds if hold_seconds is not None else None
        res = Reservation(key, uid, node, assignment, demand, bind_time, until)
        self._reservations.keep(res)
        self._apply(key)
        return res

    def promote(self, key: str) -> None:
        """Count pod ``key``'s share as guaranteed from now on (its tier annotation follows
        through the watch), so no bind takes it meanwhile."""
        self._placements.promoted.add(key)
        self._apply(key)

    def unpromote(self, key: str) -> None:
        """Undo :meth:`promote` (the annotation could not be written)."""
        if key in self._placements.promoted:
            self._placements.promoted.discard(key)
            self._apply(key)

    def expire_holds(self, now: float | None = None) -> list[str]:
        """Let go of filter-time holds whose bind never came; returns their pod keys."""
        moment = time.monotonic() if now is None else now
        lapsed = self._reservations.lapsed(moment)
        for res in lapsed:
            self.release(res)
        return [r.key for r in lapsed]

    def release(self, res: Reservation) -> None:
        """Undo a reservation (bind failed); a later reservation of the pod is left alone."""
        if self._reserved.get(res.key) is res:
            self._reservations.drop(res.key)
            self._apply(res.key)

    def _allocation_progress(self, node: str) -> None:
        for listener in self.allocation_listeners:
            try:
                listener(node)
            except Exception:
                log.exception("allocation listener failed", extra={"node": node})

    # ---- what each pod holds -------------------------------------------------------------

    def _apply(self, key: str) -> None:
        """Recount what pod ``key`` holds: its node's host resources, and its GPUs."""
        self._hosts.refresh(key)
        if self._placements.update(
            key,
            self._reserved.get(key),
            self._pods.get(key),
            stale_after=self.stale_assume_seconds,
            tenancies=self.tenancies,
        ):
            self._changed("pod", key)

    def _set_rules(self, key: str, rules: ShareRules) -> None:
        """Remember a pod's GpuShare rules; a change of a placed pod's rules changes what
        fits its GPUs, so their nodes' versions move (cached answers there are dropped)."""
        if self._rules.set(key, rules):
            for node in {self._gpu_node.get(u) for u in self._tenancy.get(key, {})}:
                if node is not None:
                    self._bump(node)

    def _changed(self, kind: str, key: str) -> None:
        self.generation += 1
        for listener in self.listeners:
            try:
                listener(kind, key)
            except Exception:
                log.exception("view listener failed", extra={"kind": kind, "key": key})
