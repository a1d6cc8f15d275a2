"""The DRA-mode GPUs and the claims allocated on them, as the controller places claims.

Fed by two watches (gpushare.cluster.watches): ResourceSlices of driver ``gpu.gpushare.io``
(one device per GPU, published by the node agents in ``--mode dra``) and ResourceClaims (every
claim: the allocator looks up the ones its gated pods use, and the allocated ones of our driver
are the GPUs' tenants, whoever allocated them: gpushare or kube-scheduler). Pure state, no I/O:
:class:`DraDevices` turns it into the :class:`~gpushare.packing.model.NodeState` the placer
reads, so a claim is placed by the same policy as an annotated pod in device-plugin mode
(docs/dra.md, "Who places a claim").

Everything read here may be hostile or half-written (a tenant writes its own claims): what
cannot be read is skipped with a reason kept in ``problems``, never raised into the watch.
"""

from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from gpushare.api.dra_objects import (
    ClaimShare,
    DraGpu,
    claim_key,
    read_allocation,
    read_slice,
    reserved_pods,
)
from gpushare.api.errors import InvalidInputError
from gpushare.api.names import CLASS_LATENCY, SLICES_PER_GPU, STATE_ALLOCATED
from gpushare.api.placement import Placement
from gpushare.cluster.state.claim_holders import ClaimHolder
from gpushare.cluster.state.quarantine import Quarantine
from gpushare.cluster.state.share_rules import NO_RULES, ShareRules
from gpushare.cluster.state.shares import PodRules
from gpushare.packing.model import GpuState, NodeState, Tenant
from gpushare.packing.placer import gpu_signature
from gpushare.packing.threads import thread_cap

MAX_INTERNED = 200_000
"""Distinct node signatures remembered (:meth:`DraDevices.signature`) before starting over."""


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _older(new: Mapping[str, Any], old: Mapping[str, Any]) -> bool:
    """``new`` is an earlier version of the same claim than ``old``: same UID, lower
    resourceVersion (etcd revisions; an unreadable one is never called older)."""
    new_meta, old_meta = _mapping(new.get("metadata")), _mapping(old.get("metadata"))
    if new_meta.get("uid") != old_meta.get("uid"):
        return False
    new_rv, old_rv = (
        str(new_meta.get("resourceVersion", "")),
        str(old_meta.get("resourceVersion", "")),
    )
    if not (new_rv.isdigit() and old_rv.isdigit()) or max(len(new_rv), len(old_rv)) > 20:
        return False
    return int(new_rv) < int(old_rv)


def _allocated(obj: Mapping[str, Any]) -> bool:
    return bool(_mapping(obj.get("status")).get("allocation"))


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _created(obj: Mapping[str, Any]) -> datetime:
    text = _mapping(obj.get("metadata")).get("creationTimestamp")
    if not isinstance(text, str) or len(text) > 64:
        return _EPOCH
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return _EPOCH
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _driver_cap(share: ClaimShare, *, latency: bool) -> int:
    """The thread cap the driver gives ``share``'s claim when it prepares it (docs/dra.md,
    "Requests and limits"): a batch claim's depends on whether a latency claim was prepared
    first, so one beside a latency claim is taken capped."""
    return thread_cap(
        share.percent,
        limit=share.limit,
        gpu_class=share.gpu_class,
        latency_neighbour=latency and share.gpu_class != CLASS_LATENCY,
    )


