"""The human-readable twin of openb-replay.json."""

from typing import Any


def _f(value: Any, digits: int = 2) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def render_markdown(doc: dict[str, Any]) -> str:
    setup = doc.get("setup", {})
    lines = [
        "# openb replayed through the real scheduler",
        "",
        f"{doc['date']} on {doc['machine']}; Kubernetes {setup.get('kubernetes', '?')}; "
        f"checkout {setup.get('git_head', '?')}.",
        "",
        f"{doc['experiment']}. {setup.get('nodes')} KWOK nodes / {setup.get('gpus')} GPUs from "
        f"`{setup.get('node_list')}`; pods created in each seed's arrival order (the "
        "simulator's), at most "
        f"{setup.get('window')} not yet bound or refused; a pod still unbound "
        f"{setup.get('fail_after_s')} s after the scheduler refused it counts as failed and "
        "is deleted. Allocation: allocated GPU share from the API server's bound pods and "
        "their placement annotations, when arrived GPU demand reaches 100% and 130% of "
        f"capacity. Controller flags: {setup.get('controller_args')}.",
        "",
        "| pod list | alloc @100% | simulator @100% | alloc @130% (std) | simulator @130% "
        "| FGD published @130% | failed pods | pods/s (stock) | seeds |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for trace, row in doc["traces"].items():
        more = doc.get("trace_details", {}).get(trace, {})
        lines.append(
            f"| {trace} | {_f(row['alloc_100'])} | {_f(row.get('sim_alloc_100'))} "
            f"| {_f(row['alloc_130'])} "
            f"({_f(more.get('alloc_130_std'))}) | {_f(row.get('sim_alloc_130'))} "
            f"| {_f(more.get('published_fgd_130'))} | {_f(row['failed_pods'], 0)} "
            f"| {_f(more.get('pods_per_s'), 1)} ({_f(more.get('stock_pods_per_s'), 1)}) "
            f"| {', '.join(str(s) for s in row['seeds'])} |"
        )
    timing = doc.get("timing_of_record")
    if timing is not None:
        mine = doc.get("this_machine_timing", {})
        lines += [
            "",
            f"Timing of record (filter p99, pods/s) from `{timing['source']}`: "
            f"{timing['machine']}, {timing.get('date')}, runs "
            + ", ".join(f"{r['trace']} seed {r['seed']}" for r in timing.get("runs", []))
            + ". On the machine above the same figures were: filter p99 "
            f"{_f(mine.get('filter_p99_ms'))} ms, pods/s {_f(mine.get('pods_per_s'), 1)} "
            f"against stock {_f(mine.get('stock_pods_per_s'), 1)}.",
        ]
    where = "" if timing is None else f", {timing['machine'].split(':')[0]}"
    lines += [
        "",
        "| measure | value |",
        "|---|---|",
        f"| extender filter p99{where} (all runs pooled, {doc.get('filter_calls')} calls) | "
        f"{_f(doc.get('filter_p99_ms'))} ms (bucket {doc.get('filter_p99_bucket_ms')} ms) |",
        f"| pods/s, gpushare{where} (to 100%, mean of runs) | {_f(doc.get('pods_per_s'), 1)} |",
        f"| pods/s, stock default-scheduler{where}, same nodes, same run | "
        f"{_f(doc.get('stock_pods_per_s'), 1)} |",
        f"| invariant violations (GPU share, GPU memory, MPS clients, host CPU/memory) | "
        f"{doc['violations']} |",
        "",
        "## Runs",
        "",
        "| pod list | seed | alloc @100% | alloc @130% | failed | pods/s to 100% | "
        "filter p99 ms | wall s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in doc.get("runs", []):
        lines.append(
            f"| {r['trace']} | {r['seed']} | {_f(r['alloc_100'])} | {_f(r['alloc_130'])} "
            f"| {r.get('failed')} | {_f(r.get('pods_per_s_to_checkpoint'), 1)} "
            f"| {_f(r.get('filter', {}).get('p99_ms'))} | {_f(r.get('wall_s'), 0)} |"
        )
    for s in doc.get("stock_runs", []):
        lines.append(
            f"| stock: {s['trace']} | {s['seed']} | | | {s.get('failed')} "
            f"| {_f(s.get('pods_per_s_to_checkpoint'), 1)} | | |"
        )
    notes = doc.get("targets") or []
    if notes:
        lines += ["", "## Against the targets", ""] + [f"- {n}" for n in notes]
    extra = doc.get("notes") or []
    if extra:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in extra]
    return "\n".join(lines) + "\n"
