"""What the extender's verbs share: the view, the placer, the answers kept per node state,
the offers filter made and the pods it refused, and reading a pod's demand and rules."""

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any, Protocol

from gpushare.cluster.extender.answers import ShapeCosts, StateAnswers, Verdict
from gpushare.cluster.extender.offers import Offers
from gpushare.cluster.extender.requeue import RefusedPods
from gpushare.cluster.state import gpu_requests, pods
from gpushare.cluster.state.quotas import KUEUE_QUEUE_LABEL
from gpushare.cluster.state.share_rules import (
    NO_RULES,
    ShareRules,
    hold_reason,
    permitted,
    rules_of,
)
from gpushare.cluster.state.view import ClusterView
from gpushare.packing.admission import Admission
from gpushare.packing.model import Assignment, Demand, NodeState
from gpushare.packing.opportunistic import Opportunism
from gpushare.packing.placer import Placer
from gpushare.packing.policy import DEFAULT_POLICY, Policy
from gpushare.packing.quick_costs import NodeFacts

log = logging.getLogger(__name__)

MAX_EXTENDER_PRIORITY = 10
"""k8s.io/kube-scheduler/extender/v1 MaxExtenderPriority."""
NO_INVENTORY = (
    "gpushare: node has no GPUs shared by gpushare (no gpushare.io/gpus inventory from the "
    "node agent)"
)


HOLD_SECONDS = 30.0
"""A share held by filter (``hold_in_filter``) lapses if no bind for the pod comes in time."""
INTERNED_LIMIT = 10_000
"""Pod shapes the extender keeps one object of (:meth:`Extender._intern`)."""


class PodWriter(Protocol):
    """The API calls bind needs (gpushare.kube.controller.Kube implements it)."""

    async def get_pod(self, *, namespace: str, name: str) -> dict[str, Any]: ...

    async def bind_pod(
        self,
        *,
        namespace: str,
        name: str,
        uid: str,
        node: str,
        annotations: Mapping[str, str] | None = None,
    ) -> None: ...


class AgentCheck(Protocol):
    """Whether a node's agent can take a pod now (gpushare.cluster.agent_readiness implements
    it over HTTP; the extender does no I/O of its own)."""

    async def not_ready(self, node: str, address: str | None) -> str | None: ...


def pod_rules(pod: Mapping[str, Any], *, granted: bool = True) -> ShareRules:
    """The pod's GpuShare rules; raises InvalidInputError naming a bad annotation."""
    meta = pods.metadata(pod)
    return rules_of(
        name=str(meta.get("name", "")),
        namespace=str(meta.get("namespace") or "default"),
        annotations=pods.annotations(pod),
        granted=granted,
    )


