"""kube-scheduler HTTP extender: filter, prioritize and bind for gpushare pods.

Wire format is k8s.io/kube-scheduler/extender/v1, whose structs carry no JSON tags: keys are the
Go field names (``Pod``, ``NodeNames``, ``FailedNodes``, ``FailedAndUnresolvableNodes``,
``Host``, ``Score``, ``PodName``, ``Node``, ``Error``). With ``nodeCacheCapable`` the scheduler
sends only node names; full ``Nodes`` lists are accepted too.

Per call the work is proportional to the candidate nodes: each is looked up in the view and
checked with gpushare.packing; nothing else is serialized. Which node and which GPUs is one
decision, :class:`gpushare.packing.placer.Placer`'s (the openb simulator asks the same object):
filter ranks the nodes that fit by its exact cost and holds the cheapest, prioritize derives its
scores from the same ranking, bind takes the GPUs filter held (docs/scheduling.md).
"""

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from gpushare.api.errors import InvalidInputError
from gpushare.api.names import SCHEDULER_NAME, SLICES_PER_GPU, STATE_ASSUMED
from gpushare.api.placement import Placement, parse_placement
from gpushare.cluster.extender.answers import FAILED as _FAILED
from gpushare.cluster.extender.answers import PASS as _PASS
from gpushare.cluster.extender.answers import UNRESOLVABLE as _UNRESOLVABLE
from gpushare.cluster.extender.answers import Answer, StateAnswers, prefixed, scheduler_safe
from gpushare.cluster.extender.offers import Offers
from gpushare.cluster.extender.requeue import RefusedPods
from gpushare.cluster.state import pods
from gpushare.cluster.state.host_resources import pod_requests
from gpushare.cluster.state.reservations import Reservation, ReservationError
from gpushare.cluster.state.share_rules import (
    NO_RULES,
    ShareRules,
    hold_reason,
    permitted,
    rules_of,
    with_profile,
)
from gpushare.cluster.state.view import ClusterView
from gpushare.packing.admission import Admission
from gpushare.packing.fit import node_fit_reason
from gpushare.packing.model import Assignment, Demand, NodeState
from gpushare.packing.placer import Placer, best_node, rank_scores
from gpushare.packing.policy import DEFAULT_POLICY, Policy

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


class BadRequestError(ValueError):
    """A body that is not the extender JSON the verb expects (answered with HTTP 400)."""


@dataclass(frozen=True)
class ExtenderArgs:
    pod: Mapping[str, Any]
    node_names: list[str]
    nodes: list[Mapping[str, Any]] | None
    """The full NodeList items when the scheduler is not nodeCacheCapable, else None."""


@dataclass(frozen=True)
class BindingArgs:
    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str


def _str_list(value: object, where: str) -> list[str]:
    # set(map(type, ...)): the check runs in C; node lists are hundreds of names per call.
    if not isinstance(value, list) or not set(map(type, value)) <= {str}:
        raise BadRequestError(f"{where} must be a list of strings")
    return list(value)


def parse_extender_args(doc: object) -> ExtenderArgs:
    """Validate an ExtenderArgs document; raises BadRequestError naming the bad key."""
    if not isinstance(doc, dict):
        raise BadRequestError("body must be an ExtenderArgs object with keys Pod and NodeNames")
    pod = doc.get("Pod")
    if not isinstance(pod, dict):
        raise BadRequestError("Pod must be an object (the v1.Pod being scheduled)")
    meta = pod.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
        raise BadRequestError("Pod.metadata.name must be a string")
    for part in ("metadata", "spec", "status"):
        if part in pod and pod[part] is not None and not isinstance(pod[part], dict):
            raise BadRequestError(f"Pod.{part} must be an object")
    if meta.get("annotations") is not None and not isinstance(meta.get("annotations"), dict):
        raise BadRequestError("Pod.metadata.annotations must be an object")
    names = doc.get("NodeNames")
    nodes_doc = doc.get("Nodes")
    if names is not None:
        return ExtenderArgs(pod=pod, node_names=_str_list(names, "NodeNames"), nodes=None)
    if nodes_doc is not None:
        items = nodes_doc.get("items") if isinstance(nodes_doc, dict) else None
        if not isinstance(items, list):
            raise BadRequestError("Nodes must be a v1.NodeList object with items")
        out_names: list[str] = []
        for i, node in enumerate(items):
            node_meta = node.get("metadata") if isinstance(node, dict) else None
            name = node_meta.get("name") if isinstance(node_meta, dict) else None
            if not isinstance(name, str):
                raise BadRequestError(f"Nodes.items[{i}].metadata.name must be a string")
            out_names.append(name)
        return ExtenderArgs(pod=pod, node_names=out_names, nodes=items)
    raise BadRequestError("one of NodeNames or Nodes is required")


