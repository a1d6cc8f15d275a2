"""Random job mixes: trace files drawn from a seed, to run gpushare on mixes nobody tuned it to.

    PYTHONPATH=. python3 -m bench.gpu.mixes --seed 7 --out mix-7.json [--jobs 8]
    PYTHONPATH=. python3 -m bench.gpu.run --out DIR --trace mix-7.json

The shipped traces (light, heavy, mixed) were written by the people who built the decisions,
so a rule tuned to them would pass them. A drawn mix is the check against that: any catalogue
kind (known, unseen, the whole-GPU XL kinds, at most one inference service), Poisson arrivals,
and, like users who write their own annotations, some rows that set ``fraction`` (sometimes
below what the job keeps busy, the case where a static cap throttles a job running alone) and
some that also set ``limit``. The other rows ask what gpushare sizes from the job's profile
(``fraction: auto``, ``sizing.request_fraction``). About a third of the batch rows opt in to
opportunistic placement (``opportunistic: true``, ``--marked-share``), as issue 65 runs a mix:
the benchmark runs each mix three ways (defaults, the marked rows, every batch row). Same seed
and catalogue, same file; the marks come from their own stream, so they move no other field of
a draw (mixes 1-6 were drawn from an older catalogue and no longer come back from their
seeds). Evidence: docs/benchmarks-gpu.md, "Run 17: three drawn mixes" and "Run 46".
"""

import argparse
import json
import random
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.gpu.catalog import KINDS
from bench.gpu.traces import MAX_ROWS, parse_trace
from gpushare.api.names import CLASS_LATENCY

FRACTIONS = (0.25, 0.3, 0.5, 0.6, 0.75, 1.0)
"""What a user writes when a row sets ``fraction``."""
LIMITS = (0.5, 0.75, 1.0)
"""What a user writes when a row also sets ``limit`` (only values at or above its fraction)."""
P_FRACTION = 0.4
"""Share of batch rows whose user sets ``fraction``."""
P_LIMIT = 0.4
"""Share of those that also set ``limit``."""
WORK_S = (1.5, 3.5)
"""A batch job's solo duration is drawn uniformly from this range (seconds)."""
SERVICE_WORK_S = (4.0, 6.0)
"""An inference service's duration (seconds of Poisson requests)."""
MARKED_SHARE = 1 / 3
"""Share of the batch rows marked ``opportunistic`` (rounded, at least one where there is a
batch row): the "third of the jobs" of issue 65."""
MAX_JOBS = MAX_ROWS
"""Most jobs one draw writes: what one trace may hold."""


def draw(
    seed: int, *, jobs: int = 8, mean_gap_s: float = 0.5, marked_share: float = MARKED_SHARE
) -> list[dict[str, Any]]:
    """``jobs`` trace rows drawn from ``seed`` (arrival order, rounded for a readable file)."""
    if not 1 <= jobs <= MAX_JOBS:
        raise ValueError(f"jobs: {jobs} is out of range; draw 1 to {MAX_JOBS} jobs")
    if not 0 < mean_gap_s <= 60:
        raise ValueError(f"mean_gap_s: {mean_gap_s} is out of range; give 0 < gap <= 60 s")
    if not 0 <= marked_share <= 1:
        raise ValueError(f"marked_share: {marked_share} is out of range; give 0 to 1")
    rows = _rows(seed, jobs=jobs, mean_gap_s=mean_gap_s)
    _mark(rows, random.Random(f"{seed}:opportunistic"), marked_share)
    return rows


def _mark(rows: list[dict[str, Any]], rng: random.Random, share: float) -> None:
    """Opt ``share`` of the batch rows in (latency rows never: admission refuses them)."""
    batch = [r for r in rows if KINDS[r["kind"]].gpu_class != CLASS_LATENCY]
    count = min(len(batch), max(1, round(share * len(batch)))) if share and batch else 0
    for row in rng.sample(batch, count):
        row["opportunistic"] = True


def _rows(seed: int, *, jobs: int, mean_gap_s: float) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    batch = sorted(k for k, spec in KINDS.items() if spec.gpu_class != CLASS_LATENCY)
    services = sorted(k for k, spec in KINDS.items() if spec.gpu_class == CLASS_LATENCY)
    rows: list[dict[str, Any]] = []
    arrival = 0.0
    has_service = False
    for i in range(jobs):
        if i:
            arrival += rng.expovariate(1.0 / mean_gap_s)
        if services and not has_service and rng.random() < 1.0 / jobs:
            has_service = True
            kind = rng.choice(services)
            rows.append(
                {
                    "arrival_s": round(arrival, 2),
                    "kind": kind,
                    "work_s": _uniform(rng, SERVICE_WORK_S),
                }
            )
            continue
        kind = rng.choice(batch)
        row: dict[str, Any] = {
            "arrival_s": round(arrival, 2),
            "kind": kind,
            "work_s": _uniform(rng, WORK_S),
        }
        if rng.random() < P_FRACTION:
            fraction = rng.choice(FRACTIONS)
            row["fraction"] = str(fraction)
            allowed = [x for x in LIMITS if x >= fraction]
            if allowed and rng.random() < P_LIMIT:
                row["limit"] = str(rng.choice(allowed))
        rows.append(row)
    return rows


def _uniform(rng: random.Random, bounds: tuple[float, float]) -> float:
    return round(rng.uniform(*bounds), 1)


def render(rows: Sequence[dict[str, Any]]) -> str:
    """One row per line, as the shipped traces are written."""
    return "[\n" + ",\n".join(json.dumps(r) for r in rows) + "\n]\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.gpu.mixes",
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--seed", type=int, required=True, help="the draw's seed (same seed, same mix)")
    p.add_argument("--jobs", type=int, default=8, help=f"jobs in the mix, 1-{MAX_JOBS} (default 8)")
    p.add_argument(
        "--mean-gap-s", type=float, default=0.5, help="mean seconds between arrivals (default 0.5)"
    )
    p.add_argument(
        "--marked-share",
        type=float,
        default=MARKED_SHARE,
        help="share of batch rows marked opportunistic, 0-1 (default a third)",
    )
    p.add_argument("--out", type=Path, required=True, help="the trace file to write (.json)")
    args = p.parse_args(argv)
    if args.out.suffix.lower() != ".json":
        p.error(f"--out: {args.out} must end in .json (the mix is written as a JSON trace)")
    try:
        rows = draw(
            args.seed, jobs=args.jobs, mean_gap_s=args.mean_gap_s, marked_share=args.marked_share
        )
    except ValueError as exc:
        p.error(f"--{str(exc).replace('_', '-')}")
    text = render(rows)
    parse_trace(text, name=args.out.stem, source=str(args.out), csv_format=False)  # a valid trace
    args.out.write_text(text)
    print(f"wrote {args.out}: {len(rows)} jobs, seed {args.seed}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
