"""Which GPU a claim gets: gpushare's placement policy for DRA claims, and the allocation the
controller writes for it. Pure: no I/O.

kube-scheduler's DRA allocator takes the first device with room (docs/dra.md, "Known limits").
For a pod carrying the ``gpushare.io/placement`` scheduling gate, the controller instead asks
the same :class:`~gpushare.packing.placer.Placer` the extender asks in device-plugin mode (cost
per node, ties by name, then the GPU on that node), writes the claim's ``status.allocation`` as
kube-scheduler would (results with a ``shareID`` and ``consumedCapacity``, the configs, a node
selector) and removes the gate. kube-scheduler then only binds the pod to that node; its
allocator counts the allocation like its own.

gpushare places the claims it can read completely: one request of the DeviceClass it serves,
asking ``count`` devices and ``gpuPercent``/``memory`` capacity. A claim with CEL selectors,
``firstAvailable``, admin access or another allocation mode is left to kube-scheduler
(:func:`read_ask` says why), since its allocator evaluates what the controller cannot.
"""

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpushare.api.dra import (
    CAPACITY_GPU_PERCENT,
    CAPACITY_MEMORY,
    DRIVER,
    MpsConfig,
    allocation_configs,
    config_for,
)
from gpushare.api.errors import InvalidInputError
from gpushare.api.names import SLICES_PER_GPU
from gpushare.api.quantities import parse_memory
from gpushare.cluster.dra.devices import DraDevices, DraGpu
from gpushare.cluster.state.share_rules import NO_RULES, ShareRules, permitted
from gpushare.packing.model import Assignment, Demand, NodeState
from gpushare.packing.placer import Placer, best_node

MAX_COUNT = 32
"""Most devices one request may ask gpushare to place (the API allows 32 per claim)."""
FINALIZER = "resource.kubernetes.io/delete-protection"
"""What kube-scheduler puts on a claim it allocates: kube-controller-manager removes it (and
the allocation) once no pod uses the claim, so a deleted claim stays until it is unprepared."""


@dataclass(frozen=True)
class ClaimAsk:
    """What a claim asks of gpushare's DeviceClass, read completely."""

    request: str
    count: int
    percent: int
    memory: str | None
    """The ``memory`` capacity request as the API server stored it; None: not asked."""
    memory_bytes: int | None
    config: MpsConfig


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def read_ask(
    claim: Mapping[str, Any],
    *,
    device_class: str,
    class_configs: Sequence[Mapping[str, Any]] = (),
) -> ClaimAsk | str:
    """The claim's ask, or why kube-scheduler places it instead (a sentence). Its MPS config
    is the DeviceClass's ``class_configs`` overridden by the claim's own, as the driver reads
    the allocation."""
    devices = _mapping(_mapping(claim.get("spec")).get("devices"))
    requests = devices.get("requests")
    if not isinstance(requests, list) or len(requests) != 1:
        return "it has more than one request"
    request = _mapping(requests[0])
    exactly = _mapping(request.get("exactly"))
    if not exactly:
        return "its request is not 'exactly' (firstAvailable)"
    if exactly.get("deviceClassName") != device_class:
        return f"its request is not of DeviceClass {device_class}"
    if exactly.get("selectors"):
        return "its request has CEL selectors"
    if exactly.get("adminAccess"):
        return "its request asks for admin access"
    if exactly.get("allocationMode", "ExactCount") != "ExactCount":
        return "its request's allocationMode is not ExactCount"
    if devices.get("constraints"):
        return "it has constraints"
    count = exactly.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_COUNT:
        return "its count is not 1..32"
    capacity = _mapping(_mapping(exactly.get("capacity")).get("requests"))
    text = str(capacity.get(CAPACITY_GPU_PERCENT, SLICES_PER_GPU)).strip()
    if not text.isdigit() or len(text) > 4 or not 1 <= int(text) <= SLICES_PER_GPU:
        return f"its {CAPACITY_GPU_PERCENT} is not a whole 1..100"
    percent = int(text)
    if count > 1 and percent < SLICES_PER_GPU:
        return "it asks for a share of several devices"
    memory = capacity.get(CAPACITY_MEMORY)
    try:
        memory_bytes = (
            None if memory is None else parse_memory(str(memory), field="capacity.memory")
        )
        configs = allocation_configs(
            {"config": [dict(c) for c in class_configs]}, field="DeviceClass spec.config"
        ) + allocation_configs(devices, field="spec.devices.config")
        config = config_for(str(request.get("name", "")), configs)
    except InvalidInputError as exc:
        return f"it cannot be read: {exc}"
    if config.limit is not None and config.limit < percent:
        return "its MpsConfig limit is below its gpuPercent (the driver refuses it)"
    return ClaimAsk(
        request=str(request.get("name", "")),
        count=count,
        percent=percent,
        memory=None if memory is None else str(memory),
        memory_bytes=memory_bytes,
        config=config,
    )


