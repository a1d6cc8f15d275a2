"""A GpuShare's ``spec.selector``: a Kubernetes LabelSelector in its object form
(``matchLabels``, ``matchExpressions``), parsed with errors that name the field.

Unlike Kubernetes, an empty selector matches no pod (:meth:`LabelSelector.matches`) and is
refused when parsed: a GpuShare must never govern every pod of a namespace by accident. The
CLI's ``-l`` string syntax is :mod:`gpushare.api.selector`.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from gpushare.api.bounds import object_field
from gpushare.api.errors import InvalidInputError
from gpushare.api.names import ANN_SHARE

OPERATORS: Final = ("In", "NotIn", "Exists", "DoesNotExist")


def _fix(text: str) -> str:
    return f"{text} (kubectl explain gpushare.spec)"


@dataclass(frozen=True)
class SelectorRequirement:
    key: str
    operator: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "In":
            return self.key in labels and labels[self.key] in self.values
        if self.operator == "NotIn":
            return self.key not in labels or labels[self.key] not in self.values
        if self.operator == "Exists":
            return self.key in labels
        return self.key not in labels  # DoesNotExist


@dataclass(frozen=True)
class LabelSelector:
    """A Kubernetes LabelSelector. An empty one matches nothing here (see ``matches``)."""

    match_labels: Mapping[str, str] = field(default_factory=dict)
    match_expressions: tuple[SelectorRequirement, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.match_labels and not self.match_expressions

    def matches(self, labels: Mapping[str, str]) -> bool:
        """True when every label and expression matches. Unlike Kubernetes, an empty selector
        matches no pod: a GpuShare must never claim every pod of a namespace by accident."""
        if self.empty:
            return False
        if any(labels.get(k) != v for k, v in self.match_labels.items()):
            return False
        return all(r.matches(labels) for r in self.match_expressions)


def _string_map(raw: object, path: str) -> dict[str, str]:
    fix = _fix("write label pairs like {app: trainer}")
    result: dict[str, str] = {}
    for key, value in object_field(raw, field=path, fix=fix).items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise InvalidInputError(f"{path}.{key}", "must be a string", fix)
        result[key] = value
    return result


MAX_SELECTOR_TERMS = 64
"""Most matchLabels pairs, matchExpressions, or values of one expression, a selector may hold:
each is matched against every pod of the namespace (issue 67: one selector of 100,000 values
took the operator's loop 14.2 s per period). Real selectors hold a handful."""


def _bounded(items: Any, where: str) -> None:
    if len(items) > MAX_SELECTOR_TERMS:
        raise InvalidInputError(
            where,
            f"holds {len(items)} entries (at most {MAX_SELECTOR_TERMS})",
            "select pods by a label they share (e.g. app: trainer) instead of listing them",
        )


def parse_label_selector(raw: object, *, path: str = "spec.selector") -> LabelSelector:
    fix = _fix("use matchLabels {key: value} or matchExpressions [{key, operator, values}]")
    body = object_field(raw, field=path, fix=fix)
    _bounded(
        object_field(body.get("matchLabels"), field=f"{path}.matchLabels", fix=fix),
        f"{path}.matchLabels",
    )
    labels = _string_map(body.get("matchLabels"), f"{path}.matchLabels")
    exprs_raw = body.get("matchExpressions") or []
    if not isinstance(exprs_raw, list):
        raise InvalidInputError(f"{path}.matchExpressions", "must be a list", fix)
    _bounded(exprs_raw, f"{path}.matchExpressions")
    exprs: list[SelectorRequirement] = []
    for i, item in enumerate(exprs_raw):
        where = f"{path}.matchExpressions[{i}]"
        entry = object_field(item, field=where, fix=fix)
        key, op, values = entry.get("key"), entry.get("operator"), entry.get("values") or []
        if not isinstance(key, str) or not key:
            raise InvalidInputError(f"{where}.key", "is missing", fix)
        if op not in OPERATORS:
            raise InvalidInputError(
                f"{where}.operator",
                f"unknown operator {op!r}",
                f"use {', '.join(OPERATORS)}",
            )
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise InvalidInputError(f"{where}.values", "must be a list of strings", fix)
        _bounded(values, f"{where}.values")
        if op in ("In", "NotIn") and not values:
            raise InvalidInputError(f"{where}.values", f"must not be empty for {op}", fix)
        if op in ("Exists", "DoesNotExist") and values:
            raise InvalidInputError(f"{where}.values", f"must be empty for {op}", fix)
        exprs.append(SelectorRequirement(key, str(op), tuple(values)))
    selector = LabelSelector(labels, tuple(exprs))
    if selector.empty:
        raise InvalidInputError(
            path,
            "is empty and would match every pod in the namespace",
            "add matchLabels or matchExpressions, or drop spec.selector and link pods with "
            f"the {ANN_SHARE} annotation",
        )
    return selector
