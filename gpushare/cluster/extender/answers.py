"""What the extender answers about a node for a pod shape, remembered per node *state*.

Whether a pod fits on a node, the placer's cost there and the verdict filter reports (pass,
failed or unresolvable, with its words) depend on the pod's shape and the node's state alone:
its GPUs' signatures (:func:`gpushare.packing.placer.gpu_signature`), its free CPU and memory,
and its GPUs with no tenants -- as long as no tenant there has a measured profile and no pod's
GpuShare rules narrow the node (those nodes are answered afresh, by the extender). A cluster's
nodes are in far fewer states than there are (node, version) pairs, and kube-scheduler offers
each pod a different window of nodes, so a pod shape keeps meeting nodes it was never asked
about: kept per state, each such node costs two dict lookups (docs/packing.md, "Speed").

A cost holds until the pod mix is refit; "does not fit" and the verdict until the node's state
changes (neither depends on the mix).
"""

import math
from collections.abc import Mapping
from functools import lru_cache
from types import MappingProxyType

from gpushare.cluster.state.view import ClusterView
from gpushare.packing.model import Demand
from gpushare.packing.placer import Placer, gpu_signature

PASS, FAILED, UNRESOLVABLE = "pass", "failed", "unresolvable"
ANSWER_LIMIT = 200_000
"""Answers kept (pod shape x node state) before all are dropped and worked out again."""

Signature = tuple[object, ...]
State = tuple[Signature, int | None, int | None, Signature | None]
"""(GPU signature, free milli-CPU, free memory, the empty node's GPU signature)."""
Verdict = tuple[str, str]


def scheduler_safe(message: str) -> str:
    """kube-scheduler passes extender messages through a printf-style event formatter, where
    "41% compute" turns into "41%!c(MISSING)ompute": spell percent signs out."""
    return message.replace("%", " percent")


@lru_cache(maxsize=4096)
def prefixed(reason: str) -> str:
    """The scheduler's words for a refusal (few distinct ones: they name no GPU)."""
    return scheduler_safe(reason if reason.startswith("gpushare") else f"gpushare: {reason}")


class Answer:
    """What the extender answered for one pod shape on nodes in one state."""

    __slots__ = ("cost", "mix", "verdict")

    def __init__(self) -> None:
        self.mix = -1
        """The mix version ``cost`` was worked out under (-1: not yet)."""
        self.cost: float | None = None
        self.verdict: Verdict | None = None

    def cost_holds(self, mix: int) -> bool:
        """``cost`` answers under mix version ``mix``: worked out under it, or "does not fit"
        (which no refit changes)."""
        return self.mix == mix or (self.mix >= 0 and self.cost is None)


