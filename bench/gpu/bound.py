"""The shortest makespan a placement could reach on a trace using only the packs a run
measured: a fluid linear-programming bound (no GPU), to tell a policy's miss from a target
below what the measured packs allow.

    PYTHONPATH=. python3 -m bench.gpu.bound --results bench/gpu/data/run10-results.json \\
        --colocations bench/gpu/data/run10-colocations.json [--trace light]

Each measured pack (and each kind alone at 100% threads) does work at the rates it measured:
a member's colocated rate over its kind's solo rate at 100% threads, so one second of a pack
finishes that many seconds of the member's solo work. The bound is the least total time over
packs that finishes every kind's solo work (its run time under ``exclusive``): ``min sum t_p``
subject to ``sum_p t_p x retained_pk >= work_k``. It is a relaxation, so a lower bound for
schedules built from those packs: jobs may be preempted and split across packs, arrivals are
ignored (all of a trace's jobs arrive within its first 2 s), packs run back to back without
gaps and the inference service (a fixed duration, not work) is left out with its cost to
neighbours. Packs never measured (five small jobs at once, the heavy trace's XL pairs) are not
in it: on the heavy trace it gives the serial time, above what ``mps_unlimited`` measured.
Only packs the trace's jobs can form count (two ResNet-50 in one pack need two ResNet-50
jobs). ``every_job_within_2x`` keeps only packs where every member keeps at least half its solo
speed: a schedule built from them never runs a job past 2x its solo time, the issue's
slowest-job target.
"""

import argparse
import json
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.gpu import colocate

EPS = 1e-12


@dataclass(frozen=True)
class PackRate:
    """What one second of a pack does: solo-seconds of work per kind, summed over members."""

    name: str
    work_per_s: Mapping[str, float]
    members: Mapping[str, int]
    slowest: float
    """The smallest member's rate over its solo rate at 100% (1.0 for a job alone)."""


def pack_rates(records: Sequence[colocate.Record]) -> list[PackRate]:
    """Every kind alone at 100% threads, then every measured pack, as work rates."""
    full, _ = colocate.tables(records)
    out = [PackRate(f"{k}@100", {k: 1.0}, {k: 1}, 1.0) for k in sorted(full)]
    for rec in records:
        jobs = rec["jobs"]
        if len(jobs) == 1 and int(jobs[0]["thread_percent"]) == 100:
            continue
        rates: dict[str, float] = {}
        retained = []
        for j in jobs:
            share = float(j["colocated_rate"]) / full[j["name"]]
            rates[j["name"]] = rates.get(j["name"], 0.0) + share
            retained.append(share)
        name = "+".join(f"{j['name']}@{j['thread_percent']}" for j in jobs)
        out.append(PackRate(name, rates, Counter(j["name"] for j in jobs), min(retained)))
    return out


def fluid_bound(
    work: Mapping[str, float], packs: Sequence[PackRate]
) -> tuple[float, list[tuple[str, float]]]:
    """(least total seconds, [(pack, seconds it runs)]) finishing ``work`` (solo-seconds per
    kind) with ``packs``. Solved as the dual (max sum work_k y_k, sum_k retained_pk y_k <= 1,
    y >= 0) by the simplex method with Bland's rule; the pack times are the dual's prices."""
    kinds = sorted(k for k, w in work.items() if w > 0)
    missing = [k for k in kinds if not any(p.work_per_s.get(k, 0.0) > 0 for p in packs)]
    if missing:
        raise ValueError(f"work: no pack runs kinds {missing}; measure them alone first")
    n, m = len(kinds), len(packs)
    rows = [
        [p.work_per_s.get(k, 0.0) for k in kinds] + [1.0 if j == i else 0.0 for j in range(m)]
        for i, p in enumerate(packs)
    ]
    rhs = [1.0] * m
    cost = [-work[k] for k in kinds] + [0.0] * m
    value = 0.0
    basis = [n + i for i in range(m)]
    while True:
        col = next((j for j in range(n + m) if cost[j] < -EPS), None)
        if col is None:
            break
        pivot: tuple[float, int] | None = None
        for i in range(m):
            if rows[i][col] > EPS:
                ratio = rhs[i] / rows[i][col]
                if (
                    pivot is None
                    or ratio < pivot[0] - EPS
                    or (abs(ratio - pivot[0]) <= EPS and basis[i] < basis[pivot[1]])
                ):
                    pivot = (ratio, i)
        if pivot is None:  # cannot happen: every row bounds y by 1 / its positive rates
            raise ArithmeticError("fluid bound: unbounded dual")
        r = pivot[1]
        scale = rows[r][col]
        rows[r] = [v / scale for v in rows[r]]
        rhs[r] /= scale
        for i in range(m):
            f = rows[i][col]
            if i != r and f != 0.0:
                rows[i] = [a - f * b for a, b in zip(rows[i], rows[r], strict=True)]
                rhs[i] -= f * rhs[r]
        f = cost[col]
        cost = [a - f * b for a, b in zip(cost, rows[r], strict=True)]
        value -= f * rhs[r]
        basis[r] = col
    used = [(p.name, cost[n + i]) for i, p in enumerate(packs) if cost[n + i] > 1e-9]
    return value, used


