"""Bounded parsing of what tenants and the wire hand gpushare: numbers, JSON, lengths.

Every annotation, CRD field and wire input is read through these, so a hostile value becomes an
:class:`InvalidInputError` naming the field, never an exception in a watch. Python's own limits
are not enough: ``json.loads`` raises ``ValueError`` past 4300 digits and ``RecursionError`` on
deep nesting, ``Decimal`` arithmetic raises ``Overflow`` on ``1e999999999``, and ``str(int)``
raises past 4300 digits (see docs/security.md, "Parsing is total").
"""

import json
import math
import re
from datetime import UTC, datetime
from typing import Any, Final

from gpushare.api.errors import InvalidInputError

MAX_ANNOTATION_CHARS: Final = 16 * 1024
"""Longest gpushare annotation value read (the API server allows 256 KiB for all of them)."""
MAX_JSON_DEPTH: Final = 16
"""Deepest nesting of a JSON annotation (inventories and profiles are two or three deep)."""
MAX_BODY_DEPTH: Final = 64
"""Deepest nesting of an HTTP body (a v1.Pod is about ten deep)."""
MAX_INT_DIGITS: Final = 20
"""Digits of any integer read (2**64 has 20)."""
MAX_BYTES: Final = 2**60
"""Largest byte count accepted anywhere (1 EiB, far above any GPU's memory)."""

_INT = re.compile(r"[+-]?[0-9]{1,20}")
_BRACKETS = re.compile(r'[\[\]{}"\\]')


def check_length(text: str, *, field: str, fix: str, limit: int = MAX_ANNOTATION_CHARS) -> str:
    """``text`` itself; InvalidInputError when longer than ``limit`` characters."""
    if len(text) > limit:
        raise InvalidInputError(field, f"is {len(text)} characters long (at most {limit})", fix)
    return text


def bounded_int(text: str, *, field: str, fix: str, low: int, high: int) -> int:
    """A decimal integer of at most 20 ASCII digits within ``low..high``."""
    stripped = text.strip()
    if not _INT.fullmatch(stripped):
        shown = stripped if len(stripped) <= 24 else stripped[:20] + "..."
        raise InvalidInputError(field, f"{shown!r} is not a whole number", fix)
    value = int(stripped)
    if not low <= value <= high:
        raise InvalidInputError(field, f"{value} is outside {low}..{high}", fix)
    return value


def json_depth(text: str) -> int:
    """Deepest nesting of arrays and objects in a JSON text (strings skipped); linear time,
    no recursion. Texts with few brackets are answered by counting them."""
    opened = text.count("[") + text.count("{")
    if opened <= MAX_JSON_DEPTH:
        return opened
    depth = deepest = 0
    in_string = escaped = False
    for match in _BRACKETS.finditer(text):
        char = match.group()
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = match.end() < len(text) and text[match.end()] in '"\\'
                if escaped:
                    continue
            elif char == '"':
                in_string = False
            continue
        if char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(text)} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:20]!r} is not a finite number")
    return value


def _parse_constant(text: str) -> float:
    raise ValueError(f"{text} is not JSON")


def load_json(
    text: str,
    *,
    field: str,
    fix: str,
    max_chars: int = MAX_ANNOTATION_CHARS,
    max_depth: int = MAX_JSON_DEPTH,
) -> Any:
    """``json.loads`` with bounds on length, nesting and digits; finite numbers only.
    Raises InvalidInputError naming ``field`` for anything else."""
    check_length(text, field=field, fix=fix, limit=max_chars)
    depth = json_depth(text)
    if depth > max_depth:
        raise InvalidInputError(field, f"is nested {depth} deep (at most {max_depth})", fix)
    try:
        return json.loads(
            text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant
        )
    except json.JSONDecodeError as exc:
        raise InvalidInputError(field, f"is not JSON ({exc.msg})", fix) from None
    except (ValueError, RecursionError) as exc:
        raise InvalidInputError(field, f"is not usable JSON ({exc})", fix) from None


def load_body(raw: bytes | str, *, field: str, fix: str) -> Any:
    """An HTTP body's JSON: digits and numbers bounded as in :func:`load_json`; nesting bounded
    by the interpreter's recursion limit (``json`` checks it in C and raises RecursionError,
    turned into InvalidInputError here), which costs nothing on the common path."""
    try:
        return json.loads(
            raw, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant
        )
    except json.JSONDecodeError as exc:
        raise InvalidInputError(field, f"is not JSON ({exc.msg})", fix) from None
    except RecursionError:
        raise InvalidInputError(field, "is nested too deeply", fix) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidInputError(field, f"is not usable JSON ({str(exc)[:200]})", fix) from None


def format_rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: str, *, field: str) -> datetime:
    check_length(text, field=field, fix='write e.g. "2025-01-31T12:00:00Z"', limit=64)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidInputError(
            field, f"{text!r} is not an RFC 3339 time", 'write e.g. "2025-01-31T12:00:00Z"'
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
