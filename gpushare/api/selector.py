"""``-l/--selector``: kubectl's label selector syntax, checked before anything is asked.

``key=value``, ``key==value``, ``key!=value``, ``key in (a,b)``, ``key notin (a,b)``, ``key``
and ``!key``, joined by commas (all must hold), as in
https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors.
The API server filters with it; :func:`matches` applies the same rules to what was read, so
every source of objects is filtered alike.
"""

import re
from collections.abc import Mapping
from dataclasses import dataclass

from gpushare.api.errors import InvalidInputError

FLAG = "-l/--selector"
_KEY = r"(?:[a-z0-9A-Z.\-]+/)?[a-zA-Z0-9](?:[-a-zA-Z0-9_.]*[a-zA-Z0-9])?"
_VALUE = r"(?:[a-zA-Z0-9](?:[-a-zA-Z0-9_.]*[a-zA-Z0-9])?)?"
_SET = re.compile(rf"^\s*({_KEY})\s+(in|notin)\s+\(([^()]*)\)\s*$")
_EQ = re.compile(rf"^\s*({_KEY})\s*(==|=|!=)\s*({_VALUE})\s*$")
_EXISTS = re.compile(rf"^\s*(!?)\s*({_KEY})\s*$")
_VALUE_ONLY = re.compile(rf"^{_VALUE}$")
_FIX = "write it like kubectl does, e.g. -l app=web,tier!=db or -l 'env in (prod,staging)'"


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str
    """``=``, ``!=``, ``in``, ``notin``, ``exists`` or ``!``."""
    values: tuple[str, ...] = ()

    def holds(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        if self.op == "exists":
            return self.key in labels
        if self.op == "!":
            return self.key not in labels
        if self.op in ("=", "in"):
            return value is not None and value in self.values
        return value is None or value not in self.values  # != and notin

    def encode(self) -> str:
        """The requirement as the API server reads it in ``labelSelector``."""
        if self.op == "exists":
            return self.key
        if self.op == "!":
            return f"!{self.key}"
        if self.op in ("=", "!="):
            return f"{self.key}{self.op}{self.values[0]}"
        return f"{self.key} {self.op} ({','.join(self.values)})"


def _split(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
        if depth not in (0, 1):
            raise InvalidInputError(FLAG, f"unbalanced parentheses in {text!r}", _FIX)
    if depth:
        raise InvalidInputError(FLAG, f"unbalanced parentheses in {text!r}", _FIX)
    parts.append(text[start:])
    return parts


def _requirement(part: str, text: str) -> Requirement:
    if found := _SET.match(part):
        key, op, inner = found.groups()
        values = tuple(v.strip() for v in inner.split(","))
        bad = [v for v in values if not _VALUE_ONLY.match(v)]
        if bad or not inner.strip():
            raise InvalidInputError(FLAG, f"{part.strip()!r} has an empty or invalid value", _FIX)
        return Requirement(key, op, values)
    if found := _EQ.match(part):
        key, op, value = found.groups()
        return Requirement(key, "=" if op == "==" else op, (value,))
    if found := _EXISTS.match(part):
        bang, key = found.groups()
        return Requirement(key, "!" if bang else "exists")
    raise InvalidInputError(FLAG, f"cannot read {part.strip()!r} in {text!r}", _FIX)


def parse_selector(text: str | None) -> tuple[Requirement, ...]:
    """Every requirement of ``text``; empty for no selector."""
    if text is None or not text.strip():
        return ()
    return tuple(_requirement(part, text) for part in _split(text))


def matches(requirements: tuple[Requirement, ...], labels: Mapping[str, str] | None) -> bool:
    return all(r.holds(labels or {}) for r in requirements)


def encode(requirements: tuple[Requirement, ...]) -> str:
    return ",".join(r.encode() for r in requirements)
