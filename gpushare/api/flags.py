"""One way every gpushare program takes its settings from the command line.

Each program's settings are one frozen dataclass with a docstring under each field
(``cluster.settings.Settings``, ``node.agent.AgentSettings``,
``cluster.operator.settings.OperatorConfig``); :func:`flag` makes a field a command-line flag
whose default is the field's and whose ``--help`` is its docstring (parsers use
``argparse.ArgumentDefaultsHelpFormatter``, which adds the default), so the code, ``--help``
and the docs cannot disagree. Bad values are refused naming the flag and the fix
(:class:`gpushare.api.errors.InvalidInputError`, exit status 2).
"""

import argparse
import ast
import dataclasses
import functools
import inspect
import itertools
from typing import Any


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
