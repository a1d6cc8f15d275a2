"""The gpushare policy's node cost from what is kept per node state and per pod shape: the same
float as :meth:`gpushare.packing.placer.Placer.node_cost` (the reference), worked out without
walking the node's tenants again.

At 1,000 nodes the scale bench's pods come in a few dozen shapes, and each bind changes one
node, which every shape then meets again: the controller spent most of its filter time working
out costs of nodes it had seen one pod earlier (docs/scale.md, "The placement path in one
process"). For a pod without a profile, on a node none of whose tenants has a profile or runs
opportunistically, the reference's cost (:func:`gpushare.packing.policy.node_cost` under the
gpushare policy: :func:`~gpushare.packing.fragmentation.placement_options`, then the cheapest
option's :func:`~gpushare.packing.policy.base_cost`) depends only on

- the node's GPUs' signatures (:meth:`~gpushare.packing.model.GpuState.signature`), which say
  which GPUs the pod fits on and the node's free shares;
- where its free CPU falls, before and after the pod, among the workload's CPU demands (all
  :meth:`~gpushare.packing.fragmentation.Workload.fragmentation` reads of it);
- the node's free CPU and memory themselves, through the stranded share, one term that every
  option of the node shares.

So the options' other terms are kept per (pod shape without its CPU and memory, node GPU
signature, the two CPU ranks) and the stranded term is added per call, in the reference's
order of operations: every cost is the reference's float, bit for bit (tests compare them on
synthetic nodes and the openb traces). The whole cost is also kept per pod shape and node state
(:attr:`NodeFacts.state`): nodes in one state -- a fresh cluster's empty nodes, nodes holding the
same pods -- cost one computation per shape (docs/scale.md, "Costs kept per node state").

Whatever this module cannot read -- a profile, GPUs the pod avoids, opportunistic tenants or
pods that may go beyond a GPU, multi-GPU fractions, other policies -- is left to the reference
(:meth:`QuickCosts.reads` and :meth:`QuickCosts.facts` say so, and the caller asks the
reference).
"""

import bisect
from collections.abc import Mapping
from dataclasses import replace

from gpushare.api.names import SLICES_PER_GPU
from gpushare.packing.fit import gpu_fit, gpus_fit_reason
from gpushare.packing.fragmentation import Workload, moved_shares
from gpushare.packing.model import Demand, GpuState, NodeState
from gpushare.packing.policy import BEST_FIT_WEIGHT, LOOKAHEAD_WEIGHT, STRANDING_WEIGHT

INTERN_LIMIT = 200_000
"""GPU and node signatures given a number before every number (and what was kept by them) is
dropped and handed out afresh."""
PARTS_LIMIT = 400_000
"""Kept option terms (pod shape x node signature x CPU ranks) before all are dropped."""
STATE_COSTS_LIMIT = 400_000
"""Kept costs (pod shape x node state) before all are dropped."""

State = tuple[int, int, int | None, int | None]
"""A node's state as a pod's cost reads it: (epoch, node signature number, free CPU, free
memory)."""
Parts = tuple[tuple[float, float, float], ...] | None
"""Per option of a node: (fragmentation change, weighted waste change, weighted free share
after); None where the pod does not fit the node's GPUs."""


