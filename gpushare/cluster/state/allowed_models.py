"""Which GPU models a pod may use, read from where Kubernetes says it: its node selector and
required node affinity, matched against the labels of the nodes with gpushare GPUs.

A pod limited to some GPU models says so with node labels (``nvidia.com/gpu.product`` as
NVIDIA's GPU Feature Discovery sets it, or any label an admin gives a node pool), and
kube-scheduler filters the nodes before the extender sees them: the extender never needs the
models. The pod mix does (:class:`gpushare.packing.mix.PodMix`): a model only some pods may use
is worth keeping for them (:mod:`gpushare.packing.scarcity`, docs/packing.md "Scarce GPU
models"). So the models are the GPU models of the nodes the pod's constraints admit, whatever
label they use, and a pod every model's nodes admit has no limit.

Only the mix reads this; a malformed selector or affinity (the API server validates them, so
only a hand-made object) reads as no limit, never as an error.
"""

import json
from collections.abc import Mapping, Sequence
from typing import Any

NAME_FIELD = "metadata.name"
CACHE_LIMIT = 4096
"""Distinct constraints remembered before all answers are dropped."""


class AllowedModels:
    """GPU models by node (with the node's labels), and what a pod's constraints admit."""

    def __init__(self) -> None:
        self._nodes: dict[str, tuple[Mapping[str, str], str]] = {}
        self._answers: dict[str, str | None] = {}

    def node(self, name: str, labels: Mapping[str, Any] | None, model: str | None) -> None:
        """The node as last seen: its labels and its GPUs' model (None: no gpushare GPUs)."""
        if not model:
            self.drop(name)
            return
        clean = {str(k): str(v) for k, v in (labels or {}).items() if isinstance(v, str)}
        clean.setdefault("kubernetes.io/hostname", name)
        if self._nodes.get(name) != (clean, model):
            self._nodes[name] = (clean, model)
            self._answers.clear()

    def drop(self, name: str) -> None:
        if self._nodes.pop(name, None) is not None:
            self._answers.clear()

    def of(self, spec: Mapping[str, Any]) -> str | None:
        """The models (``"A|B"``, sorted) of the nodes ``spec`` (a pod's spec) may run on, or
        None when it is not limited: no constraint, every model admitted, or none (the pod
        fits nowhere, and kube-scheduler says so)."""
        selector = spec.get("nodeSelector")
        affinity = spec.get("affinity")
        terms = None
        if isinstance(affinity, Mapping):
            node_affinity = affinity.get("nodeAffinity")
            if isinstance(node_affinity, Mapping):
                required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
                if isinstance(required, Mapping):
                    terms = required.get("nodeSelectorTerms")
        if not selector and not terms:
            return None
        try:
            key = json.dumps([selector, terms], sort_keys=True)
        except (TypeError, ValueError):
            return None
        if key in self._answers:
            return self._answers[key]
        answer = self._work_out(selector, terms)
        if len(self._answers) >= CACHE_LIMIT:
            self._answers.clear()
        self._answers[key] = answer
        return answer

    def _work_out(self, selector: object, terms: object) -> str | None:
        if selector is not None and not isinstance(selector, Mapping):
            return None
        if terms is not None and not isinstance(terms, list):
            return None
        every: set[str] = set()
        admitted: set[str] = set()
        for name, (labels, model) in self._nodes.items():
            every.add(model)
            if model in admitted:
                continue
            if selector and any(labels.get(str(k)) != v for k, v in selector.items()):
                continue
            if terms and not any(_term_matches(t, name, labels) for t in terms):
                continue
            admitted.add(model)
        if not admitted or admitted == every:
            return None
        return "|".join(sorted(admitted))


def _term_matches(term: object, name: str, labels: Mapping[str, str]) -> bool:
    """A node selector term: every expression and field matches; an empty term matches no
    node (as in Kubernetes)."""
    if not isinstance(term, Mapping):
        return False
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not isinstance(expressions, list) or not isinstance(fields, list):
        return False
    if not expressions and not fields:
        return False
    return all(_matches(e, labels) for e in expressions) and all(
        _matches(f, {NAME_FIELD: name}) for f in fields
    )


def _matches(requirement: object, labels: Mapping[str, str]) -> bool:
    if not isinstance(requirement, Mapping):
        return False
    key, operator = requirement.get("key"), requirement.get("operator")
    raw = requirement.get("values") or []
    values: Sequence[object] = raw if isinstance(raw, list) else []
    if not isinstance(key, str):
        return False
    value = labels.get(key)
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and len(values) == 1:
        try:
            have, bound = int(value), int(str(values[0]))
        except ValueError:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False
