"""bench/results/deviceplugin.json + .md: each run merges its part and re-renders the table."""

import json
import os
import platform
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RESULTS_JSON = REPO / "bench" / "results" / "deviceplugin.json"
RESULTS_MD = RESULTS_JSON.with_suffix(".md")


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory_gib = 0.0
    try:
        first = Path("/proc/meminfo").read_text().splitlines()[0]
        memory_gib = round(int(first.split()[1]) / 2**20, 1)
    except (OSError, IndexError, ValueError):
        pass
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = -1.0
    return {
        "load_average_1m": round(load, 2),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": memory_gib,
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge(part: dict[str, Any], *, path: Path = RESULTS_JSON) -> dict[str, Any]:
    """Merge ``part`` into the results file (top-level keys replaced) and rewrite the .md."""
    data: dict[str, Any] = {}
    if path.exists():
        data = json.loads(path.read_text())
    data.update(part)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    path.with_suffix(".md").write_text(render(data))
    return data


def render(data: dict[str, Any]) -> str:
    lines = ["# Device plugin benchmark", ""]
    if "allocate_p50_ms" in data:
        bench = data.get("allocate", {})
        host = bench.get("machine", {})
        lines += [
            "## Allocate latency (simulated GPUs, real API server, gRPC over a unix socket)",
            "",
            f"Measured {bench.get('date', '?')} on {host.get('cpu', '?')} "
            f"({host.get('cores', '?')} cores, {host.get('memory_gib', '?')} GiB, shared with "
            f"other work: load average {host.get('load_average_1m', '?')}), Python "
            f"{host.get('python', '?')}: {bench.get('gpus')} GPUs, {bench.get('pods')} pods "
            f"placed, {bench.get('samples')} Allocate calls.",
            "",
            "| metric | value |",
            "| --- | --- |",
            f"| Allocate p50 | {data['allocate_p50_ms']:.2f} ms |",
            f"| Allocate p99 | {data['allocate_p99_ms']:.2f} ms |",
            f"| Allocate max | {bench.get('max_ms', 0):.2f} ms |",
            f"| GetPreferredAllocation p50 | {bench.get('preferred_p50_ms', 0):.2f} ms |",
            f"| GetPreferredAllocation p99 | {bench.get('preferred_p99_ms', 0):.2f} ms |",
            f"| pods given the wrong placement | {bench.get('wrong_pod', '?')} |",
            "",
            bench.get("method", ""),
            "",
        ]
    if "mps" in data:
        gpu = data.get("gpu", {})
        lines += [
            "## MPS on a real GPU (tests/gpu/test_mps_gpu.py)",
            "",
            f"Measured {gpu.get('date', '?')} on {data.get('gpu_model', '?')} "
            f"(driver {gpu.get('driver', '?')}), MPS daemon started by gpushare's MPS manager, "
            "clients run with the environment and mounts Allocate returned.",
            "",
            "| active-thread % | bf16 GEMM TFLOP/s | share of 100% |",
            "| --- | --- | --- |",
        ]
        full = max((m["tflops"] for m in data["mps"] if m["percent"] == 100), default=None)
        for row in data["mps"]:
            share = f"{row['tflops'] / full:.2f}" if full else "-"
            lines.append(f"| {row['percent']} | {row['tflops']:.1f} | {share} |")
        if data.get("mps_concurrent"):
            lines += [
                "",
                "Both at once on one MPS server (one client at 30 %, one at 70 %):",
                "",
                "| active-thread % | bf16 GEMM TFLOP/s |",
                "| --- | --- |",
            ]
            for row in data["mps_concurrent"]:
                lines.append(f"| {row['percent']} | {row['tflops']:.1f} |")
        lines += [
            "",
            f"- memory limit refused an over-limit allocation: "
            f"**{data.get('memory_limit_enforced')}**",
        ]
        for key, value in sorted(gpu.items()):
            if key not in ("date", "driver"):
                lines.append(f"- {key}: {value}")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    """``python -m bench.deviceplugin.results <deviceplugin_gpu.json> "<machine>"``: merge the
    GPU test's output (tests/gpu/test_mps_gpu.py) into the results."""
    import sys  # noqa: PLC0415

    part = json.loads(Path(sys.argv[1]).read_text())
    part.setdefault("gpu", {})["machine"] = sys.argv[2] if len(sys.argv) > 2 else ""
    merge(part)


if __name__ == "__main__":
    main()
