"""Targets, the results JSON and its markdown; merging runs on several GPUs into one record.

    PYTHONPATH=. python3 -m bench.gpu.report merge RUN.json [RUN.json ...] --out DIR [--name N]

writes ``DIR/gpu-packing.json`` (``decided_by``, ``targets`` of every run, ``comparisons`` of
every trace, each run in full under ``runs``) and ``DIR/gpu-packing.md``; ``--name`` renames
both (the drawn mixes' record is ``gpu-mixes``).

Every trace, a shipped one or your own (``run --trace FILE``), gets a comparison for each way
gpushare ran it (defaults, marked rows, every batch row opted in): its makespan, mean JCT and
stretch against exclusive FIFO and against the best other scheme measured on it, a ``by_trace``
row and issue 65's targets (:func:`check_targets`).
"""

import argparse
import heapq
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.gpu.catalog import KINDS
from bench.gpu.metrics import ratio
from gpushare.api.names import CLASS_BATCH

OPPORTUNISTIC = "gpushare_opportunistic"
OPPORTUNISTIC_ALL = "gpushare_opportunistic_all"
GPUSHARE = ("gpushare", OPPORTUNISTIC, OPPORTUNISTIC_ALL)
"""gpushare with the chart's defaults, with the trace's marked rows opted in, and with every
batch row opted in: the three ways every trace is run (issue 65)."""
WAYS = {"gpushare": "defaults", OPPORTUNISTIC: "marked", OPPORTUNISTIC_ALL: "every batch row"}
SCHEMES = ("exclusive", "timeslice", "mps_equal", "mps_unlimited", *GPUSHARE)
TRACE_KEYS = (
    "makespan_s",
    "mean_jct_s",
    "throughput",
    "cold_starts",
    "pauses",
    "paused_s",
    "discarded_gpu_s",
)
"""Per scheme and trace in the results' ``traces``: the times, and how its jobs started and
were preempted (cold starts inside the clock, pauses, paused seconds, seconds of work its
kills threw away)."""
HEAVY_BASELINES = ("exclusive", "timeslice", "mps_unlimited")

LIMITS: dict[str, float] = {
    "vs_exclusive": 1.00,
    "defaults_vs_mps_unlimited": 1.10,
    "all_vs_mps_unlimited": 1.00,
    "jct_vs_best_other": 0.90,
    "jct_floor_above": 0.86,
    "jct_within_floor": 1.05,
    "stretch_vs_mps_unlimited": 1.00,
    "discarded_gpu_s": 0.0,
    "guaranteed_bound": 2.0,
    "latency_p99": 1.10,
}
"""Issue 65's targets: every trace, every way (docs/benchmarks-gpu.md, "Targets")."""


def jct_limit(floor_vs_best_other: float | None) -> float:
    """Mean JCT over the best other scheme's: at most 0.90, or within 5 % of the floor no
    scheme can beat (``mean_jct_floor``) where that floor is above 0.86."""
    if floor_vs_best_other is not None and floor_vs_best_other > LIMITS["jct_floor_above"]:
        return round(floor_vs_best_other * LIMITS["jct_within_floor"], 3)
    return LIMITS["jct_vs_best_other"]


