"""The human-readable twin of scale.json."""

from typing import Any


def _fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:,.1f}{unit}" if abs(value) >= 10 else f"{value:.3g}{unit}"
    return f"{value}{unit}"


def _p99(s: dict[str, Any]) -> str:
    """p99 of a histogram summary; ">= x" when it lies beyond the last finite bucket."""
    text = _fmt(s.get("p99_ms"), " ms")
    return f">= {text}" if s.get("p99_beyond_last_bucket") else text


def _within(s: dict[str, Any], limit_ms: float) -> bool:
    p99 = s.get("p99_ms")
    return p99 is not None and p99 <= limit_ms and not s.get("p99_beyond_last_bucket")


def _stock_bind_row(r: dict[str, Any]) -> list[str]:
    """The stock scheduler's own bind p99 in the same run: what the API server gives a
    Binding POST at that load (the reference for the extender's bind target)."""
    stock = r.get("phases", {}).get("stock", {}).get("scheduler", {}).get("bind_plugins", {})
    if not stock.get("count"):
        return []
    return [f"| stock scheduler p99, its own bind | {_p99(stock)} | reference | |"]


def _latency_rows(phase: dict[str, Any]) -> list[str]:
    rows = []
    sched = phase.get("scheduler", {})
    for label, key in (
        ("scheduler SLI (pod_scheduling_sli_duration)", "pod_scheduling_sli"),
        ("scheduler attempt, scheduled", "scheduling_attempt_scheduled"),
        ("scheduler's own Bind (Binding POST; none where the extender binds)", "bind_plugins"),
        ("scheduling algorithm (filters, extenders' filter, scores)", "scheduling_algorithm"),
    ):
        s = sched.get(key, {})
        if key in ("bind_plugins", "scheduling_algorithm") and not s.get("count"):
            continue
        rows.append(
            f"| {label} | {_fmt(s.get('count'))} | {_fmt(s.get('p50_ms'), ' ms')} | "
            f"{_p99(s)} | {_fmt(s.get('p99_bucket_ms'))} |"
        )
    points = {k: v for k, v in sched.get("extension_points_mean_ms", {}).items() if v is not None}
    if points:
        text = ", ".join(f"{k} {v:.3f} ms" for k, v in points.items())
        rows.append(f"| scheduler's own points, mean per pod | | {text} | | |")
    outside = sched.get("algorithm_outside_points_mean_ms")
    if outside is not None:
        rows.append(
            "| scheduling algorithm outside its own points (the extender's filter call), mean"
            f" | | {outside:.3f} ms | | |"
        )
    lat = phase.get("bind_latency_ms", {})
    rows.append(
        f"| bench: created -> bound | {_fmt(phase.get('bound'))} | {_fmt(lat.get('p50'), ' ms')} | "
        f"{_fmt(lat.get('p99'), ' ms')} | exact |"
    )
    run = phase.get("bound_to_running_ms", {})
    rows.append(
        f"| bench: bound -> Running (kwok) | {_fmt(phase.get('running'))} | "
        f"{_fmt(run.get('p50'), ' ms')} | {_fmt(run.get('p99'), ' ms')} | exact |"
    )
    return rows


def _machine(m: dict[str, Any], *, with_label: bool = True) -> str:
    label = f"{m['label']}: " if m.get("label") and with_label else ""
    cores = f"{m['cpu_cores']} cores"
    usable = m.get("cpu_cores_usable")
    if usable is not None and usable != m["cpu_cores"]:
        cores += f" ({usable} usable)"
    if m.get("cpu_quota_cores") is not None:
        cores += f", CPU quota {m['cpu_quota_cores']} cores"
    return (
        f"{label}{cores} ({m['cpu_model']}), {m['memory_gib']} GiB, kernel {m['kernel']}, "
        f"Python {m['python']}"
    )