def trace_work(results: Mapping[str, Any], trace: str) -> tuple[dict[str, float], Counter[str]]:
    """(solo-seconds of work per kind, jobs per kind) of ``trace``'s batch jobs, from their
    run times under ``exclusive`` in the same run (the inference service does no work here)."""
    try:
        jobs = results["details"]["jobs"][trace]["exclusive"]
    except KeyError as exc:
        raise ValueError(
            f"results: details.jobs.{trace}.exclusive missing ({exc}); give a full run's "
            "gpu-packing.json"
        ) from exc
    work: dict[str, float] = {}
    count: Counter[str] = Counter()
    for j in jobs:
        if j["gpu_class"] == "latency":
            continue
        work[j["kind"]] = work.get(j["kind"], 0.0) + float(j["end_s"]) - float(j["start_s"])
        count[j["kind"]] += 1
    return work, count


def bounds(
    *, results: Mapping[str, Any], records: Sequence[colocate.Record], trace: str
) -> dict[str, Any]:
    """The trace's makespan bounds (seconds, and as a ratio of its exclusive makespan)."""
    work, count = trace_work(results, trace)
    ex = results["details"]["jobs"][trace]["exclusive"]
    exclusive = max(float(j["end_s"]) for j in ex)
    last = max(ex, key=lambda j: float(j["arrival_s"]))
    arrival_bound = float(last["arrival_s"]) + float(last["end_s"]) - float(last["start_s"])
    measured = pack_rates(records)
    alone = {p.name for p in measured}
    # A kind never measured in a pack (the heavy trace's XL jobs) can still run alone.
    singles = [PackRate(f"{k}@100", {k: 1.0}, {k: 1}, 1.0) for k in work if f"{k}@100" not in alone]
    feasible = [
        p
        for p in measured + singles
        if set(p.members) <= set(work) and all(c <= count[k] for k, c in p.members.items())
    ]
    out: dict[str, Any] = {
        "trace": trace,
        "exclusive_makespan_s": round(exclusive, 2),
        "work_s": {k: round(v, 2) for k, v in sorted(work.items())},
        "last_arrival_plus_its_run_s": round(arrival_bound, 2),
    }
    for label, keep in (("any_pack", 0.0), ("every_job_within_2x", 0.5)):
        value, used = fluid_bound(work, [p for p in feasible if p.slowest >= keep])
        out[label] = {
            "makespan_s": round(value, 2),
            "vs_exclusive": round(value / exclusive, 3),
            "packs": {name: round(t, 2) for name, t in used},
        }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.gpu.bound",
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--results", type=Path, required=True, help="a run's gpu-packing.json")
    p.add_argument("--colocations", type=Path, required=True, help="the same run's packs")
    p.add_argument("--trace", choices=("light", "heavy"), default="light")
    args = p.parse_args(argv)
    results = json.loads(args.results.read_text())
    records = colocate.validate(json.loads(args.colocations.read_text()))
    print(json.dumps(bounds(results=results, records=records, trace=args.trace), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