def check_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets, each with the measured value and whether it was met (None: not
    measured in this run), for every trace and every way it was run (:func:`by_trace`)."""
    checks: list[dict[str, Any]] = []

    def add(name: str, value: float | None, limit: float, *, at_most: bool = True) -> None:
        met = None if value is None else (value <= limit if at_most else value >= limit)
        checks.append(
            {
                "target": name,
                "value": None if value is None else round(value, 3),
                "limit": limit,
                "met": met,
            }
        )

    for row in by_trace(results):
        t = f"{row['trace']}, {row['way']}"
        add(f"{t}: makespan / exclusive FIFO", row["makespan_vs_exclusive"],
            LIMITS["vs_exclusive"])  # fmt: skip
        add(f"{t}: mean JCT / exclusive FIFO", row["jct_vs_exclusive"], LIMITS["vs_exclusive"])
        if row["way"] in (WAYS["gpushare"], WAYS[OPPORTUNISTIC_ALL]):
            key = "defaults" if row["way"] == WAYS["gpushare"] else "all"
            add(
                f"{t}: makespan / MPS without limits",
                row["makespan_vs_mps_unlimited"],
                LIMITS[f"{key}_vs_mps_unlimited"],
            )
            add(
                f"{t}: mean JCT / best other scheme ({row.get('jct_best_other') or '-'}; floor "
                f"{_fmt(row.get('jct_floor_vs_best_other'))})",
                row["jct_vs_best_other"],
                jct_limit(row.get("jct_floor_vs_best_other")),
            )
        add(
            f"{t}: slowest job's stretch / MPS without limits'",
            row.get("max_stretch_vs_mps_unlimited"),
            LIMITS["stretch_vs_mps_unlimited"],
        )
        add(
            f"{t}: GPU-seconds of work discarded by kills",
            row["discarded_gpu_s"],
            LIMITS["discarded_gpu_s"],
        )
        if row["way"] != WAYS["gpushare"]:
            add(
                f"{t}: worst guaranteed batch job beside an opportunistic one, run time / solo",
                row.get("guaranteed_worst_slowdown"),
                LIMITS["guaranteed_bound"],
            )
    lat = results.get("latency", {})
    add(
        "latency: shared p99 / solo p99 without MPS",
        ratio(lat.get("shared_p99_ms"), lat.get("solo_p99_ms")),
        LIMITS["latency_p99"],
    )
    return checks


COMPARED = ("makespan_s", "mean_jct_s", "mean_stretch", "max_stretch", "inference_p99_ms")
"""What :func:`comparisons` sets gpushare against the other schemes on (the last only where the
trace holds a latency-class job: the p99 of its requests)."""


def stretches(jobs: Sequence[dict[str, Any]], solo_run_s: dict[str, float]) -> list[float]:
    """Each finished job's stretch: its JCT (waiting included) over its run time alone under
    exclusive FIFO. 1.0 is a job that neither waited nor slowed down; the mean says what a
    typical job pays, the max what the worst-served one does (a large request starved by
    smaller ones shows here, not in the run-time slowdown)."""
    out = []
    for j in jobs:
        solo = solo_run_s.get(str(j.get("id")))
        end, arrival = j.get("end_s"), j.get("arrival_s")
        if j.get("error") is None and solo and end is not None and arrival is not None:
            out.append((float(end) - float(arrival)) / solo)
    return out


def _arrivals(
    jobs: Sequence[dict[str, Any]], solo_run_s: dict[str, float]
) -> list[tuple[float, float]]:
    """(arrival, solo run time) of each job that has both, by arrival."""
    return sorted(
        (float(j["arrival_s"]), solo_run_s[str(j.get("id"))])
        for j in jobs
        if j.get("arrival_s") is not None and solo_run_s.get(str(j.get("id")))
    )


def stretch_floor(
    jobs: Sequence[dict[str, Any]], solo_run_s: dict[str, float], rate: float
) -> float | None:
    """The smallest slowest-job stretch any scheme could reach on these jobs if the GPU does
    at most ``rate`` jobs' worth of exclusive work per second (the best throughput measured on
    the trace). For every window of arrivals [a_i, a_j], the jobs arriving in it cannot all
    finish before a_i + their solo work / rate, and the last of them arrived by a_j with at
    most the window's longest solo time: its stretch is at least
    (a_i + work / rate - a_j) / longest. The largest such figure over the windows is the
    floor. None without arrivals, solo times or a rate."""
    timed = _arrivals(jobs, solo_run_s)
    if not timed or rate <= 0:
        return None
    floor = 1.0
    for i, (first, _) in enumerate(timed):
        work = longest = 0.0
        for last, solo in timed[i:]:
            work += solo
            longest = max(longest, solo)
            floor = max(floor, (first + work / rate - last) / longest)
    return round(floor, 3)


def mean_jct_floor(
    jobs: Sequence[dict[str, Any]], solo_run_s: dict[str, float], rate: float
) -> float | None:
    """The smallest mean JCT any scheme could reach on these jobs if the GPU does at most
    ``rate`` jobs' worth of exclusive work per second (the best throughput measured on the
    trace), as :func:`stretch_floor` assumes. Such a GPU is at best one server of speed
    ``rate``, and there serving the least remaining work first finishes, at every moment, at
    least as many jobs as any other order (Schrage, 1968): its k-th completion is a floor on
    any scheme's k-th, and so is the k-th smallest arrival + solo time (no job runs faster
    than alone). The sum of JCTs is the sum of completions less the sum of arrivals,
    whoever finishes when. None without arrivals, solo times or a rate."""
    timed = _arrivals(jobs, solo_run_s)
    if not timed or rate <= 0:
        return None
    served = _least_work_first(timed, rate)
    alone = sorted(arrival + solo for arrival, solo in timed)
    completions = sum(max(a, b) for a, b in zip(served, alone, strict=True))
    return round((completions - sum(a for a, _ in timed)) / len(timed), 3)


def _least_work_first(timed: Sequence[tuple[float, float]], rate: float) -> list[float]:
    """Completion times, in order, of ``(arrival, work)`` jobs (sorted by arrival) on one
    server doing ``rate`` work per second, the least remaining work served first."""
    done: list[float] = []
    waiting: list[float] = []  # remaining work of the jobs that have arrived
    now, nxt = 0.0, 0
    while nxt < len(timed) or waiting:
        if not waiting:
            now = max(now, timed[nxt][0])
        while nxt < len(timed) and timed[nxt][0] <= now:
            heapq.heappush(waiting, timed[nxt][1])
            nxt += 1
        least = heapq.heappop(waiting)
        until = timed[nxt][0] if nxt < len(timed) else math.inf
        finish = now + least / rate
        if finish <= until:
            now = finish
            done.append(now)
        else:
            heapq.heappush(waiting, least - (until - now) * rate)
            now = until
    return done


def _solo_run(by_scheme: dict[str, Any]) -> dict[str, float]:
    return {
        str(j["id"]): float(j["end_s"]) - float(j["start_s"])
        for j in by_scheme.get("exclusive", [])
        if j.get("error") is None and j.get("end_s") is not None and j.get("start_s") is not None
    }


def comparisons(results: dict[str, Any], *, scheme: str = "gpushare") -> list[dict[str, Any]]:
    """For every trace run under ``scheme`` (a gpushare run): its makespan, mean JCT and
    stretch, the same over exclusive FIFO's, and over the best other scheme's (named; neither
    gpushare run counts as another) -- below 1 is gpushare ahead."""
    out: list[dict[str, Any]] = []
    jobs = results.get("details", {}).get("jobs", {})
    summaries = results.get("details", {}).get("schemes", {})
    for trace, rows in results.get("traces", {}).items():
        by_scheme = jobs.get(trace, {})
        if scheme not in rows or "exclusive" not in by_scheme:
            continue
        solo = _solo_run(by_scheme)
        values: dict[str, dict[str, float | None]] = {}
        for name, r in rows.items():
            st = stretches(by_scheme.get(name, []), solo)
            values[name] = {
                "makespan_s": r.get("makespan_s"),
                "mean_jct_s": r.get("mean_jct_s"),
                "mean_stretch": round(sum(st) / len(st), 3) if st else None,
                "max_stretch": round(max(st), 3) if st else None,
                "inference_p99_ms": summaries.get(trace, {}).get(name, {}).get("inference_p99_ms"),
            }
        entry: dict[str, Any] = {"trace": trace, "scheme": scheme, "gpushare": values[scheme]}
        for key in COMPARED:
            mine = values[scheme][key]
            entry[f"{key}_vs_exclusive"] = ratio(mine, values.get("exclusive", {}).get(key))
            others = {
                s: v[key] for s, v in values.items() if s not in GPUSHARE and v[key] is not None
            }
            best = min(others, key=lambda s: others[s]) if others else None
            entry[f"{key}_best_other"] = best
            entry[f"{key}_vs_best_other"] = ratio(mine, others[best]) if best else None
            entry[f"{key}_vs_mps_unlimited"] = ratio(mine, values.get("mps_unlimited", {}).get(key))
        entry["schemes"] = sorted(values)
        best_rate = max((float(r.get("throughput") or 0.0) for r in rows.values()), default=0.0)
        entry["max_stretch_floor"] = stretch_floor(by_scheme["exclusive"], solo, best_rate)
        floor = mean_jct_floor(by_scheme["exclusive"], solo, best_rate)
        best_jct = entry.get("mean_jct_s_best_other")
        entry["mean_jct_floor_s"] = floor
        entry["mean_jct_floor_vs_best_other"] = (
            ratio(floor, values[best_jct]["mean_jct_s"]) if best_jct else None
        )
        # A job that failed finishes no work: a scheme's makespan and JCT cover only the
        # jobs that finished, so the failures are listed beside them.
        entry["failed"] = {
            name: len(summaries.get(trace, {}).get(name, {}).get("failed", []))
            for name in sorted(values)
        }
        detail = summaries.get(trace, {}).get(scheme, {})
        entry["preemptions"] = detail.get("preemptions", 0)
        entry["promotions"] = detail.get("promotions", 0)
        for key in ("cold_starts", "pauses", "paused_s", "discarded_gpu_s"):
            entry[key] = rows[scheme].get(key, detail.get(key))
        entry["guaranteed_worst_slowdown"] = guaranteed_beside_opportunistic(
            by_scheme.get(scheme, []), solo
        )
        out.append(entry)
    return out


def guaranteed_beside_opportunistic(
    jobs: Sequence[dict[str, Any]], solo_run_s: dict[str, float]
) -> float | None:
    """The largest run-time slowdown (run time over its solo run time) of a guaranteed batch
    job that did not opt in and ran while an opportunistic one did: what its class bound holds
    it to, measured. A job that opted in and was placed in a guaranteed share is one of the
    equals (no preemption among equals; docs/packing.md) and is not counted; records from
    before runs kept ``opted_in`` count every guaranteed job. None when no such job overlapped
    an opportunistic one."""
    opportunistic = [
        (float(j["start_s"]), float(j["end_s"]))
        for j in jobs
        if j.get("opportunistic") and j.get("start_s") is not None and j.get("end_s") is not None
    ]
    worst: float | None = None
    for j in jobs:
        if j.get("opportunistic") or j.get("opted_in") or j.get("error") is not None:
            continue
        if j.get("end_s") is None:
            continue
        spec = KINDS.get(str(j.get("kind")))
        if spec is None or spec.gpu_class != CLASS_BATCH:
            continue
        start = j.get("first_start_s") if j.get("first_start_s") is not None else j.get("start_s")
        solo = solo_run_s.get(str(j.get("id")))
        if start is None or not solo:
            continue
        begin, end = float(start), float(j["end_s"])
        if not any(b < end and begin < e for b, e in opportunistic):
            continue
        slowdown = (end - begin) / solo
        worst = slowdown if worst is None else max(worst, slowdown)
    return None if worst is None else round(worst, 3)


def trace_ways(results: dict[str, Any], trace: str) -> dict[str, str]:
    """Each way ``trace`` was run (:data:`WAYS`) -> the scheme whose run it is. Recorded by the
    run (``details.ways``); for a run before that, the gpushare runs it holds."""
    recorded = results.get("details", {}).get("ways", {}).get(trace)
    if recorded:
        return dict(recorded)
    rows = results.get("traces", {}).get(trace, {})
    return {WAYS[s]: s for s in GPUSHARE if s in rows}


def by_trace(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per trace and way (defaults, marked rows opted in, every batch row opted in):
    makespan over MPS without limits' and over exclusive FIFO's, mean JCT over the best other
    scheme's and over exclusive FIFO's with the floor no scheme beats, the slowest job's
    stretch, and how jobs started and were preempted (cold starts, pauses, paused seconds,
    seconds of work discarded by kills): issue 65's record."""
    gpu = short_name(str(results.get("gpu", "")))
    compared = {
        (c["trace"], c["scheme"]): c for scheme in GPUSHARE for c in comparisons(results,
                                                                                  scheme=scheme)
    }  # fmt: skip
    out: list[dict[str, Any]] = []
    for trace in results.get("traces", {}):
        for way, scheme in trace_ways(results, trace).items():
            c = compared.get((trace, scheme))
            if c is None:
                continue
            mine = c["gpushare"].get("max_stretch")
            ratio_mps = c.get("max_stretch_vs_mps_unlimited")
            out.append(
                {
                    "gpu": gpu,
                    "trace": trace,
                    "way": way,
                    "scheme": scheme,
                    "makespan_vs_mps_unlimited": c.get("makespan_s_vs_mps_unlimited"),
                    "makespan_vs_exclusive": c.get("makespan_s_vs_exclusive"),
                    "jct_vs_best_other": c.get("mean_jct_s_vs_best_other"),
                    "jct_best_other": c.get("mean_jct_s_best_other"),
                    "jct_vs_exclusive": c.get("mean_jct_s_vs_exclusive"),
                    "jct_floor_vs_best_other": c.get("mean_jct_floor_vs_best_other"),
                    "max_stretch": mine,
                    "max_stretch_vs_mps_unlimited": ratio_mps,
                    "mps_unlimited_max_stretch": (
                        round(mine / ratio_mps, 3) if mine is not None and ratio_mps else None
                    ),
                    "max_stretch_floor": c.get("max_stretch_floor"),
                    "guaranteed_worst_slowdown": c.get("guaranteed_worst_slowdown"),
                    "pauses": c.get("pauses"),
                    "paused_s": c.get("paused_s"),
                    "discarded_gpu_s": c.get("discarded_gpu_s"),
                    "cold_starts": c.get("cold_starts"),
                    "preemptions": c.get("preemptions", 0),
                    "promotions": c.get("promotions", 0),
                    "others": [s for s in c.get("schemes", []) if s not in GPUSHARE],
                }
            )
    return out


