"""What the filter knows of each offered node for a pod: its verdict (passes, fails, cannot be
helped) and the placer's cost there, from the answers kept per node state and pod shape where
they hold (:mod:`~gpushare.cluster.extender.answers`, :mod:`gpushare.packing.quick_costs`),
else worked out for this pod. :class:`~gpushare.cluster.extender.filtering.FilterVerbs` builds
on it; docs/scale.md says why each answer is kept the way it is.
"""

from collections.abc import Mapping
from itertools import compress, count, repeat
from operator import is_
from typing import cast

from gpushare.cluster.extender.answers import FAILED as _FAILED
from gpushare.cluster.extender.answers import (
    NO_FIT,
    SHAPES_KEPT,
    Answer,
    Verdict,
    prefixed,
    scheduler_safe,
)
from gpushare.cluster.extender.answers import PASS as _PASS
from gpushare.cluster.extender.answers import UNRESOLVABLE as _UNRESOLVABLE
from gpushare.cluster.extender.base import NO_INVENTORY, ExtenderBase
from gpushare.cluster.state.share_rules import ShareRules
from gpushare.packing.model import Demand, NodeState
from gpushare.packing.quick_costs import UNKNOWN, NodeFacts

FACTS_LIMIT = 100_000
"""Nodes whose quick-cost facts are kept (all dropped beyond it: nodes come and go)."""

Verdicts = tuple[list[str], dict[str, str], dict[str, str]]
"""Nodes that passed, and those that failed and cannot be helped, each with its reason."""


