"""Real-GPU check of the exporter: under known loads the exported pipe metrics move as expected,
and the exported GPU memory of a process matches what it allocated.

Run on a Hopper GPU node (H100/H200), as root so the load can be put into a pod-like cgroup:

    python3 bench/exporter/gpu_check.py --out gpu_check.json

The exporter runs in this process over the real NVML backend (gpushare.node.gpu.nvml) exactly as in
the node agent: background sampler, per-scrape collector, profiler. Each load (bf16, fp32, fp64
GEMM) runs in its own CUDA process; the readings are the profiler's windowed averages over the
load's steady state, and the process's memory as the collector exports it. Where the machine
lets us, the load process is moved into a cgroup named like a kubelet pod's, so the whole
PID -> cgroup -> pod chain is exercised too. A raw two-sample GPM read of both FP64 tensor
counters (DFMA id 6, DMMA id 8) is recorded beside, as a cross-check of the backend's mapping.
"""

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import time
import uuid as uuidlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from gpushare.api.profile import RATIOS, WORK_PIPES  # noqa: E402
from gpushare.node.exporter import PodAllocation, SamplerSettings, build_exporter  # noqa: E402
from gpushare.node.gpu.nvml import NvmlBackend  # noqa: E402

GIB = 2**30
EXTRA_GIB = 2
LOAD = r"""
import json, sys, time, torch
dtype = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp64": torch.float64}[sys.argv[1]]
seconds = float(sys.argv[2])
torch.backends.cuda.matmul.allow_tf32 = False
n = 8192 if dtype != torch.float64 else 6144
a = torch.randn(n, n, device="cuda", dtype=dtype)
b = torch.randn(n, n, device="cuda", dtype=dtype)
c = a @ b
torch.cuda.synchronize()
def say(**kw):
    print(json.dumps(kw), flush=True)
def spin(duration):
    t0 = time.perf_counter(); k = 0
    while time.perf_counter() - t0 < duration:
        for _ in range(4):
            torch.matmul(a, b, out=c)
        torch.cuda.synchronize(); k += 4
    return 2 * n**3 * k / (time.perf_counter() - t0) / 1e12
say(phase="ready", reserved=torch.cuda.memory_reserved())
tflops = spin(seconds / 2)
extra = torch.empty(int(sys.argv[3]) * 2**30, dtype=torch.uint8, device="cuda")
extra.fill_(1)
torch.cuda.synchronize()
say(phase="grown", reserved=torch.cuda.memory_reserved(), tflops=tflops)
spin(seconds / 2)
say(phase="done")
"""


def pod_cgroup(pid: int, pod_uid: str, container_id: str) -> str:
    """Move ``pid`` into /kubepods/besteffort/pod<uid>/<cid>; returns how, or raises OSError."""
    root = Path("/sys/fs/cgroup")
    if (root / "cgroup.controllers").exists():  # cgroup v2
        leaf = root / "kubepods" / "besteffort" / f"pod{pod_uid}" / container_id
        leaf.mkdir(parents=True, exist_ok=True)
        (leaf / "cgroup.procs").write_text(str(pid))
        return f"cgroup v2: {leaf}"
    for hierarchy in ("pids", "memory", "cpu"):
        base = root / hierarchy
        if base.is_dir():
            leaf = base / "kubepods" / "besteffort" / f"pod{pod_uid}" / container_id
            leaf.mkdir(parents=True, exist_ok=True)
            (leaf / "cgroup.procs").write_text(str(pid))
            return f"cgroup v1 ({hierarchy}): {leaf}"
    raise OSError("no writable cgroup hierarchy")


