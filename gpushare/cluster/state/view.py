"""The controller's in-memory view of GPUs and the shares placed on them.

Fed by watches of nodes (inventory annotation ``gpushare.io/gpus``) and pods (placement
annotations), plus the extender's in-flight reservations. Nothing here is state of record: every
tenant comes from a pod's placement annotations or from a bind in progress in this process, so a
restart rebuilds the same view from the API server.

Besides the GPUs it keeps each node's free host CPU and memory (allocatable minus the requests of
every pod bound there, gpushare's or not: the gpushare policy charges GPU share stranded by CPU
or memory) and feeds the pod mix the policy measures against (:class:`PodMix`, see
``_count_in_mix``).

All methods are synchronous and the process is single-threaded asyncio: a caller that checks a
fit and reserves without awaiting in between can never oversubscribe a GPU.
"""

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from gpushare.api.errors import InvalidInputError
from gpushare.api.exclusive import (
    ExclusiveWorkload,
    load_exclusive,
    load_separated,
    separation_reason,
)
from gpushare.api.gpushare_crd import PROFILING_SKIP, parse_spec
from gpushare.api.inventory import GpuInfo, load_inventory
from gpushare.api.names import (
    ANN_NODE_EXCLUSIVE,
    ANN_NODE_GPUS,
    ANN_NODE_SEPARATED,
    RESOURCE_GPU_PERCENT,
    SCHEDULER_NAME,
    SLICES_PER_GPU,
)
from gpushare.api.request import GpuRequest
from gpushare.cluster.state.host_resources import node_allocatable, pod_requests
from gpushare.cluster.state.pods import PodFacts, annotations, facts, metadata, pod_key, spec
from gpushare.cluster.state.share_rules import NO_RULES, ShareRules, rules_of, with_profile
from gpushare.cluster.state.tenancy import Tenancies
from gpushare.packing.fit import fit_reason
from gpushare.packing.mix import PodMix
from gpushare.packing.model import Assignment, Demand, GpuState, NodeState, Tenant

log = logging.getLogger(__name__)

ShareResolver = Callable[[str, str], GpuRequest | None]
"""(namespace, GpuShare name) -> the request it stands for, or None when there is no such share.
Set by the operator; the webhook uses it for pods linked with ``gpushare.io/share``."""


class ReservationError(Exception):
    """A reservation that would oversubscribe a GPU or names a GPU not on the node."""


@dataclass(frozen=True)
class Reservation:
    """A bind in progress: the GPU share is held before any API write is awaited. With
    ``held_until`` set it is a *hold* taken at filter time (``--hold-in-filter``), waiting for
    its bind; it lapses at that ``time.monotonic()`` deadline."""

    key: str
    uid: str
    node: str
    assignment: Assignment
    demand: Demand
    bind_time: datetime
    held_until: float | None = None

    @property
    def is_hold(self) -> bool:
        return self.held_until is not None


def _now() -> datetime:
    return datetime.now(UTC)


