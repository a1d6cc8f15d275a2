"""Which node and GPUs a claim gets: the search over the nodes that publish gpushare GPUs,
asking the extender's :class:`~gpushare.packing.placer.Placer` the cost of each, as
kube-scheduler's search asks the extender in device-plugin mode (docs/dra.md, "Who places a
claim"). Pure: no I/O. gpushare.cluster.dra.placement reads the claim's ask before and writes
its allocation after.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpushare.api.names import SLICES_PER_GPU
from gpushare.cluster.dra.devices import DraDevices, DraGpu
from gpushare.cluster.state.share_rules import NO_RULES, ShareRules, permitted
from gpushare.packing.model import Assignment, Demand, NodeState
from gpushare.packing.placer import Placer, best_node


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
    search = _Search(
        placer=placer,
        devices=devices,
        want=want,
        tenancy_of=tenancy_of,
        host_free=host_free,
        held=held,
        rules=rules,
        narrow=rules.constrains_gpus or bool(devices.blockers),
    )
    costs, examined = _costs(search, names, start=start, memo=memo, gone=gone)
    best = best_node(costs)
    assignment = None
    if best is not None:
        assignment = placer.choose_gpus(search.state_of(best, search.room(best)), want)
    if best is None or assignment is None:
        return _refusals(search, names, gone)
    gpus = tuple(devices.gpu(best, u) for u in assignment.gpu_uuids)
    if any(g is None for g in gpus):
        return {"the chosen GPU left its ResourceSlice": 1}
    return Choice(
        assignment=assignment, gpus=tuple(g for g in gpus if g is not None), examined=examined
    )


@dataclass(frozen=True)
class _Search:
    """One claim's search: what it reads of each node it looks at."""

    placer: Placer
    devices: DraDevices
    want: Demand
    tenancy_of: Callable[[str], str | None]
    host_free: Mapping[str, tuple[int, int]]
    held: Mapping[str, tuple[int, int]]
    rules: ShareRules
    narrow: bool
    """Some GPUs are ruled out (by the pod's rules or a placed claim's): each node is narrowed
    to the GPUs permitted before it is costed, and no cost is remembered."""

    def room(self, name: str) -> tuple[int, int] | None:
        """Node ``name``'s free host room less what placements not bound yet hold of it."""
        free = self.host_free.get(name)
        if free is not None and name in self.held:
            taken = self.held[name]
            free = (free[0] - taken[0], free[1] - taken[1])
        return free

    def state_of(self, name: str, free: tuple[int, int] | None) -> NodeState:
        """Node ``name`` as the placer costs it: its GPUs (the permitted ones when narrowed)
        and ``free`` host room."""
        state = self.devices.node_state(name, tenancy_of=self.tenancy_of)
        state.cpu_milli_free, state.memory_free_bytes = free if free is not None else (None, None)
        if self.narrow:
            state = permitted(state, rules=self.rules, tenant_rules=self.devices.tenant_rules)[0]
        return state


def _costs(
    search: _Search,
    names: list[str],
    *,
    start: int,
    memo: CostMemo | None,
    gone: Mapping[str, str],
) -> tuple[list[tuple[str, float]], int]:
    """The costs of nodes with room, visited from ``start`` until :func:`nodes_to_find` have
    room, and how many nodes were looked at. A demand without a profile, GPUs to avoid or
    narrowing ("plain") costs the same on every node in one state: ``memo`` keeps those."""
    placer, devices, want, held = search.placer, search.devices, search.want, search.held
    count = len(names)
    wanted = nodes_to_find(count)
    costs: list[tuple[str, float]] = []
    examined = count
    plain = want.profile is None and not want.avoid_gpus and not search.narrow
    known, seen = (memo or CostMemo()).for_demand(placer, want) if plain else ({}, {})
    added = 0
    keys, host_free = devices.placement_keys, search.host_free
    need, gpus_wanted = min(want.percent, SLICES_PER_GPU), want.gpus
    first = start % count if count else 0
    # Runs for hundreds of nodes per claim: every line here shows in the controller's profile.
    for offset, name in enumerate((*names[first:], *names[:first])):
        if gone and name in gone:
            continue
        current = keys.get(name) or devices.placement_key(name, tenancy_of=search.tenancy_of)
        free_gpus, signature = current
        if len(free_gpus) < gpus_wanted or free_gpus[gpus_wanted - 1] < need:
            continue  # not enough GPUs with this share free: the placer would say no
        free = host_free.get(name)
        last = seen.get(name)
        if last is not None and last[0] is current and last[1] is free and name not in held:
            cost = last[2]  # the node has not changed since this shape last met it
        elif plain and signature is not None:
            cost, grew = _shared_cost(
                search, name, current, free, known=known, seen=seen, new=last is None
            )
            added += grew
        else:
            kept = None if search.narrow else signature  # a narrowed node is not the signed one
            cost = placer.node_cost(search.state_of(name, search.room(name)), want, signature=kept)
        if cost is not None:
            costs.append((name, cost))
            if len(costs) >= wanted:
                examined = offset + 1
                break
    if memo is not None:
        memo.grew(added)
    return costs, examined


def _shared_cost(
    search: _Search,
    name: str,
    current: tuple[tuple[int, ...], tuple[object, ...] | None],
    free: tuple[int, int] | None,
    *,
    known: _Known,
    seen: _Seen,
    new: bool,
) -> tuple[float | None, int]:
    """A plain demand's cost on node ``name`` (its placement key ``current``): looked up by
    the node's state in ``known``, costed once per state, and remembered for the node in
    ``seen`` unless placements not bound yet hold some of its room. Also how many entries
    the memo grew by (``new``: the node was not in ``seen``)."""
    signature = current[1]
    added = 0
    held_here = name in search.held
    if held_here and free is not None:
        taken = search.held[name]
        free = (free[0] - taken[0], free[1] - taken[1])
    key = (signature, free)
    if key in known:
        cost = known[key]
    else:
        cost = known[key] = search.placer.node_cost(
            search.state_of(name, free), search.want, signature=signature
        )
        added += 1
    if not held_here:  # a held node's room is a new tuple each time: not kept
        seen[name] = (current, free, cost)
        added += new
    return cost, added


def _refusals(search: _Search, names: list[str], gone: Mapping[str, str]) -> dict[str, int]:
    """How many nodes refused the claim for each reason (what the pod's event says): the
    placer's refusal and, when narrowed, which GPUs the GpuShare rules ruled out."""
    placer, devices, want = search.placer, search.devices, search.want
    reasons: dict[str, int] = {}
    for name in names:
        if name in gone:
            reasons[gone[name]] = reasons.get(gone[name], 0) + 1
            continue
        state = search.state_of(name, search.room(name))
        ruled_out = None
        if search.narrow:
            full = devices.node_state(name, tenancy_of=search.tenancy_of)
            ruled_out = permitted(full, rules=search.rules, tenant_rules=devices.tenant_rules)[1]
        refusal = placer.refusal(state, want) if state.gpus else None
        parts = [r for r in (refusal, ruled_out) if r is not None]
        why = "; ".join(parts) or "no GPU has room"
        reasons[why] = reasons.get(why, 0) + 1
    return reasons or {"no node publishes gpushare GPUs (ResourceSlices)": 1}


__all__ = ["Choice", "CostMemo", "choose", "nodes_to_find"]
