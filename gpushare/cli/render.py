"""Renderings of the ``top`` view (text, wide, JSON, YAML) and the cell formats ``get`` shares."""

import json
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from gpushare.cli.view import PIPE_ORDER, GpuRow, NodeRow, PodRow
from gpushare.cli.yaml_out import dump_yaml

GiB = 2**30


def printable(text: str) -> str:
    """``text`` with every character a terminal would act on or hide shown as a Python escape
    (``\\x1b``, ``\\n``, ``\\u202e``): control characters, Unicode format characters (bidi
    overrides) and separators. A GPU model, a pod's name or class come from objects others
    write; printed raw, an escape sequence in one could rewrite the screen or the terminal's
    title, or hide a row (docs/security.md, "Files tenants can write are not believed")."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def percent(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.0f}%"


def gib(value: float | None) -> str:
    return "-" if value is None else f"{value / GiB:.1f}Gi"


def memory_limit(value: int) -> str:
    """A pod's memory cap in the unit of every memory column (``gib``): a cap of 25% of an
    80 GB GPU reads 19.9Gi beside a stated 10.0Gi, not 20879104Ki beside 10Gi."""
    return "-" if not value else gib(value)


def request(pod: PodRow) -> str:
    return f"{pod.fraction_percent}%" if pod.fraction_percent is not None else "share"


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
        parts.append(f"util {percent(gpu.utilization)}")
        parts.append(f"mem {gib(gpu.memory_used_bytes)}/{gib(info.memory_bytes)}")
        if gpu.mps_clients is not None:
            parts.append(f"mps-clients {gpu.mps_clients:.0f}")
    else:
        parts.append(f"mem {gib(info.memory_bytes)}")
    if not info.healthy:
        parts.append("UNHEALTHY")
    if gpu.simulated:
        parts.append("[simulated]")
    return printable("  ".join(parts))


def _pipes_line(gpu: GpuRow) -> str:
    if not gpu.pipes:
        return "pipes: unavailable (no GPM on this GPU, or no fresh reading)"
    shown = [f"{p} {percent(gpu.pipes[p])}" for p in PIPE_ORDER if p in gpu.pipes]
    extra = [
        f"sm-occupancy {percent(gpu.sm_occupancy)}",
        f"dram {percent(gpu.dram_bandwidth)}",
    ]
    return "pipes: " + "  ".join(shown + extra)


def table(rows: Sequence[Sequence[str]]) -> list[str]:
    """Columns padded to their widest cell, two spaces apart, as kubectl prints them; every
    cell :func:`printable`."""
    rows = [[printable(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


NO_GPUS = "No node advertises gpushare GPUs (is the gpushare node agent running?)\n"


def render_text(
    nodes: list[NodeRow], *, live_source: str | None, wide: bool = False, no_headers: bool = False
) -> str:
    """The ``top`` view: per node and GPU, its pods. ``wide`` adds each pod's state and phase;
    ``no_headers`` leaves out the pods' header rows."""
    lines: list[str] = []
    if not nodes:
        return NO_GPUS
    headers: tuple[str, ...] = (
        "NAMESPACE",
        "POD",
        "CLASS",
        "REQUEST",
        "LIMIT",
        "MEM-LIMIT",
        "MEM-USED",
    )
    if wide:
        headers = (*headers, "STATE", "PHASE", "TIER")
    for node in nodes:
        lines.append(f"NODE {printable(node.name)}")
        if node.problem:
            lines.append(f"  ! {printable(node.problem)}")
        for gpu in node.gpus:
            lines.append("  " + _gpu_header(gpu, live=live_source is not None))
            if live_source is not None:
                lines.append("    " + _pipes_line(gpu))
            if not gpu.pods:
                lines.append("    (no pods)")
                continue
            rows: list[tuple[str, ...]] = [] if no_headers else [headers]
            for p in gpu.pods:
                row = (
                    p.namespace,
                    p.name,
                    p.gpu_class,
                    request(p),
                    f"{p.thread_percent}%",
                    memory_limit(p.memory_limit_bytes),
                    gib(p.memory_used_bytes) if live_source is not None else "-",
                )
                rows.append((*row, p.state or "-", p.phase or "-", p.tier) if wide else row)
            lines.extend("    " + line for line in table(rows))
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


def dump(data: Any, *, output: str) -> str:
    """``-o json`` or ``-o yaml`` of a JSON-compatible document."""
    if output == "yaml":
        return dump_yaml(data)
    return json.dumps(data, indent=2) + "\n"
