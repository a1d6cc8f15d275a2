"""One way every gpushare program takes its settings from the command line.

Each program's settings are frozen dataclasses with a docstring under each field
(``node.agent.AgentSettings``, ``cluster.operator.settings.OperatorConfig``; the controller's
``cluster.settings.Settings`` is one small dataclass per concern, whose flags
:func:`add_group` generates); :func:`flag` makes a field a command-line flag
whose default is the field's and whose ``--help`` is its docstring (parsers use
``argparse.ArgumentDefaultsHelpFormatter``, which adds the default), so the code, ``--help``
and the docs cannot disagree. Bad values are refused naming the flag and the fix
(:class:`gpushare.api.errors.InvalidInputError`, exit status 2).
"""

import argparse
import ast
import dataclasses
import enum
import functools
import inspect
import itertools
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of dataclass ``cls``, on one line."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for stmt, nxt in itertools.pairwise(body):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[stmt.target.id] = " ".join(nxt.value.value.split())
    return docs


def field_default(cls: type, name: str) -> Any:
    """The default of field ``name`` of dataclass ``cls`` (its factory's value if it has one)."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
            raise ValueError(f"{cls.__name__}.{name} has no default")
    raise ValueError(f"{cls.__name__} has no field {name}")


def flag(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    name: str,
    *names: str,
    **kwargs: Any,
) -> None:
    """Add the flag for field ``name`` of ``cls`` (``--field-name`` unless ``names`` are given):
    default and help from the field unless given in ``kwargs``."""
    kwargs.setdefault("dest", name)
    if kwargs.get("action") not in ("store_true", "store_false"):
        kwargs.setdefault("default", field_default(cls, name))
    given = kwargs.pop("help", None)
    # argparse formats help with %: a docstring's "50 %" must not read as a placeholder.
    help_text = given if given is not None else field_docs(cls).get(name, "").replace("%", "%%")
    flags = names or (f"--{name.replace('_', '-')}",)
    if kwargs.get("action") in (None, "append"):
        kwargs.setdefault("metavar", flags[0].lstrip("-").upper().replace("-", "_"))
    parser.add_argument(*flags, help=help_text, **kwargs)


# ---- settings grouped by concern --------------------------------------------------------------
#
# A program's settings may be several small dataclasses, one per concern (Kopf's
# ``configuration.py``): each field is one flag, named ``--<prefix>-<field>`` after its group's
# ``PREFIX`` (a class attribute; none: ``--<field>``) unless :func:`option` names it otherwise.
# :func:`add_group` adds a group's flags, :func:`read_group` builds the group from the parsed
# values; the flag's destination (its "flat" name) is the field's name as one flat namespace
# knows it, e.g. ``extender_port``.

T = TypeVar("T")


def flag_meta(
    *,
    flat: str | None = None,
    flags: tuple[str, ...] = (),
    convert: Callable[[Any], Any] | None = None,
    help_suffix: str = "",
    no_flag: bool = False,
    **argparse_kwargs: Any,
) -> dict[str, Any]:
    """Field metadata for a settings field whose flag differs from the rule: ``flat`` (its
    destination), ``flags`` (its spellings), ``convert`` (parsed value -> field value, e.g. the
    list of a repeated flag -> a tuple; a repeated flag not given keeps the field's default),
    ``help_suffix`` (after the field's docstring), ``no_flag`` (set in code only), anything else
    for ``argparse.add_argument``."""
    return {
        "flat": flat,
        "flags": flags,
        "convert": convert,
        "help_suffix": help_suffix,
        "no_flag": no_flag,
        "argparse": argparse_kwargs,
    }


def option(value: Any, /, **meta: Any) -> Any:
    """A settings field with default ``value`` and :func:`flag_meta` ``meta``."""
    return dataclasses.field(default=value, metadata=flag_meta(**meta))


def repeated(
    value: tuple[str, ...],
    name: str,
    help_suffix: str,
    *,
    convert: Callable[[Sequence[str]], tuple[str, ...]] = tuple,
) -> Any:
    """A tuple field given by repeating flag ``name``; given at all, it replaces ``value``."""
    return option(value, flags=(name,), action="append", convert=convert, help_suffix=help_suffix)


def flat_name(cls: type, f: dataclasses.Field[Any]) -> str:
    """The destination of field ``f`` of group ``cls`` (see the section comment)."""
    given = f.metadata.get("flat")
    if given:
        return str(given)
    prefix = getattr(cls, "PREFIX", "")
    return f"{prefix}_{f.name}" if prefix else f.name


def _inferred(f: dataclasses.Field[Any]) -> dict[str, Any]:
    """argparse arguments read off the field's type: booleans take --x/--no-x, enums their
    values as choices, other types their constructor."""
    kind = f.type
    if isinstance(kind, types.UnionType):
        kind = next(a for a in typing.get_args(kind) if a is not type(None))
    if kind is bool:
        return {"action": argparse.BooleanOptionalAction}
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return {"choices": [str(x) for x in kind], "default": str(f.default)}
    if kind in (int, float, Path):
        return {"type": kind}
    return {}


def add_group(parser: argparse.ArgumentParser, cls: type, title: str) -> None:
    """Add the flags of every field of group ``cls`` under ``title``."""
    group = parser.add_argument_group(title)
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        meta = f.metadata
        if meta.get("no_flag"):
            continue
        kwargs = {**_inferred(f), **(meta.get("argparse") or {})}
        if kwargs.get("action") == "append":
            kwargs.setdefault("default", None)  # argparse would append to the default
        if "choices" in kwargs:
            kwargs.setdefault("metavar", None)  # --help lists the choices
        doc = docs.get(f.name, "").replace("%", "%%")
        help_text = kwargs.pop("help", None) or " ".join(
            p for p in (doc, meta.get("help_suffix", "")) if p
        )
        dest = flat_name(cls, f)
        names = meta.get("flags") or (f"--{dest.replace('_', '-')}",)
        flag(group, cls, f.name, *names, dest=dest, help=help_text, **kwargs)


def read_group(cls: type[T], values: Mapping[str, Any]) -> T:
    """Group ``cls`` from parsed flag values (keyed by destination); a repeatable flag not
    given keeps the field's default."""
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        dest = flat_name(cls, f)
        if f.metadata.get("no_flag") or dest not in values:
            continue
        value = values[dest]
        if value is None and f.metadata.get("argparse", {}).get("action") == "append":
            continue
        convert = f.metadata.get("convert")
        kind = f.type
        if convert is not None:
            value = convert(value)
        elif isinstance(kind, type) and issubclass(kind, enum.Enum):
            value = kind(value)
        kwargs[f.name] = value
    return cls(**kwargs)
