"""kubectl's JSONPath templates, for ``-o jsonpath=``, ``-o custom-columns=`` and ``--sort-by``
(https://kubernetes.io/docs/reference/kubectl/jsonpath/): text outside braces is printed as
it is; inside, ``.field`` / ``['field']``, ``[n]``, ``[start:end:step]``, ``[*]``, ``..field``
(recursive), ``[?(@.field == "x")]`` filters (``==``, ``!=``, ``<``, ``<=``, ``>``, ``>=`` and
bare existence), ``range ... {end}`` and string literals (``{"\\n"}``). Results of one
expression are joined by spaces; a string prints as it is, anything else as JSON. A missing
field prints nothing, as kubectl does by default (``--allow-missing-template-keys``).
"""

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from gpushare.api.errors import InvalidInputError


class JsonPathError(ValueError):
    """A template kubectl would refuse too."""


@dataclass(frozen=True)
class _Text:
    text: str


@dataclass(frozen=True)
class _Expr:
    path: str


@dataclass(frozen=True)
class _Range:
    path: str
    body: tuple["_Node", ...]


_Node = _Text | _Expr | _Range
_STEP = re.compile(
    r"""\.\.(?P<deep>[A-Za-z0-9_\-/]+|\*)
      | \.(?P<field>[A-Za-z0-9_\-/]+|\*)
      | \[(?P<bracket>(?:'[^']*'|"[^"]*"|\?\(.*?\)|[^\]])*)\]""",
    re.VERBOSE,
)
_FILTER = re.compile(r"^\?\(\s*(@[^=!<>]*?)\s*(?:(==|!=|<=|>=|<|>)\s*(.+?))?\s*\)$")
_MISSING = object()


def _split(template: str) -> Iterator[tuple[bool, str]]:
    """(is_expression, text) pieces; braces inside quoted literals do not count."""
    pos, start, depth, quote = 0, 0, 0, ""
    while pos < len(template):
        char = template[pos]
        if quote:
            if char == "\\":
                pos += 1
            elif char == quote:
                quote = ""
        elif depth and char in "'\"":
            quote = char
        elif char == "{":
            if depth == 0:
                if pos > start:
                    yield False, template[start:pos]
                start = pos + 1
            depth += 1
        elif char == "}" and depth:
            depth -= 1
            if depth == 0:
                yield True, template[start:pos].strip()
                start = pos + 1
        pos += 1
    if depth or quote:
        raise JsonPathError(f"unclosed {{ or quote in {template!r}")
    if start < len(template):
        yield False, template[start:]


def parse(template: str) -> tuple[_Node, ...]:
    stack: list[tuple[str, list[_Node]]] = [("", [])]
    for is_expr, text in _split(template):
        if not is_expr:
            stack[-1][1].append(_Text(text))
        elif text.startswith("range "):
            stack.append((text[len("range ") :].strip(), []))
        elif text == "end":
            if len(stack) == 1:
                raise JsonPathError("{end} without {range}")
            path, body = stack.pop()
            stack[-1][1].append(_Range(path, tuple(body)))
        elif text[:1] in "'\"" and text[-1:] == text[:1] and len(text) >= 2:
            stack[-1][1].append(_Text(json.loads('"' + text[1:-1].replace('"', '\\"') + '"')))
        else:
            stack[-1][1].append(_Expr(text))
    if len(stack) != 1:
        raise JsonPathError("{range} without {end}")
    return tuple(stack[0][1])


def _literal(text: str) -> Any:
    text = text.strip()
    if text[:1] in "'\"" and text[-1:] == text[:1]:
        return text[1:-1]
    try:
        return json.loads(text)
    except ValueError:
        return text