def comparison_table(
    rows: Sequence[dict[str, Any]], *, label: str = "", suffix: str = ""
) -> list[str]:
    """Markdown rows, one per trace: ``ratio (best other scheme)`` for each compared value."""
    lines = []
    for c in rows:
        cells = []
        for key in COMPARED:
            mine = c.get("gpushare", {}).get(key)
            if mine is None:
                cells.append("-")
                continue
            cell = (
                f"{_fmt(c.get(f'{key}_vs_exclusive'))} / {_fmt(c.get(f'{key}_vs_best_other'))} "
                f"({c.get(f'{key}_best_other') or '-'})"
            )
            cells.append(f"{_fmt(mine, 1)} ms: {cell}" if key.endswith("_ms") else cell)
        failed = c.get("failed", {})
        cells.append(", ".join(f"{s} {n}" for s, n in failed.items() if n) or "none")
        lines.append(f"| {label}{c['trace']}{suffix} | " + " | ".join(cells) + " |")
    return lines


BY_TRACE_HEADER = [
    "| GPU | trace | way | makespan / MPS without limits | makespan / exclusive | mean JCT / "
    "best other (which; floor of any scheme) | mean JCT / exclusive | slowest stretch (MPS "
    "without limits') | cold starts | pauses | paused s | discarded GPU-s | preemptions | "
    "promotions |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
]