class StateAnswers:
    """Costs and verdicts per pod shape and node state, over one view and placer; and, per
    pod shape, which answer each node had at its version (a lookup by node name, for the
    common case of a node unchanged since the shape last met it)."""

    def __init__(self, *, view: ClusterView, placer: Placer, limit: int = ANSWER_LIMIT) -> None:
        self.view = view
        self.placer = placer
        self.limit = limit
        self._states: dict[str, tuple[int, State | None]] = {}
        self._answers: dict[Demand, dict[State, Answer]] = {}
        self._named: dict[Demand, dict[str, tuple[int, Answer]]] = {}
        self._size = 0

    def clear(self) -> None:
        """Forget every answer (the extender benchmark's cold phase times the work without
        them; answers are worked out again as nodes are asked)."""
        self._states.clear()
        self._answers.clear()
        self._named.clear()
        self._size = 0

    def named(self, demand: Demand) -> Mapping[str, tuple[int, Answer]]:
        """Node name -> (node version, its answer then) for ``demand``: valid while the
        node's version is the same."""
        return self._named.get(demand, _NONE)

    def answer(self, name: str, demand: Demand) -> Answer | None:
        """The answer for ``demand`` on node ``name`` as it is now; None when the node's
        answers cannot be shared (no gpushare GPUs, a tenant with a measured profile)."""
        version = self.view.node_version(name)
        state = self.state(name, version)
        if state is None:
            return None
        known = self._answers.get(demand)
        if known is None:
            known = self._answers[demand] = {}
        answer = known.get(state)
        if answer is None:
            if self._size >= self.limit:
                self._answers.clear()
                self._named.clear()
                self._size = 0
                known = self._answers[demand] = {}
            answer = known[state] = Answer()
            self._size += 1
        named = self._named.get(demand)
        if named is None:
            named = self._named[demand] = {}
        named[name] = (version, answer)
        return answer

    def state(self, name: str, version: int) -> State | None:
        """Node ``name``'s state at ``version`` (kept per version); None when its answers
        cannot be shared."""
        hit = self._states.get(name)
        if hit is not None and hit[0] == version:
            return hit[1]
        node = self.view.node(name)
        state: State | None = None
        gpus = gpu_signature(node) if node is not None and node.gpus else None
        if node is not None and gpus is not None:
            empty = self.view.empty_node(name)
            state = (
                gpus,
                node.cpu_milli_free,
                node.memory_free_bytes,
                gpu_signature(empty) if empty is not None else None,
            )
        self._states[name] = (version, state)
        return state

    def cost(self, answer: Answer, name: str, demand: Demand) -> float | None:
        """The placer's cost of ``demand`` on node ``name`` (None: no fit), from ``answer``
        (:meth:`answer` for that node) when it holds."""
        mix = self.placer.version
        if answer.cost_holds(mix):
            return answer.cost
        node = self.view.node(name)
        assert node is not None  # a node with a state is in the view
        answer.cost = self.placer.node_cost(node, demand)
        answer.mix = mix
        return answer.cost

    def verdict(self, answer: Answer, name: str, demand: Demand) -> Verdict:
        """(pass|failed|unresolvable, words) for ``demand`` on node ``name``: a node that
        fails only because of its tenants is failed (preemption could help), one where the
        pod would not fit even empty is unresolvable."""
        if answer.verdict is not None:
            return answer.verdict
        node = self.view.node(name)
        assert node is not None
        reason = self.placer.refusal(node, demand)
        if reason is None:
            verdict = (PASS, "")
        else:
            empty = self.view.empty_node(name)
            if empty is None:
                verdict = (UNRESOLVABLE, prefixed(reason))
            elif (empty_reason := self.placer.refusal(empty, demand)) is not None:
                verdict = (UNRESOLVABLE, prefixed(empty_reason))
            else:
                verdict = (FAILED, prefixed(reason))
        answer.verdict = verdict
        return verdict


NO_FIT = math.inf
"""A node's cost in :class:`ShapeCosts` where the pod does not fit."""
SHAPES_KEPT = 256
"""Pod shapes :class:`ShapeCosts` keeps node costs for, the least recently asked dropped
first (at 5,000 nodes at most about 1.3 million costs)."""


class _ShapeEntry:
    __slots__ = ("costs", "mix", "seq")

    def __init__(self, mix: int, seq: int) -> None:
        self.costs: dict[str, float] = {}
        self.mix = mix
        self.seq = seq


class ShapeCosts:
    """Per pod shape, the placer's cost on each node as last worked out (:data:`NO_FIT` where
    it does not fit), for the filter's loop over the offered nodes: a node unchanged since the
    shape last met it costs one dict lookup done in C (``map(costs.get, names)``), where
    comparing each node's version costs Python work per node (docs/scale.md). A node's entry
    is dropped when the view logs a change of it (:meth:`ClusterView.changed_since`), every
    entry when the pod mix is refit; only answers that hold for every pod of the shape (no
    GpuShare rules narrow a node, the pod holds nothing there) may be kept."""

    def __init__(self, *, view: ClusterView, placer: Placer, shapes: int = SHAPES_KEPT) -> None:
        self.view = view
        self.placer = placer
        self.shapes = shapes
        self._entries: dict[Demand, _ShapeEntry] = {}

    def clear(self) -> None:
        """Forget every shape's costs (see :meth:`StateAnswers.clear`)."""
        self._entries.clear()

    def costs(self, demand: Demand) -> dict[str, float]:
        """Node -> cost for ``demand``, every entry current (the caller adds what it works
        out for nodes missing from it)."""
        mix, seq = self.placer.version, self.view.change_seq
        entry = self._entries.pop(demand, None)
        if entry is None or entry.mix != mix:
            entry = _ShapeEntry(mix, seq)
        elif entry.seq != seq:
            changed = self.view.changed_since(entry.seq)
            if changed is None or len(changed) >= len(entry.costs):
                entry.costs.clear()
            else:
                drop = entry.costs.pop
                for name in changed:
                    drop(name, None)
            entry.seq = seq
        self._entries[demand] = entry  # most recently asked last
        if len(self._entries) > self.shapes:
            del self._entries[next(iter(self._entries))]
        return entry.costs


_NONE: Mapping[str, tuple[int, Answer]] = MappingProxyType({})