def _children(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return list(value.values())
    if isinstance(value, list):
        return list(value)
    return []


def _deep(value: Any, name: str) -> Iterator[Any]:
    if isinstance(value, dict):
        if name == "*":
            yield from value.values()
        elif name in value:
            yield value[name]
    for child in _children(value):
        yield from _deep(child, name)


def _compare(left: Any, op: str, right: Any) -> bool:
    try:
        if op == "==":
            return bool(left == right)
        if op == "!=":
            return bool(left != right)
        if op == "<":
            return bool(left < right)
        if op == "<=":
            return bool(left <= right)
        if op == ">":
            return bool(left > right)
        return bool(left >= right)
    except TypeError:
        return False


def _bracket(values: list[Any], inner: str) -> list[Any]:
    inner = inner.strip()
    out: list[Any] = []
    if inner == "*":
        for v in values:
            out.extend(_children(v))
        return out
    if inner[:1] in "'\"":
        keys = [k.strip()[1:-1] for k in inner.split(",")]
        return [v[k] for v in values for k in keys if isinstance(v, dict) and k in v]
    if inner.startswith("?("):
        match = _FILTER.match(inner)
        if match is None:
            raise JsonPathError(f"bad filter [{inner}]")
        path, op, right = match.group(1), match.group(2), match.group(3)
        for v in values:
            for item in _children(v) if isinstance(v, list) else [v]:
                found = evaluate(path[1:] or "@", item)
                if op is None:
                    if found:
                        out.append(item)
                elif found and _compare(found[0], op, _literal(right)):
                    out.append(item)
        return out
    if ":" in inner:
        parts = [int(p) if p.strip() else None for p in inner.split(":")]
        window = slice(*parts[:3])
        for v in values:
            if isinstance(v, list):
                out.extend(v[window])
        return out
    try:
        index = int(inner)
    except ValueError:
        raise JsonPathError(f"bad subscript [{inner}]") from None
    for v in values:
        if isinstance(v, list) and -len(v) <= index < len(v):
            out.append(v[index])
    return out


def evaluate(path: str, data: Any) -> list[Any]:
    """The values ``path`` (one expression, without braces) selects in ``data``."""
    path = path.strip()
    if path.startswith(("$", "@")):
        path = path[1:]
    if path and not path.startswith((".", "[")):
        path = "." + path
    values = [data]
    pos = 0
    while pos < len(path):
        match = _STEP.match(path, pos)
        if match is None:
            raise JsonPathError(f"cannot read {path[pos:]!r} in {path!r}")
        pos = match.end()
        if match.group("deep") is not None:
            values = [found for v in values for found in _deep(v, match.group("deep"))]
        elif match.group("field") is not None:
            name = match.group("field")
            if name == "*":
                values = [c for v in values for c in _children(v)]
            else:
                values = [v[name] for v in values if isinstance(v, dict) and name in v]
        else:
            values = _bracket(values, match.group("bracket"))
    return values


def show(value: Any) -> str:
    """A value as printed: strings as they are, but with every character a terminal would act
    on or hide escaped (``\x1b``, ``\u202e``: values come from objects others write; issue
    67), other values as compact JSON (non-ASCII escaped)."""
    if isinstance(value, str):
        if value.isprintable():
            return value
        return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in value)
    if value is None:
        return ""
    return json.dumps(value, separators=(",", ":"))


def _run(nodes: tuple[_Node, ...], data: Any, out: list[str]) -> None:
    for node in nodes:
        if isinstance(node, _Text):
            out.append(node.text)
        elif isinstance(node, _Expr):
            out.append(" ".join(show(v) for v in evaluate(node.path, data)))
        else:
            for item in evaluate(node.path, data):
                _run(node.body, item, out)


def execute(template: str, data: Any, *, flag: str = "-o/--output") -> str:
    """The template's text for ``data``; a bad template is an InvalidInputError naming
    ``flag``."""
    try:
        out: list[str] = []
        _run(parse(template), data, out)
    except JsonPathError as exc:
        raise InvalidInputError(
            flag,
            f"bad JSONPath template ({exc})",
            "write it as kubectl does, e.g. {.items[*].name}",
        ) from None
    return "".join(out)


def expression(text: str) -> str:
    """A path given with or without its braces (``--sort-by``, custom columns)."""
    text = text.strip()
    return text[1:-1] if text.startswith("{") and text.endswith("}") else text