class NodeFacts:
    """What :class:`QuickCosts` reads of one node in one state: its free CPU and memory, its
    GPUs' free shares, and numbers standing for its GPUs' signatures. The caller keeps it as
    long as the node does not change (the view's node version); :meth:`QuickCosts.facts`
    makes it."""

    __slots__ = (
        "before",
        "cpu",
        "epoch",
        "free",
        "gpus",
        "key",
        "memory",
        "model",
        "points",
        "rank",
        "state",
        "strand",
        "total",
        "workload",
    )

    def __init__(
        self,
        *,
        cpu: int | None,
        memory: int | None,
        free: tuple[int, ...],
        model: str,
        gpus: tuple[tuple[int, int, int], ...],
        key: int,
        epoch: int,
    ) -> None:
        self.cpu = cpu
        self.memory = memory
        self.free = free
        """Free shares of the healthy GPUs, ascending (what fragmentation reads)."""
        self.total = sum(free)
        self.model = model
        self.gpus = gpus
        """(GPU signature number, its free share, how many GPUs have it), in the order the
        GPUs first appear on the node."""
        self.key = key
        """Number of the node's GPU model and GPU signatures (equal exactly when they are)."""
        self.epoch = epoch
        self.state = (epoch, key, cpu, memory)
        """Everything the cost of a pod on the node reads (:meth:`QuickCosts.cost`): nodes in
        one state cost the same for every pod."""
        # Read from the workload on first use (and again after a refit changed it).
        self.workload: Workload | None = None
        self.points: tuple[int, ...] = ()
        self.rank: int | None = None
        self.before = 0.0
        self.strand = 0.0

    def read(self, workload: Workload) -> None:
        """What depends on the workload: the CPU rank, fragmentation and stranded share."""
        self.workload = workload
        self.points = workload.cpu_points(self.model)
        self.rank = None if self.cpu is None else bisect.bisect_right(self.points, self.cpu)
        self.before = workload.fragmentation(self.free, self.cpu, self.model)
        self.strand = workload.stranded(self.total, self.cpu, self.memory)


class _Shape:
    """A pod shape's GPU part (the demand without CPU and memory) and what is kept for it."""

    __slots__ = ("demand", "fits", "parts", "percent", "reasons")

    def __init__(self, demand: Demand) -> None:
        self.demand = demand
        self.percent = min(demand.percent, SLICES_PER_GPU)
        self.fits: dict[int, bool] = {}
        """GPU signature number -> whether the pod fits a GPU with it."""
        self.parts: dict[tuple[int, int | None, int | None], Parts] = {}
        self.reasons: dict[int, str | None] = {}
        """Node signature number -> why the pod fits none of its GPUs (None: one fits)."""


class _Asked:
    """A pod shape with its CPU and memory: its GPU part and its cost by node state."""

    __slots__ = ("costs", "shape")

    def __init__(self, shape: _Shape) -> None:
        self.shape = shape
        self.costs: dict[State, float | None] = {}


UNKNOWN = float("nan")
"""Told apart by identity (``is``): no cost kept for the state yet (a kept one is a float or
None)."""