def parse_binding_args(doc: object) -> BindingArgs:
    if not isinstance(doc, dict):
        raise BadRequestError("body must be an ExtenderBindingArgs object")
    values: dict[str, str] = {}
    for key in ("PodName", "PodNamespace", "PodUID", "Node"):
        value = doc.get(key)
        if not isinstance(value, str) or (key != "PodUID" and not value):
            raise BadRequestError(f"{key} must be a non-empty string")
        values[key] = value
    return BindingArgs(values["PodName"], values["PodNamespace"], values["PodUID"], values["Node"])


class PodWriter(Protocol):
    """The API calls bind needs (gpushare.cluster.kube.Kube implements it)."""

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


def pod_rules(pod: Mapping[str, Any], *, granted: bool = True) -> ShareRules:
    """The pod's GpuShare rules; raises InvalidInputError naming a bad annotation."""
    meta = pods.metadata(pod)
    return rules_of(
        name=str(meta.get("name", "")),
        namespace=str(meta.get("namespace") or "default"),
        annotations=pods.annotations(pod),
        granted=granted,
    )


class Extender:
    """The three verbs over one view; the HTTP layer (server.py) only parses and times."""

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
    ) -> None:
        self.view = view
        self.writer = writer
        self.policy = policy
        self.placer = Placer(policy, mix=view.mix, admission=admission)
        """Which node and which GPUs, measured against the pod mix the view learns; with
        ``admission``, never beside a neighbour predicted past its class bound."""
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
        self._demands: dict[Demand, Demand] = {}
        self._cached = 0
        self.refused = RefusedPods()
        """Pods the filter left without a node, for ``requeue`` when hidden capacity frees."""
        self.offers = Offers()
        """The nodes filter passed for each pod: bind places a pod only on one of them."""
        self.bind_stage_observer: Callable[[str, float], None] | None = None
        """Told (stage, seconds) for each bind: ``gate`` (waiting for the node's earlier pods'
        Allocate) and ``write`` (choosing GPUs and the Binding POST)."""

    def _read(self, pod: Mapping[str, Any]) -> tuple[Demand | None, ShareRules]:
        """The pod's demand (with its tenancy) and GpuShare rules (with its namespace's grant);
        raises InvalidInputError naming a bad annotation."""
        demand = pods.demand_of(pod)
        if demand is None:
            return None, NO_RULES
        namespace = str(pods.metadata(pod).get("namespace") or "default")
        rules = pod_rules(pod, granted=self.view.tenancies.neighbour_rules(namespace))
        return self.view.with_tenancy(demand, namespace), rules

    # ---- filter --------------------------------------------------------------------------

    def filter(self, args: ExtenderArgs) -> dict[str, Any]:
        """ExtenderFilterResult. Misfits no preemption can cure (a pod bigger than any GPU of
        the node, a node without gpushare GPUs) go to FailedAndUnresolvableNodes."""
        passed: list[str] = []
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        try:
            demand, rules = self._read(args.pod)
        except InvalidInputError as exc:
            message = scheduler_safe(f"gpushare: {exc}")
            return self._filter_result(args, [], {}, dict.fromkeys(args.node_names, message))
        if demand is None:
            return self._filter_without_gpus(args)
        demand = self._intern(with_profile(demand, rules))
        hold = self._hold_reason(rules)
        if hold is not None:
            message = prefixed(hold)
            return self._filter_result(args, [], {}, dict.fromkeys(args.node_names, message))
        key = pods.pod_key(args.pod)
        own = self._own_nodes(key)
        constrained = rules.constrains_gpus
        # Answers kept per node state hold for this pod unless its own rules, or others',
        # narrow a node (then each node is asked afresh, see _shared_state).
        fast = not constrained and not self.view.any_blockers
        versions = self.view.node_versions
        uid = pods.pod_uid(args.pod)
        if self.hold_in_filter and self._may_hold(key, uid):
            # The placer's cost is None exactly where the pod does not fit: rank by it first;
            # per-node reasons are only worth working out when no node is left (the scheduler
            # reads them only then, for its events and for preemption).
            fitting: list[str] = []
            costs: list[float] = []
            mix = self.placer.version
            for name in args.node_names:
                answer = (
                    self._fast_answer(name, demand, versions) if fast and name not in own else None
                )
                if answer is None:
                    cost = self._cost(name, key, demand, rules, shared=name not in own)
                elif answer.cost_holds(mix):
                    cost = answer.cost  # the common case, inlined
                else:
                    cost = self.answers.cost(answer, name, demand)
                if cost is not None:
                    fitting.append(name)
                    costs.append(cost)
            if fitting:
                self.refused.placed(key)
                best = self._hold_best(args, key, demand, rules, passed=fitting, costs=costs)
                if best is not None:
                    # With one node offered, the reasons for the others are dead weight
                    # (hundreds of entries per call to encode and decode): none are sent.
                    self.offers.offer(key, uid, (best,))
                    return self._filter_result(args, [best], {}, {})
        for name in args.node_names:
            answer = self._fast_answer(name, demand, versions) if fast and name not in own else None
            if answer is None:
                shared = not constrained and name not in own
                verdict, message = self._verdict(name, key, demand, rules, shared=shared)
            else:
                verdict, message = answer.verdict or self.answers.verdict(answer, name, demand)
            if verdict == _PASS:
                passed.append(name)
            elif verdict == _FAILED:
                failed[name] = message
            else:
                unresolvable[name] = message
        if passed:
            self.refused.placed(key)
        elif args.node_names:
            self.refused.refused(key)
        if passed:
            self.offers.offer(key, uid, passed)
        if not passed and args.node_names:
            first = args.node_names[0]
            log.info(
                "no node fits",
                extra={
                    "pod": key,
                    "nodes": len(args.node_names),
                    "example": f"{first}: {failed.get(first) or unresolvable.get(first)}",
                },
            )
        return self._filter_result(args, passed, failed, unresolvable)

    def _hold_best(
        self,
        args: ExtenderArgs,
        key: str,
        demand: Demand,
        rules: ShareRules,
        *,
        passed: list[str],
        costs: list[float],
    ) -> str | None:
        """Pick the placer's cheapest node among ``passed`` (``costs``: their exact costs, in
        order; ties to the name that sorts first), hold the GPU(s) there for the pod now, and
        return it (None when nothing could be held). Later pods are filtered against the hold,
        so they do not collide with this one at bind time (kube-scheduler binds
        asynchronously). The price: the scheduler's own scores cannot pick among GPU-feasible
        nodes any more."""
        # Among nodes of exactly the best cost, prefer one where the bind will not wait at the
        # allocation gate behind a pod of the same size (back-to-back pods of one shape often
        # go to one node). Only exact ties: the ranking itself is the placer's.
        low = min(costs)
        ties = sorted(name for name, cost in zip(passed, costs, strict=True) if cost == low)
        size = demand.percent
        best = next((n for n in ties if not self._pending_alike(n, key, size)), ties[0])
        node, _ = self._node(best, key, rules)
        assignment = self.placer.choose_gpus(node, demand) if node else None
        if assignment is None:
            return None
        try:
            self.view.reserve(
                key=key,
                uid=pods.pod_uid(args.pod),
                node=best,
                assignment=assignment,
                demand=demand,
                bind_time=datetime.now(UTC),
                hold_seconds=self.hold_seconds,
            )
        except ReservationError:
            return None
        return best

    def _may_hold(self, key: str, uid: str) -> bool:
        """Filter holds a share only for a real pod waiting for gpushare-scheduler, as the
        view knows it from its watch (same UID, not bound): a forged filter call for a pod
        that does not exist holds nothing, and each pod holds at most one share (a later hold
        replaces it) that lapses after ``hold_seconds``."""
        known = self.view.pod(key)
        return (
            known is not None
            and bool(uid)
            and known.uid == uid
            and known.node is None
            and not known.finished
            and known.scheduler == SCHEDULER_NAME
        )

    def _filter_without_gpus(self, args: ExtenderArgs) -> dict[str, Any]:
        """A pod asking for no GPU (sent to gpushare-scheduler on purpose): under the gpushare
        policy it goes where its CPU and memory strand the least GPU share -- the cheapest
        node by the placer's cost, a node without gpushare GPUs costing nothing -- and, with
        filter-time holds, its CPU and memory are held there until the bind. Other policies,
        and pods requesting neither CPU nor memory, pass every node."""
        cpu, memory = pod_requests(args.pod)
        if self.placer.policy is not Policy.GPUSHARE or (cpu <= 0 and memory <= 0):
            # Every node passes, and bind may place the pod on any of them.
            self.offers.offer(pods.pod_key(args.pod), pods.pod_uid(args.pod), args.node_names)
            return self._filter_result(args, list(args.node_names), {}, {})
        demand = self._intern(Demand(percent=0, gpus=0, cpu_milli=cpu, host_memory_bytes=memory))
        key = pods.pod_key(args.pod)
        costs = self._host_costs(args.node_names, key, demand)
        passed = [name for name, cost in costs.items() if cost is not None]

        def failed() -> dict[str, str]:
            return {
                name: self._host_refusal(name, key, demand)
                for name, cost in costs.items()
                if cost is None
            }

        if not passed:
            if args.node_names:
                self.refused.refused(key)
            return self._filter_result(args, [], failed(), {})
        self.refused.placed(key)
        uid = pods.pod_uid(args.pod)
        if not self.hold_in_filter or not uid or pods.scheduler_name(args.pod) != SCHEDULER_NAME:
            self.offers.offer(key, uid, passed)
            return self._filter_result(args, passed, failed(), {})
        best = best_node((name, cost) for name, cost in costs.items() if cost is not None)
        assert best is not None
        self.offers.offer(key, uid, (best,))
        if self.view.node(best) is not None:
            try:
                self.view.reserve(
                    key=key,
                    uid=uid,
                    node=best,
                    assignment=Assignment(best, (), 0, 0),
                    demand=demand,
                    bind_time=datetime.now(UTC),
                    hold_seconds=self.hold_seconds,
                )
            except ReservationError:
                return self._filter_result(args, passed, failed(), {})
        return self._filter_result(args, [best], {}, {})

    def _host_costs(self, names: list[str], key: str, demand: Demand) -> dict[str, float | None]:
        """Placer cost of a pod without GPUs per node (None: its CPU or memory does not fit
        there, as the view counts them); 0 on nodes without gpushare GPUs."""
        out: dict[str, float | None] = {}
        for name in names:
            if self.view.node(name) is None:
                out[name] = 0.0
            else:
                out[name] = self._cost(name, key, demand, NO_RULES, shared=True)
        return out

    def _host_refusal(self, name: str, key: str, demand: Demand) -> str:
        node = self.view.node_for(name, key)
        reason = node_fit_reason(node, demand) if node is not None else None
        return prefixed(reason or "the node's CPU or memory is taken")

    def _pending_alike(self, node: str, key: str, size: int) -> bool:
        """A bind of this pod to ``node`` would wait at the gate: a pod of the same size (or
        of unknown size) waits for its Allocate there, is being bound there, or holds a share
        there from filter and soon will be. Stops at the first such pod."""
        known = self.view.pods()
        for other in self.view.pending_on(node):
            if other != key:
                f = known.get(other)
                other_size = f.demand.percent if f is not None and f.demand is not None else -1
                if other_size == size or other_size < 0 or size < 0:
                    return True
        return False

    def _own_nodes(self, key: str) -> set[str]:
        """Nodes where the pod itself already holds a share (a stale or earlier placement):
        its answers there depend on the pod, so they are not cached."""
        return {n for u in self.view.tenancy(key) if (n := self.view.node_of_gpu(u)) is not None}

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

    def _verdict(
        self, name: str, key: str, demand: Demand, rules: ShareRules, *, shared: bool
    ) -> tuple[str, str]:
        """(pass|failed|unresolvable, message) for one node: from the answers kept per node
        state when the pod's own rules and placements do not single it out (``shared``) and
        nobody's rules narrow the node, else worked out for this pod."""
        node, refusal = self._node(name, key, rules)
        answer = self._shared_answer(name, node, refusal, demand) if shared else None
        if answer is not None:
            return self.answers.verdict(answer, name, demand)
        if node is None or (not node.gpus and refusal is None):
            problem = self.view.node_problem(name)
            return _UNRESOLVABLE, (
                scheduler_safe(f"gpushare: {problem}") if problem else NO_INVENTORY
            )
        reason = self.placer.refusal(node, demand) if node.gpus else refusal
        if reason is None:
            return _PASS, ""
        if refusal is not None:
            # Rules took GPUs away; pods leaving (or a profile stored) can give them back.
            detail = refusal if reason == refusal else f"{refusal}; on its other GPUs: {reason}"
            return _FAILED, prefixed(detail)
        empty = self.view.empty_node(name)
        empty_reason = self.placer.refusal(empty, demand) if empty is not None else reason
        if empty_reason is not None:
            return _UNRESOLVABLE, prefixed(empty_reason)
        return _FAILED, prefixed(reason)

    def _cost(
        self, name: str, key: str, demand: Demand, rules: ShareRules, *, shared: bool
    ) -> float | None:
        """The placer's exact cost of the pod on node ``name`` (None: it does not fit there),
        from the answers kept per node state when ``shared`` (see :meth:`_verdict`)."""
        node, refusal = self._node(name, key, rules)
        answer = self._shared_answer(name, node, refusal, demand) if shared else None
        if answer is not None:
            return self.answers.cost(answer, name, demand)
        if node is not None and (node.gpus or demand.gpus <= 0):
            return self.placer.node_cost(node, demand)
        return None

    def _fast_answer(self, name: str, demand: Demand, versions: Mapping[str, int]) -> Answer | None:
        """The kept answer for ``demand`` on node ``name`` when neither the pod's rules nor
        anyone else's narrow nodes (the caller checks): the node's own pointer when it did not
        change since, else its state's answer; None when the node's answers are not shared."""
        hit = self.answers.named(demand).get(name)
        if hit is not None and hit[0] == versions.get(name, 0):
            return hit[1]
        return self.answers.answer(name, demand)

    def _shared_answer(
        self, name: str, node: NodeState | None, refusal: str | None, demand: Demand
    ) -> Answer | None:
        """The answer kept for the node's state, or None when this pod's view of the node is
        not the view's own (rules narrowed it) or the node's answers are not shared."""
        if node is None or refusal is not None or node is not self.view.node(name):
            return None
        return self.answers.answer(name, demand)

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

    @staticmethod
    def _filter_result(
        args: ExtenderArgs,
        passed: list[str],
        failed: dict[str, str],
        unresolvable: dict[str, str],
    ) -> dict[str, Any]:
        result: dict[str, Any] = {
            "FailedNodes": failed,
            "FailedAndUnresolvableNodes": unresolvable,
            "Error": "",
        }
        if args.nodes is None:
            result["NodeNames"] = passed
            result["Nodes"] = None
        else:
            keep = set(passed)
            result["Nodes"] = {
                "items": [n for n in args.nodes if n.get("metadata", {}).get("name") in keep]
            }
            result["NodeNames"] = None
        return result

    # ---- prioritize ----------------------------------------------------------------------

    def prioritize(self, args: ExtenderArgs) -> list[dict[str, Any]]:
        """HostPriorityList: 0..10 per node from the placer's cost ranking (the node filter
        would hold gets 10; see :func:`gpushare.packing.placer.rank_scores`)."""
        try:
            demand, rules = self._read(args.pod)
        except InvalidInputError:
            return [{"Host": n, "Score": 0} for n in args.node_names]
        key = pods.pod_key(args.pod)
        costs: dict[str, float | None]
        if demand is None:
            cpu, memory = pod_requests(args.pod)
            if self.placer.policy is not Policy.GPUSHARE or (cpu <= 0 and memory <= 0):
                return [{"Host": n, "Score": 0} for n in args.node_names]
            host = self._intern(Demand(percent=0, gpus=0, cpu_milli=cpu, host_memory_bytes=memory))
            costs = self._host_costs(args.node_names, key, host)
        else:
            demand = self._intern(with_profile(demand, rules))
            own = self._own_nodes(key)
            costs = {
                name: self._cost(
                    name,
                    key,
                    demand,
                    rules,
                    shared=name not in own and not rules.constrains_gpus,
                )
                for name in args.node_names
            }
        scores = rank_scores(costs)
        return [{"Host": name, "Score": scores[name]} for name in args.node_names]

    # ---- bind ----------------------------------------------------------------------------

    async def bind(self, args: BindingArgs) -> dict[str, str]:
        """Choose GPU(s), hold them in the view before any await, then POST the Binding with
        the placement annotations in it (the API server sets them with ``spec.nodeName`` in one
        update). On failure the hold is rolled back; nothing was written.

        Binds of pods of one size to one node are serialized, and each waits until no other pod
        of that size on the node is still waiting for its Allocate: the kubelet calls Allocate
        with device IDs only, and the node agent tells waiting pods apart by GPU and slice
        count, so only same-size pods could be mistaken for each other.
        """
        if self.writer is None:
            return {"Error": "gpushare: this extender has no API access and cannot bind"}
        key = f"{args.pod_namespace}/{args.pod_name}"
        held = self.view.reservation(key)
        if held is not None and not held.assignment.gpu_uuids and self.view.pod(key) is None:
            return await self._bind_without_gpus(args, held)
        size = self._size(key)
        loop = asyncio.get_running_loop()
        start = loop.time()
        deadline = start + self.gate_seconds
        lock = self._node_locks.setdefault((args.node, size), asyncio.Lock())
        try:
            async with asyncio.timeout_at(deadline):
                await lock.acquire()
        except TimeoutError:
            self._observe("gate", loop.time() - start)
            waiting = self._ambiguous(args.node, key, size)
            return {
                "Error": f"gpushare: node {args.node} is busy: {len(waiting)} pod(s) there "
                "still wait for their GPU allocation; the pod will be retried"
            }
        try:
            seen = self.view.allocations_seen(args.node)
            waiting = await self._wait_for_allocations(args.node, key, size, deadline)
            if waiting and self.view.allocations_seen(args.node) == seen:
                # Nothing on the node got its Allocate for the whole wait: its node agent (or
                # kubelet) is not answering, and a pod bound now would be refused by the
                # kubelet ("no healthy devices") and end Failed. Let the scheduler retry.
                self._observe("gate", loop.time() - start)
                log.warning(
                    "not binding: no pod on the node got its allocation during the wait",
                    extra={"pod": key, "node": args.node, "waiting": waiting[:5]},
                )
                return {
                    "Error": scheduler_safe(
                        f"gpushare: node {args.node}: {len(waiting)} pod(s) there have waited "
                        f"{self.gate_seconds:.0f}s for their GPU allocation and none got it "
                        "(is the gpushare node agent running there?); the pod will be retried"
                    )
                }
            if waiting:
                log.warning(
                    "binding while other pods still wait for their allocation",
                    extra={"pod": key, "node": args.node, "waiting": waiting[:5]},
                )
            opened = loop.time()
            self._observe("gate", opened - start)
            result = await self._bind(args)
            self._observe("write", loop.time() - opened)
        finally:
            lock.release()
        return {"Error": scheduler_safe(result["Error"])}

    def _observe(self, stage: str, seconds: float) -> None:
        if self.bind_stage_observer is not None:
            self.bind_stage_observer(stage, seconds)

    def _wake(self, node: str) -> None:
        event = self._node_events.get(node)
        if event is not None:
            event.set()

    def _size(self, key: str) -> int:
        """The pod's gpu-percent request as the view knows it (-1 when unknown: such a pod
        waits for every other pod on the node)."""
        known = self.view.pod(key)
        return known.demand.percent if known is not None and known.demand is not None else -1

    def _ambiguous(self, node: str, key: str, size: int) -> list[str]:
        """Pods on ``node`` still waiting for their Allocate that the node agent could mistake
        for this one. It tells waiting pods apart by GPU and slice count
        (deviceplugin.allocation.select_pod), so only pods of the same size, or of unknown
        size, count."""
        out: list[str] = []
        for other in self.view.awaiting_allocation(node, exclude=key):
            other_size = self._size(other)
            if size >= 0 and other_size >= 0 and other_size != size:
                continue
            out.append(other)
        return out

    async def _wait_for_allocations(
        self, node: str, key: str, size: int, deadline: float
    ) -> list[str]:
        """Wait (woken by the view, no polling) until no pod on ``node`` that the node agent
        could mistake for this one waits for its Allocate, or until ``deadline``; returns those
        still waiting."""
        loop = asyncio.get_running_loop()
        event = self._node_events.setdefault(node, asyncio.Event())
        while True:
            event.clear()
            waiting = self._ambiguous(node, key, size)
            remaining = deadline - loop.time()
            if not waiting or remaining <= 0:
                return waiting
            try:
                async with asyncio.timeout(remaining):
                    await event.wait()
            except TimeoutError:
                return self._ambiguous(node, key, size)

    async def _pod_facts(
        self, args: BindingArgs
    ) -> tuple[str, str | None, Demand | None, ShareRules, str]:
        """(uid, node it is bound to, demand, GpuShare rules, scheduler name) from the view, or
        from a GET when the view does not know this pod (or an older pod of the same name).
        Raises InvalidInputError for unreadable annotations and KubeError-like exceptions for
        API failures."""
        assert self.writer is not None
        key = f"{args.pod_namespace}/{args.pod_name}"
        known = self.view.pod(key)
        if (
            known is not None
            and (not args.pod_uid or known.uid == args.pod_uid)
            and (known.demand is not None or known.problem is not None)
        ):
            if known.demand is None and known.problem is not None:
                raise InvalidInputError(key, known.problem, "fix the pod's gpushare annotations")
            rules = self.view.pod_rules().get(key, NO_RULES)
            return known.uid, known.node, known.demand, rules, known.scheduler
        pod = await self.writer.get_pod(namespace=args.pod_namespace, name=args.pod_name)
        demand, rules = self._read(pod)
        demand = with_profile(demand, rules) if demand is not None else None
        return pods.pod_uid(pod), pods.node_name(pod), demand, rules, pods.scheduler_name(pod)

    async def _bind(self, args: BindingArgs) -> dict[str, str]:
        assert self.writer is not None
        ns, name, node_name = args.pod_namespace, args.pod_name, args.node
        key = f"{ns}/{name}"
        try:
            uid, bound_to, demand, rules, scheduler = await self._pod_facts(args)
        except InvalidInputError as exc:
            return {"Error": f"gpushare: {exc}"}
        except Exception as exc:
            return {"Error": f"gpushare: {exc}"}
        if args.pod_uid and uid != args.pod_uid:
            return {"Error": f"gpushare: pod {key} was recreated (uid {uid}, asked {args.pod_uid})"}
        if bound_to is not None:
            if bound_to == node_name:
                return {"Error": ""}  # a retried bind that already went through
            return {"Error": f"gpushare: pod {key} is already bound to {bound_to}"}
        refusal = self._not_ours(key, uid, node_name, scheduler=scheduler)
        if refusal is not None:
            log.warning("bind refused", extra={"pod": key, "node": node_name, "why": refusal})
            return {"Error": f"gpushare: {refusal}"}
        if demand is None:
            return await self._plain_bind(ns, name, uid, node_name)
        waits = self._hold_reason(rules)
        if waits is not None:
            return {"Error": f"gpushare: {waits}"}
        # From here to view.reserve() nothing awaits: no other bind can interleave.
        node, refusal = self._node(node_name, key, rules)
        if node is None or (not node.gpus and refusal is None):
            return {"Error": f"gpushare: node {node_name} has no GPUs shared by gpushare"}
        hold = self.view.reservation(key)
        usable = {g.uuid for g in node.gpus}
        if (
            hold is not None
            and hold.is_hold
            and hold.node == node_name
            and hold.uid == uid
            and usable.issuperset(hold.assignment.gpu_uuids)
        ):
            assignment: Assignment | None = hold.assignment  # what filter promised
        else:
            assignment = self.placer.choose_gpus(node, demand) if node.gpus else None
        if assignment is None:
            reason = (self.placer.refusal(node, demand) if node.gpus else None) or refusal
            return {
                "Error": scheduler_safe(f"gpushare: node {node_name}: {reason or 'no GPU fits'}")
            }
        bind_time = datetime.now(UTC)
        try:
            held = self.view.reserve(
                key=key,
                uid=uid,
                node=node_name,
                assignment=assignment,
                demand=demand,
                bind_time=bind_time,
            )
        except ReservationError as exc:
            return {"Error": f"gpushare: {exc}"}
        placement = Placement(
            gpu_uuids=assignment.gpu_uuids,
            thread_percent=assignment.thread_percent,
            memory_limit_bytes=assignment.memory_limit_bytes,
            bind_time=bind_time,
            state=STATE_ASSUMED,
            request_percent=min(demand.percent, SLICES_PER_GPU),
        )
        try:
            await self.writer.bind_pod(
                namespace=ns,
                name=name,
                uid=uid,
                node=node_name,
                annotations=placement.to_annotations(),
            )
        except Exception as exc:
            current = await self._current_binding(ns, name)
            if current is not None and current[0] == node_name:
                # Bound anyway (a lost response, or a retried bind that won the race): the
                # annotations that came with that Binding are the record.
                if current[1] is None or current[1].gpu_uuids != assignment.gpu_uuids:
                    self.view.release(held)
                log.info("bind answered with an error but the pod is bound", extra={"pod": key})
                return {"Error": ""}
            self.view.release(held)
            log.warning(
                "bind failed; share released",
                extra={"pod": key, "node": node_name, "error": str(exc)},
            )
            return {"Error": f"gpushare: {exc}"}
        log.info(
            "bound",
            extra={
                "pod": key,
                "node": node_name,
                "gpus": list(assignment.gpu_uuids),
                "thread_percent": assignment.thread_percent,
                "request_percent": placement.request_percent,
                "memory_limit": assignment.memory_limit_bytes,
            },
        )
        return {"Error": ""}

    def _not_ours(self, key: str, uid: str, node: str, *, scheduler: str) -> str | None:
        """Why this bind is not the caller's to ask for, or None: the extender binds only
        pods of gpushare-scheduler (with the controller's cluster-wide binding right, anything
        else would let a caller move any pod), with or without a GPU share, and only to a node
        its own filter offered for that pod moments before."""
        if scheduler != SCHEDULER_NAME:
            return (
                f"pod {key} is scheduled by {scheduler or 'default-scheduler'!r}, not "
                f"{SCHEDULER_NAME}; this extender binds only the pods {SCHEDULER_NAME} places"
            )
        if not self.offers.offered(key, uid, node):
            return (
                f"node {node} was not offered for pod {key} by this controller's filter (or the "
                "offer expired); the scheduler filters again"
            )
        return None

    async def _bind_without_gpus(self, args: BindingArgs, held: Reservation) -> dict[str, str]:
        """Bind a pod without GPUs whose CPU and memory filter held: nothing waits for an
        Allocate, so no gate; the hold ends with the bind (the watch then counts the pod)."""
        key = f"{args.pod_namespace}/{args.pod_name}"
        uid = args.pod_uid or held.uid
        if not self.offers.offered(key, uid, args.node):
            self.view.release(held)
            return {
                "Error": f"gpushare: node {args.node} was not offered for pod {key} by this "
                "controller's filter (or the offer expired); the scheduler filters again"
            }
        if held.node != args.node or (args.pod_uid and held.uid != args.pod_uid):
            self.view.release(held)
        result = await self._plain_bind(args.pod_namespace, args.pod_name, uid, args.node)
        if result["Error"]:
            self.view.release(held)
        return result

    async def _plain_bind(self, ns: str, name: str, uid: str, node: str) -> dict[str, str]:
        assert self.writer is not None
        try:
            await self.writer.bind_pod(namespace=ns, name=name, uid=uid, node=node)
        except Exception as exc:
            return {"Error": f"gpushare: {exc}"}
        return {"Error": ""}

    async def _current_binding(self, ns: str, name: str) -> tuple[str, Placement | None] | None:
        """(node, placement) of the pod as the API server has it now; None if unbound or
        unknown."""
        assert self.writer is not None
        try:
            pod = await self.writer.get_pod(namespace=ns, name=name)
        except Exception:
            return None
        bound = pods.node_name(pod)
        if bound is None:
            return None
        try:
            return bound, parse_placement(pods.annotations(pod))
        except InvalidInputError:
            return bound, None