class ClusterView:
    """GPUs by node, tenants by GPU, gpushare pods by key."""

    def __init__(
        self,
        *,
        stale_assume_seconds: float = 120.0,
        clock: Callable[[], datetime] = _now,
        mix: PodMix | None = None,
    ) -> None:
        self.stale_assume_seconds = stale_assume_seconds
        self._clock = clock
        self.mix = mix if mix is not None else PodMix()
        """The pod mix learned from the pods this view saw (the gpushare policy's workload)."""
        self._counted: dict[str, str] = {}
        """Pod key -> UID of the pod counted in ``mix`` (at most one entry per live pod)."""
        self._host_allocatable: dict[str, tuple[int, int]] = {}
        self._host_bound: dict[str, tuple[str, int, int]] = {}
        """Pod key -> (node, milli-CPU, memory bytes) of every live pod bound to a node."""
        self._host_of: dict[str, tuple[str, int, int]] = {}
        """Pod key -> what it takes of its node's host resources: bound, else held by a
        reservation of this process."""
        self._host_used: dict[str, tuple[int, int]] = {}
        self._nodes: dict[str, NodeState] = {}
        self._empty_nodes: dict[str, NodeState] = {}
        self._node_problems: dict[str, str] = {}
        self._gpus: dict[str, GpuState] = {}
        self._gpu_node: dict[str, str] = {}
        self._pods: dict[str, PodFacts] = {}
        self._reservations: dict[str, Reservation] = {}
        self._reserved_on: dict[str, set[str]] = {}
        self._held_on: dict[str, set[str]] = {}
        self._tenancy: dict[str, dict[str, Tenant]] = {}
        self._tenants_by_gpu: dict[str, dict[str, Tenant]] = {}
        self._max_gpu_memory = 0
        self._max_gpus_per_node = 0
        self._exclusive: dict[str, dict[str, ExclusiveWorkload]] = {}
        self._separated: dict[str, dict[str, ExclusiveWorkload]] = {}
        self.generation = 0
        """Bumped on every change; lets readers cache derived data."""
        self._node_versions: dict[str, int] = {}
        self._awaiting: dict[str, set[str]] = {}
        self._awaiting_node: dict[str, str] = {}
        self.nodes_synced = False
        self.pods_synced = False
        self.share_resolver: ShareResolver | None = None
        self.tenancies = Tenancies()
        """Namespace grants: the tenancy boundary and who may keep others off a GPU."""
        self._rules: dict[str, ShareRules] = {}
        self._blockers: set[str] = set()
        self._share_status: dict[str, Mapping[str, Any]] = {}
        self._share_requests: dict[str, GpuRequest | None] = {}
        self._shares_without_profiling: set[str] = set()
        self.shares_synced = False
        self.listeners: list[Callable[[str, str], None]] = []
        """Called with (kind, key) after a node or pod changed; kind is "node" or "pod"."""
        self.allocation_listeners: list[Callable[[str], None]] = []
        self._allocations_seen: dict[str, int] = {}
        """Called with a node name when a pod there stopped waiting for its Allocate (or a
        reservation there ended): wakes binds waiting on that node."""

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
    def node_versions(self) -> Mapping[str, int]:
        """Every node's version (``node_version``), for callers checking many nodes at once."""
        return self._node_versions

    def _bump(self, name: str) -> None:
        self._node_versions[name] = self._node_versions.get(name, 0) + 1

    def node_problem(self, name: str) -> str | None:
        """Why a node's inventory annotation could not be read, if it could not."""
        return self._node_problems.get(name)

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

    def gpu(self, uuid: str) -> GpuState | None:
        return self._gpus.get(uuid)

    def node_of_gpu(self, uuid: str) -> str | None:
        return self._gpu_node.get(uuid)

    def pod(self, key: str) -> PodFacts | None:
        return self._pods.get(key)

    def pods(self) -> Mapping[str, PodFacts]:
        return self._pods

    def awaiting_allocation(self, node: str, *, exclude: str = "") -> list[str]:
        """Pods on ``node`` whose Allocate is still to come: bound with state ``assumed`` and
        Pending, or being bound by this process right now."""
        keys = self._awaiting.get(node, set()) | self._reserved_on.get(node, set())
        keys.discard(exclude)
        return sorted(keys)

    def pending_on(self, node: str) -> Iterator[str]:
        """Pods on ``node`` waiting for their Allocate, being bound, or held there by filter
        (a pod may come up twice); nothing is copied."""
        for index in (self._awaiting, self._reserved_on, self._held_on):
            keys = index.get(node)
            if keys:
                yield from keys

    def held_on(self, node: str) -> set[str]:
        """Pods holding a share on ``node`` from filter (``--hold-in-filter``) whose bind has
        not come yet: they will be waiting for their Allocate there shortly."""
        return self._held_on.get(node, set())

    def _set_reservation(self, res: Reservation) -> None:
        self._drop_reservation(res.key)
        self._reservations[res.key] = res
        if not res.assignment.gpu_uuids:
            return  # host resources only: nothing will wait for an Allocate
        # A hold's pod is not bound: nothing for the gate to wait for yet.
        index = self._held_on if res.is_hold else self._reserved_on
        index.setdefault(res.node, set()).add(res.key)

    def _drop_reservation(self, key: str) -> None:
        res = self._reservations.pop(key, None)
        if res is None:
            return
        index = self._held_on if res.is_hold else self._reserved_on
        keys = index.get(res.node)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del index[res.node]
        self._allocation_progress(res.node)

    def _allocation_progress(self, node: str) -> None:
        for listener in self.allocation_listeners:
            try:
                listener(node)
            except Exception:
                log.exception("allocation listener failed", extra={"node": node})

    def _track_awaiting(self, key: str, f: PodFacts | None) -> None:
        old = self._awaiting_node.pop(key, None)
        if old is not None:
            keys = self._awaiting[old]
            keys.discard(key)
            if not keys:
                del self._awaiting[old]
        if f is not None and f.awaiting_allocation and f.node is not None:
            self._awaiting.setdefault(f.node, set()).add(key)
            self._awaiting_node[key] = f.node
        elif old is not None:
            self._allocations_seen[old] = self._allocations_seen.get(old, 0) + 1
            self._allocation_progress(old)

    def allocations_seen(self, node: str) -> int:
        """How many pods on ``node`` stopped waiting for their Allocate (allocated, started,
        failed or gone) since this process began: when it does not move while pods wait, the
        node agent or the kubelet is not answering."""
        return self._allocations_seen.get(node, 0)

    def reservation(self, key: str) -> Reservation | None:
        return self._reservations.get(key)

    def tenancy(self, key: str) -> Mapping[str, Tenant]:
        """GPU uuid -> the tenant this pod holds there now."""
        return self._tenancy.get(key, {})

    @property
    def max_gpu_memory(self) -> int:
        """Memory of the largest healthy GPU in the cluster (0 before any inventory)."""
        return self._max_gpu_memory

    @property
    def max_gpus_per_node(self) -> int:
        """Most healthy GPUs on one node (0 before any inventory); the webhook reads it for
        every pod, so it is kept up to date as inventories change, not counted per call."""
        return self._max_gpus_per_node

    # ---- nodes ---------------------------------------------------------------------------

    def upsert_node(self, node: Mapping[str, Any]) -> None:
        meta = node.get("metadata") if isinstance(node.get("metadata"), Mapping) else {}
        assert isinstance(meta, Mapping)
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            return
        ann = meta.get("annotations") if isinstance(meta.get("annotations"), Mapping) else {}
        assert isinstance(ann, Mapping)
        self._read_marks(self._exclusive, name, ann.get(ANN_NODE_EXCLUSIVE), load_exclusive)
        self._read_marks(self._separated, name, ann.get(ANN_NODE_SEPARATED), load_separated)
        text = ann.get(ANN_NODE_GPUS)
        if not isinstance(text, str):
            self.delete_node(name)
            return
        try:
            inventory = load_inventory(text)
        except InvalidInputError as exc:
            log.warning("node inventory unreadable", extra={"node": name, "error": str(exc)})
            self.delete_node(name)
            self._node_problems[name] = str(exc)
            return
        status = node.get("status") if isinstance(node.get("status"), Mapping) else {}
        assert isinstance(status, Mapping)
        allocatable = status.get("allocatable")
        if isinstance(allocatable, Mapping) and str(allocatable.get(RESOURCE_GPU_PERCENT)) == "0":
            # The kubelet lost the device plugin (node agent down or restarting): a pod bound now
            # would fail admission ("no healthy devices") and a bare pod would be lost.
            self.delete_node(name)
            self._node_problems[name] = (
                f"the node's kubelet has no allocatable {RESOURCE_GPU_PERCENT}: the gpushare node "
                "agent (device plugin) is not registered; waiting for it"
            )
            return
        self._node_problems.pop(name, None)
        allocatable = node_allocatable(node)
        if allocatable is None:
            self._host_allocatable.pop(name, None)
        else:
            self._host_allocatable[name] = allocatable
        self._set_inventory(name, inventory)
        self._sync_host(name)

    @staticmethod
    def _read_marks(
        into: dict[str, dict[str, ExclusiveWorkload]],
        name: str,
        text: object,
        load: Callable[[str], list[ExclusiveWorkload]],
    ) -> None:
        """Workloads the node's agent marked, exclusive or separated (gpushare.api.exclusive);
        an unreadable list keeps the last one read."""
        if not isinstance(text, str) or not text:
            into.pop(name, None)
            return
        try:
            into[name] = {w.uid: w for w in load(text)}
        except InvalidInputError as exc:
            log.warning("workload marks unreadable", extra={"node": name, "error": str(exc)})

    def separation(self, workload_uid: str) -> tuple[frozenset[str], str] | None:
        """(GPUs the workload's new pods keep off, why) when some node's agent separated it."""
        marks = [m for node in self._separated.values() if (m := node.get(workload_uid))]
        gpus = frozenset(m.gpu_uuid for m in marks if m.gpu_uuid)
        if not gpus:
            return None
        return gpus, separation_reason(marks[-1])

    def exclusive_reason(self, workload_uid: str) -> str | None:
        """Why the workload (a pod's controller UID) must run on a GPU of its own, if it must."""
        for marks in self._exclusive.values():
            mark = marks.get(workload_uid)
            if mark is not None:
                return mark.reason
        return None

    def _set_inventory(self, name: str, inventory: list[GpuInfo]) -> None:
        old = self._nodes.get(name)
        if old is not None and [_signature(g) for g in old.gpus] == [
            (g.uuid, g.index, g.model, g.memory_bytes, g.healthy) for g in inventory
        ]:
            return
        self._drop_node_gpus(name)
        gpus: list[GpuState] = []
        empties: list[GpuState] = []
        for info in sorted(inventory, key=lambda g: g.index):
            state = GpuState(
                uuid=info.uuid,
                memory_bytes=info.memory_bytes,
                model=info.model,
                index=info.index,
                healthy=info.healthy,
                tenants=list(self._tenants_by_gpu.get(info.uuid, {}).values()),
            )
            gpus.append(state)
            empties.append(replace(state, tenants=[]))
            self._gpus[info.uuid] = state
            self._gpu_node[info.uuid] = name
        self._nodes[name] = NodeState(name=name, gpus=gpus)
        self._sync_host(name)
        self._bump(name)
        self._empty_nodes[name] = NodeState(name=name, gpus=empties)
        self._refresh_maxima()
        self._changed("node", name)

    def _drop_node_gpus(self, name: str) -> None:
        old = self._nodes.pop(name, None)
        self._empty_nodes.pop(name, None)
        if old is None:
            return
        for g in old.gpus:
            if self._gpu_node.get(g.uuid) == name:
                self._gpus.pop(g.uuid, None)
                self._gpu_node.pop(g.uuid, None)

    def delete_node(self, name: str) -> None:
        self._node_problems.pop(name, None)
        if name in self._nodes:
            self._drop_node_gpus(name)
            self._bump(name)
            self._refresh_maxima()
            self._changed("node", name)

    def replace_nodes(self, nodes: Iterable[Mapping[str, Any]]) -> None:
        """A full list: nodes missing from it are gone."""
        seen: set[str] = set()
        for node in nodes:
            meta = node.get("metadata")
            if isinstance(meta, Mapping) and isinstance(meta.get("name"), str):
                seen.add(meta["name"])
            self.upsert_node(node)
        for name in [n for n in self._nodes if n not in seen]:
            self.delete_node(name)
        for name in [n for n in self._exclusive if n not in seen]:
            del self._exclusive[name]
        for name in [n for n in self._separated if n not in seen]:
            del self._separated[name]
        self.nodes_synced = True

    def _refresh_maxima(self) -> None:
        self._max_gpu_memory = max(
            (g.memory_bytes for g in self._gpus.values() if g.healthy), default=0
        )
        self._max_gpus_per_node = max(
            (sum(1 for g in n.gpus if g.healthy) for n in self._nodes.values()), default=0
        )

    # ---- pods ----------------------------------------------------------------------------

    def upsert_pod(self, pod: Mapping[str, Any]) -> PodFacts | None:
        """Take a watched pod in; returns what was read (None for pods gpushare does not place
        on GPUs: of those only the host resources they take are kept)."""
        f = facts(pod)
        cpu, memory = pod_requests(pod)
        if f.node is not None and not f.finished:
            self._host_bound[f.key] = (f.node, cpu, memory)
        else:
            self._host_bound.pop(f.key, None)
        ours = f.demand is not None or f.placement is not None or f.problem is not None
        self._count_in_mix(pod, f, ours=ours, cpu=cpu, memory=memory)
        if not ours:
            self._forget(f.key)
            return None
        namespace = f.key.partition("/")[0]
        rules = _rules_of(pod, granted=self.tenancies.neighbour_rules(namespace))
        if f.demand is not None:
            f = replace(f, demand=self.with_tenancy(with_profile(f.demand, rules), namespace))
        f = self._frozen(f)
        self._set_rules(f.key, rules)
        self._pods[f.key] = f
        self._track_awaiting(f.key, f)
        res = self._reservations.get(f.key)
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
            self._drop_reservation(f.key)
        self._apply(f.key)
        return f

    def with_tenancy(self, demand: Demand, namespace: str) -> Demand:
        """The demand of a pod of ``namespace``, carrying its tenancy (the boundary fit checks)."""
        tenancy = self.tenancies.tenancy(namespace)
        return demand if demand.tenancy == tenancy else replace(demand, tenancy=tenancy)

    def _frozen(self, f: PodFacts) -> PodFacts:
        """Once bound, a pod holds what it was placed with: a later change of its request
        annotations (refused by the chart's admission policy; here if that is missing) does
        not change what it counts for on its GPU (docs/security.md)."""
        old = self._pods.get(f.key)
        if (
            old is None
            or old.uid != f.uid
            or old.node is None
            or old.placement is None
            or old.demand is None
            or f.demand == old.demand
        ):
            return f
        if f.demand is None or replace(f.demand, tenancy=None) != replace(old.demand, tenancy=None):
            log.warning(
                "request annotations changed after bind; the pod keeps the share it was placed "
                "with",
                extra={"pod": f.key},
            )
        return replace(
            f, demand=replace(old.demand, tenancy=f.demand.tenancy if f.demand else None)
        )

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
        self._regrant(self.tenancies.replace(namespaces))

    def _regrant(self, names: set[str]) -> None:
        """Namespace labels changed: its pods' tenancy and rule grants follow."""
        for key, f in list(self._pods.items()):
            namespace = key.partition("/")[0]
            if namespace not in names:
                continue
            rules = self._rules.get(key)
            if rules is not None:
                self._set_rules(
                    key, replace(rules, granted=self.tenancies.neighbour_rules(namespace))
                )
            if f.demand is not None:
                self._pods[key] = replace(f, demand=self.with_tenancy(f.demand, namespace))
            self._apply(key)

    def delete_pod(self, key: str) -> None:
        self._host_bound.pop(key, None)
        self._counted.pop(key, None)
        self._forget(key)

    def _forget(self, key: str) -> None:
        """Drop what the view keeps of a pod on GPUs (its host resources follow
        ``_host_bound``)."""
        had = key in self._pods or key in self._reservations
        self._pods.pop(key, None)
        self._set_rules(key, NO_RULES)
        self._track_awaiting(key, None)
        self._drop_reservation(key)
        self._apply(key)
        if had:
            self._changed("pod", key)

    def replace_pods(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """A full list: gpushare pods missing from it are gone."""
        seen: set[str] = set()
        for pod in pods:
            self.upsert_pod(pod)
            seen.add(pod_key(pod))
        gone = {k for k in (*self._pods, *self._host_bound, *self._counted) if k not in seen}
        for key in gone:
            self.delete_pod(key)
        self.pods_synced = True

    def expire_stale(self) -> list[str]:
        """Re-evaluate placements written but never bound; returns the keys that let go."""
        released: list[str] = []
        for key, f in list(self._pods.items()):
            if f.node is None and f.placement is not None and key not in self._reservations:
                before = bool(self._tenancy.get(key))
                self._apply(key)
                if before and not self._tenancy.get(key):
                    released.append(key)
        return released

    # ---- GpuShare rules ------------------------------------------------------------------

    def _set_rules(self, key: str, rules: ShareRules) -> None:
        """Remember a pod's GpuShare rules; a change of a placed pod's rules changes what
        fits its GPUs, so their nodes' versions move (cached answers there are dropped)."""
        if rules.share is None and not rules.constrains_gpus:
            rules = NO_RULES
        if rules == self._rules.get(key, NO_RULES):
            return
        if rules == NO_RULES:
            self._rules.pop(key, None)
        else:
            self._rules[key] = rules
        if rules.blocks_others:
            self._blockers.add(key)
        else:
            self._blockers.discard(key)
        for node in {self._gpu_node.get(u) for u in self._tenancy.get(key, {})}:
            if node is not None:
                self._bump(node)

    def pod_rules(self) -> Mapping[str, ShareRules]:
        """Pod key -> GpuShare rules, for the pods that have any."""
        return self._rules

    @property
    def any_blockers(self) -> bool:
        """True while some pod keeps other pods off its GPU (profiling, exclusive policy)."""
        return bool(self._blockers)

    def share_status(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The GpuShare's ``status`` as last watched; None when the share is unknown."""
        return self._share_status.get(f"{namespace}/{name}")

    def share_statuses(self) -> Mapping[str, Mapping[str, Any]]:
        """Every known GpuShare's ``status`` by ``namespace/name`` (for the metrics)."""
        return self._share_status

    def upsert_share(self, share: Mapping[str, Any]) -> None:
        meta = share.get("metadata")
        if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
            return
        status = share.get("status")
        key = f"{meta.get('namespace') or 'default'}/{meta['name']}"
        self._share_status[key] = dict(status) if isinstance(status, Mapping) else {}
        spec = share.get("spec")
        self._share_requests[key] = _share_request(spec, name=str(meta["name"]))
        profiling = spec.get("profiling") if isinstance(spec, Mapping) else None
        mode = profiling.get("mode") if isinstance(profiling, Mapping) else None
        if mode == PROFILING_SKIP:
            self._shares_without_profiling.add(key)
        else:
            self._shares_without_profiling.discard(key)

    def share_request(self, namespace: str, name: str) -> GpuRequest | None:
        """The request a GpuShare stands for, from its spec as watched; None when there is no
        such share or its spec is invalid. Every replica has it (the webhook of a standby,
        which runs no operator, resolves ``gpushare.io/share`` with it)."""
        return self._share_requests.get(f"{namespace}/{name}")

    def share_skips_profiling(self, namespace: str, name: str) -> bool:
        """The GpuShare asks for no profiling (``spec.profiling.mode: skip``): its pods are
        never held back for a profiling run."""
        return f"{namespace}/{name}" in self._shares_without_profiling

    def delete_share(self, share: Mapping[str, Any]) -> None:
        meta = share.get("metadata")
        if isinstance(meta, Mapping):
            key = f"{meta.get('namespace') or 'default'}/{meta.get('name')}"
            self._share_status.pop(key, None)
            self._share_requests.pop(key, None)
            self._shares_without_profiling.discard(key)

    def replace_shares(self, shares: Iterable[Mapping[str, Any]]) -> None:
        """A full list: shares missing from it are gone."""
        self._share_status.clear()
        self._share_requests.clear()
        self._shares_without_profiling.clear()
        for share in shares:
            self.upsert_share(share)
        self.shares_synced = True

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
        per_gpu = _per_gpu_demand(demand)
        for uuid in assignment.gpu_uuids:
            gpu = next((g for g in current.gpus if g.uuid == uuid), None)
            if gpu is None:
                raise ReservationError(f"GPU {uuid} is not on node {node}")
            reason = fit_reason(gpu, per_gpu)
            if reason is not None:
                raise ReservationError(f"GPU {uuid} on {node}: {reason}")
        until = time.monotonic() + hold_seconds if hold_seconds is not None else None
        res = Reservation(key, uid, node, assignment, demand, bind_time, until)
        self._set_reservation(res)
        self._apply(key)
        return res

    def expire_holds(self, now: float | None = None) -> list[str]:
        """Let go of filter-time holds whose bind never came; returns their pod keys."""
        moment = time.monotonic() if now is None else now
        lapsed = [
            r
            for r in self._reservations.values()
            if r.held_until is not None and r.held_until <= moment
        ]
        for res in lapsed:
            self.release(res)
        return [r.key for r in lapsed]

    def release(self, res: Reservation) -> None:
        """Undo a reservation (bind failed); a later reservation of the pod is left alone."""
        if self._reservations.get(res.key) is res:
            self._drop_reservation(res.key)
            self._apply(res.key)

    # ---- tenancy -------------------------------------------------------------------------

    def _desired(self, key: str) -> dict[str, Tenant]:
        res = self._reservations.get(key)
        if res is not None:
            return self._tenants(
                key,
                res.assignment.gpu_uuids,
                res.demand,
                res.assignment.memory_limit_bytes,
                res.assignment.thread_percent,
            )
        f = self._pods.get(key)
        if f is None or f.finished or f.placement is None:
            return {}
        if f.node is None:
            age = (self._clock() - f.placement.bind_time).total_seconds()
            if age > self.stale_assume_seconds:
                return {}
        demand = f.demand
        if demand is None:
            demand = Demand(
                percent=min(f.placement.guaranteed_percent, SLICES_PER_GPU),
                tenancy=self.tenancies.tenancy(key.partition("/")[0]),
            )
        return self._tenants(
            key,
            f.placement.gpu_uuids,
            demand,
            f.placement.memory_limit_bytes,
            f.placement.thread_percent,
        )

    def _tenants(
        self,
        key: str,
        uuids: tuple[str, ...],
        demand: Demand,
        memory_limit: int,
        threads: int,
    ) -> dict[str, Tenant]:
        """The pod as a tenant of each of its GPUs, with the MPS thread cap it was given (a
        batch pod alone may run uncapped: its neighbours feel all of it, docs/packing.md)."""
        out: dict[str, Tenant] = {}
        per_gpu = _per_gpu_demand(demand)
        for uuid in uuids:
            memory = memory_limit
            if memory <= 0:
                gpu = self._gpus.get(uuid)
                memory = gpu.memory_bytes if gpu is not None else 0
            out[uuid] = Tenant(
                key=key,
                percent=per_gpu.percent,
                memory_bytes=memory,
                gpu_class=demand.gpu_class,
                processes=demand.processes,
                profile=demand.profile,
                thread_percent=threads if threads > 0 else None,
                tenancy=demand.tenancy,
            )
        return out

    def _apply(self, key: str) -> None:
        self._refresh_host(key)
        new = self._desired(key)
        old = self._tenancy.get(key, {})
        if new == old:
            return
        for uuid in old:
            tenants = self._tenants_by_gpu.get(uuid)
            if tenants is not None:
                tenants.pop(key, None)
                if not tenants:
                    del self._tenants_by_gpu[uuid]
        for uuid, tenant in new.items():
            self._tenants_by_gpu.setdefault(uuid, {})[key] = tenant
        if new:
            self._tenancy[key] = new
        else:
            self._tenancy.pop(key, None)
        for uuid in set(old) | set(new):
            gpu = self._gpus.get(uuid)
            if gpu is not None:
                gpu.tenants = list(self._tenants_by_gpu.get(uuid, {}).values())
                self._bump(self._gpu_node[uuid])
        self._changed("pod", key)

    # ---- host resources and the pod mix --------------------------------------------------

    def _refresh_host(self, key: str) -> None:
        """Recount what pod ``key`` takes of its node's CPU and memory: its requests once bound,
        its reservation's demand while this process holds or binds it."""
        new = self._host_bound.get(key)
        if new is None:
            res = self._reservations.get(key)
            if res is not None and (res.demand.cpu_milli or res.demand.host_memory_bytes):
                new = (res.node, res.demand.cpu_milli, res.demand.host_memory_bytes)
        old = self._host_of.get(key)
        if new == old:
            return
        for entry, sign in ((old, -1), (new, 1)):
            if entry is None:
                continue
            node, cpu, memory = entry
            used_cpu, used_memory = self._host_used.get(node, (0, 0))
            used = (used_cpu + sign * cpu, used_memory + sign * memory)
            if used == (0, 0):
                self._host_used.pop(node, None)
            else:
                self._host_used[node] = used
        if new is None:
            self._host_of.pop(key, None)
        else:
            self._host_of[key] = new
        for node in {e[0] for e in (old, new) if e is not None}:
            self._sync_host(node)

    def _sync_host(self, name: str) -> None:
        """Set the node's free CPU and memory from its allocatable and the pods there (None:
        the node's status did not say what it offers)."""
        node = self._nodes.get(name)
        if node is None:
            return
        allocatable = self._host_allocatable.get(name)
        if allocatable is None:
            free: tuple[int | None, int | None] = (None, None)
        else:
            used = self._host_used.get(name, (0, 0))
            free = (allocatable[0] - used[0], allocatable[1] - used[1])
        if (node.cpu_milli_free, node.memory_free_bytes) != free:
            node.cpu_milli_free, node.memory_free_bytes = free
            self._bump(name)

    def _count_in_mix(
        self, pod: Mapping[str, Any], f: PodFacts, *, ours: bool, cpu: int, memory: int
    ) -> None:
        """Count a pod in ``mix`` the first time the view sees it (per UID), as it arrives: a
        gpushare pod or a pod for the gpushare-scheduler at once (pending), any other pod once
        bound to a node with gpushare GPUs (its CPU and memory compete with them there).
        Finished pods are not counted (a restart's first list holds old ones)."""
        if f.finished or self._counted.get(f.key) == f.uid:
            return
        if ours:
            if f.demand is None:
                return
            demand = f.demand
        elif spec(pod).get("schedulerName") == SCHEDULER_NAME or (
            f.node is not None and f.node in self._nodes
        ):
            demand = Demand(percent=0, gpus=0, cpu_milli=cpu, host_memory_bytes=memory)
        else:
            return
        self._counted[f.key] = f.uid
        self.mix.observe(demand)

    def host_used(self, name: str) -> tuple[int, int]:
        """(milli-CPU, memory bytes) the pods bound to or held on node ``name`` request."""
        return self._host_used.get(name, (0, 0))

    def _changed(self, kind: str, key: str) -> None:
        self.generation += 1
        for listener in self.listeners:
            try:
                listener(kind, key)
            except Exception:
                log.exception("view listener failed", extra={"kind": kind, "key": key})


def _rules_of(pod: Mapping[str, Any], *, granted: bool) -> ShareRules:
    """The pod's GpuShare rules; unreadable ones count as none here (the extender refuses the
    pod itself with the reason when it is scheduled)."""
    meta = metadata(pod)
    try:
        return rules_of(
            name=str(meta.get("name", "")),
            namespace=str(meta.get("namespace") or "default"),
            annotations=annotations(pod),
            granted=granted,
        )
    except Exception:  # InvalidInputError, or a bound missed: never the watch's problem
        return NO_RULES


def _share_request(spec: object, *, name: str) -> GpuRequest | None:
    if not isinstance(spec, Mapping):
        return None
    try:
        parsed = parse_spec(spec)
    except InvalidInputError:
        return None
    return GpuRequest(
        percent=parsed.percent,
        memory_bytes=parsed.memory_bytes,
        gpu_class=parsed.gpu_class,
        share=name,
    )


def _per_gpu_demand(demand: Demand) -> Demand:
    """What a (possibly multi-GPU) demand asks of each one of its GPUs."""
    if demand.gpus > 1:
        return replace(demand, gpus=1, percent=SLICES_PER_GPU)
    return demand


def _signature(g: GpuState) -> tuple[str, int, str, int, bool]:
    return (g.uuid, g.index, g.model, g.memory_bytes, g.healthy)