class QuickCosts:
    """Node costs of the gpushare policy from :class:`NodeFacts` (module doc), for one
    workload at a time: a refit's new workload drops what was kept for the old one."""

    def __init__(self) -> None:
        self._gpu_ids: dict[tuple[object, ...], int] = {}
        self._gpus: list[GpuState] = []
        """By signature number: a copy of the first GPU met with it (what fits it is asked
        of; GPUs with one signature are interchangeable for the pods read here)."""
        self._node_ids: dict[tuple[object, ...], int] = {}
        self._shapes: dict[Demand, _Shape] = {}
        self._by_demand: dict[Demand, _Asked] = {}
        self._workload: Workload | None = None
        self._kept = 0
        self._costs_kept = 0
        self.epoch = 0
        """Bumped when the signature numbers start over: facts of an older epoch are stale."""

    def forget_shapes(self) -> None:
        """Forget what was kept per pod shape (facts made before stay good)."""
        self._shapes.clear()
        self._by_demand.clear()
        self._kept = 0
        self._costs_kept = 0

    def clear(self) -> None:
        """Forget everything (numbers start over; facts made before are stale)."""
        self._gpu_ids.clear()
        self._gpus.clear()
        self._node_ids.clear()
        self._shapes.clear()
        self._by_demand.clear()
        self._kept = 0
        self._costs_kept = 0
        self.epoch += 1

    @staticmethod
    def reads(demand: Demand) -> bool:
        """True when :meth:`cost` answers for ``demand`` (the caller has checked the policy is
        gpushare and the pod may not go beyond a GPU's guaranteed capacity): no profile, no
        GPU avoided by name; whole GPUs, one GPU's fraction, or no GPU at all (a pod placed
        by its CPU and memory)."""
        if demand.profile is not None or demand.avoid_gpus:
            return False
        if demand.percent == 0 and demand.gpus == 0:
            return True
        return demand.percent > 0 and (demand.gpus == 1 or (demand.gpus > 1 and demand.whole))

    def facts(self, node: NodeState) -> NodeFacts | None:
        """What :meth:`cost` reads of ``node`` now; None when it cannot read the node (no
        GPUs, or a tenant with a measured profile or running opportunistically: the
        reference then decides)."""
        if not node.gpus:
            return None
        if (
            len(self._gpu_ids) + len(node.gpus) > INTERN_LIMIT
            or len(self._node_ids) >= INTERN_LIMIT
        ):
            self.clear()
        counts: dict[int, int] = {}
        shares: dict[int, int] = {}
        free: list[int] = []
        ids = self._gpu_ids
        for gpu in node.gpus:
            signature = gpu.signature()
            if signature is None:
                return None
            number = ids.get(signature)
            if number is None:
                number = ids[signature] = len(ids)
                self._gpus.append(replace(gpu, tenants=list(gpu.tenants)))
            counts[number] = counts.get(number, 0) + 1
            share = SLICES_PER_GPU - gpu.totals()[0]
            shares[number] = share
            if gpu.healthy:
                free.append(share)
        free.sort()
        model = node.gpus[0].model
        node_signature = (model, tuple(sorted(counts.items())))
        key = self._node_ids.get(node_signature)
        if key is None:
            key = self._node_ids[node_signature] = len(self._node_ids)
        return NodeFacts(
            cpu=node.cpu_milli_free,
            memory=node.memory_free_bytes,
            free=tuple(free),
            model=model,
            gpus=tuple((n, shares[n], c) for n, c in counts.items()),
            key=key,
            epoch=self.epoch,
        )

    def cost(self, facts: NodeFacts, demand: Demand, workload: Workload) -> float | None:
        """The reference's cost of ``demand`` on the node ``facts`` were made of (None: it does
        not fit), under ``workload``. The caller has checked :meth:`reads` and that ``facts``
        is of this epoch. Kept per pod shape and node state (:attr:`NodeFacts.state`): a pod
        shape first met is asked about hundreds of nodes per filter call, most of them in a
        few states (empty, or holding the same few pods)."""
        if facts.epoch != self.epoch:
            raise ValueError("node facts of an earlier epoch: make them again (QuickCosts.facts)")
        asked = self._asked_under(demand, workload)
        costs = asked.costs
        known = costs.get(facts.state, UNKNOWN)
        if known is not UNKNOWN:
            return known
        value = self._cost(facts, demand, asked.shape, workload)
        if self._costs_kept >= STATE_COSTS_LIMIT:
            for other in self._by_demand.values():
                other.costs.clear()
            self._costs_kept = 0
        costs[facts.state] = value
        self._costs_kept += 1
        return value

    def kept(self, demand: Demand, workload: Workload) -> Mapping[State, float | None]:
        """:meth:`cost` of ``demand`` by :attr:`NodeFacts.state` as kept so far (:data:`UNKNOWN`
        where not): a caller asking about hundreds of nodes reads it once and each node's cost
        with one dict lookup, asking :meth:`cost` only for states not in it."""
        return self._asked_under(demand, workload).costs

    def _asked_under(self, demand: Demand, workload: Workload) -> _Asked:
        if workload is not self._workload:
            if self._workload is not None and workload.basis is self._workload.basis:
                # Only the prices moved: the options' terms stay, the costs go.
                for other in self._by_demand.values():
                    other.costs.clear()
            else:
                self._shapes.clear()
                self._by_demand.clear()
                self._kept = 0
            self._workload = workload
            self._costs_kept = 0
        asked = self._by_demand.get(demand)
        return asked if asked is not None else self._asked(demand)

    def _cost(
        self, facts: NodeFacts, demand: Demand, shape: _Shape, workload: Workload
    ) -> float | None:
        """:meth:`cost` worked out."""
        cpu, memory = facts.cpu, facts.memory
        if cpu is not None and demand.cpu_milli > cpu:
            return None
        if memory is not None and demand.host_memory_bytes > memory:
            return None
        if facts.workload is not workload:
            facts.read(workload)
        cpu_after = None if cpu is None else cpu - demand.cpu_milli
        rank = None if cpu_after is None else bisect.bisect_right(facts.points, cpu_after)
        key = (facts.key, facts.rank, rank)
        parts = shape.parts.get(key)
        if parts is None and key not in shape.parts:
            parts = self._parts(shape, facts, cpu_after, workload)
            if self._kept >= PARTS_LIMIT:
                for kept in self._shapes.values():
                    kept.parts.clear()
                self._kept = 0
            shape.parts[key] = parts
            self._kept += 1
        if parts is None:
            return None
        # placement_options' strand term, shared by every option of the node.
        memory_after = None if memory is None else memory - demand.host_memory_bytes
        strand = STRANDING_WEIGHT * (
            workload.stranded(facts.total - shape.percent * demand.gpus, cpu_after, memory_after)
            - facts.strand
        )
        # base_cost's order of operations: (((frag + strand) + waste) + best fit) + price.
        price = workload.prices.get(facts.model, 0.0) * (shape.percent * demand.gpus)
        return min(frag + strand + waste + fit + price for frag, waste, fit in parts)

    def gpu_reason(self, facts: NodeFacts, node: NodeState, demand: Demand) -> str | None:
        """:func:`~gpushare.packing.fit.gpus_fit_reason` of ``demand`` on ``node`` (which
        ``facts`` are of), kept per pod shape without its CPU and memory and node GPU
        signature: the words name no GPU and no number of one (the caller has checked
        :meth:`reads`)."""
        if facts.epoch != self.epoch:
            raise ValueError("node facts of an earlier epoch: make them again (QuickCosts.facts)")
        asked = self._by_demand.get(demand)
        if asked is None:
            asked = self._asked(demand)
        reasons = asked.shape.reasons
        reason = reasons.get(facts.key)
        if reason is None and facts.key not in reasons:
            reason = reasons[facts.key] = gpus_fit_reason(node, demand)
        return reason

    def _asked(self, demand: Demand) -> _Asked:
        gpu_part = replace(demand, cpu_milli=0, host_memory_bytes=0)
        shape = self._shapes.get(gpu_part)
        if shape is None:
            shape = self._shapes[gpu_part] = _Shape(gpu_part)
        if len(self._by_demand) >= INTERN_LIMIT:
            self._by_demand.clear()
            self._costs_kept = 0
        asked = self._by_demand[demand] = _Asked(shape)
        return asked

    def _parts(
        self, shape: _Shape, facts: NodeFacts, cpu_after: int | None, workload: Workload
    ) -> Parts:
        """The options' terms as placement_options and base_cost work them out."""
        demand, percent = shape.demand, shape.percent
        model, free, before = facts.model, facts.free, facts.before
        if not demand.gpus:  # no GPU: only the node's free CPU (and memory) changes
            after = workload.fragmentation(free, cpu_after, model)
            return ((after - before, LOOKAHEAD_WEIGHT * 0.0, BEST_FIT_WEIGHT * 0),)
        fits = shape.fits
        whole = demand.whole
        fitting: list[int] = []  # free shares of the options, as placement_options finds them
        idle = 0
        for number, share, count in facts.gpus:
            if share < percent:
                continue
            fit = fits.get(number)
            if fit is None:
                fit = fits[number] = gpu_fit(self._gpus[number], demand)[0] is None
            if not fit:
                continue
            if whole:
                idle += count
            elif share not in fitting:
                fitting.append(share)
        waste = workload.waste_table(model)
        if whole:
            gpus = demand.gpus
            if idle < gpus:
                return None
            after = workload.fragmentation(
                moved_shares(free, SLICES_PER_GPU, 0, gpus), cpu_after, model
            )
            return (
                (
                    after - before,
                    LOOKAHEAD_WEIGHT * (-gpus * waste[SLICES_PER_GPU]),
                    BEST_FIT_WEIGHT * 0,
                ),
            )
        if not fitting:
            return None
        parts = []
        for share in fitting:
            after = workload.fragmentation(
                moved_shares(free, share, share - percent), cpu_after, model
            )
            parts.append(
                (
                    after - before,
                    LOOKAHEAD_WEIGHT * (waste[share - percent] - waste[share]),
                    BEST_FIT_WEIGHT * (share - percent),
                )
            )
        return tuple(parts)