def render_markdown(r: dict[str, Any]) -> str:
    """One run's report; for a combined file (``runs``, see bench/scale/combine.py) a table of
    the runs side by side, then each run's report under its machine's label."""
    runs = r.get("runs")
    if not runs:
        return _render_run(r)
    lines = [
        "# Scheduling throughput at scale",
        "",
        f"{len(runs)} runs of the same bench; the top-level fields of the JSON are the first "
        f"run's (`primary_run`: {r.get('primary_run')}).",
        "",
        "| run | machine | nodes / pods | extender e2e | stock e2e | ratio | extender drain "
        "| stock drain | drain ratio | filter p99 | bind p99 | violations |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for run in runs:
        lat = (run["phases"].get("extender") or {}).get("extender_latency", {})
        lines.append(
            f"| {run['machine'].get('label', '')} | {_machine(run['machine'], with_label=False)}, "
            f"{'shared' if run['machine'].get('shared_host', True) else 'dedicated'} "
            f"({run['date']}) | {run['nodes']} / {run['pods']} | "
            f"{_fmt(run['extender_pods_per_s'])} | {_fmt(run['stock_pods_per_s'])} | "
            f"{_fmt(run['ratio_to_stock'])} | {_fmt(run.get('extender_drain_pods_per_s'))} | "
            f"{_fmt(run.get('stock_drain_pods_per_s'))} | "
            f"{_fmt(run.get('drain_ratio_to_stock'))} | "
            f"{_p99(lat['filter']) if 'filter' in lat else 'n/a'} | "
            f"{_p99(lat['bind']) if 'bind' in lat else 'n/a'} | {run['violations']} |"
        )
    lines.append("")
    by_mode = r.get("by_mode") or []
    if by_mode:
        lines += [
            "By mode (issue 47's fields; `runs` in the JSON has every run in full):",
            "",
            "| mode | machine | nodes / pods | policy | pods/s | stock pods/s | filter p99 "
            "| bind p99 | controller RSS | violations |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for m in by_mode:
            lines.append(
                f"| {m['mode']} | {m['machine']} | {m['nodes']} / {m['pods']} | {m['policy']} | "
                f"{_fmt(m['pods_per_s'])} | {_fmt(m['stock_pods_per_s'])} | "
                f"{_fmt(m['filter_p99_ms'], ' ms')} | {_fmt(m['bind_p99_ms'], ' ms')} | "
                f"{_fmt(m['controller_rss_mib'], ' MiB')} | {m['violations']} |"
            )
        lines.append("")
    for run in runs:
        body = _render_run(run).splitlines()
        body[0] = f"# Run: {run['machine'].get('label', run['date'])}"
        lines += ["#" + ln if ln.startswith("#") else ln for ln in body]
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def _dra_rows(r: dict[str, Any]) -> list[str]:
    """The DRA phases (``--dra``): the same pods as claims, allocated by the controller with
    gpushare's placer (``dra_gpushare``, what mode dra installs) or by kube-scheduler's DRA
    allocator (``dra``)."""
    t = r["targets"]
    rows: list[str] = []
    extender_gpus = r["invariant"].get("gpus_used")
    for key, who in (
        ("dra_gpushare", "gpushare placement"),
        ("dra", "kube-scheduler's allocator"),
    ):
        alloc = r["invariant"].get(key)
        if alloc is None:
            continue
        # Results written before issue 47 held the DRA rate to 0.95x, later ones to 0.8x.
        limit = next(
            (x for x in ("0.8", "0.95") if f"{key}_pods_per_s >= {x} x extender" in t), "0.8"
        )
        rate_target = f"{key}_pods_per_s >= {limit} x extender"
        rows += [
            f"| DRA end-to-end rate, {who} | {_fmt(r.get(f'{key}_pods_per_s'), ' pods/s')} | | |",
            f"| ratio DRA ({who}) / extender | {_fmt(r.get(f'{key}_ratio_to_extender'))} | "
            f">= {limit} | {'yes' if t.get(rate_target) else 'NO'} |",
            f"| DRA oversubscribed GPUs, {who} | {alloc['violations']} (claims allocated "
            f"{alloc['claims_allocated']}/{r['pods']}, on {alloc['gpus_used']} GPUs; the "
            f"extender used {extender_gpus}) | 0 | "
            f"{'yes' if t.get(f'{key} violations == 0') else 'NO'} |",
        ]
    return rows


def _render_run(r: dict[str, Any]) -> str:
    m = r["machine"]
    setup = r["setup"]
    ext = r["phases"].get("extender")
    lines = [
        "# Scheduling throughput at scale",
        "",
        f"{r['date']} - {_machine(m)}, Kubernetes {setup['kubernetes']}; "
        f"{'shared host' if m.get('shared_host', True) else 'dedicated to this run'}, "
        f"load average at start {m['load_average_at_start']}.",
        "",
        f"{r['nodes']} KWOK nodes x {setup['node_shape']['gpus']} GPUs "
        f"({r['gpus']} GPUs), {r['pods']} fractional pods from `{setup['trace_file']}` "
        f"(gpushare-scheduler + extender), {r['stock_pods']} whole-GPU pods for the stock "
        "default-scheduler on the same nodes; pods created with "
        f"{setup['concurrency']} parallel POSTs.",
        "",
        f"Controller: {setup.get('controller_source', 'checkout')} at {setup.get('git_head')}, "
        f"arguments {setup.get('controller_args') or 'none (defaults)'}; kwok pod stage "
        f"workers {setup.get('kwok_pod_workers')}; gpushare-scheduler "
        f"percentageOfNodesToScore "
        f"{setup.get('gpushare_percentage_of_nodes_to_score') or 'adaptive (default)'}. "
        "Other tenants' CPU during each phase: "
        "`outside_bench` in the CPU table.",
        "",
        "| result | value | target | met |",
        "| --- | --- | --- | --- |",
    ]
    t = r["targets"]
    # Results written before issue 47 carry its earlier targets (ratio 0.5, every verb 10 ms).
    ratio_key = next((k for k in t if k.startswith("ratio_to_stock >= ")), "ratio_to_stock")
    verb_limits = (
        {"filter": 5.0, "bind": 10.0}
        if "filter_p99_ms <= 5" in t
        else {"filter": 10.0, "bind": 10.0, "prioritize": 10.0}
    )
    rss = r.get("controller_rss_mib")
    rss_row = (
        [
            f"| controller peak RSS | {_fmt(rss, ' MiB')} | <= 2048 MiB | "
            f"{'yes' if t.get('controller_rss_mib <= 2048') else 'NO'} |"
        ]
        if "controller_rss_mib <= 2048" in t
        else []
    )
    lines += [
        f"| extender end-to-end rate | {_fmt(r['extender_pods_per_s'], ' pods/s')} | >= 100 | "
        f"{'yes' if t['extender_pods_per_s >= 100'] else 'NO'} |",
        f"| stock scheduler rate | {_fmt(r['stock_pods_per_s'], ' pods/s')} | reference | |",
        f"| ratio extender / stock | {_fmt(r['ratio_to_stock'])} | "
        f">= {ratio_key.rsplit(' ', 1)[-1]} | {'yes' if t.get(ratio_key) else 'NO'} |",
        f"| extender drain rate (backlog) | {_fmt(r.get('extender_drain_pods_per_s'), ' pods/s')} "
        "| | |",
        f"| stock drain rate (backlog) | {_fmt(r.get('stock_drain_pods_per_s'), ' pods/s')} | | |",
        f"| drain ratio extender / stock | {_fmt(r.get('drain_ratio_to_stock'))} | | |",
        *[
            f"| extender p99, {verb} | {_p99(summary)} | <= {verb_limits.get(verb, 10.0):g} ms | "
            f"{'yes' if _within(summary, verb_limits.get(verb, 10.0)) else 'NO'} |"
            for verb, summary in (ext or {}).get("extender_latency", {}).items()
        ],
        *_stock_bind_row(r),
        *rss_row,
        *[
            f"| extender p99, {verb} | no calls (filter offers one node; kube-scheduler scores "
            "only when several are left) | <= 10 ms | n/a |"
            for verb in ("filter", "prioritize", "bind")
            if ext is not None and verb not in ext.get("extender_latency", {"filter": 0})
        ],
        f"| invariant violations | {r['violations']} (bound {r['pods_bound']}/{r['pods']}) | 0 | "
        f"{'yes' if t['violations == 0'] else 'NO'} |",
        *_dra_rows(r),
        "",
        "## Phases",
        "",
        "| phase | pods | bound | e2e pods/s | steady pods/s | creation pods/s | drain pods/s "
        "| duration | errors (retried attempts) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, p in r["phases"].items():
        lines.append(
            f"| {name} | {p['pods']} | {p['bound']} | {_fmt(p['pods_per_s'])} | "
            f"{_fmt(p['steady_pods_per_s'])} | {_fmt(p['creation_pods_per_s'])} | "
            f"{_fmt(p.get('drain_pods_per_s'))} | {_fmt(p['duration_s'], ' s')} | "
            f"{p['scheduler']['attempts_by_result'].get('error', 0)} |"
        )
    lines += ["", "## Latency", ""]
    for name, p in r["phases"].items():
        lines += [
            f"{name}:",
            "",
            "| what | count | p50 | p99 | p99 bucket (ms) |",
            "| --- | --- | --- | --- | --- |",
            *_latency_rows(p),
            "",
            f"attempts by result: {p['scheduler']['attempts_by_result']}",
            "",
        ]
    ext = ext or {}
    lines += [
        f"Extender per verb (controller histogram `{ext.get('extender_metric')}`):",
        "",
        "| verb | calls | mean | p50 | p90 | p99 | p99 bucket (ms) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for verb, s in ext.get("extender_latency", {}).items():
        lines.append(
            f"| {verb} | {s['count']} | {_fmt(s['mean_ms'], ' ms')} | "
            f"{_fmt(s['p50_ms'], ' ms')} | {_fmt(s['p90_ms'], ' ms')} | "
            f"{_p99(s)} | {_fmt(s['p99_bucket_ms'])} |"
        )
    stages = ext.get("bind_stages") or {}
    if stages:
        lines += [
            "",
            "Bind stages (controller histogram `gpushare_extender_bind_stage_seconds`): gate = "
            "waiting until no pod of the same size on the node still waits for its Allocate; "
            "write = choosing GPUs and the Binding POST.",
            "",
            "| stage | count | mean | p50 | p90 | p99 | p99 bucket (ms) |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for stage, s in stages.items():
            lines.append(
                f"| {stage} | {s['count']} | {_fmt(s['mean_ms'], ' ms')} | "
                f"{_fmt(s['p50_ms'], ' ms')} | {_fmt(s['p90_ms'], ' ms')} | "
                f"{_p99(s)} | {_fmt(s['p99_bucket_ms'])} |"
            )
    loops = {n: p["controller_loop"] for n, p in r["phases"].items() if p.get("controller_loop")}
    if loops:
        lines += [
            "",
            "The controller's event loop (`gpushare_controller_loop_turn_seconds`, "
            "`gpushare_controller_loop_delay_seconds_total`): busy = share of the phase it ran "
            "callbacks; wait = mean time a request arriving at a random moment waits for the "
            "turn in progress.",
            "",
            "| phase | turns/s | busy | mean turn | p99 turn | wait |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for name, loop in loops.items():
            lines.append(
                f"| {name} | {_fmt(loop['turns_per_s'])} | {_fmt(loop['busy_share'])} | "
                f"{_fmt(loop['turn']['mean_ms'], ' ms')} | {_p99(loop['turn'])} | "
                f"{_fmt(loop['mean_wait_for_turn_ms'], ' ms')} |"
            )
    lines += ["", "## CPU (cores used on average during each phase)", ""]
    present = list(r["phases"].items())
    names = sorted({k for _, p in present for k in p["cpu_cores_used"]})
    lines.append("| process | " + " | ".join(n for n, _ in present) + " |")
    lines.append("| --- |" + " --- |" * len(present))
    for n in names:
        cells = [_fmt(p["cpu_cores_used"].get(n)) for _, p in present]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    inv = r["invariant"]
    lines += [
        "",
        "## Invariant",
        "",
        f"{inv['gpus_used']} of {inv['gpus']} GPUs used by {inv['pods_placed']} pods "
        f"({inv['allocated_gpu_equivalents']} GPUs of guaranteed shares); fullest GPU "
        f"{inv['max_guaranteed_percent_on_a_gpu']}%, most pods on a GPU "
        f"{inv['max_pods_on_a_gpu']}; unbound gpushare pods {inv['pods_unbound']}; "
        f"violations {inv['violations']}.",
    ]
    for v in inv.get("violation_examples", []):
        lines.append(f"- {v}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import json
    import sys
    from pathlib import Path

    # Render a stored result again: python -m bench.scale.report RESULT.json > RESULT.md
    sys.stdout.write(render_markdown(json.loads(Path(sys.argv[1]).read_text())))
