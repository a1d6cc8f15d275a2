"""Which node and which GPUs: the one placement decision gpushare makes.

The scheduler extender (filter, prioritize, bind) and the openb simulator (``bench/sim``) both
ask a :class:`Placer`, so what the simulator reports is what the installed extender does
(docs/packing.md, "One placement path"):

- :meth:`Placer.node_cost` is the policy's exact cost of placing a pod on a node (lower is
  better; None when it does not fit), measured against the pod mix the placer learned
  (:class:`~gpushare.packing.mix.PodMix`, fed by the controller's pod watch);
- :func:`best_node` ranks candidates by that cost, ties to the node whose name sorts first, so
  the answer does not depend on the order kube-scheduler lists the nodes in;
- :func:`rank_scores` turns the same ranking into kube-scheduler's 0-10 extender scores;
- :meth:`Placer.choose_gpus` picks the GPU(s) on the chosen node;
- with an :class:`~gpushare.packing.admission.Admission`, GPUs where the pod or a tenant there
  would be predicted past its class bound are left out of all of these, and
  :meth:`Placer.refusal` says why a node has no room;
- a pod is placed by its guaranteed share against the guaranteed tenants only: opportunistic
  tenants in its way are named in ``Assignment.pause`` (their compute) and
  ``Assignment.evict`` (memory or MPS clients it needs); a pod that opted in is placed beside
  every tenant and preempts nobody (no preemption among equals); with an
  :class:`~gpushare.packing.opportunistic.Opportunism`, an opted-in pod no node has room for
  may go beyond a GPU's guaranteed capacity (``Assignment.opportunistic``), ranked after every
  guaranteed option (docs/packing.md, "The sharing contract").
"""

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Generic, TypeVar

from gpushare.api.names import SLICES_PER_GPU
from gpushare.packing.admission import Admission
from gpushare.packing.fit import gpus_fit_reason, host_reason, node_fit_reason
from gpushare.packing.fragmentation import Workload
from gpushare.packing.interference import InterferenceModel
from gpushare.packing.mix import PodMix
from gpushare.packing.model import Assignment, Demand, NodeState
from gpushare.packing.opportunistic import (
    EVICTION_COST,
    OPPORTUNISTIC_COST,
    PAUSE_COST,
    Opportunism,
    Option,
    guaranteed_node,
)
from gpushare.packing.policy import DEFAULT_POLICY, Policy, choose_gpus, node_cost
from gpushare.packing.quick_costs import NodeFacts, QuickCosts, State

MAX_SCORE = 10
"""k8s.io/kube-scheduler/extender/v1 MaxExtenderPriority."""
MEMO_LIMIT = 400_000
"""Costs a placer remembers (pod shape x node signature) before it starts over."""


NO_GUARANTEE = (
    "its namespace's ResourceQuota on gpushare.io/gpu-percent has no room for it as a "
    "guaranteed share (it asks for gpushare.io/opportunistic-gpu-percent, which the quota did "
    "not count), so it runs only opportunistically"
)
"""Why a pod that may hold no guaranteed share (``Demand.guarantee``) got none."""


