"""``-o yaml`` of a JSON-compatible document, without a YAML library (the CLI installs with no
dependency; docs/cli.md, "Install"). Block style, keys in document order; a string that YAML
would read as something else (a number, a boolean, null, or text with indicators) is written
as a JSON string, which YAML reads back unchanged."""

import json
import re
from typing import Any

_PLAIN = re.compile(r"^[A-Za-z_/][A-Za-z0-9_./@-]*( [A-Za-z0-9_./@()%-]+)*$")
_RESERVED = {"y", "yes", "n", "no", "true", "false", "on", "off", "null", "~"}


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return json.dumps(value)
    text = str(value)
    if _PLAIN.match(text) and text.lower() not in _RESERVED:
        return text
    if text.isprintable():
        return json.dumps(text, ensure_ascii=False)
    # Escaped, every character a terminal would act on or hide (C1 controls, bidi overrides,
    # DEL): values come from objects others write (issue 67; docs/security.md).
    return json.dumps(text, ensure_ascii=True)


def _inline(value: Any) -> str:
    """A scalar, or an empty mapping or list, on its key's line."""
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[]"
    return _scalar(value)


def _lines(value: Any, indent: int) -> list[str]:
    pad = " " * indent
    if isinstance(value, dict):
        if not value:
            return [pad + "{}"]
        out: list[str] = []
        for key, item in value.items():
            head = f"{pad}{_scalar(str(key))}:"
            if isinstance(item, dict | list) and item:
                out.append(head)
                out.extend(_lines(item, indent + (0 if isinstance(item, list) else 2)))
            else:
                out.append(f"{head} {_inline(item)}")
        return out
    if isinstance(value, list):
        if not value:
            return [pad + "[]"]
        out = []
        for item in value:
            if isinstance(item, dict | list) and item:
                inner = _lines(item, indent + 2)
                out.append(f"{pad}- {inner[0].lstrip()}")
                out.extend(inner[1:])
            else:
                out.extend(f"{pad}- {line.lstrip()}" for line in _lines(item, 0))
        return out
    return [pad + _scalar(value)]


def dump_yaml(document: Any) -> str:
    return "\n".join(_lines(document, 0)) + "\n"