def demand(ask: ClaimAsk, *, cpu_milli: int, memory_bytes: int, tenancy: str | None) -> Demand:
    """The placer's demand for ``ask`` from a pod requesting ``cpu_milli``/``memory_bytes`` of
    its host, in ``tenancy`` (a whole GPU per device when ``count`` > 1)."""
    return Demand(
        percent=SLICES_PER_GPU if ask.count > 1 else ask.percent,
        limit_percent=ask.config.limit,
        memory_bytes=ask.memory_bytes if ask.count == 1 else None,
        gpu_class=ask.config.gpu_class,
        gpus=ask.count,
        cpu_milli=cpu_milli,
        host_memory_bytes=memory_bytes,
        tenancy=tenancy,
    )


@dataclass(frozen=True)
class Choice:
    """Where the claim goes: the placer's assignment and our devices for its GPUs."""

    assignment: Assignment
    gpus: tuple[DraGpu, ...]
    examined: int = 0
    """Nodes looked at (where the next claim's search starts, as kube-scheduler rotates)."""


_NOTHING_HELD: Mapping[str, tuple[int, int]] = {}
_NO_NODE_GONE: Mapping[str, str] = {}
MEMO_LIMIT = 400_000
"""Costs a :class:`CostMemo` keeps before it starts over."""


_Known = dict[tuple[object, ...], float | None]
_Seen = dict[str, tuple[object, object, float | None]]


class CostMemo:
    """Costs of demands without a profile by node state, kept across claims.

    Such a demand costs the same on every node in one state: GPU signature
    (:meth:`DraDevices.signature`) and free host room (:meth:`Placer.node_cost` says why).
    Between two claims only the nodes they landed on change, while the search looks at
    hundreds per claim (42 % of 1,000 nodes, more once they fill). So, per claim shape:

    - ``known``: cost by (signature, free room), shared by the nodes in one state;
    - ``seen``: node -> (its :attr:`DraDevices.placement_keys` entry, its free-room tuple,
      cost) when last costed. While both are the same objects the node has not changed, and
      its cost is one lookup by name: no tuple of the state is built and hashed (what the
      extender keeps per node too, gpushare.cluster.extender.answers).

    Everything is dropped when the placer's answers may change (its pod mix refit) or past
    MEMO_LIMIT (docs/dra.md, "Known limits")."""

    def __init__(self) -> None:
        self._version: int | None = None
        self._by_demand: dict[Demand, tuple[_Known, _Seen]] = {}
        self._size = 0

    def for_demand(self, placer: Placer, want: Demand) -> tuple[_Known, _Seen]:
        """(known, seen) for ``want``: fill in what is missing, then say how many with
        :meth:`grew`."""
        if self._version != placer.version or self._size > MEMO_LIMIT:
            self._by_demand.clear()
            self._size = 0
            self._version = placer.version
        memo = self._by_demand.get(want)
        if memo is None:
            memo = self._by_demand[want] = ({}, {})
        return memo

    def grew(self, added: int) -> None:
        self._size += added


MIN_FEASIBLE_NODES = 100
"""kube-scheduler's minFeasibleNodesToFind."""
MIN_FEASIBLE_PERCENT = 5
"""kube-scheduler's minFeasibleNodesPercentageToFind."""
BASE_PERCENT = 50
"""kube-scheduler's basePercentageOfNodesToScore (its adaptive default)."""


