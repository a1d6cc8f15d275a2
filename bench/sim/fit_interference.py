"""Refit gpushare's interference model from measured colocations; one command.

    python -m bench.sim.fit_interference bench/gpu/data/colocations.json [more.json ...]
    python -m bench.sim.fit_interference --seed           # the shipped seed-derived default
    python -m bench.sim.fit_interference --calibrate mine.json --output calibrated.json

Reads JSON lists of colocation records (format in bench.gpu.colocate; several files, e.g.
several GPU runs, are fit as one list), fits ln(slowdown) by non-negative least squares
(bench.gpu.fitting), prints each coefficient, the in-sample MAPE and the leave-one-record-out
(held-out) MAPE, and writes gpushare/packing/data/interference.json unless ``--dry-run``.

``--calibrate`` instead refines the shipped model with the records (colocations measured on
your own GPUs) through ``gpushare.packing.calibration.calibrate``, the refit anchored to the
shipped coefficients, and writes it to ``--output`` (required: the shipped file stays as it
is). Point ``GPUSHARE_INTERFERENCE_MODEL`` at that file in the controller (docs/packing.md,
"Calibrating on your GPUs").
"""

import argparse
import json
import sys
from pathlib import Path

from bench.gpu.fitting import fit, observations, parse_records
from gpushare.api.errors import InvalidInputError
from gpushare.packing.calibration import PRIOR_WEIGHT, calibrate
from gpushare.packing.interference import load_default

REPO = Path(__file__).resolve().parents[2]
SEED = REPO / "bench" / "sim" / "data" / "seed_colocations.json"
OUTPUT = REPO / "gpushare" / "packing" / "data" / "interference.json"
SEED_SOURCE = (
    "seed: fit on bench/sim/data/seed_colocations.json, colocations reconstructed from the "
    "numbers in DESIGN.md and the seed papers (cautiously-aggressive GPU space sharing, KACE); "
    "several profiles there are assumed. Replace with measured data: "
    "python -m bench.sim.fit_interference bench/gpu/data/colocations.json"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", nargs="*", type=Path, help="colocations JSON file(s)")
    parser.add_argument("--seed", action="store_true", help="fit the shipped seed records")
    parser.add_argument(
        "--calibrate",
        action="store_true",
        help="refine the shipped model with the records instead of fitting afresh (needs --output)",
    )
    parser.add_argument(
        "--prior-weight",
        type=float,
        default=PRIOR_WEIGHT,
        help="with --calibrate: the pull toward the shipped coefficients "
        f"(default {PRIOR_WEIGHT:g})",
    )
    parser.add_argument("--output", type=Path, default=None, help=f"default {OUTPUT}")
    parser.add_argument(
        "--exclude-kind",
        action="append",
        default=[],
        metavar="KIND",
        help="leave out every pack holding this job kind (repeatable): kinds kept unseen, so "
        "the GPU benchmark can still test the model on them",
    )
    parser.add_argument("--dry-run", action="store_true", help="print, do not write")
    args = parser.parse_args(argv)
    paths: list[Path] = [SEED] if args.seed else list(args.records)
    if not paths:
        parser.error("give a colocations JSON file, or --seed")
    if args.calibrate and (args.seed or args.output is None):
        parser.error("--calibrate needs colocation files and --output (not the shipped file)")
    output: Path = args.output or OUTPUT
    path = paths[0]
    try:
        records = []
        for path in paths:
            records += parse_records(json.loads(path.read_text()), origin=path.name)
        left_out = set(args.exclude_kind)
        records = [r for r in records if not left_out & {j.name for j in r.jobs}]
        gpus = sorted({r.gpu for r in records if r.gpu})
        source = (
            SEED_SOURCE
            if args.seed
            else f"measured: {len(records)} colocation packs on {', '.join(gpus) or 'GPUs'} "
            f"({', '.join(p.name for p in paths)}"
            + (f"; packs holding {', '.join(sorted(left_out))} left out" if left_out else "")
            + "); "
            "refit: python -m bench.sim.fit_interference <colocations.json> ..."
        )
        if args.calibrate:
            model = calibrate(load_default(), observations(records), prior_weight=args.prior_weight)
        else:
            model = fit(records, source=source)
    except (OSError, json.JSONDecodeError) as exc:
        print(f"cannot read {path}: {exc}", file=sys.stderr)
        return 2
    except InvalidInputError as exc:
        print(f"bad colocation data: {exc}", file=sys.stderr)
        return 2
    for name, c in zip(model.feature_names, model.coefficients, strict=True):
        print(f"  {name:22s} {c:8.4f}")
    held = "n/a" if model.mape_held_out is None else f"{100 * model.mape_held_out:.1f}%"
    print(
        f"records {model.records}, jobs {model.jobs}, "
        f"MAPE in-sample {100 * (model.mape_in_sample or 0):.1f}%, held-out {held}"
    )
    if not args.dry_run:
        output.write_text(json.dumps(model.to_dict(), indent=2) + "\n")
        print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