def by_trace_table(rows: Sequence[dict[str, Any]]) -> list[str]:
    return [
        f"| {r['gpu']} | {r['trace']} | {r.get('way', r['scheme'])} | "
        f"{_fmt(r['makespan_vs_mps_unlimited'])} | {_fmt(r.get('makespan_vs_exclusive'))} | "
        f"{_fmt(r['jct_vs_best_other'])} ({r.get('jct_best_other') or '-'}; "
        f"{_fmt(r.get('jct_floor_vs_best_other'))}) | {_fmt(r.get('jct_vs_exclusive'))} | "
        f"{_fmt(r['max_stretch'])} ({_fmt(r['mps_unlimited_max_stretch'])}) | "
        f"{_fmt(r.get('cold_starts'))} | {_fmt(r.get('pauses'))} | {_fmt(r.get('paused_s'))} | "
        f"{_fmt(r.get('discarded_gpu_s'))} | {r['preemptions']} | {r['promotions']} |"
        for r in rows
    ]


COMPARISON_HEADER = [
    "Each cell: gpushare's value over exclusive FIFO's / over the best other scheme's (which "
    "one); below 1, gpushare is ahead. Stretch is a job's JCT over its run time alone; inference "
    "p99 is the latency-class job's request p99, where the trace has one.",
    "",
    "| trace | makespan | mean JCT | mean stretch | max stretch | inference p99 | failed jobs |",
    "|---|---|---|---|---|---|---|",
]


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def markdown(results: dict[str, Any], *, level: int = 1) -> str:
    """One run's results (``level`` 2 nests it under a merged record's heading)."""
    h = "#" * level
    d = results.get("details", {})
    db = results.get("decided_by", {})
    model = db.get("model", {})
    lines = [
        f"{h} gpushare on a real GPU: {results.get('gpu')}",
        "",
        f"- GPU: {results.get('gpu')} (driver {results.get('driver')}), {d.get('machine', '')}",
        f"- Date: {results.get('date')}; run took {_fmt(d.get('run_s'), 0)} s of a "
        f"{_fmt(d.get('budget_s'), 0)}-s budget"
        + (" (--quick: shorter jobs and fewer packs)" if d.get("quick") else "")
        + (" (DRY RUN: no GPU work, numbers check the harness only)" if d.get("dry_run") else ""),
        f"- Decided by: {db.get('placement')}; admission {db.get('admission')} (bounds "
        f"{db.get('bounds')}); thread cap {db.get('thread_cap')}; client env "
        f"{db.get('client_env')}",
        f"- Model: `{model.get('file')}` (sha256 {str(model.get('sha256', ''))[:12]}, "
        f"{model.get('source', '')[:80]}...), shipped, never refit in the run; code "
        f"{db.get('code_rev') or 'unrecorded'}",
        f"- Profiles from: {d.get('profile_source')}; traces: {d.get('trace_sources')}",
        "",
    ]
    lines += _jobs_table(d, h)
    for trace, rows in results.get("traces", {}).items():
        extra = d.get("schemes", {}).get(trace, {})
        ex = rows.get("exclusive", {})
        lines += [
            f"{h}# {trace} trace ({d.get('trace_jobs', {}).get(trace, '?')} jobs)",
            "",
            *_warm_plan_lines(d.get("warm_plans", {}).get(trace)),
            "| scheme | makespan s | mean JCT s | throughput | makespan / exclusive "
            "| JCT / exclusive | slowest job vs solo | failed | cold starts | pauses | paused s "
            "| discarded GPU-s |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for s in SCHEMES:
            r = rows.get(s)
            if not r:
                lines.append(f"| {s} | not run | | | | | | | | | | |")
                continue
            x = extra.get(s, {})
            lines.append(
                f"| {s} | {_fmt(r['makespan_s'])} | {_fmt(r['mean_jct_s'])} | "
                f"{_fmt(r['throughput'])} | {_fmt(ratio(r['makespan_s'], ex.get('makespan_s')))} | "
                f"{_fmt(ratio(r['mean_jct_s'], ex.get('mean_jct_s')))} | "
                f"{_fmt(x.get('max_slowdown'))}x | {len(x.get('failed', []))} | "
                f"{_fmt(r.get('cold_starts'))} | {_fmt(r.get('pauses'))} | "
                f"{_fmt(r.get('paused_s'))} | {_fmt(r.get('discarded_gpu_s'))} |"
            )
        lines.append("")
    for scheme in GPUSHARE:
        compared = comparisons(results, scheme=scheme)
        if compared:
            lines += [f"{h}# Every trace: {TITLES[scheme]} against the others", "",
                      *COMPARISON_HEADER]  # fmt: skip
            lines += [*comparison_table(compared), ""]
    rows = by_trace(results)
    if rows:
        lines += [f"{h}# Per trace and way", "", *BY_TRACE_HEADER]
        lines += [*by_trace_table(rows), ""]
    corrections = d.get("corrections")
    if corrections:
        learned = ", ".join(f"{k} {v:.2f}" for k, v in sorted(corrections.items()))
        lines += [
            f"The governor's corrections after the opt-in runs (factor on each kind's predicted "
            f"log-slowdown; below 1 the model was pessimistic): {learned}.",
            "",
        ]
    dl = d.get("latency", {})
    lines += [
        f"{h}# Inference beside training",
        "",
        f"Training (ResNet-50, asks 0.5) beside the service as gpushare places it: "
        f"{dl.get('training_launch', '-')}, cap {dl.get('training_cap', '-')}% at priority 1, "
        f"service {dl.get('service_threads', '-')}% at priority 0 "
        f"({dl.get('gpushare_admission', '-')}). Windows of {_fmt(dl.get('window_s'), 1)} s, "
        f"{dl.get('rounds', '-')} rounds in rotated order, warm-up requests left out.",
        "",
        "| setting | windows | requests | p50 ms | p99 ms | p99 by window | training it/s "
        "(share of solo) |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in dl.get("rows", []):
        lines.append(
            f"| {row['setting']} | {row.get('windows')} | {row.get('requests')} | "
            f"{_fmt(row.get('p50_ms'))} | {_fmt(row.get('p99_ms'))} | "
            f"{' / '.join(_fmt(x, 1) for x in row.get('p99_ms_by_window', []))} | "
            f"{_fmt(row.get('train_rate'))} ({_fmt(row.get('train_share'))}) |"
        )
    m = d.get("model", {})
    shipped = m.get("shipped", {})
    loko = m.get("leave_one_kind_out", {})
    cal = m.get("calibrated", {})
    rep = m.get("repeatability", {})
    ex = d.get("exhaustive", {})
    lines += [
        "",
        f"{h}# Interference model and packing",
        "",
        f"- Shipped model on this run's packs of the kinds it was fit on: MAPE "
        f"{_fmt(shipped.get('fitted_kinds_mape'), 3)} "
        f"({shipped.get('fitted_kinds_predictions', '-')} predictions)",
        f"- Shipped model on packs holding a kind it never saw: MAPE "
        f"{_fmt(shipped.get('unseen_kinds_mape'), 3)} "
        f"({shipped.get('unseen_kinds_predictions', '-')} predictions; by kind "
        f"{shipped.get('unseen_by_kind', {})})",
        f"- Shipped model calibrated on this run's known-kind packs "
        f"(gpushare.packing.calibration), on packs holding an unseen kind: MAPE "
        f"{_fmt(cal.get('unseen_kinds_mape'), 3)} "
        f"({cal.get('unseen_kinds_predictions', '-')} predictions; by kind "
        f"{cal.get('unseen_by_kind', {})})",
        f"- Leave-one-kind-out (refit on this run's packs without the kind): MAPE "
        f"{_fmt(loko.get('mape'), 3)}; by kind {loko.get('by_kind', {})}",
        f"- The same packs as the stored runs measured them (each job's mean slowdown there, "
        f"no model), as a prediction of this run: MAPE {_fmt(rep.get('mape'), 3)} "
        f"({rep.get('predictions', '-')} predictions over {rep.get('stored_runs', '-')} stored "
        f"runs; packs holding an unseen kind {_fmt(rep.get('unseen_kinds_mape'), 3)}, the others "
        f"{_fmt(rep.get('fitted_kinds_mape'), 3)}): how far packs repeat from host to host",
        f"- 5-fold by pack (refit on this run's packs): MAPE "
        f"{_fmt(m.get('k_fold', {}).get('mape_slowdown'), 3)}",
        f"- Chosen packs vs exhaustive best over measured packs: "
        f"{_fmt(results.get('packing_vs_exhaustive'), 3)}; against the best the requests allow: "
        f"{_fmt(ex.get('packing_vs_exhaustive_within_requests'), 3)} "
        f"({ex.get('scenarios', '-')} scenarios)",
        f"- Colocation packs measured: {d.get('colocation_packs', '-')}",
        "",
        f"{h}# Targets",
        "",
        "| target | value | limit | met |",
        "|---|---|---|---|",
    ]
    for c in results.get("targets", []):
        met = {True: "yes", False: "**no**", None: "not measured"}[c["met"]]
        lines.append(f"| {c['target']} | {_fmt(c['value'], 3)} | {c['limit']} | {met} |")
    if d.get("errors"):
        lines += ["", f"{h}# Errors during the run", ""] + [f"- {e}" for e in d["errors"]]
    return "\n".join(lines) + "\n"


TITLES = {
    "gpushare": "gpushare (defaults)",
    OPPORTUNISTIC: "gpushare with the marked rows opted in",
    OPPORTUNISTIC_ALL: "gpushare with every batch row opted in",
}


def _warm_plan_lines(plan: dict[str, Any] | None) -> list[str]:
    """How the trace's jobs started, the same under every scheme (``warmup.plan``)."""
    if not plan:
        return []
    cold = plan.get("cold", [])
    sources = sorted(set(plan.get("memory_source", {}).values()))
    return [
        f"Started warm under every scheme: {len(plan.get('warm', []))} jobs; cold under every "
        f"scheme: {len(cold)}{' (' + ', '.join(cold) + ')' if cold else ''} (memory "
        f"{'/'.join(sources) or '-'}, {plan.get('usable_mib')} MiB usable).",
        "",
    ]


def _jobs_table(d: dict[str, Any], h: str) -> list[str]:
    """Per kind: what it is, its solo profile, what it asked for and what start-up cost."""
    lines = [
        f"{h}# Jobs (solo profiles from gpushare's profiler, MPS, 100% threads)",
        "",
        "| kind | job | it/s | SM util | SM occ | tensor | fp32 | fp64 | DRAM | asks "
        "| start-up s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    raw = d.get("raw_profiles", {})
    for name, spec in KINDS.items():
        p = d.get("profiles", {}).get(name)
        rate = d.get("solo_rates_mps", {}).get(name)
        if p is None and rate is None:
            continue
        p = p or {}  # measured alone but not profiled (a GPU without GPM): cells read "-"
        asks = d.get("requested_fractions", {}).get(name)
        unseen = " (unseen)" if spec.unseen else ""
        lines.append(
            f"| {name}{unseen} | {spec.description} | {_fmt(rate, 1)} | "
            f"{_fmt(raw.get(name, {}).get('sm_utilization'))} | {_fmt(p.get('sm_occupancy'))} | "
            f"{_fmt(p.get('tensor'))} | {_fmt(p.get('fp32'))} | {_fmt(p.get('fp64'))} | "
            f"{_fmt(p.get('dram_bandwidth'))} | {_fmt(asks)} | "
            f"{_fmt(d.get('startup_s', {}).get(name), 1)} |"
        )
    lines.append("")
    return lines


def write(out: Path, results: dict[str, Any], *, name: str = "gpu-packing") -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    js = out / f"{name}.json"
    md = out / f"{name}.md"
    js.write_text(json.dumps(results, indent=2, sort_keys=False, default=str) + "\n")
    md.write_text(markdown(results))
    return js, md


def short_name(gpu: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``H100``, ``NVIDIA A100-SXM4-80GB`` -> ``A100``, ``NVIDIA
    GH200 480GB`` -> ``GH200``: the first word with a digit that is not a memory size, the
    label a merged record's targets carry."""
    for word in gpu.replace("-", " ").split():
        if any(c.isdigit() for c in word) and not word.upper().endswith("GB"):
            return word
    return gpu or "gpu"


def merge(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One record for runs on several GPUs: each run's targets, labelled by its GPU. The
    targets are checked again by this code (:func:`check_targets`), so a record merged from
    runs stored before a target changed reads them against today's targets."""
    runs = [{**r, "targets": check_targets(r)} for r in runs]
    labels: list[str] = []
    for r in runs:
        label = short_name(str(r.get("gpu", "")))
        while label in labels:
            label += "'"
        labels.append(label)
    decided = [r.get("decided_by", {}) for r in runs]
    first = decided[0] if decided else {}
    return {
        "decided_by": {
            **first,
            "same_in_every_run": all(
                d.get("model", {}).get("sha256") == first.get("model", {}).get("sha256")
                for d in decided
            ),
        },
        "targets": [
            {**t, "target": f"{label}: {t['target']}"}
            for label, r in zip(labels, runs, strict=True)
            for t in r.get("targets", [])
        ],
        "comparisons": [
            {"gpu": label, **c}
            for label, r in zip(labels, runs, strict=True)
            for scheme in GPUSHARE
            for c in comparisons(r, scheme=scheme)
        ],
        "by_trace": [row for r in runs for row in by_trace(r)],
        "runs": dict(zip(labels, runs, strict=True)),
    }


def merged_markdown(record: dict[str, Any], notes: str = "") -> str:
    db = record.get("decided_by", {})
    model = db.get("model", {})
    request = db.get("request", "requests: the trace rows, else the benchmark's own user rule")
    lines = [
        "# gpushare on real GPUs: job mixes, decided by the product",
        "",
        f"Every request a trace row leaves open, placement, thread cap, MPS priority and "
        f"admission below was decided by gpushare's own code ({request}; "
        f"{db.get('placement')}; {db.get('admission')}; "
        f"{db.get('thread_cap')}; {db.get('client_env')}) with the shipped interference model "
        f"`{model.get('file')}` (sha256 {str(model.get('sha256', ''))[:12]}), never refit on "
        f"a run's packs. Runs: {', '.join(record.get('runs', {}))}.",
        "",
        "## Targets",
        "",
        "| target | value | limit | met |",
        "|---|---|---|---|",
    ]
    for c in record.get("targets", []):
        met = {True: "yes", False: "**no**", None: "not measured"}[c["met"]]
        lines.append(f"| {c['target']} | {_fmt(c['value'], 3)} | {c['limit']} | {met} |")
    lines.append("")
    compared = record.get("comparisons", [])
    if compared:
        lines += ["## Every trace: gpushare against the others", "", *COMPARISON_HEADER]
        for c in compared:
            scheme = c.get("scheme", "gpushare")
            run = "" if scheme == "gpushare" else f" ({WAYS.get(scheme, scheme)})"
            lines += comparison_table([c], label=f"{c['gpu']}: ", suffix=run)
        lines.append("")
    if record.get("by_trace"):
        lines += ["## Per trace and way", "", *BY_TRACE_HEADER]
        lines += [*by_trace_table(record["by_trace"]), ""]
    if notes:
        lines += [notes.strip(), ""]
    for run in record.get("runs", {}).values():
        lines.append(markdown(run, level=2))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gpu.report", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("merge", help="one record from runs on several GPUs")
    m.add_argument("runs", type=Path, nargs="+", help="gpu-packing.json of each run")
    m.add_argument("--out", type=Path, required=True, help="directory for the merged record")
    m.add_argument("--notes", type=Path, help="markdown placed after the targets table")
    m.add_argument(
        "--name",
        default="gpu-packing",
        help="file name of the record, without .json/.md (default gpu-packing)",
    )
    args = p.parse_args(argv)
    if not args.name or not all(c.isalnum() or c in "-_" for c in args.name):
        p.error(f"--name: {args.name!r} must be letters, digits, '-' or '_' (e.g. gpu-mixes)")
    runs = []
    for path in args.runs:
        try:
            runs.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError) as exc:
            p.error(f"{path}: {exc}")
    record = merge(runs)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
    notes = args.notes.read_text() if args.notes else ""
    (args.out / f"{args.name}.md").write_text(merged_markdown(record, notes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