def nodes_to_find(total: int) -> int:
    """How many nodes with room the search collects before it picks the cheapest: what
    kube-scheduler's default (adaptive ``percentageOfNodesToScore``) hands the extender in
    device-plugin mode, so a claim is chosen among as many nodes as an annotated pod is
    (all of them up to 100 nodes; 42 % of 1,000)."""
    if total < MIN_FEASIBLE_NODES:
        return total
    percent = max(BASE_PERCENT - total // 125, MIN_FEASIBLE_PERCENT)
    return max(total * percent // 100, MIN_FEASIBLE_NODES)


def choose(
    placer: Placer,
    devices: DraDevices,
    want: Demand,
    *,
    tenancy_of: Callable[[str], str | None],
    host_free: Mapping[str, tuple[int, int]],
    held: Mapping[str, tuple[int, int]] = _NOTHING_HELD,
    start: int = 0,
    memo: CostMemo | None = None,
    rules: ShareRules = NO_RULES,
    gone: Mapping[str, str] = _NO_NODE_GONE,
) -> Choice | dict[str, int]:
    """The cheapest node and its GPUs for ``want``, or, when no node has room, how many nodes
    refused for each reason (what the pod's event says).

    Like kube-scheduler's search for the extender, nodes are visited from ``start`` (the
    caller rotates it by :attr:`Choice.examined`) until :func:`nodes_to_find` have room; the
    cheapest of those wins, ties to the name that sorts first. ``host_free``: each node's free
    (milli-CPU, memory bytes), a node missing when its status does not say; ``held``: what
    placements not bound yet take of a node on top. ``memo``: the costs of earlier searches,
    kept by the caller across claims (:class:`CostMemo`). Both are mappings, not calls: the
    search reads them for hundreds of nodes per claim. A node whose GPUs lack the share
    (:attr:`DraDevices.placement_keys`) is passed over without asking the placer: it counts
    as looked at, as kube-scheduler's filter counts it, but costs a dict lookup.

    ``rules``: the pod's GpuShare rules. When they, or those of a claim already placed (a pod
    profiling alone, an exclusive share), keep a pod off some GPUs, each node is narrowed to
    the GPUs the rules permit before it is costed, as the extender narrows it
    (gpushare.cluster.state.share_rules), and no cost is remembered: the answer then depends
    on the pod.

    ``gone``: nodes whose agent is gone (its Lease expired, gpushare.cluster.state.agents) and
    why; they get no claim."""
    names = devices.node_names()
    count = len(names)
    wanted = nodes_to_find(count)
    costs: list[tuple[str, float]] = []
    examined = count
    tenant_rules = devices.tenant_rules
    narrow = rules.constrains_gpus or bool(devices.blockers)
    plain = want.profile is None and not want.avoid_gpus and not narrow
    known, seen = (memo or CostMemo()).for_demand(placer, want) if plain else ({}, {})
    added = 0
    keys = devices.placement_keys
    need, gpus_wanted = min(want.percent, SLICES_PER_GPU), want.gpus

    def room(name: str) -> tuple[int, int] | None:
        free = host_free.get(name)
        if free is not None and name in held:
            taken = held[name]
            free = (free[0] - taken[0], free[1] - taken[1])
        return free

    def state_of(name: str, free: tuple[int, int] | None) -> NodeState:
        state = devices.node_state(name, tenancy_of=tenancy_of)
        state.cpu_milli_free, state.memory_free_bytes = free if free is not None else (None, None)
        if narrow:
            state = permitted(state, rules=rules, tenant_rules=tenant_rules)[0]
        return state

    first = start % count if count else 0
    # Runs for hundreds of nodes per claim: every line here shows in the controller's profile.
    for offset, name in enumerate((*names[first:], *names[:first])):
        if gone and name in gone:
            continue
        current = keys.get(name) or devices.placement_key(name, tenancy_of=tenancy_of)
        free_gpus, signature = current
        if len(free_gpus) < gpus_wanted or free_gpus[gpus_wanted - 1] < need:
            continue  # not enough GPUs with this share free: the placer would say no
        free = host_free.get(name)
        last = seen.get(name)
        if last is not None and last[0] is current and last[1] is free and name not in held:
            cost = last[2]  # the node has not changed since this shape last met it
        elif plain and signature is not None:
            held_here = name in held
            if held_here and free is not None:
                taken = held[name]
                free = (free[0] - taken[0], free[1] - taken[1])
            key = (signature, free)
            if key in known:
                cost = known[key]
            else:
                cost = known[key] = placer.node_cost(
                    state_of(name, free), want, signature=signature
                )
                added += 1
            if not held_here:  # a held node's room is a new tuple each time: not kept
                seen[name] = (current, free, cost)
                added += last is None
        else:
            kept = None if narrow else signature  # a narrowed node is not the signed one
            cost = placer.node_cost(state_of(name, room(name)), want, signature=kept)
        if cost is not None:
            costs.append((name, cost))
            if len(costs) >= wanted:
                examined = offset + 1
                break
    if memo is not None:
        memo.grew(added)
    best = best_node(costs)
    assignment = None
    if best is not None:
        assignment = placer.choose_gpus(state_of(best, room(best)), want)
    if best is None or assignment is None:
        reasons: dict[str, int] = {}
        for name in names:
            if name in gone:
                reasons[gone[name]] = reasons.get(gone[name], 0) + 1
                continue
            state = state_of(name, room(name))
            ruled_out = None
            if narrow:
                full = devices.node_state(name, tenancy_of=tenancy_of)
                ruled_out = permitted(full, rules=rules, tenant_rules=tenant_rules)[1]
            refusal = placer.refusal(state, want) if state.gpus else None
            parts = [r for r in (refusal, ruled_out) if r is not None]
            why = "; ".join(parts) or "no GPU has room"
            reasons[why] = reasons.get(why, 0) + 1
        return reasons or {"no node publishes gpushare GPUs (ResourceSlices)": 1}
    gpus = tuple(devices.gpu(best, u) for u in assignment.gpu_uuids)
    if any(g is None for g in gpus):
        return {"the chosen GPU left its ResourceSlice": 1}
    return Choice(
        assignment=assignment, gpus=tuple(g for g in gpus if g is not None), examined=examined
    )


def allocation(
    claim: Mapping[str, Any],
    ask: ClaimAsk,
    choice: Choice,
    *,
    class_configs: Sequence[Mapping[str, Any]] = (),
    share_id: Callable[[], str] = lambda: str(uuid.uuid4()),
) -> dict[str, Any]:
    """``status.allocation`` for ``claim``, as kube-scheduler writes one: a result per device
    (a fresh ``shareID``, the consumed capacity), the DeviceClass's configs then the claim's,
    and a node selector naming the chosen node."""
    consumed = {
        CAPACITY_GPU_PERCENT: str(ask.percent),
        CAPACITY_MEMORY: ask.memory if ask.memory is not None and ask.count == 1 else "0",
    }
    results = [
        {
            "request": ask.request,
            "driver": DRIVER,
            "pool": g.pool,
            "device": g.device,
            "shareID": share_id(),
            "consumedCapacity": dict(consumed),
        }
        for g in choice.gpus
    ]
    configs = [
        {"source": "FromClass", "requests": [ask.request], **_config_body(c)} for c in class_configs
    ]
    spec_configs = _mapping(_mapping(claim.get("spec")).get("devices")).get("config")
    for c in spec_configs if isinstance(spec_configs, list) else ():
        entry = _mapping(c)
        configs.append({"source": "FromClaim", **_config_body(entry), **_requests(entry)})
    out: dict[str, Any] = {
        "devices": {"results": results},
        "nodeSelector": {
            "nodeSelectorTerms": [
                {
                    "matchFields": [
                        {
                            "key": "metadata.name",
                            "operator": "In",
                            "values": [choice.assignment.node],
                        }
                    ]
                }
            ]
        },
    }
    if configs:
        out["devices"]["config"] = configs
    return out


def _config_body(entry: Mapping[str, Any]) -> dict[str, Any]:
    return {"opaque": dict(_mapping(entry.get("opaque")))}


def _requests(entry: Mapping[str, Any]) -> dict[str, Any]:
    requests = entry.get("requests")
    return {"requests": list(requests)} if isinstance(requests, list) and requests else {}


def pod_claim_names(pod: Mapping[str, Any]) -> Iterable[tuple[str, str | None]]:
    """(pod claim name, ResourceClaim name) of each of the pod's claims; the name is None for a
    claim from a template that kube-controller-manager has not made yet."""
    spec, status = _mapping(pod.get("spec")), _mapping(pod.get("status"))
    made = {
        str(_mapping(s).get("name")): _mapping(s).get("resourceClaimName")
        for s in status.get("resourceClaimStatuses") or []
        if isinstance(s, Mapping)
    }
    for raw in spec.get("resourceClaims") or []:
        entry = _mapping(raw)
        name = str(entry.get("name", ""))
        direct = entry.get("resourceClaimName")
        if isinstance(direct, str) and direct:
            yield name, direct
        else:
            made_name = made.get(name)
            yield name, made_name if isinstance(made_name, str) and made_name else None


__all__ = [
    "FINALIZER",
    "Choice",
    "ClaimAsk",
    "CostMemo",
    "allocation",
    "choose",
    "demand",
    "nodes_to_find",
    "pod_claim_names",
    "read_ask",
]
