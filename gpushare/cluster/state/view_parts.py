"""The parts :class:`~gpushare.cluster.state.view.ClusterView` is made of, and what every
change goes through: :class:`ViewParts`.

It builds the parts (one concern each, see the ``view`` module), binds the indexes the hot
paths read, keeps the pods as last watched, and holds the steps every watch event ends with:
recounting what a pod holds (``_apply``), its GpuShare rules (``_set_rules``), and telling the
listeners. The view's methods, grouped by what they do, live in the ``view_*`` modules, each a
subclass of this one.
"""

import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime

from gpushare.api.inventory import GpuInfo
from gpushare.cluster.state.agents import AgentLeases
from gpushare.cluster.state.claim_holders import ClaimHolder
from gpushare.cluster.state.governance import GoverningIndex
from gpushare.cluster.state.hosts import HostUsage
from gpushare.cluster.state.nodes import NodeInventory
from gpushare.cluster.state.placements import Placements
from gpushare.cluster.state.pod_facts import PodFacts
from gpushare.cluster.state.pod_mix import FreeByModel, HostShapes, MixCounter
from gpushare.cluster.state.quarantine import Quarantine
from gpushare.cluster.state.quotas import GuaranteeQuotas
from gpushare.cluster.state.reservations import Reservations
from gpushare.cluster.state.share_rules import ShareRules
from gpushare.cluster.state.shares import PodRules, ShareRegistry
from gpushare.cluster.state.tenancy import Tenancies
from gpushare.cluster.state.workload_marks import WorkloadMarks
from gpushare.packing.mix import PodMix

log = logging.getLogger("gpushare.cluster.state.view")  # the name the view's messages have


def _now() -> datetime:
    return datetime.now(UTC)


class ViewParts:
    """The view's parts and its pods, and the steps every change ends with."""

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
        self._init_listeners()
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
        self.nodes_back = 0
        """Counts nodes placeable again after a refusal of the whole node (the kubelet has
        the agent's devices again, the agent is ready again, its Lease renewed): kube-scheduler
        may have retried a refused pod on the Node event before this view saw it, and no
        event follows, so those pods are asked to be retried too."""
        self.placed_rules_changed = 0
        """Counts rule changes of pods placed on GPUs (a GpuShare's profile written on its
        running pods, a profiling mark ended): what fits beside them changes and kube-scheduler
        sees no event of interest (an annotation of a bound pod), so pods refused meanwhile
        are asked to be retried."""
        self._read: dict[str, tuple[list[GpuInfo] | None, str | None]] = {}
        """Each node with gpushare GPUs: (its GPUs, or None and why not) as last read from it,
        before its agent's Lease is judged: what a node gets back once its agent is."""
        self._node_inputs: dict[str, tuple[object, object, object]] = {}
        """Each node's parts that ``upsert_node`` reads (annotations, addresses, allocatable)
        as last taken in: a kubelet's heartbeat changes none of them (docs/scale.md)."""
        self._init_parts(clock)
        self._pods: dict[str, PodFacts] = {}
        """The gpushare pods as the watch last said, by key."""
        self._governable: dict[str, PodFacts] = {}
        """Pods naming gpushare-scheduler without a request (not gpushare's to place): a
        GpuShare's selector may govern them, and the operator gives them its request."""
        self._listing = False
        self._bind_indexes()
        if self.mix.free_capacity is None:
            self.mix.free_capacity = FreeByModel(self._nodes, self._node_versions)
        if self.mix.host_shapes is None:
            self.mix.host_shapes = HostShapes(self._nodes, self._hosts.allocatable)

    def _init_listeners(self) -> None:
        """Who is told of changes: empty lists the controller's parts append to."""
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

    def _init_parts(self, clock: Callable[[], datetime]) -> None:
        """The parts, wired to the node inventory's indexes they share."""
        self._inventory = NodeInventory()
        self._marks = WorkloadMarks()
        self._reservations = Reservations(progress=self._allocation_progress)
        self._hosts = HostUsage(
            nodes=self._inventory.nodes,
            bump=self._inventory.bump,
            reservations=self._reservations.by_key,
        )
        self._shares = ShareRegistry()
        self._governing = GoverningIndex()
        self.lapsed_holds: dict[str, tuple[str, int]] = {}
        """Pod key -> (its UID, filter-time holds of it that lapsed without a bind)."""
        self.quotas = GuaranteeQuotas()
        """ResourceQuotas' bounds on guaranteed GPU share by namespace (their watch): an
        opted-in pod holds a guaranteed share only within them (``may_guarantee``)."""
        self._rules = PodRules()
        self._mix_count = MixCounter()
        self._placements = Placements(
            gpus=self._inventory.gpus,
            gpu_node=self._inventory.gpu_node,
            bump=self._inventory.bump,
            clock=clock,
        )

    def _bind_indexes(self) -> None:
        """The parts' indexes the hot paths read, bound once (the parts never replace them)."""
        self._nodes = self._inventory.nodes
        self._empty_nodes = self._inventory.empty
        self._gpus = self._inventory.gpus
        self._gpu_node = self._inventory.gpu_node
        self._node_versions = self._inventory.versions
        self._bump = self._inventory.bump
        self._host_of = self._hosts.of
        self._reserved = self._reservations.by_key
        self._tenancy = self._placements.by_pod

    @property
    def synced(self) -> bool:
        """True once the first full list of nodes and pods is in."""
        return self.nodes_synced and self.pods_synced

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
            held = self._tenancy.get(key, {})
            for node in {self._gpu_node.get(u) for u in held}:
                if node is not None:
                    self._bump(node)
            if held and key in self._pods:
                self.placed_rules_changed += 1

    # ---- telling the listeners -----------------------------------------------------------

    def _changed(self, kind: str, key: str) -> None:
        self.generation += 1
        for listener in self.listeners:
            try:
                listener(kind, key)
            except Exception:
                log.exception("view listener failed", extra={"kind": kind, "key": key})

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

    def _allocation_progress(self, node: str) -> None:
        for listener in self.allocation_listeners:
            try:
                listener(node)
            except Exception:
                log.exception("allocation listener failed", extra={"node": node})