class Placer:
    """A policy plus the pod mix it measures against (the mix only matters to ``gpushare``)."""

    def __init__(
        self,
        policy: Policy = DEFAULT_POLICY,
        *,
        mix: PodMix | None = None,
        model: InterferenceModel | None = None,
        admission: Admission | None = None,
        opportunism: Opportunism | None = None,
    ) -> None:
        self.policy = policy
        self.mix = mix if mix is not None else PodMix()
        self.model = model
        self.admission = admission
        self.opportunism = opportunism
        self._costs: _Answers[float | None] = _Answers()
        """Costs without the prices of scarce models (:mod:`gpushare.packing.scarcity`),
        kept while the mix's :attr:`Workload.basis` holds: a reprice adds the new price."""
        self._costs_basis = self.mix.workload.basis
        self._reasons: _Answers[str | None] = _Answers()
        self.quick = QuickCosts()
        """:meth:`node_cost` from facts kept per node state, where it reads the pod and the
        node (:meth:`quick_reads`, :meth:`node_facts`, :meth:`quick_cost`)."""

    @property
    def workload(self) -> Workload:
        return self.mix.workload

    def forget(self) -> None:
        """Forget every remembered cost and refusal (the extender benchmark's cold phase times
        a pod shape never met; answers are worked out again as they are asked). What
        :meth:`node_facts` made stays good: it is kept per node state, not per pod shape."""
        self._costs.clear()
        self._reasons.clear()
        self.quick.forget_shapes()

    @property
    def version(self) -> int:
        """Changes whenever the same node and pod could get another cost (the mix was refit):
        part of the key of any cached answer."""
        return self.mix.generation if self.policy is Policy.GPUSHARE else 0

    def node_cost(
        self, node: NodeState, demand: Demand, *, signature: tuple[object, ...] | None = None
    ) -> float | None:
        """The policy's exact cost of ``demand`` on ``node``; None when it does not fit.

        A pod without a profile, beside tenants without one, gets the same answer on every
        node in the same state (:func:`gpu_signature`, free CPU and memory): such answers are
        remembered, costs until the mix is refit. Many nodes look alike (the openb replay's
        1,213 nodes took 641k evaluations for 222k distinct states), and most have no room
        for a given pod, which their GPUs' state alone says (docs/packing.md, "Speed").
        ``signature``: the node's :func:`gpu_signature` when the caller keeps it, or a key that
        stands for it (equal exactly when the signatures are, e.g. an interned id: a tuple's
        hash is not cached, and hashing a node's signature for every node of every decision
        costs more than the rest, gpushare.cluster.dra.devices); None when it is None.

        Opportunistic tenants in the way add :data:`PAUSE_COST` each it pauses and
        :data:`EVICTION_COST` each it evicts; an opted-in pod without a guaranteed option costs
        :data:`OPPORTUNISTIC_COST` less its gain; one its quota did not count
        (``Demand.guarantee`` false) has only that option."""
        # Inlined _seen_by: this runs for every candidate node.
        guaranteed = node if demand.opportunistic else guaranteed_node(node)
        if not demand.guarantee:
            cost = None
        elif guaranteed is node:
            cost = self._guaranteed_cost(node, demand, signature)
        else:
            assignment = self._choose_guaranteed(node, guaranteed, demand)
            cost = None
            if assignment is not None:
                base = self._node_cost(guaranteed, demand)
                if base is not None:
                    cost = (
                        base
                        + PAUSE_COST * len(assignment.pause)
                        + EVICTION_COST * len(assignment.evict)
                    )
        if cost is not None or not self._may_go_beyond(demand):
            return cost
        option = self._opportunistic(node, demand)
        return None if isinstance(option, str) else OPPORTUNISTIC_COST - 100.0 * option.gain

    def quick_reads(self, demand: Demand) -> bool:
        """True when :meth:`quick_cost` answers for ``demand`` on nodes it has facts of: the
        gpushare policy, a pod without a profile that may not go beyond a GPU's guaranteed
        capacity (:meth:`QuickCosts.reads`)."""
        return (
            self.policy is Policy.GPUSHARE
            and demand.guarantee
            and not self._may_go_beyond(demand)
            and QuickCosts.reads(demand)
        )

    def node_facts(self, node: NodeState) -> NodeFacts | None:
        """What :meth:`quick_cost` reads of ``node`` as it is now (keep it while the node does
        not change, and while its ``epoch`` is ``quick.epoch``); None where only
        :meth:`node_cost` can answer (a tenant with a profile or running opportunistically)."""
        return self.quick.facts(node)

    def quick_cost(self, facts: NodeFacts, demand: Demand) -> float | None:
        """:meth:`node_cost` of ``demand`` on the node ``facts`` are of, the same float
        (:mod:`gpushare.packing.quick_costs`), for a pod :meth:`quick_reads` accepts."""
        return self.quick.cost(facts, demand, self.mix.workload)

    def quick_costs_kept(self, demand: Demand) -> Mapping[State, float | None]:
        """:meth:`quick_cost` of ``demand`` by node state, as kept so far (``UNKNOWN`` where
        not: :meth:`QuickCosts.kept`)."""
        return self.quick.kept(demand, self.mix.workload)

    def quick_refusal(self, facts: NodeFacts, node: NodeState, demand: Demand) -> str | None:
        """:meth:`refusal` of ``demand`` on ``node`` (which ``facts`` are of, made while it is
        as it is now), the same words, for a pod :meth:`quick_reads` accepts: its host's
        shortfall, else why none of its GPUs fits, kept per pod shape and node signature."""
        return host_reason(node, demand) or self.quick.gpu_reason(facts, node, demand)

    def _guaranteed_cost(
        self, node: NodeState, demand: Demand, signature: tuple[object, ...] | None
    ) -> float | None:
        gpus = self._plain_gpus(node, demand, signature)
        if gpus is None:
            return self._node_cost(node, demand)
        if host_reason(node, demand) is not None or self._gpu_reason(gpus, node, demand):
            return None
        if self.policy is not Policy.GPUSHARE:
            return self._node_cost(node, demand)
        workload = self.mix.workload
        if self._costs_basis is not workload.basis:
            self._costs.clear()
            self._costs_basis = workload.basis
        state = (node.cpu_milli_free, node.memory_free_bytes, gpus)
        cost = self._costs.answer(
            demand, state, lambda: self._node_cost(node, demand, workload.basis)
        )
        if cost is None or not workload.prices or not node.gpus:
            return cost
        # The price is the same for every option of the node, and adding it after the cheapest
        # gives the float adding it to each does (rounding keeps order): the reference's cost.
        taken = min(demand.percent, SLICES_PER_GPU) * max(demand.gpus, 0)
        return cost + workload.prices.get(node.gpus[0].model, 0.0) * (
            taken if demand.percent > 0 else 0
        )

    @staticmethod
    def _seen_by(node: NodeState, demand: Demand) -> NodeState:
        """The node a pod's guaranteed share is placed against: its guaranteed tenants only
        (:func:`guaranteed_node`, the opportunistic ones make room), or, for a pod that opted
        in, everyone on it (no preemption among equals)."""
        return node if demand.opportunistic else guaranteed_node(node)

    def _may_go_beyond(self, demand: Demand) -> bool:
        return self.opportunism is not None and demand.opportunistic

    def _opportunistic(self, node: NodeState, demand: Demand) -> Option | str:
        assert self.opportunism is not None
        return self.opportunism.node_option(node, demand)

    def _node_cost(
        self, node: NodeState, demand: Demand, workload: Workload | None = None
    ) -> float | None:
        return node_cost(
            self._admitted(node, demand),
            demand,
            policy=self.policy,
            workload=workload or self.mix.workload,
            model=self.model,
        )

    def choose_gpus(self, node: NodeState, demand: Demand) -> Assignment | None:
        """The GPU(s), thread cap and memory limit ``demand`` gets on ``node``: by its
        guaranteed share when one fits (naming the opportunistic tenants it pauses and
        evicts) and its quota counted it, else, for an opted-in pod, beyond a GPU's guaranteed
        capacity where that pays."""
        assignment = (
            self._choose_guaranteed(node, self._seen_by(node, demand), demand)
            if demand.guarantee
            else None
        )
        if assignment is not None or not self._may_go_beyond(demand):
            return assignment
        option = self._opportunistic(node, demand)
        if isinstance(option, str):
            return None
        return Assignment(
            node=node.name,
            gpu_uuids=(option.gpu.uuid,),
            thread_percent=option.threads,
            memory_limit_bytes=option.memory_bytes,
            opportunistic=True,
            predicted_gain=option.gain,
        )

    def _choose_guaranteed(
        self, node: NodeState, guaranteed: NodeState, demand: Demand
    ) -> Assignment | None:
        assignment = choose_gpus(
            self._admitted(guaranteed, demand),
            demand,
            policy=self.policy,
            workload=self.mix.workload,
            model=self.model,
        )
        if assignment is None or guaranteed is node:
            return assignment
        pause: list[str] = []
        evict: list[str] = []
        reasons: list[str] = []
        rules = self.opportunism or Opportunism(model=self.model or Opportunism().model)
        for uuid in assignment.gpu_uuids:
            gpu = node.gpu(uuid)
            if gpu is None:
                continue
            out = rules.preemptions(gpu, demand, admit=self.admission is not None)
            if out is None:
                return None
            pause.extend(out.pause)
            evict.extend(out.evict)
            reasons.append(out.evict_reason)
        if not pause and not evict:
            return assignment
        return replace(
            assignment,
            pause=tuple(pause),
            evict=tuple(evict),
            evict_reason=next((r for r in reasons if r), ""),
        )

    def refusal(
        self, node: NodeState, demand: Demand, *, signature: tuple[object, ...] | None = None
    ) -> str | None:
        """Why ``demand`` has no room on ``node`` (fit first, then admission, then for an
        opted-in pod why it may not go beyond either), or None; remembered like
        :meth:`node_cost` (the words name no GPU, so nodes in one state give one answer)."""
        guaranteed = self._seen_by(node, demand)
        reason = (
            self._guaranteed_refusal(guaranteed, demand, signature if guaranteed is node else None)
            if demand.guarantee
            else NO_GUARANTEE
        )
        if reason is None or not self._may_go_beyond(demand):
            return reason
        option = self._opportunistic(node, demand)
        if not isinstance(option, str):
            return None
        return f"{reason}; not opportunistically either: {option}"

    def _guaranteed_refusal(
        self, node: NodeState, demand: Demand, signature: tuple[object, ...] | None
    ) -> str | None:
        gpus = self._plain_gpus(node, demand, signature)
        if gpus is None:
            reason = node_fit_reason(node, demand)
            if reason is not None or self.admission is None:
                return reason
            if node_fit_reason(self._admitted(node, demand), demand) is None:
                return None
            return self.admission.node_reason(node, demand)
        return host_reason(node, demand) or self._gpu_reason(gpus, node, demand)

    @staticmethod
    def _plain_gpus(
        node: NodeState, demand: Demand, signature: tuple[object, ...] | None
    ) -> tuple[object, ...] | None:
        """The node's :func:`gpu_signature` when answers may be remembered by it: nobody
        involved has a measured profile (then admission and interference have nothing to
        say) and the pod avoids no GPU by name."""
        if demand.profile is not None or demand.avoid_gpus:
            return None
        return signature if signature is not None else gpu_signature(node)

    def _gpu_reason(self, gpus: tuple[object, ...], node: NodeState, demand: Demand) -> str | None:
        return self._reasons.answer(demand, gpus, lambda: gpus_fit_reason(node, demand))

    def _admitted(self, node: NodeState, demand: Demand) -> NodeState:
        return node if self.admission is None else self.admission.admitted(node, demand)


