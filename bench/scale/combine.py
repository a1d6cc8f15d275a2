"""Several runs of the bench (e.g. on different machines) in one results file.

``python -m bench.scale.combine OUT_PREFIX PRIMARY.json[=LABEL] OTHER.json[=LABEL] ...`` writes
``OUT_PREFIX.json`` and ``.md``. The issue's fields (``nodes``, ``pods``,
``extender_pods_per_s``, ``stock_pods_per_s``, ``extender_p99_ms``, ``violations``, ``machine``,
``date``, ...) stay at the top level, taken from the primary run (the better-characterised one),
and ``primary_run`` names it; ``runs`` holds every run in full, each with ``machine.label``;
``by_mode`` lists one line per run and mode measured (the extender path, DRA mode), in issue 47's
shape (``nodes``, ``pods``, ``policy``, ``mode``, ``pods_per_s``, ``stock_pods_per_s``,
``filter_p99_ms``, ``bind_p99_ms``, ``controller_rss_mib``, ``violations``, ``machine``). An
input that is itself a combined file contributes its runs.
"""

import copy
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.scale.run import write_results
from gpushare.api.errors import InvalidInputError


def label_of(run: dict[str, Any]) -> str:
    m = run.get("machine", {})
    return str(m.get("label") or f"{m.get('cpu_cores', '?')} cores ({m.get('cpu_model', '?')})")


def _expand(result: dict[str, Any], label: str | None) -> list[dict[str, Any]]:
    if "runs" in result:
        if label is not None:
            raise InvalidInputError(
                "LABEL", "a combined file holds several runs", "give it without =LABEL"
            )
        return [copy.deepcopy(r) for r in result["runs"]]
    run = copy.deepcopy(result)
    if label is not None:
        run.setdefault("machine", {})["label"] = label
    return [run]


def combine(primary: dict[str, Any], *others: dict[str, Any]) -> dict[str, Any]:
    """The primary run's fields at the top level, and every run (primary first) under
    ``runs``. Runs must have distinct labels: the Markdown and readers tell them apart by it."""
    if "runs" in primary:
        raise InvalidInputError(
            "PRIMARY", "the primary is a combined file", "give the primary run's own result file"
        )
    runs = [copy.deepcopy(primary)]
    for o in others:
        runs += _expand(o, None)
    labels = [label_of(r) for r in runs]
    if len(set(labels)) != len(labels):
        raise InvalidInputError(
            "LABEL", f"two runs share a label ({labels})", "label each run: FILE.json=LABEL"
        )
    out = copy.deepcopy(primary)
    out["primary_run"] = labels[0]
    out["runs"] = runs
    out["by_mode"] = [line for r in runs for line in r.get("modes", ())]
    return out


def _load(arg: str) -> tuple[dict[str, Any], str | None]:
    path, _, label = arg.partition("=")
    try:
        data: dict[str, Any] = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise InvalidInputError(
            "RESULT", f"cannot read {path}: {exc}", "give a scale.json result"
        ) from exc
    return data, label or None


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        loaded = [_load(a) for a in args[1:]]
        first, first_label = loaded[0]
        primary = _expand(first, first_label)
        if len(primary) != 1:
            raise InvalidInputError(
                "PRIMARY", "the primary is a combined file", "give the primary run's own file"
            )
        others = [{"runs": _expand(d, lbl)} for d, lbl in loaded[1:]]
        result = combine(primary[0], *others)
    except InvalidInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    json_path, md_path = write_results(result, Path(args[0]))
    print(f"wrote {json_path} and {md_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
