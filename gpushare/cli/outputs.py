"""kubectl's other output formats for ``get pods|gpus``: ``-o name``, ``-o jsonpath=``,
``-o jsonpath-file=``, ``-o custom-columns=``, ``-o custom-columns-file=``, with
``--no-headers`` and ``--sort-by`` (docs/cli.md, "Output"). They read the same documents as
``-o json`` (one object per row), so every field a column or template can name is there."""

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpushare.api.errors import InvalidInputError
from gpushare.cli.jsonpath import JsonPathError, evaluate, execute, expression, show
from gpushare.cli.render import table

FLAG = "-o/--output"
SIMPLE = ("text", "wide", "json", "yaml", "name")
TEMPLATED = ("jsonpath", "jsonpath-file", "custom-columns", "custom-columns-file")
NONE = "<none>"


@dataclass(frozen=True)
class Output:
    """An ``-o`` value: its format and, for the templated ones, the template."""

    format: str
    template: str = ""

    @property
    def document(self) -> bool:
        return self.format in ("json", "yaml")


def parse_output(text: str) -> Output:
    """``-o``'s value as kubectl spells it (an argparse ``type``)."""
    if text in SIMPLE:
        return Output(text)
    name, sep, value = text.partition("=")
    if sep and name in TEMPLATED and value:
        if name.endswith("-file"):
            try:
                value = Path(value).read_text()
            except OSError as exc:
                raise InvalidInputError(
                    FLAG, f"cannot read {value} ({exc.strerror})", "give a readable file"
                ) from None
        return Output(name.removesuffix("-file"), value)
    raise InvalidInputError(
        FLAG,
        f"unknown output {text!r}",
        "use wide, json, yaml, name, jsonpath=TEMPLATE, jsonpath-file=FILE, "
        "custom-columns=SPEC or custom-columns-file=FILE",
    )


def sort_order(items: Sequence[Any], sort_by: str) -> list[int]:
    """Indexes of ``items`` ordered by the first value ``sort_by`` selects in each (numbers
    numerically, then text; items without one first), as ``kubectl get --sort-by``."""

    def key(i: int) -> tuple[int, float, str]:
        try:
            found = evaluate(expression(sort_by), items[i])
        except JsonPathError as exc:
            raise InvalidInputError(
                "--sort-by", f"bad JSONPath ({exc})", "e.g. --sort-by=.request_percent"
            ) from None
        if not found or found[0] is None:
            return (0, 0.0, "")
        value = found[0]
        if isinstance(value, bool) or not isinstance(value, int | float):
            return (2, 0.0, show(value))
        return (1, float(value), "")

    return sorted(range(len(items)), key=key)


def _columns(spec: str) -> list[tuple[str, str]]:
    """``NAME:.path,...`` or the file form: a header line, then a line of paths."""
    lines = [line for line in spec.splitlines() if line.strip()]
    if len(lines) == 2 and ":" not in lines[0]:
        heads, paths = lines[0].split(), lines[1].split()
        if len(heads) != len(paths):
            raise InvalidInputError(
                FLAG, "the custom-columns file has unequal header and path lines", "fix it"
            )
        return list(zip(heads, paths, strict=True))
    columns = []
    for part in spec.replace("\n", ",").split(","):
        head, sep, path = part.partition(":")
        if not part.strip():
            continue
        if not sep or not head.strip() or not path.strip():
            raise InvalidInputError(
                FLAG,
                f"custom column {part!r} is not NAME:PATH",
                "write e.g. custom-columns=NAME:.name,GPU:.gpus[*].index",
            )
        columns.append((head.strip(), path.strip()))
    return columns


def custom_columns(items: Sequence[Any], spec: str, *, no_headers: bool) -> str:
    columns = _columns(spec)
    rows: list[tuple[str, ...]] = [] if no_headers else [tuple(h for h, _ in columns)]
    for item in items:
        row = []
        for _, path in columns:
            try:
                found = evaluate(expression(path), item)
            except JsonPathError as exc:
                raise InvalidInputError(
                    FLAG, f"bad column path {path!r} ({exc})", "fix it"
                ) from None
            row.append(",".join(show(v) for v in found) if found else NONE)
        rows.append(tuple(row))
    return "\n".join(table(rows)) + "\n" if rows else ""


def names(items: Sequence[Any], kind: str) -> str:
    """``-o name``: ``pod/NAME`` (as kubectl) or ``gpu/UUID``."""
    key = "uuid" if kind == "gpu" else "name"
    return "".join(f"{kind}/{item[key]}\n" for item in items)


def jsonpath(data: Any, template: str) -> str:
    return execute(template, data)


def reorder_table(text: str, order: Sequence[int], *, no_headers: bool) -> str:
    """A table whose data rows follow ``items``: rows in ``order``, the header kept unless
    ``no_headers``."""
    lines = text.splitlines()
    if len(lines) != len(order) + 1:  # "No ... found" messages
        return text
    rows = [lines[1 + i] for i in order]
    return "\n".join(rows if no_headers else [lines[0], *rows]) + "\n"