_T = TypeVar("_T")


class _Answers(Generic[_T]):
    """Answers by pod shape, then node state; all dropped once MEMO_LIMIT are kept."""

    def __init__(self) -> None:
        self._by_demand: dict[Demand, dict[tuple[object, ...], _T]] = {}
        self._size = 0

    def answer(self, demand: Demand, state: tuple[object, ...], compute: Callable[[], _T]) -> _T:
        known = self._by_demand.get(demand)
        if known is None:
            known = self._by_demand[demand] = {}
        elif state in known:
            return known[state]
        if self._size >= MEMO_LIMIT:
            self.clear()
            known = self._by_demand[demand] = {}
        value = known[state] = compute()
        self._size += 1
        return value

    def clear(self) -> None:
        self._by_demand.clear()
        self._size = 0


def gpu_signature(node: NodeState) -> tuple[object, ...] | None:
    """What placement reads of ``node``'s GPUs for a pod without a profile: the node's GPU
    model and every GPU's :meth:`~gpushare.packing.model.GpuState.signature`, in a canonical
    order (GPU positions change no cost and no refusal). None when a tenant has a measured
    profile: interference then makes the tenants themselves matter."""
    gpus = [gpu.signature() for gpu in node.gpus]
    if None in gpus:
        return None
    gpus.sort()
    return (node.gpus[0].model if node.gpus else "", tuple(gpus))


def best_node(costs: Iterable[tuple[str, float]]) -> str | None:
    """The cheapest node of ``(name, cost)`` pairs; ties go to the name that sorts first."""
    best: tuple[float, str] | None = None
    for name, cost in costs:
        if best is None or cost < best[0] or (cost == best[0] and name < best[1]):
            best = (cost, name)
    return None if best is None else best[1]


def rank_scores(costs: Mapping[str, float | None]) -> dict[str, int]:
    """kube-scheduler's 0-10 extender scores from the cost ranking: the cheapest node(s) get 10,
    the others less by their rank among the distinct costs (never below 1), a node where the
    pod does not fit 0. The node :func:`best_node` picks always has the top score."""
    distinct = sorted({c for c in costs.values() if c is not None and not math.isnan(c)})
    where = {c: i for i, c in enumerate(distinct)}
    out: dict[str, int] = {}
    for name, cost in costs.items():
        if cost is None or math.isnan(cost):
            out[name] = 0
            continue
        rank = where[cost]
        out[name] = max(1, MAX_SCORE - (MAX_SCORE * rank + len(distinct) - 1) // len(distinct))
    return out