class RawGpm:
    """Two-sample GPM read of chosen metric ids, independent of the backend (cross-check)."""

    IDS = {
        "fp16": 13,
        "fp32": 12,
        "fp64": 11,
        "tensor_any": 5,
        "tensor_dfma_id6": 6,
        "tensor_hmma_id7": 7,
        "tensor_dmma_id8": 8,
        "tensor_imma_id9": 9,
    }

    def __init__(self, handle: Any) -> None:
        import pynvml  # noqa: PLC0415

        self.nvml = pynvml
        self.handle = handle
        self.first: Any = None

    def start(self) -> None:
        self.first = self.nvml.nvmlGpmSampleGet(self.handle, self.nvml.nvmlGpmSampleAlloc())

    def stop(self) -> dict[str, float | None]:
        nv = self.nvml
        second = nv.nvmlGpmSampleGet(self.handle, nv.nvmlGpmSampleAlloc())
        req = nv.c_nvmlGpmMetricsGet_t()
        req.version = nv.NVML_GPM_METRICS_GET_VERSION
        req.numMetrics = len(self.IDS)
        req.sample1, req.sample2 = self.first, second
        for i, mid in enumerate(self.IDS.values()):
            req.metrics[i].metricId = mid
        nv.nvmlGpmMetricsGet(req)
        out: dict[str, float | None] = {}
        for i, key in enumerate(self.IDS):
            m = req.metrics[i]
            out[key] = round(m.value / 100, 4) if m.nvmlReturn == nv.NVML_SUCCESS else None
        nv.nvmlGpmSampleFree(self.first)
        nv.nvmlGpmSampleFree(second)
        return out


