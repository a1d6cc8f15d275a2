"""How closely a run's colocation packs repeat the same packs measured on other hosts.

The model targets compare predicted with measured slowdowns on a host no fit has seen. Part of
that error is the host itself: the same pack, the same jobs at the same thread caps, slows down
differently from one host to the next and from one run to the next (an uncapped FP64 GEMM cost
its neighbour 40-60x on some H200 hosts, 10-38x on others). This module measures that spread:
each job of each pack of this run is "predicted" by the mean slowdown of the same job in the same
pack as the stored runs measured it, and the relative errors are pooled like the model's.

It is a reference, not a model: no fit can use it for a pack nobody measured, and a model fit on
the stored runs cannot be expected to predict a new host much better than their own
measurements do (docs/benchmarks-gpu.md, "How far packs repeat").

    python -m bench.gpu.repeatability bench/gpu/data/run16-h100-colocations.json
"""

import argparse
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.gpu.catalog import UNSEEN_KINDS
from bench.gpu.colocate import PackKey, Record, key_of

DATA_DIR = Path(__file__).resolve().parent / "data"
STORED_GLOB = ("colocations.json", "run*-colocations.json")
"""The stored colocation files (this repository's runs 5-16 and later)."""

JobKey = tuple[PackKey, str, int]
"""(pack, job kind, its thread %): one job of one pack; twins share a key."""


def slowdowns(data: Iterable[Record]) -> dict[JobKey, list[float]]:
    """Every job's measured slowdown (rate alone at its cap / rate in the pack), by job key."""
    out: dict[JobKey, list[float]] = {}
    for record in data:
        key = key_of(record)
        for job in record.get("jobs", []):
            solo, shared = job.get("solo_rate"), job.get("colocated_rate")
            if not isinstance(solo, int | float) or not isinstance(shared, int | float):
                continue  # a job measured only as a neighbour
            if solo <= 0 or shared <= 0:
                continue
            job_key = (key, str(job["name"]), int(job["thread_percent"]))
            out.setdefault(job_key, []).append(float(solo) / float(shared))
    return out


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _mape(errs: Sequence[float]) -> float | None:
    return round(_mean(errs), 4) if errs else None


def repeatability(
    current: Sequence[Record], stored: Sequence[Sequence[Record]], *, unseen: Iterable[str] = ()
) -> dict[str, Any]:
    """This run's slowdowns against the stored runs' mean for the same job in the same pack.

    ``mape`` pools every job measured in both; ``unseen_kinds_mape`` / ``fitted_kinds_mape``
    split it as the model's targets are split (packs holding a kind in ``unseen`` or not), so
    the two can be read side by side. A stored run equal to this one (a run resumed from its
    stored packs) is left out: it would predict itself."""
    others = [run for run in stored if list(run) != list(current)]
    before: dict[JobKey, list[float]] = {}
    for run in others:
        for key, values in slowdowns(run).items():
            before.setdefault(key, []).append(_mean(values))
    new = set(unseen)
    pooled: list[float] = []
    fresh: list[float] = []
    known: list[float] = []
    for key, values in slowdowns(current).items():
        if key not in before:
            continue
        expected = _mean(before[key])
        errs = [abs(expected - v) / v for v in values if v > 0]
        pooled += errs
        (fresh if {k for k, _ in key[0]} & new else known).extend(errs)
    return {
        "mape": _mape(pooled),
        "predictions": len(pooled),
        "unseen_kinds_mape": _mape(fresh),
        "fitted_kinds_mape": _mape(known),
        "stored_runs": len(others),
    }


def stored_files(directory: Path = DATA_DIR, *, leave_out: Iterable[Path] = ()) -> list[Path]:
    """The stored colocation files, without ``leave_out`` (the run being compared)."""
    skip = {p.resolve() for p in leave_out}
    found = {p.resolve() for pattern in STORED_GLOB for p in directory.glob(pattern)}
    return sorted(p for p in found if p not in skip)


def load(path: Path) -> list[Record]:
    """A colocation file: a list of packs (or ``{"packs": [...]}``)."""
    raw = json.loads(path.read_text())
    packs = raw.get("packs", []) if isinstance(raw, Mapping) else raw
    if not isinstance(packs, list):
        raise ValueError(f"{path}: not a list of colocation packs")
    for i, pack in enumerate(packs):
        try:
            key_of(pack)
        except (KeyError, TypeError, ValueError, AttributeError):
            raise ValueError(
                f"{path}: pack {i + 1}: needs jobs with a name and a thread_percent"
            ) from None
    return list(packs)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gpu.repeatability",
        description="How closely a run's colocation packs repeat the same packs measured by "
        "the stored runs (the spread between hosts a model fit elsewhere meets).",
    )
    parser.add_argument("run", type=Path, help="a colocations.json of one run")
    parser.add_argument(
        "--against",
        type=Path,
        nargs="*",
        help="colocation files to compare with (default: every stored run but RUN)",
    )
    args = parser.parse_args(argv)
    against = args.against or stored_files(leave_out=[args.run])
    try:
        current = load(args.run)
        stored = [load(p) for p in against]
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result = repeatability(current, stored, unseen=UNSEEN_KINDS)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