class NodeAnswers(ExtenderBase):
    """Verdicts and costs of one pod on the offered nodes."""

    def _verdicts(
        self,
        names: list[str],
        key: str,
        demand: Demand,
        rules: ShareRules,
        *,
        fast: bool,
        own: set[str],
    ) -> Verdicts:
        """Each node's verdict: (passed, failed with reasons, unresolvable with reasons)."""
        passed: list[str] = []
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        versions = self.view.node_versions
        constrained = rules.constrains_gpus
        quick = fast and self.placer.quick_reads(demand)
        kept = self._kept_verdicts(demand) if quick else {}
        for name in names:
            quick_verdict = (
                self._kept_verdict(name, demand, versions, kept)
                if quick and name not in own
                else None
            )
            answer = (
                self._fast_answer(name, demand, versions)
                if fast and quick_verdict is None and name not in own
                else None
            )
            if quick_verdict is not None:
                verdict, message = quick_verdict
            elif answer is None:
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
        return passed, failed, unresolvable

    def _kept_verdicts(self, demand: Demand) -> dict[str, tuple[int, Verdict]]:
        """Node -> (its version, the verdict then) for ``demand``, as the quick refusals gave
        them: a pod no node takes is asked about every node again and again (kube-scheduler
        retries it), mostly unchanged ones."""
        kept = self._verdicts_by_shape.pop(demand, None)
        if kept is None:
            kept = {}
        self._verdicts_by_shape[demand] = kept  # most recently asked last
        if len(self._verdicts_by_shape) > SHAPES_KEPT:
            del self._verdicts_by_shape[next(iter(self._verdicts_by_shape))]
        return kept

    def _kept_verdict(
        self,
        name: str,
        demand: Demand,
        versions: Mapping[str, int],
        kept: dict[str, tuple[int, Verdict]],
    ) -> Verdict | None:
        """The quick verdict on node ``name`` (kept in ``kept`` while the node's version
        holds); None where only the reference reads the node."""
        version = versions.get(name, 0)
        hit = kept.get(name)
        if hit is not None and hit[0] == version:
            return hit[1]
        facts = self._node_facts(name, versions)
        if facts is None:
            return None
        verdict = self._quick_verdict(name, facts, demand)
        kept[name] = (version, verdict)
        return verdict

    def _quick_verdict(self, name: str, facts: NodeFacts, demand: Demand) -> Verdict:
        """:meth:`StateAnswers.verdict` of ``demand`` on node ``name`` from the placer's quick
        refusals (the same words): fails with the node's refusal, unresolvable with the
        refusal on its GPUs emptied when they would not take the pod either."""
        node = self.view.node(name)
        assert node is not None  # facts are made of nodes in the view
        reason = self.placer.quick_refusal(facts, node, demand)
        if reason is None:
            return _PASS, ""
        empty = self.view.empty_node(name)
        if empty is None:
            return _UNRESOLVABLE, prefixed(reason)
        hit = self._empty_facts.get(name)
        if hit is None or hit[0] is not empty or hit[1].epoch != self.placer.quick.epoch:
            made = self.placer.node_facts(empty)
            hit = (empty, made) if made is not None else None
            if hit is not None:
                self._empty_facts[name] = hit
        empty_reason = (
            self.placer.quick_refusal(hit[1], empty, demand)
            if hit is not None
            else self.placer.refusal(empty, demand)
        )
        if empty_reason is not None:
            return _UNRESOLVABLE, prefixed(empty_reason)
        return _FAILED, prefixed(reason)

    def _fitting(
        self,
        names: list[str],
        key: str,
        demand: Demand,
        rules: ShareRules,
        *,
        fast: bool,
        own: set[str],
    ) -> list[float]:
        """The placer's cost of ``demand`` on each node of ``names``, in order (:data:`NO_FIT`
        where it does not fit). This runs for every offered node of every filter call (about
        420 of 1,000 nodes, docs/scale.md): with ``fast``, costs of nodes unchanged since the
        pod shape last met them come from :class:`ShapeCosts` in one pass done in C, and only
        the others are worked out here, by the placer's quick cost from facts kept per node
        version where it reads the pod and the node, else by the reference."""
        if not fast:
            return [self._node_cost(n, key, demand, rules, shared=n not in own) for n in names]
        known = self.shape_costs.costs(demand)
        costs: list[float | None] = list(map(known.get, names))
        if own or None in costs:
            mix = self.placer.version
            versions = self.view.node_versions
            quick = self.placer.quick_reads(demand)
            # Nodes in one state cost the same: most of a new shape's nodes are a dict read.
            by_state = self.placer.quick_costs_kept(demand) if quick else {}
            # The nodes to work out, in order: those the shape's costs lack (found in C), and
            # those where the pod holds something itself.
            todo = list(compress(count(), map(is_, costs, repeat(None))))
            if own:
                todo = sorted({*todo, *(i for i, n in enumerate(names) if n in own)})
            for i in todo:
                name = names[i]
                facts = self._node_facts(name, versions) if quick and name not in own else None
                if facts is not None:
                    cost = by_state.get(facts.state, UNKNOWN)
                    if cost is UNKNOWN:
                        cost = self.placer.quick_cost(facts, demand)
                    costs[i] = known[name] = NO_FIT if cost is None else cost
                    continue
                answer = self._fast_answer(name, demand, versions) if name not in own else None
                if answer is None:
                    costs[i] = self._node_cost(name, key, demand, rules, shared=name not in own)
                    continue
                cost = (
                    answer.cost
                    if answer.cost_holds(mix)
                    else self.answers.cost(answer, name, demand)
                )
                costs[i] = known[name] = NO_FIT if cost is None else cost
        return cast(list[float], costs)  # every None was replaced above

    def _node_facts(self, name: str, versions: Mapping[str, int]) -> NodeFacts | None:
        """What the placer's quick cost reads of node ``name`` (:mod:`gpushare.packing.
        quick_costs`), kept while the node's version and the facts' epoch hold; None where
        only the reference reads the node (no gpushare GPUs, profiled or opportunistic
        tenants)."""
        version = versions.get(name, 0)
        hit = self._facts.get(name)
        if hit is not None and hit[0] == version:
            facts = hit[1]
            if facts is None or facts.epoch == self.placer.quick.epoch:
                return facts
        node = self.view.node(name)
        facts = self.placer.node_facts(node) if node is not None else None
        if len(self._facts) >= FACTS_LIMIT:
            self._facts.clear()
            self._empty_facts.clear()
        self._facts[name] = (version, facts)
        return facts

    def _node_cost(
        self, name: str, key: str, demand: Demand, rules: ShareRules, *, shared: bool
    ) -> float:
        cost = self._cost(name, key, demand, rules, shared=shared)
        return NO_FIT if cost is None else cost

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
