"""Filter and prioritize: which nodes can take the pod, and which one it should take.

Per call the work is proportional to the candidate nodes: each is looked up in the view and
answered from the answers kept per node state (:mod:`~gpushare.cluster.extender.answers`).
Which node and which GPUs is one decision, :class:`gpushare.packing.placer.Placer`'s (the openb
simulator asks the same object): filter ranks the nodes that fit by its exact cost and holds the
cheapest, prioritize derives its scores from the same ranking (docs/scheduling.md).
"""

import logging
from datetime import UTC, datetime
from itertools import compress, repeat
from operator import eq
from typing import Any

from gpushare.api.errors import InvalidInputError
from gpushare.api.names import SCHEDULER_NAME
from gpushare.cluster.extender.answers import (
    NO_FIT,
    prefixed,
    scheduler_safe,
)
from gpushare.cluster.extender.args import ExtenderArgs
from gpushare.cluster.extender.node_answers import NodeAnswers, Verdicts
from gpushare.cluster.state import pods
from gpushare.cluster.state.host_resources import pod_requests
from gpushare.cluster.state.reservations import ReservationError
from gpushare.cluster.state.share_rules import (
    NO_RULES,
    ShareRules,
    with_profile,
)
from gpushare.packing.fit import node_fit_reason
from gpushare.packing.model import Assignment, Demand
from gpushare.packing.placer import best_node, rank_scores
from gpushare.packing.policy import Policy

log = logging.getLogger(__name__)


class FilterVerbs(NodeAnswers):
    """filter and prioritize."""

    def filter(self, args: ExtenderArgs) -> dict[str, Any]:
        """ExtenderFilterResult. Misfits no preemption can cure (a pod bigger than any GPU of
        the node, a node without gpushare GPUs) go to FailedAndUnresolvableNodes."""
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
        # Answers kept per node state hold for this pod unless its own rules, or others',
        # narrow a node (then each node is asked afresh, see _shared_state).
        fast = not rules.constrains_gpus and not self.view.any_blockers
        uid = pods.pod_uid(args.pod)
        if self.hold_in_filter and self._may_hold(key, uid):
            held = self._held(args, key, uid, demand, rules, fast=fast, own=own)
            if held is not None:
                return held
        verdicts = self._verdicts(args.node_names, key, demand, rules, fast=fast, own=own)
        self._tell(args, key, uid, demand, verdicts)
        return self._filter_result(args, *verdicts)

    def _held(
        self,
        args: ExtenderArgs,
        key: str,
        uid: str,
        demand: Demand,
        rules: ShareRules,
        *,
        fast: bool,
        own: set[str],
    ) -> dict[str, Any] | None:
        """Hold the best node for the pod and offer it alone; None when no node fits (the
        per-node reasons are then worked out, which the scheduler reads only then)."""
        # The placer's cost is None exactly where the pod does not fit: rank by it first.
        costs = self._fitting(args.node_names, key, demand, rules, fast=fast, own=own)
        low = min(costs, default=NO_FIT)
        if low >= NO_FIT:
            return None
        self.refused.placed(key)
        # The nodes of exactly the lowest cost; found in C (hundreds of nodes a call).
        if costs.count(low) == 1:
            ties = [args.node_names[costs.index(low)]]
        else:
            ties = list(compress(args.node_names, map(eq, costs, repeat(low))))
        best = self._hold_best(args, key, demand, rules, ties=ties)
        if best is None:
            return None
        # With one node offered, the reasons for the others are dead weight (hundreds of
        # entries per call to encode and decode): none are sent.
        self.offers.offer(key, uid, (best,))
        return self._filter_result(args, [best], {}, {})

    def _tell(
        self, args: ExtenderArgs, key: str, uid: str, demand: Demand, verdicts: Verdicts
    ) -> None:
        """Record the outcome: the nodes offered, or that none fits (logged with an example).
        Where only room stood in its way (``failed``: the node emptied would take it), the
        pod waits for a guaranteed share there, which the promotion round leaves it
        (``RefusedPods.waiting``)."""
        passed, failed, unresolvable = verdicts
        if passed:
            self.refused.placed(key)
            self.offers.offer(key, uid, passed)
            return
        if not args.node_names:
            return
        self.refused.refused(key, demand=demand if failed else None, nodes=failed.keys())
        first = args.node_names[0]
        log.info(
            "no node fits",
            extra={
                "pod": key,
                "nodes": len(args.node_names),
                "example": f"{first}: {failed.get(first) or unresolvable.get(first)}",
            },
        )

    def _hold_best(
        self,
        args: ExtenderArgs,
        key: str,
        demand: Demand,
        rules: ShareRules,
        *,
        ties: list[str],
    ) -> str | None:
        """Pick the placer's cheapest node (``ties``: the nodes of exactly the lowest cost,
        the first by name taken), hold the GPU(s) there for the pod now, and return it (None
        when nothing could be held). Later pods are filtered against the hold,
        so they do not collide with this one at bind time (kube-scheduler binds
        asynchronously). The price: the scheduler's own scores cannot pick among GPU-feasible
        nodes any more."""
        # Among nodes of exactly the best cost, prefer one where the bind will not wait at the
        # allocation gate behind a pod of the same size (back-to-back pods of one shape often
        # go to one node). Only exact ties: the ranking itself is the placer's.
        size = demand.percent
        best = min(ties)  # often hundreds of ties (empty nodes): no sort unless this one waits
        if len(ties) > 1 and self._pending_alike(best, key, size):
            best = next((n for n in sorted(ties) if not self._pending_alike(n, key, size)), best)
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
        replaces it) that lapses after ``hold_seconds``; a pod whose holds lapsed twice
        without a bind gets none more (``ClusterView.may_hold_again``)."""
        known = self.view.pod(key)
        return (
            known is not None
            and bool(uid)
            and known.uid == uid
            and known.node is None
            and not known.finished
            and known.scheduler == SCHEDULER_NAME
            and self.view.may_hold_again(key, uid)
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
        if (
            not self.hold_in_filter
            or not uid
            or pods.scheduler_name(args.pod) != SCHEDULER_NAME
            or not self.view.may_hold_again(key, uid)
        ):
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
        fast = not self.view.any_blockers
        own = self._own_nodes(key) if fast else set()
        versions = self.view.node_versions
        mix = self.placer.version
        # As in _fitting: a node unchanged since the shape last met it costs a dict read, one
        # the placer's quick cost reads costs that, and only the others the reference.
        known = self.shape_costs.costs(demand) if fast else {}
        quick = fast and self.placer.quick_reads(demand)
        for name in names:
            shared = fast and name not in own
            if shared:
                cost = known.get(name)
                if cost is not None:
                    out[name] = None if cost == NO_FIT else cost
                    continue
                facts = self._node_facts(name, versions) if quick else None
                if facts is not None:
                    out[name] = cost = self.placer.quick_cost(facts, demand)
                    known[name] = NO_FIT if cost is None else cost
                    continue
            answer = self._fast_answer(name, demand, versions) if shared else None
            if answer is not None:
                out[name] = cost = (
                    answer.cost
                    if answer.cost_holds(mix)
                    else self.answers.cost(answer, name, demand)
                )
                known[name] = NO_FIT if cost is None else cost
            elif self.view.node(name) is None:
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
