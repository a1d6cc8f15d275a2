"""Settings dataclasses as command-line flags: the field's default and docstring are the flag's."""

import argparse
from dataclasses import dataclass, field

import pytest

from gpushare.api.flags import field_docs, flag


@dataclass(frozen=True)
class Example:
    share: int = 50
    """Thread cap in % of the GPU's SMs."""
    names: tuple[str, ...] = field(default_factory=tuple)
    """Namespaces to watch."""
    verbose: bool = False


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    flag(p, Example, "share", type=int)
    flag(p, Example, "names", "--name", action="append", default=[])
    flag(p, Example, "verbose", action="store_true")
    return p


def test_defaults_and_help_come_from_the_dataclass() -> None:
    args = parser().parse_args([])
    assert (args.share, args.names, args.verbose) == (50, [], False)
    shown = parser().format_help()  # a "%" in a docstring must not break the formatting
    assert "Thread cap in % of the GPU's SMs. (default: 50)" in " ".join(shown.split())
    assert "--name NAME" in shown
    assert field_docs(Example) == {
        "share": "Thread cap in % of the GPU's SMs.",
        "names": "Namespaces to watch.",
    }


def test_flags_set_the_fields() -> None:
    args = parser().parse_args(["--share", "25", "--name", "a", "--name", "b", "--verbose"])
    assert Example(share=args.share, names=tuple(args.names), verbose=args.verbose) == Example(
        25, ("a", "b"), True
    )


def test_a_field_that_is_not_there_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="no field"):
        flag(argparse.ArgumentParser(), Example, "shares")
