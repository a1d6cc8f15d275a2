"""Raw terminal controls in ``-o yaml`` and ``-o jsonpath`` (issue 67): a pod's name, class or
a GPU model come from objects others write; printed raw, an escape sequence could rewrite the
screen or the terminal's title, or hide a row. Tables escaped them already; the YAML and
JSONPath outputs now do too (-o json always did)."""

import json

import pytest

from gpushare.cli.jsonpath import execute
from gpushare.cli.yaml_out import dump_yaml

HOSTILE = [
    "x\x1b]0;owned\x07y",  # OSC: set the terminal's title
    "\x1b[2J\x1b[H",  # clear the screen
    "\u202egnp.exe",  # right-to-left override
    "\x9b31m",  # C1 control sequence introducer
    "line\rover",  # carriage return: hides what came before
    "del\x7f",
]


def _raw_controls(text: str) -> list[str]:
    allowed = "\n"
    return [c for c in text if not c.isprintable() and c not in allowed]


@pytest.mark.parametrize("value", HOSTILE)
def test_yaml_output_escapes_what_a_terminal_would_act_on(value: str) -> None:
    out = dump_yaml({"name": value, value: "key", "list": [value]})
    assert _raw_controls(out) == []
    # Still a faithful rendering: the JSON-quoted scalars read back to the value.
    quoted = out.splitlines()[0].split(": ", 1)[1]
    assert json.loads(quoted) == value


@pytest.mark.parametrize("value", HOSTILE)
def test_jsonpath_output_escapes_what_a_terminal_would_act_on(value: str) -> None:
    out = execute("{.items[*].name}{'\\n'}", {"items": [{"name": value}, {"name": "ok"}]})
    assert _raw_controls(out) == []
    assert out.endswith(" ok\n")
