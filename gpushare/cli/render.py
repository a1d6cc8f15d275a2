"""Text and JSON renderings of the ``top`` view."""

from dataclasses import asdict
from typing import Any

from gpushare.api.quantities import format_memory
from gpushare.cli.view import PIPE_ORDER, GpuRow, NodeRow

GiB = 2**30


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.0f}%"


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value / GiB:.1f}Gi"


def _limit(value: int) -> str:
    return "-" if not value else format_memory(value)


def _gpu_header(gpu: GpuRow, *, live: bool) -> str:
    info = gpu.info
    parts = [
        f"GPU {info.index}",
        info.model,
        info.uuid,
        f"allocated {gpu.allocated_percent}%",
        f"limits {gpu.limit_percent}%",
        f"pods {len(gpu.pods)}",
    ]
    if live:
        parts.append(f"util {_pct(gpu.utilization)}")
        parts.append(f"mem {_gib(gpu.memory_used_bytes)}/{_gib(info.memory_bytes)}")
        if gpu.mps_clients is not None:
            parts.append(f"mps-clients {gpu.mps_clients:.0f}")
    else:
        parts.append(f"mem {_gib(info.memory_bytes)}")
    if not info.healthy:
        parts.append("UNHEALTHY")
    if gpu.simulated:
        parts.append("[simulated]")
    return "  ".join(parts)


def _pipes_line(gpu: GpuRow) -> str:
    if not gpu.pipes:
        return "pipes: unavailable (no GPM on this GPU, or no fresh reading)"
    shown = [f"{p} {_pct(gpu.pipes[p])}" for p in PIPE_ORDER if p in gpu.pipes]
    extra = [
        f"sm-occupancy {_pct(gpu.sm_occupancy)}",
        f"dram {_pct(gpu.dram_bandwidth)}",
    ]
    return "pipes: " + "  ".join(shown + extra)


def render_text(nodes: list[NodeRow], *, live_source: str | None) -> str:
    lines: list[str] = []
    if not nodes:
        return "No node advertises gpushare GPUs (is the gpushare node agent running?)\n"
    headers = ("NAMESPACE", "POD", "CLASS", "REQUEST", "LIMIT", "MEM-LIMIT", "MEM-USED")
    for node in nodes:
        lines.append(f"NODE {node.name}")
        if node.problem:
            lines.append(f"  ! {node.problem}")
        for gpu in node.gpus:
            lines.append("  " + _gpu_header(gpu, live=live_source is not None))
            if live_source is not None:
                lines.append("    " + _pipes_line(gpu))
            if not gpu.pods:
                lines.append("    (no pods)")
                continue
            rows = [headers]
            for p in gpu.pods:
                fraction = f"{p.fraction_percent}%" if p.fraction_percent is not None else "share"
                rows.append(
                    (
                        p.namespace,
                        p.name,
                        p.gpu_class,
                        fraction,
                        f"{p.thread_percent}%",
                        _limit(p.memory_limit_bytes),
                        _gib(p.memory_used_bytes) if live_source is not None else "-",
                    )
                )
            widths = [max(len(r[i]) for r in rows) for i in range(len(headers))]
            for r in rows:
                lines.append("    " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    if live_source is None:
        lines.append("")
        lines.append("Live utilization: add --prometheus URL or --metrics-url URL.")
    return "\n".join(line.rstrip() for line in lines) + "\n"


def render_json(nodes: list[NodeRow], *, live_source: str | None) -> dict[str, Any]:
    return {
        "live_source": live_source,
        "nodes": [
            {
                "name": n.name,
                "problem": n.problem,
                "gpus": [
                    {
                        **asdict(g.info),
                        "allocated_percent": g.allocated_percent,
                        "limit_percent": g.limit_percent,
                        "pipes": g.pipes,
                        "utilization": g.utilization,
                        "sm_occupancy": g.sm_occupancy,
                        "dram_bandwidth": g.dram_bandwidth,
                        "memory_used_bytes": g.memory_used_bytes,
                        "mps_clients": g.mps_clients,
                        "simulated": g.simulated,
                        "pods": [asdict(p) for p in g.pods],
                    }
                    for g in n.gpus
                ],
            }
            for n in nodes
        ],
    }