class ExtenderBase:
    """The state filter, prioritize and bind share (the verbs:
    :class:`~gpushare.cluster.extender.verbs.Extender`)."""

    def __init__(
        self,
        *,
        view: ClusterView,
        writer: PodWriter | None,
        policy: Policy = DEFAULT_POLICY,
        admission: Admission | None = None,
        gate_seconds: float = 5.0,
        hold_in_filter: bool = False,
        hold_seconds: float = HOLD_SECONDS,
        opportunism: Opportunism | None = None,
        agent_check: AgentCheck | None = None,
    ) -> None:
        self.view = view
        self.writer = writer
        self.policy = policy
        self.placer = Placer(policy, mix=view.mix, admission=admission, opportunism=opportunism)
        """Which node and which GPUs, measured against the pod mix the view learns; with
        ``admission``, never beside a neighbour predicted past its class bound; with
        ``opportunism``, opted-in pods may go beyond a GPU's guaranteed capacity."""
        self.agent_check = agent_check
        """Asked by bind, for nodes whose agent keeps a Lease, just before the Binding: a pod
        the kubelet admits while the agent is gone fails for good (gpushare.cluster.
        agent_readiness)."""
        self.gate_seconds = gate_seconds
        """Longest a bind waits for its node (queue + earlier pods' Allocate)."""
        self.hold_in_filter = hold_in_filter
        """Filter picks the node itself and holds the GPU there until the bind (see docs)."""
        self.hold_seconds = hold_seconds
        self._node_locks: dict[tuple[str, int], asyncio.Lock] = {}
        self._node_events: dict[str, asyncio.Event] = {}
        view.allocation_listeners.append(self._wake)
        self.answers = StateAnswers(view=view, placer=self.placer)
        """Costs and verdicts per pod shape and node state (shared by every node in it)."""
        self.shape_costs = ShapeCosts(view=view, placer=self.placer)
        """Per pod shape, each unchanged node's cost: the filter's common case."""
        self._facts: dict[str, tuple[int, NodeFacts | None]] = {}
        """Node -> (its version, what the placer's quick cost reads of it then)."""
        self._verdicts_by_shape: dict[Demand, dict[str, tuple[int, Verdict]]] = {}
        """Per pod shape, the verdicts the quick refusals gave (FilterVerbs._kept_verdicts)."""
        self._empty_facts: dict[str, tuple[NodeState, NodeFacts]] = {}
        """Node -> (its GPUs emptied, as the view has them, and their quick-cost facts)."""
        self._demands: dict[Demand, Demand] = {}
        self._cached = 0
        self.refused = RefusedPods()
        """Pods the filter left without a node, for ``requeue`` when hidden capacity frees."""
        self.offers = Offers()
        """The nodes filter passed for each pod: bind places a pod only on one of them."""
        self.bound_listeners: list[Callable[[str, Assignment], None]] = []
        """Told (pod key, assignment) after each bind that placed a pod on GPUs: the
        controller's opportunistic duties preempt what the assignment names and record
        Events."""
        self.pauser: Callable[[str, Assignment], Awaitable[str | None]] | None = None
        """Asked by bind, once the pod's share is held and before its Binding, to pause the
        opportunistic tenants its assignment names (the controller's opportunistic duties):
        the pod never starts beside compute it needs. A reason when not None: the bind does
        not go ahead (docs/scheduling.md, "Bind protocol")."""
        self.bind_stage_observer: Callable[[str, float], None] | None = None
        """Told (stage, seconds) for each bind: ``gate`` (waiting for the node's earlier pods'
        Allocate) and ``write`` (choosing GPUs and the Binding POST)."""

    def _read(self, pod: Mapping[str, Any]) -> tuple[Demand | None, ShareRules]:
        """The pod's demand (with its tenancy) and GpuShare rules (with its namespace's grant);
        raises InvalidInputError naming a bad annotation."""
        demand = gpu_requests.demand_of(pod)
        if demand is None:
            return None, NO_RULES
        namespace = str(pods.metadata(pod).get("namespace") or "default")
        rules = pod_rules(pod, granted=self.view.tenancies.neighbour_rules(namespace))
        if demand.opportunistic:
            demand = self._within_quota(pods.pod_key(pod), demand, queued=_queued(pod))
        return self.view.with_tenancy(demand, namespace), rules

    def _within_quota(self, key: str, demand: Demand, *, queued: bool = False) -> Demand:
        """An opted-in pod's demand as its quota lets it be placed: one its namespace's quota
        has no room for as a guaranteed share, or a queue admitted by the opportunistic
        resource (``queued``), may hold none (gpushare.cluster.state.quotas)."""
        if not demand.opportunistic or (not queued and self.view.may_guarantee(key, demand)):
            return demand
        return replace(demand, guarantee=False)

    def _own_nodes(self, key: str) -> set[str]:
        """Nodes where the pod itself already holds a share or host resources (a stale or
        earlier placement, a filter-time hold): its answers there depend on the pod, so they
        are not cached."""
        return self.view.own_nodes(key)

    def _hold_reason(self, rules: ShareRules) -> str | None:
        if rules.share is None or self.view.share_skips_profiling(rules.namespace, rules.share):
            return None
        status = self.view.share_status(rules.namespace, rules.share)
        return hold_reason(rules, share_status=status)

    def _node(self, name: str, key: str, rules: ShareRules) -> tuple[NodeState | None, str | None]:
        """The node as the pod sees it, narrowed to the GPUs its GpuShare rules (and those of
        the pods already there) permit, with the first refusal when a GPU was taken away."""
        node = self.view.node_for(name, key)
        if node is None or not node.gpus:
            return node, None
        return permitted(
            node,
            rules=rules,
            tenant_rules=self.view.pod_rules(),
            others_block=self.view.any_blockers,
        )

    def _intern(self, demand: Demand) -> Demand:
        """One object per pod shape: the answer caches are keyed by shape, and a lookup with
        the very key object stored skips comparing the shape's fields."""
        known = self._demands.get(demand)
        if known is not None:
            return known
        if len(self._demands) >= INTERNED_LIMIT:
            self._demands.clear()
        self._demands[demand] = demand
        return demand

    def _wake(self, node: str) -> None:
        """Wake the binds waiting on ``node`` (a pod there got its Allocate): bind's to do."""


def _queued(pod: Mapping[str, Any]) -> bool:
    """The pod is Kueue's (its queue label), admitted by the quota of what it asks for."""
    labels = pods.metadata(pod).get("labels")
    return isinstance(labels, Mapping) and KUEUE_QUEUE_LABEL in labels
