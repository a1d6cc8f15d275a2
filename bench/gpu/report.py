"""Targets, the results JSON and its markdown rendering."""

import json
import math
from pathlib import Path
from typing import Any

from bench.gpu.catalog import KINDS
from bench.gpu.metrics import ratio

SCHEMES = ("exclusive", "timeslice", "mps_equal", "mps_unlimited", "gpushare")
TRACE_KEYS = ("makespan_s", "mean_jct_s", "throughput")


def check_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets, each with the measured value and whether it was met."""
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

    traces = results.get("traces", {})
    details = results.get("details", {}).get("schemes", {})
    light = traces.get("light", {})
    gs = light.get("gpushare", {})
    ex = light.get("exclusive", {})
    eq = light.get("mps_equal", {})
    add(
        "light: gpushare makespan / exclusive",
        ratio(gs.get("makespan_s"), ex.get("makespan_s")),
        0.50,
    )
    add(
        "light: gpushare mean JCT / exclusive",
        ratio(gs.get("mean_jct_s"), ex.get("mean_jct_s")),
        0.50,
    )
    add(
        "light: gpushare makespan / mps_equal",
        ratio(gs.get("makespan_s"), eq.get("makespan_s")),
        0.85,
    )
    add(
        "light: gpushare slowest job run time / its solo time",
        details.get("light", {}).get("gpushare", {}).get("max_slowdown"),
        2.0,
    )
    heavy = traces.get("heavy", {})
    for key, label in (("makespan_s", "makespan"), ("mean_jct_s", "mean JCT")):
        others = [heavy[s][key] for s in SCHEMES if s != "gpushare" and heavy.get(s, {}).get(key)]
        best = min(others) if others else None
        add(
            f"heavy: gpushare {label} / best other scheme",
            ratio(heavy.get("gpushare", {}).get(key), best),
            1.05,
        )
    lat = results.get("latency", {})
    add(
        "latency: shared p99 / solo p99",
        ratio(lat.get("shared_p99_ms"), lat.get("solo_p99_ms")),
        1.15,
    )
    add(
        "latency: training keeps of its solo throughput",
        lat.get("train_retained_ratio"),
        0.60,
        at_most=False,
    )
    add("interference model MAPE (held-out packs)", results.get("prediction_mape"), 0.10)
    add(
        "gpushare packing / exhaustive best",
        results.get("packing_vs_exhaustive"),
        0.95,
        at_most=False,
    )
    return checks


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


VARIANTS: dict[str, str] = {
    "gpushare_no_tail": "gpushare without tail pairing",
    "gpushare_charge_cap": (
        "gpushare with the thread cap's modelled cost charged in admission: "
        "the batch bound is on the slowdown vs the whole GPU (runs 6-8; the default since run 9)"
    ),
    "gpushare_own_cap": (
        "gpushare with the batch bound on the slowdown vs the job alone at its own cap, "
        "the thread cap's cost not charged in admission (gpushare to run 8)"
    ),
}
"""What each sensitivity run changes, for the markdown."""


def markdown(results: dict[str, Any]) -> str:
    d = results.get("details", {})
    lines = [
        "# gpushare on a real GPU: job mixes",
        "",
        f"- GPU: {results.get('gpu')} (driver {results.get('driver')}), {d.get('machine', '')}",
        f"- Date: {results.get('date')}; run took {_fmt(d.get('run_s'), 0)} s"
        + (" (--quick: shorter jobs and fewer packs)" if d.get("quick") else ""),
        f"- Profiles from: {d.get('profile_source')}; placement by: {d.get('policy_source')}",
        "",
    ]
    lines += _jobs_table(d)
    for trace in ("light", "heavy"):
        rows = results.get("traces", {}).get(trace, {})
        extra = d.get("schemes", {}).get(trace, {})
        ex = rows.get("exclusive", {})
        eq = rows.get("mps_equal", {})
        lines += [
            f"## {trace} trace ({d.get('trace_jobs', {}).get(trace, '?')} jobs)",
            "",
            "| scheme | makespan s | mean JCT s | throughput | makespan / exclusive "
            "| JCT / exclusive | makespan / mps_equal | slowest job vs solo | failed |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for s in SCHEMES:
            r = rows.get(s)
            if not r:
                lines.append(f"| {s} | not run | | | | | | | |")
                continue
            x = extra.get(s, {})
            lines.append(
                f"| {s} | {_fmt(r['makespan_s'])} | {_fmt(r['mean_jct_s'])} | "
                f"{_fmt(r['throughput'])} | {_fmt(ratio(r['makespan_s'], ex.get('makespan_s')))} | "
                f"{_fmt(ratio(r['mean_jct_s'], ex.get('mean_jct_s')))} | "
                f"{_fmt(ratio(r['makespan_s'], eq.get('makespan_s')))} | "
                f"{_fmt(x.get('max_slowdown'))}x | {len(x.get('failed', []))} |"
            )
        lines.append("")
    for name, v in d.get("variants", {}).items():
        trace = v.get("trace", "light")
        ex = results.get("traces", {}).get(trace, {}).get("exclusive", {})
        eq = results.get("traces", {}).get(trace, {}).get("mps_equal", {})
        what = (
            f"requests sized by the policy's own compute demand: {v['requested_fractions']}"
            if v.get("requested_fractions")
            else VARIANTS.get(name, name)
        )
        lines += [
            f"Sensitivity, {trace} trace, `{name}` ({what}): "
            f"makespan {_fmt(v.get('makespan_s'))} s "
            f"({_fmt(ratio(v.get('makespan_s'), ex.get('makespan_s')))}x exclusive, "
            f"{_fmt(ratio(v.get('makespan_s'), eq.get('makespan_s')))}x mps_equal), mean JCT "
            f"{_fmt(v.get('mean_jct_s'))} s "
            f"({_fmt(ratio(v.get('mean_jct_s'), ex.get('mean_jct_s')))}x exclusive), slowest "
            f"job {_fmt(v.get('max_slowdown'))}x its solo time.",
            "",
        ]
    lat = results.get("latency", {})
    dl = d.get("latency", {})
    lines += [
        "## Inference beside training",
        "",
        "| setting | p50 ms | p99 ms | training it/s (share of solo) |",
        "|---|---|---|---|",
    ]
    for row in d.get("latency_rows", []):
        lines.append(
            f"| {row['setting']} | {_fmt(row.get('p50_ms'))} | {_fmt(row.get('p99_ms'))} | "
            f"{_fmt(row.get('train_rate'))} ({_fmt(row.get('train_share'))}) |"
        )
    lines += [
        "",
        "Solo p99 (alone under the same MPS daemon, "
        + (
            f"{len(dl.get('solo_p99_ms_by_window', []))} windows of {_fmt(dl['window_s'], 0)} s "
            "interleaved with the shared rows' in rotating order, same arrivals per round; "
            "each window's p99: "
            if dl.get("window_s")
            else "same window length and arrivals, windows before and after the shared rows: "
        )
        + f"{' / '.join(_fmt(x) for x in dl.get('solo_p99_ms_by_window', [])) or '-'} ms) "
        f"{_fmt(lat.get('solo_p99_ms'))} ms; shared under gpushare "
        f"{_fmt(lat.get('shared_p99_ms'))} ms at the training cap picked from the measured "
        f"curve ({_fmt(dl.get('picked_training_cap'))}%; p99 / solo by cap: "
        f"{dl.get('p99_ratio_by_training_cap', '-')}"
        + (
            f"; each window's p99 by cap: {dl['p99_ms_by_window_by_training_cap']}"
            if dl.get("p99_ms_by_window_by_training_cap")
            else ""
        )
        + "), training kept "
        f"{_fmt(lat.get('train_retained_ratio'))} of its solo throughput.",
        "",
        "## Interference model and packing",
        "",
        f"- Held-out MAPE of the predicted slowdown (5-fold by pack): "
        f"{_fmt(results.get('prediction_mape'), 3)}; of the predicted colocated rate: "
        f"{_fmt(d.get('mape', {}).get('mape_rate'), 3)}",
        f"- Chosen packings vs exhaustive best over measured packs: "
        f"{_fmt(results.get('packing_vs_exhaustive'), 3)}; against the best the requests allow "
        "(whole-GPU jobs alone): "
        f"{_fmt(d.get('exhaustive', {}).get('packing_vs_exhaustive_within_requests'), 3)}",
        f"- Colocation packs measured: {d.get('colocation_packs', '-')}",
        "",
        "## Targets",
        "",
        "| target | value | limit | met |",
        "|---|---|---|---|",
    ]
    for c in results.get("targets", []):
        met = {True: "yes", False: "**no**", None: "not measured"}[c["met"]]
        lines.append(f"| {c['target']} | {_fmt(c['value'], 3)} | {c['limit']} | {met} |")
    if d.get("errors"):
        lines += ["", "## Errors during the run", ""] + [f"- {e}" for e in d["errors"]]
    return "\n".join(lines) + "\n"


def _jobs_table(d: dict[str, Any]) -> list[str]:
    """Per kind: what it is, its solo profile, what it asked for and what start-up cost."""
    lines = [
        "## Jobs (solo profiles from gpushare's profiler, MPS, 100% threads)",
        "",
        "| kind | job | it/s | SM util | SM occ | tensor | fp32 | fp64 | DRAM | asks "
        "| start-up s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    raw = d.get("raw_profiles", {})
    for name, spec in KINDS.items():
        p = d.get("profiles", {}).get(name)
        if p is None:
            continue
        rate = d.get("solo_rates_mps", {}).get(name)
        asks = d.get("requested_fractions", {}).get(name)
        lines.append(
            f"| {name} | {spec.description} | {_fmt(rate, 1)} | "
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
