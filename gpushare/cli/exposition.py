"""The Prometheus text exposition format, read far enough for ``--metrics-url``: sample name,
labels and value per line (``# HELP``/``# TYPE`` and timestamps skipped). A parser of our own
keeps the CLI free of dependencies (docs/cli.md, "Install")."""

import re

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(\s+-?\d+)?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}

Sample = tuple[str, dict[str, str], float]


def _labels(text: str, line: str) -> dict[str, str]:
    inner, labels, pos = text[1:-1], {}, 0
    while pos < len(inner.rstrip()):
        match = _LABEL.match(inner, pos)
        if match is None:
            raise ValueError(f"bad labels in {line!r}")
        labels[match.group(1)] = re.sub(
            r"\\[\\\"n]", lambda m: _ESCAPES[m.group(0)], match.group(2)
        )
        pos = match.end()
    return labels


def samples(text: str) -> list[Sample]:
    """Every sample of an exposition; ValueError naming the first line it cannot read."""
    out: list[Sample] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            raise ValueError(f"not a sample: {line!r}")
        name, labels, value = match.group(1), match.group(2), match.group(3)
        out.append((name, _labels(labels, line) if labels else {}, float(value)))
    return out
