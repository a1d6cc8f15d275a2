"""Scrape latency and sampler CPU cost of the node exporter: 8 GPUs, 50 pods (simulated backend).

    python bench/exporter/scrape_bench.py --out bench/results/exporter.json [--gpu-check FILE]

Scrapes go over real HTTP on loopback to the exporter's server, as Prometheus does. The 50 pods
hold one GPU process each; their PIDs resolve through cgroup files laid out like the host's
/proc, so every scrape also builds 50 per-pod memory series. The sampler's CPU cost is the CPU
time of its thread over wall time at the default 1 s interval (and at GPM's 0.1 s minimum).
The simulated backend's own reads are nearly free, so this is the exporter's overhead; the
real-NVML figures come from bench/exporter/gpu_check.py (merged in with --gpu-check).
"""

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid as uuidlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402

from bench.exporter.standalone import SimulatedPodProcesses  # noqa: E402
from gpushare.node.exporter import PodAllocation, SamplerSettings, build_exporter  # noqa: E402
from gpushare.node.exporter.server import serve  # noqa: E402
from gpushare.node.gpu.backend import GpuProcess  # noqa: E402
from gpushare.node.gpu.simulated import SimulatedBackend  # noqa: E402

GPUS = 8
PODS = 50
GIB = 2**30


def machine() -> dict[str, Any]:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "note": "shared development machine: other builds and tests ran alongside",
    }


def setup(proc_root: Path) -> tuple[Any, list[PodAllocation]]:
    inner = SimulatedBackend(f"{GPUS}xH100-80GB", node_name="bench-node")
    backend = SimulatedPodProcesses(inner)
    gpus = backend.inventory()
    pods: list[PodAllocation] = []
    procs: dict[str, list[GpuProcess]] = {g.uuid: [] for g in gpus}
    for i in range(PODS):
        gpu = gpus[i % GPUS]
        uid = str(uuidlib.UUID(int=i + 1))
        cid = f"{i + 1:064x}"
        pid = 100000 + i
        (proc_root / str(pid)).mkdir()
        (proc_root / str(pid) / "cgroup").write_text(f"0::/kubepods/burstable/pod{uid}/{cid}\n")
        pods.append(
            PodAllocation(
                namespace=f"team-{i % 5}",
                name=f"job-{i}",
                uid=uid,
                gpu_uuids=(gpu.uuid,),
                compute_ratio=0.15,
                thread_percent=15,
                memory_limit_bytes=8 * GIB,
                containers={cid: "main"},
            )
        )
        procs[gpu.uuid].append(GpuProcess(pid=pid, used_memory_bytes=6 * GIB, mps_client=True))
    for gpu in gpus:
        backend.set_processes(gpu.uuid, procs[gpu.uuid])
        n = len(procs[gpu.uuid])
        inner.set_load(
            gpu.uuid,
            pipes={"tensor": 0.1 * n, "tensor_hmma": 0.1 * n, "fp32": 0.05 * n},
            sm_occupancy=0.08 * n,
            memory_used_bytes=6 * GIB * n,
        )
    return backend, pods


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def sampler_cpu_ratio(backend: Any, pods: list[PodAllocation], proc_root: Path, interval: float,
                      seconds: float) -> float:  # fmt: skip
    exporter = build_exporter(
        backend=backend,
        node_name="bench-node",
        placements=lambda: pods,
        settings=SamplerSettings(interval_s=interval, proc_root=proc_root),
    )
    exporter.start()
    time.sleep(seconds)
    exporter.stop()
    return exporter.sampler.cpu_seconds / seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--scrapes", type=int, default=1000)
    parser.add_argument("--cpu-seconds", type=float, default=30.0)
    parser.add_argument("--gpu-check", type=Path, help="gpu_check.json from a real GPU")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        proc_root = Path(tmp)
        backend, pods = setup(proc_root)
        exporter = build_exporter(
            backend=backend,
            node_name="bench-node",
            placements=lambda: pods,
            settings=SamplerSettings(interval_s=1.0, proc_root=proc_root),
        )
        exporter.start()
        registry = CollectorRegistry()
        registry.register(exporter.collector)
        server = serve(registry=registry, profiler=exporter.profiler, host="127.0.0.1")
        url = f"http://127.0.0.1:{server.port}/metrics"
        time.sleep(1.5)
        with urllib.request.urlopen(url) as resp:
            body = resp.read()
        series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
        pod_series = body.count(b"gpushare_pod_gpu_memory_used_bytes{")
        timings = []
        for _ in range(args.scrapes):
            start = time.perf_counter()
            with urllib.request.urlopen(url) as resp:
                resp.read()
            timings.append((time.perf_counter() - start) * 1000)
        collect = []
        for _ in range(args.scrapes):
            start = time.perf_counter()
            generate_latest(registry)
            collect.append((time.perf_counter() - start) * 1000)
        server.stop()
        exporter.stop()
        cpu_default = sampler_cpu_ratio(backend, pods, proc_root, 1.0, args.cpu_seconds)
        cpu_fast = sampler_cpu_ratio(backend, pods, proc_root, 0.1, args.cpu_seconds / 3)
    result: dict[str, Any] = {
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine(),
        "setup": {
            "gpus": GPUS,
            "pods": PODS,
            "backend": "simulated (8xH100-80GB), pods' processes resolved through cgroup files",
            "series_per_scrape": series,
            "pod_memory_series": pod_series,
            "scrape_bytes": len(body),
            "scrapes": args.scrapes,
            "transport": "HTTP GET /metrics on loopback (ThreadingWSGIServer)",
        },
        "scrape_p50_ms": round(percentile(timings, 0.50), 3),
        "scrape_p99_ms": round(percentile(timings, 0.99), 3),
        "scrape_mean_ms": round(statistics.fmean(timings), 3),
        "collect_in_process_p50_ms": round(percentile(collect, 0.50), 3),
        "collect_in_process_p99_ms": round(percentile(collect, 0.99), 3),
        "sampler_cpu_ratio": round(cpu_default, 5),
        "sampler_cpu_ratio_at_0_1s": round(cpu_fast, 5),
        "sampler_interval_s": 1.0,
    }
    if args.gpu_check is not None:
        result["gpu_check"] = json.loads(args.gpu_check.read_text())
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "gpu_check"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