def scrape(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def process_memory(exporter: Any, pid: int) -> int | None:
    for reading in exporter.sampler.readings():
        for proc in reading.processes or ():
            if proc.pid == pid:
                return int(proc.used_memory_bytes)
    return None


def run_load(
    kind: str,
    *,
    exporter: Any,
    registry: CollectorRegistry,
    raw: RawGpm,
    uuid: str,
    pods: list[PodAllocation],
    seconds: float,
) -> dict[str, Any]:
    pod_uid = str(uuidlib.uuid4())
    cid = uuidlib.uuid4().hex + uuidlib.uuid4().hex
    proc = subprocess.Popen(
        [sys.executable, "-c", LOAD, kind, str(seconds), str(EXTRA_GIB)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    result: dict[str, Any] = {"load": f"{kind} GEMM", "pid": proc.pid}
    ready = json.loads(proc.stdout.readline())
    try:
        result["cgroup"] = pod_cgroup(proc.pid, pod_uid, cid)
        pods[:] = [
            PodAllocation(
                namespace="gpu-check",
                name=f"{kind}-gemm",
                uid=pod_uid,
                gpu_uuids=(uuid,),
                compute_ratio=1.0,
                thread_percent=100,
                memory_limit_bytes=0,
                containers={cid: "main"},
            )
        ]
    except OSError as exc:
        result["cgroup"] = f"not possible here ({exc}); memory read per PID"
        pods.clear()
    time.sleep(1.5)  # steady state, and a fresh process list in the sampler
    t0 = time.monotonic()
    raw.start()
    time.sleep(seconds / 2 - 3.0)
    result["raw_gpm"] = raw.stop()
    window = time.monotonic() - t0
    profile = exporter.profiler.profile(gpu=uuid, window_s=window).to_json()
    result["profile"] = {
        k: profile[k] for k in (*RATIOS, "sampled_seconds", "samples", "unavailable")
    }
    before = process_memory(exporter, proc.pid)
    series = scrape(registry)
    pod_series = [
        v
        for (name, labels), v in series.items()
        if name == "gpushare_pod_gpu_memory_used_bytes" and ("pod", f"{kind}-gemm") in labels
    ]
    grown = json.loads(proc.stdout.readline())
    time.sleep(2.0)
    after = process_memory(exporter, proc.pid)
    result["memory"] = {
        "torch_reserved_bytes": ready["reserved"],
        "exported_process_bytes": before,
        "exported_pod_series_bytes": pod_series[0] if pod_series else None,
        "cuda_context_overhead_bytes": (before - ready["reserved"]) if before else None,
        "allocated_extra_bytes": grown["reserved"] - ready["reserved"],
        "exported_growth_bytes": (after - before) if (after and before) else None,
    }
    result["tflops"] = round(grown["tflops"], 1)
    proc.wait(timeout=seconds + 60)
    pods.clear()
    return result


def verdicts(loads: dict[str, dict[str, Any]]) -> dict[str, bool]:
    p = {k: v["profile"] for k, v in loads.items()}

    def val(kind: str, pipe: str) -> float:
        v = p[kind].get(pipe)
        return float(v) if v is not None else -1.0

    checks = {
        "idle: every pipe under 5%": all(val("idle", x) < 0.05 for x in WORK_PIPES),
        "bf16 GEMM: tensor_hmma > 30% and the busiest pipe": val("bf16", "tensor_hmma") > 0.3
        and val("bf16", "tensor_hmma") > max(val("bf16", "fp32"), val("bf16", "fp64")),
        "fp32 GEMM: fp32 > 30%, tensor_hmma < 10%": val("fp32", "fp32") > 0.3
        and val("fp32", "tensor_hmma") < 0.1,
        "fp64 GEMM: tensor_dmma > 30%, fp64 pipe lower": val("fp64", "tensor_dmma") > 0.3
        and val("fp64", "fp64") < val("fp64", "tensor_dmma"),
    }
    for kind in ("bf16", "fp32", "fp64"):
        mem = loads[kind]["memory"]
        growth = mem["exported_growth_bytes"]
        checks[f"{kind}: exported memory grows by the {EXTRA_GIB} GiB allocated (+-2%)"] = (
            growth is not None
            and abs(growth - mem["allocated_extra_bytes"]) <= 0.02 * EXTRA_GIB * GIB
        )
    return checks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=14.0, help="per load")
    args = parser.parse_args()
    backend = NvmlBackend()
    gpu = backend.inventory()[0]
    pods: list[PodAllocation] = []
    exporter = build_exporter(
        backend=backend,
        node_name=platform.node(),
        placements=lambda: list(pods),
        settings=SamplerSettings(interval_s=0.5, history_s=120),
    )
    registry = CollectorRegistry()
    registry.register(exporter.collector)
    started = time.monotonic()
    cpu0 = exporter.sampler.cpu_seconds
    exporter.start()
    import pynvml  # noqa: PLC0415

    raw = RawGpm(pynvml.nvmlDeviceGetHandleByIndex(gpu.index))
    loads: dict[str, dict[str, Any]] = {}
    time.sleep(2.0)
    t0 = time.monotonic()
    raw.start()
    time.sleep(4.0)
    idle_raw = raw.stop()
    loads["idle"] = {
        "load": "idle",
        "raw_gpm": idle_raw,
        "profile": exporter.profiler.profile(
            gpu=gpu.uuid, window_s=time.monotonic() - t0
        ).to_json(),
    }
    for kind in ("bf16", "fp32", "fp64"):
        try:
            loads[kind] = run_load(
                kind,
                exporter=exporter,
                registry=registry,
                raw=raw,
                uuid=gpu.uuid,
                pods=pods,
                seconds=args.seconds,
            )
        except Exception as exc:  # record and go on: one call, every load counts
            loads[kind] = {"load": f"{kind} GEMM", "error": repr(exc)}
        print(json.dumps(loads[kind])[:600], flush=True)
    elapsed = time.monotonic() - started
    scrape_ms = []
    for _ in range(200):
        s = time.perf_counter()
        generate_latest(registry)
        scrape_ms.append((time.perf_counter() - s) * 1000)
    scrape_ms.sort()
    result = {
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "gpu_model": gpu.model,
        "gpu_uuid": gpu.uuid,
        "compute_capability": gpu.compute_capability,
        "driver": pynvml.nvmlSystemGetDriverVersion(),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "sample_interval_s": 0.5,
        "loads": loads,
        "real_nvml_sampler_cpu_ratio": round((exporter.sampler.cpu_seconds - cpu0) / elapsed, 5),
        "real_nvml_scrape_p50_ms": round(scrape_ms[100], 3),
        "real_nvml_scrape_p99_ms": round(scrape_ms[197], 3),
    }
    with contextlib.suppress(Exception):
        result["checks"] = verdicts(loads)
    exporter.stop()
    backend.close()
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result.get("checks"), indent=2))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