class DraDevices:
    """GPUs by node from the slices, shares by GPU from the allocated claims."""

    def __init__(self, *, quarantine: Quarantine | None = None) -> None:
        self.quarantine = quarantine if quarantine is not None else Quarantine()
        """Slices and claims this ledger could not take in, held out one by one (the
        controller passes its view's, so one Event path reports them all)."""
        self._slices: dict[str, list[DraGpu]] = {}
        self._gpus: dict[tuple[str, str], DraGpu] = {}
        """(pool, device) -> GPU."""
        self._by_node: dict[str, list[DraGpu]] = {}
        self._claims: dict[str, Mapping[str, Any]] = {}
        self._shares: dict[str, list[ClaimShare]] = {}
        """Claim key -> what it consumes of our GPUs (allocated claims only)."""
        self._on_gpu: dict[tuple[str, str], dict[str, ClaimShare]] = {}
        self._assumed: dict[str, list[ClaimShare]] = {}
        """Claim key -> the shares of an allocation this process is writing."""
        self._states: dict[str, NodeState] = {}
        self._signatures: dict[str, tuple[object, ...] | None] = {}
        """Node -> :func:`gpu_signature` of its state in ``_states`` (dropped with it)."""
        self._keys: dict[str, tuple[tuple[int, ...], tuple[object, ...] | None]] = {}
        """:attr:`placement_keys` (dropped with the node's state)."""
        self._names: list[str] | None = None
        self._interned: dict[tuple[object, ...], tuple[object, ...]] = {}
        self._next_id = 0
        self._rules = PodRules()
        """Claim key -> the GpuShare rules of the pod using it (claims of pods with rules)."""
        self.problems: dict[str, str] = {}
        """Object (``slice <name>`` / ``claim <ns/name>``) -> why it could not be read."""
        self.version = 0
        """Moves whenever a GPU or a share changes: a refused claim may fit now."""
        self.listeners: list[Callable[[str], None]] = []
        """Called with a claim's key after each event about it."""
        self.slices_synced = False
        self.claims_synced = False
        self._claim_events = 0
        """Moves with every claim event or slice change: :meth:`holders` is made again."""
        self._holders: tuple[int, dict[str, ClaimHolder]] | None = None

    # ---- reading -------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        return self.slices_synced and self.claims_synced

    def claim(self, key: str) -> Mapping[str, Any] | None:
        return self._claims.get(key)

    def node_names(self) -> list[str]:
        """The nodes with gpushare GPUs, by name (kept until a node comes or goes)."""
        if self._names is None:
            self._names = sorted(self._by_node)
        return self._names

    def signature(self, name: str, state: NodeState) -> tuple[object, ...] | None:
        """A key for :func:`gpu_signature` of node ``name``'s ``state`` (from
        :meth:`node_state`): ``(id,)``, one id per distinct signature, never reused (the
        placer remembers answers by it; Placer.node_cost). Computed once per state, since
        placement reads it for every node for every claim; None when the signature is."""
        if name in self._signatures:
            return self._signatures[name]
        signature = gpu_signature(state)
        key: tuple[object, ...] | None = None
        if signature is not None:
            key = self._interned.get(signature)
            if key is None:
                self._next_id += 1
                key = self._interned[signature] = (self._next_id,)
                if len(self._interned) > MAX_INTERNED:
                    self._interned.clear()  # ids go on rising: an old key never comes back
        self._signatures[name] = key
        return key

    def placement_view(
        self, name: str, *, tenancy_of: Callable[[str], str | None]
    ) -> tuple[NodeState, tuple[object, ...] | None]:
        """:meth:`node_state` and :meth:`signature` of node ``name`` in one call."""
        state = self._states.get(name)
        if state is None or name not in self._signatures:
            state = self.node_state(name, tenancy_of=tenancy_of)
        return state, self.signature(name, state)

    def placement_key(
        self, name: str, *, tenancy_of: Callable[[str], str | None]
    ) -> tuple[tuple[int, ...], tuple[object, ...] | None]:
        """Node ``name``'s entry of :attr:`placement_keys`, made when missing."""
        entry = self._keys.get(name)
        if entry is None:
            state, signature = self.placement_view(name, tenancy_of=tenancy_of)
            free = tuple(sorted((g.free_percent for g in state.gpus), reverse=True))
            entry = self._keys[name] = (free, signature)
        return entry

    @property
    def placement_keys(self) -> Mapping[str, tuple[tuple[int, ...], tuple[object, ...] | None]]:
        """Node -> (its GPUs' free gpuPercent largest first, :meth:`signature`), for the nodes
        that have not changed since :meth:`placement_key` made their entry (a node missing:
        ask it). An entry is a new object whenever its node changes. Placement reads this for
        hundreds of nodes per claim: a claim needing ``count`` GPUs with ``p`` percent each
        fits no node whose ``count``-th largest is below ``p``, and the signature finds the
        cost already known for the node's state (docs/dra.md, "Known limits")."""
        return self._keys

    @property
    def tenant_rules(self) -> Mapping[str, ShareRules]:
        """Claim key -> the GpuShare rules of its pod, for the claims whose pods have any
        (:func:`gpushare.cluster.state.share_rules.permitted` reads them as tenant rules)."""
        return self._rules.by_pod

    @property
    def blockers(self) -> set[str]:
        """The claims whose pods' rules keep other pods off their GPU (profiling, exclusive)."""
        return self._rules.blockers

    def set_claim_rules(self, key: str, rules: ShareRules) -> None:
        """The GpuShare rules of the pod using claim ``key`` (NO_RULES: none). Its tenant
        carries the measured profile from now on, and a claim it blocks may fit once they
        change."""
        if rules.share is None and rules.profile is None and not rules.constrains_gpus:
            rules = NO_RULES
        if not self._rules.put(key, rules):
            return
        for s in self._shares.get(key, ()):
            g = self._gpus.get((s.pool, s.device))
            if g is not None:
                self._changed(g.node)
        self.version += 1

    def gpu(self, node: str, uuid: str) -> DraGpu | None:
        return next((g for g in self._by_node.get(node, ()) if g.uuid == uuid), None)

    def shares_on(self, pool: str, device: str) -> list[ClaimShare]:
        return list(self._on_gpu.get((pool, device), {}).values())

    def node_state(self, name: str, *, tenancy_of: Callable[[str], str | None]) -> NodeState:
        """Node ``name``'s GPUs with the claims on them as tenants (kept until they change;
        ``tenancy_of`` maps a namespace to its tenancy, gpushare.packing.tenancy)."""
        state = self._states.get(name)
        if state is not None:
            return state
        gpus = []
        for g in sorted(self._by_node.get(name, ()), key=lambda g: g.index):
            shares = self._on_gpu.get((g.pool, g.device), {}).values()
            latency = any(s.gpu_class == CLASS_LATENCY for s in shares)
            tenants = [
                Tenant(
                    key=s.claim,
                    percent=s.percent,
                    memory_bytes=s.memory_bytes or g.memory_bytes * s.percent // SLICES_PER_GPU,
                    gpu_class=s.gpu_class,
                    tenancy=tenancy_of(s.namespace),
                    profile=self._rules.by_pod.get(s.claim, NO_RULES).profile,
                    thread_percent=_driver_cap(s, latency=latency),
                )
                for s in shares
            ]
            gpus.append(
                GpuState(
                    uuid=g.uuid,
                    memory_bytes=g.memory_bytes,
                    model=g.model,
                    index=g.index,
                    tenants=tenants,
                )
            )
        state = self._states[name] = NodeState(name=name, gpus=gpus)
        self._signatures.pop(name, None)
        return state

    def totals(self) -> tuple[int, int, int]:
        """(GPUs published, allocated claims on them, gpuPercent those claims consume): what
        the controller's metrics report of DRA mode."""
        return (
            len(self._gpus),
            len(self._shares),
            sum(s.percent for shares in self._shares.values() for s in shares),
        )

    def holders(self) -> Mapping[str, ClaimHolder]:
        """Pod key -> where the pod's allocated claims on our GPUs put it, for each pod their
        ``status.reservedFor`` names (the operator's reads of DRA-mode pods, ``ClusterView.
        claim_holders``). Made again only after a claim changed; pods on several GPUs get
        every GPU (the operator leaves them out, as annotated ones)."""
        if self._holders is not None and self._holders[0] == self._claim_events:
            return self._holders[1]
        out: dict[str, ClaimHolder] = {}
        for (pool, device), on_gpu in self._on_gpu.items():
            g = self._gpus.get((pool, device))
            if g is None or not on_gpu:
                continue
            latency = any(s.gpu_class == CLASS_LATENCY for s in on_gpu.values())
            for s in on_gpu.values():
                claim = self._claims.get(s.claim)
                if claim is None:
                    continue
                memory = s.memory_bytes or g.memory_bytes * s.percent // SLICES_PER_GPU
                for name, uid in reserved_pods(claim):
                    key = f"{s.namespace}/{name}"
                    held = out.get(key)
                    if held is not None and g.uuid in held.placement.gpu_uuids:
                        continue
                    placement = Placement(
                        gpu_uuids=(*(held.placement.gpu_uuids if held else ()), g.uuid),
                        thread_percent=_driver_cap(s, latency=latency),
                        memory_limit_bytes=memory,
                        bind_time=_created(claim),
                        state=STATE_ALLOCATED,
                        request_percent=s.percent,
                    )
                    out[key] = ClaimHolder(
                        pod_key=key,
                        pod_uid=uid,
                        node=g.node,
                        placement=placement,
                        gpu_class=s.gpu_class,
                    )
        self._holders = (self._claim_events, out)
        return out

    def _changed(self, node: str) -> None:
        """Node ``node``'s GPUs or shares changed: its state is built again when asked."""
        self._states.pop(node, None)
        self._keys.pop(node, None)

    def forget_states(self) -> None:
        """Build every node's state afresh (namespaces' tenancies changed)."""
        self._states.clear()
        self._signatures.clear()
        self._keys.clear()

    # ---- slices --------------------------------------------------------------------------

    def upsert_slice(self, obj: Mapping[str, Any]) -> None:
        name = str(_mapping(obj.get("metadata")).get("name", ""))
        try:
            gpus = read_slice(obj)
        except InvalidInputError as exc:
            self.problems[f"slice {name}"] = str(exc)
            gpus = None
        if gpus is None:
            self.delete_slice(obj)
            return
        self.problems.pop(f"slice {name}", None)
        self._set_slice(name, gpus)

    def delete_slice(self, obj: Mapping[str, Any]) -> None:
        name = str(_mapping(obj.get("metadata")).get("name", ""))
        if name in self._slices:
            self._set_slice(name, None)

    def replace_slices(self, objs: Iterable[Mapping[str, Any]]) -> None:
        seen = set()
        for obj in objs:
            seen.add(str(_mapping(obj.get("metadata")).get("name", "")))
            self.quarantine.take("ResourceSlice", obj, self.upsert_slice)
        for name in [n for n in self._slices if n not in seen]:
            self._set_slice(name, None)
        self.slices_synced = True

    def _set_slice(self, name: str, gpus: list[DraGpu] | None) -> None:
        old = self._slices.pop(name, [])
        if gpus is not None:
            self._slices[name] = gpus
        if old == (gpus or []):
            return
        for g in old:
            self._gpus.pop((g.pool, g.device), None)
            on_node = [x for x in self._by_node.get(g.node, []) if x is not g]
            if on_node:
                self._by_node[g.node] = on_node
            else:
                self._by_node.pop(g.node, None)
            self._changed(g.node)
        for g in gpus or []:
            self._gpus[(g.pool, g.device)] = g
            self._by_node.setdefault(g.node, []).append(g)
            self._changed(g.node)
        self._names = None
        self._claim_events += 1
        self.version += 1

    # ---- claims --------------------------------------------------------------------------

    def upsert_claim(self, obj: Mapping[str, Any]) -> None:
        key = claim_key(obj)
        old = self._claims.get(key)
        if old is not None and _older(obj, old):
            # The watch delivering a version before the one this process's own write returned
            # (the finalizer's update after the allocation's answer): it would drop the share
            # until the allocation's event came, and a claim placed meanwhile could take it.
            return
        self._claims[key] = obj
        self._claim_events += 1
        try:
            shares = read_allocation(obj)
            self.problems.pop(f"claim {key}", None)
        except InvalidInputError as exc:
            self.problems[f"claim {key}"] = str(exc)
            shares = []
        if shares or _allocated(obj):
            self._assumed.pop(key, None)
        elif key in self._assumed:
            shares = self._assumed[key]  # our allocation is being written: keep counting it
        self._set_shares(key, shares)
        for listener in self.listeners:
            listener(key)

    def assume(self, key: str, allocated: Mapping[str, Any]) -> None:
        """Count ``allocated`` (the claim with the allocation this process is writing) from
        now on, whatever older versions of the claim its watch still delivers, until a version
        with an allocation arrives or :meth:`forget_assumed` is called."""
        self._assumed[key] = read_allocation(allocated)
        self._set_shares(key, self._assumed[key])

    def assumed(self, key: str) -> bool:
        return key in self._assumed

    def forget_assumed(self, key: str) -> None:
        """The write failed: count the claim as last watched."""
        if self._assumed.pop(key, None) is None:
            return
        obj = self._claims.get(key)
        try:
            shares = read_allocation(obj) if obj is not None else []
        except InvalidInputError:
            shares = []
        self._set_shares(key, shares)

    def delete_claim(self, obj: Mapping[str, Any]) -> None:
        key = claim_key(obj)
        self._assumed.pop(key, None)
        self._claims.pop(key, None)
        self.problems.pop(f"claim {key}", None)
        self._set_shares(key, [])
        for listener in self.listeners:
            listener(key)

    def replace_claims(self, objs: Iterable[Mapping[str, Any]]) -> None:
        seen = set()
        for obj in objs:
            seen.add(claim_key(obj))
            self.quarantine.take("ResourceClaim", obj, self.upsert_claim)
        for key in [k for k in self._claims if k not in seen]:
            namespace, _, name = key.partition("/")
            self.delete_claim({"metadata": {"namespace": namespace, "name": name}})
        self.claims_synced = True

    def _set_shares(self, key: str, shares: list[ClaimShare]) -> None:
        self._claim_events += 1
        old = self._shares.get(key, [])
        if old == shares:
            return
        for s in old:
            self._on_gpu.get((s.pool, s.device), {}).pop(key, None)
        for s in shares:
            self._on_gpu.setdefault((s.pool, s.device), {})[key] = s
        if shares:
            self._shares[key] = shares
        else:
            self._shares.pop(key, None)
        for s in (*old, *shares):
            g = self._gpus.get((s.pool, s.device))
            if g is not None:
                self._changed(g.node)
        self.version += 1


__all__ = ["ClaimShare", "DraDevices", "DraGpu", "read_allocation", "read_slice"]
