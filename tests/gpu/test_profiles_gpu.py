"""Profiles the operator stores for two real jobs on a real NVIDIA GPU (Hopper or newer).

A bf16 GEMM and an fp64 GEMM each run alone on the GPU for a profiling window while the node
agent's profiler (the real exporter sampler over NVML GPM, served by its real HTTP endpoint)
samples it; the operator's own code turns each answer into the stored profile
(``status.profile`` and a profile cache entry). The two profiles must differ in the expected
pipes: the bf16 GEMM in the HMMA tensor pipe, the fp64 GEMM in the DMMA tensor pipe (on
Hopper an fp64 GEMM runs on the tensor cores, not on the FP64 pipe).

Skips itself (loudly) without torch, NVML or GPM. Runnable with only torch, nvidia-ml-py,
prometheus-client and pytest (aiohttp is used when installed, as the operator does)::

    PYTHONPATH=. python3 -m pytest --noconftest -p no:cacheprovider \
        tests/gpu/test_profiles_gpu.py -s

or without pytest: ``PYTHONPATH=. python3 tests/gpu/test_profiles_gpu.py``. Results go to
``$GPUSHARE_RESULTS_DIR`` (else ``$OUT``, else bench/results) as operator-profiles.json + .md.
"""

import asyncio
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.gpu

WINDOW_S = 10  # the CRD's smallest profiling window
REPO = Path(__file__).resolve().parents[2]
JOBS = {
    "bf16_gemm": ("python3", "-c", "<bf16 GEMM loop>", "bf16"),
    "fp64_gemm": ("python3", "-c", "<fp64 GEMM loop>", "fp64"),
}
"""Image-less "commands" the cache is keyed by (the jobs run as host processes here)."""

LOAD = r"""
import json, sys, time, torch
dtype = {"bf16": torch.bfloat16, "fp64": torch.float64}[sys.argv[1]]
seconds = float(sys.argv[2])
n = 8192 if dtype == torch.bfloat16 else 6144
a = torch.randn(n, n, device="cuda", dtype=dtype); b = torch.randn_like(a); c = a @ b
torch.cuda.synchronize()
print(json.dumps({"phase": "ready"}), flush=True)
count, t0 = 0, time.time()
while time.time() - t0 < seconds:
    torch.matmul(a, b, out=c); torch.cuda.synchronize(); count += 1
elapsed = time.time() - t0
print(json.dumps({"phase": "done", "tflops": 2 * n**3 * count / elapsed / 1e12}), flush=True)
"""


def why_skip() -> str | None:
    for module, what in (("torch", "torch"), ("pynvml", "nvidia-ml-py")):
        if importlib.util.find_spec(module) is None:
            return f"{what} is not installed"
    import pynvml  # noqa: PLC0415

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return f"NVML does not start ({exc})"
    try:
        if pynvml.nvmlDeviceGetCount() == 0:
            return "no GPU"
        major, _ = pynvml.nvmlDeviceGetCudaComputeCapability(pynvml.nvmlDeviceGetHandleByIndex(0))
        if major < 9:
            return "GPU 0 is older than Hopper: no GPM per-pipe counters"
    finally:
        pynvml.nvmlShutdown()
    return None


def fetch_profile(base_url: str, uuid: str) -> tuple[Any, str]:
    """The node agent's answer, read the way the operator reads it."""
    from gpushare.cluster.operator.readings import parse_reading  # noqa: PLC0415

    if importlib.util.find_spec("aiohttp") is not None:
        from gpushare.cluster.operator.profiler_client import ProfilerClient  # noqa: PLC0415

        async def read() -> Any:
            client = ProfilerClient(url_template=base_url, timeout_s=10)
            try:
                return await client.fetch(
                    node="gpu", node_ip=None, gpu_uuid=uuid, window_s=WINDOW_S
                )
            finally:
                await client.close()

        return asyncio.run(read()), "operator ProfilerClient (aiohttp)"
    url = f"{base_url}/profile?gpu={uuid}&window={WINDOW_S}"
    with urllib.request.urlopen(url, timeout=10 + WINDOW_S) as response:
        return parse_reading(json.loads(response.read())), "urllib + operator parse_reading"


def profile_job(kind: str, *, base_url: str, uuid: str) -> dict[str, Any]:
    from gpushare.cluster.operator import cache  # noqa: PLC0415

    proc = subprocess.Popen(
        [sys.executable, "-c", LOAD, JOBS[kind][3], str(WINDOW_S + 4)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert json.loads(proc.stdout.readline())["phase"] == "ready"
    time.sleep(1.5 + WINDOW_S)  # warm-up, then one full window of the job alone
    reading, client = fetch_profile(base_url, uuid)
    done = json.loads(proc.stdout.readline())
    proc.wait(60)
    profile = reading.stored(now=datetime.now(UTC))
    stored = profile.to_status()
    entry = cache.CacheEntry("host-process", JOBS[kind], profile.gpu_model, profile)
    key = cache.cache_key(image=entry.image, command=entry.command, gpu_model=entry.gpu_model)
    decoded = cache.decode_entry(cache.encode_entry(entry))
    # What the cache gives back is what status holds (both are the rounded stored form).
    assert decoded is not None and decoded.profile.to_status() == stored
    return {"status_profile": stored, "cache_key": key, "tflops": round(done["tflops"], 1),
            "client": client}  # fmt: skip


def machine() -> dict[str, Any]:
    import pynvml  # noqa: PLC0415

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(handle)
        driver = pynvml.nvmlSystemGetDriverVersion()
        return {
            "gpu": name.decode() if isinstance(name, bytes) else name,
            "gpus": pynvml.nvmlDeviceGetCount(),
            "driver": driver.decode() if isinstance(driver, bytes) else driver,
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        }
    finally:
        pynvml.nvmlShutdown()


def measure() -> dict[str, Any]:
    """Run both jobs under the real profiler; the measurement, before any verdict."""
    from prometheus_client import CollectorRegistry  # noqa: PLC0415

    from gpushare.node.exporter import SamplerSettings, build_exporter  # noqa: PLC0415
    from gpushare.node.exporter.server import serve  # noqa: PLC0415
    from gpushare.node.gpu.nvml import NvmlBackend  # noqa: PLC0415

    backend = NvmlBackend()
    exporter = build_exporter(
        backend=backend,
        node_name="gpu-check",
        placements=list,
        settings=SamplerSettings(interval_s=0.5, history_s=120),
    )
    exporter.start()
    server = serve(registry=CollectorRegistry(), profiler=exporter.profiler, host="127.0.0.1")
    try:
        base_url = f"http://127.0.0.1:{server.port}"
        time.sleep(2)  # an idle reading or two first
        uuid = exporter.sampler.gpus()[0].uuid
        profiles = {kind: profile_job(kind, base_url=base_url, uuid=uuid) for kind in JOBS}
    finally:
        server.stop()
        exporter.stop()
        backend.close()
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine(),
        "window_seconds": WINDOW_S,
        "profiles": profiles,
    }


def verdict(result: dict[str, Any]) -> dict[str, bool]:
    bf16 = result["profiles"]["bf16_gemm"]["status_profile"]
    fp64 = result["profiles"]["fp64_gemm"]["status_profile"]

    def get(p: dict[str, Any], key: str) -> float:
        return float(p.get(key, 0.0))

    return {
        "bf16_gemm_runs_on_hmma_tensor_pipe": get(bf16, "tensorHmma") >= 0.3,
        "bf16_gemm_leaves_dmma_and_fp64_idle": max(get(bf16, "tensorDmma"), get(bf16, "fp64"))
        <= 0.05,
        "fp64_gemm_runs_on_dmma_tensor_pipe": get(fp64, "tensorDmma") >= 0.3,
        "fp64_gemm_leaves_hmma_idle": get(fp64, "tensorHmma") <= 0.05,
        "profiles_differ_in_hmma": get(bf16, "tensorHmma") - get(fp64, "tensorHmma") >= 0.25,
        "profiles_differ_in_dmma": get(fp64, "tensorDmma") - get(bf16, "tensorDmma") >= 0.25,
        "cache_keys_differ": result["profiles"]["bf16_gemm"]["cache_key"]
        != result["profiles"]["fp64_gemm"]["cache_key"],
        "same_gpu_model": bf16["gpuModel"] == fp64["gpuModel"] == result["machine"]["gpu"],
    }


def write(result: dict[str, Any]) -> Path:
    out = Path(
        os.environ.get("GPUSHARE_RESULTS_DIR") or os.environ.get("OUT") or REPO / "bench/results"
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "operator-profiles.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    rows = []
    for kind, data in result["profiles"].items():
        p = data["status_profile"]
        cells = [f"{p.get(k, float('nan')):.2f}" for k in
                 ("fp16", "fp32", "fp64", "tensor", "tensorHmma", "tensorDmma", "smOccupancy",
                  "dramBandwidth")]  # fmt: skip
        rows.append(f"| {kind} | {' | '.join(cells)} | {data['tflops']} |")
    checks = "\n".join(
        f"- {'PASS' if ok else 'FAIL'}: {name}" for name, ok in result["checks"].items()
    )
    m = result["machine"]
    (out / "operator-profiles.md").write_text(
        f"# GpuShare profiles of two real jobs\n\n"
        f"{m['gpu']} (x{m['gpus']}), driver {m['driver']}, {m['cpus']} CPUs, {result['date']}.\n"
        f"Each job ran alone for a {result['window_seconds']} s profiling window; the node "
        f"agent's profiler (exporter sampler over NVML GPM) answered, and the operator's code "
        f"stored the profile ({result['profiles']['bf16_gemm']['client']}).\n\n"
        "| job | fp16 | fp32 | fp64 | tensor | tensorHmma | tensorDmma | SM occ. | DRAM "
        "| TFLOP/s |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n\n" + checks + "\n"
    )
    return out


def test_stored_profiles_of_bf16_and_fp64_gemm_differ_in_the_expected_pipes() -> None:
    skip = why_skip()
    if skip is not None:
        pytest.skip(f"needs a real Hopper-or-newer NVIDIA GPU: {skip}")
    result = measure()
    result["checks"] = verdict(result)
    where = write(result)
    print(f"\nwrote {where / 'operator-profiles.json'}")
    failed = [name for name, ok in result["checks"].items() if not ok]
    assert not failed, f"{failed}: {json.dumps(result['profiles'], indent=1)}"


if __name__ == "__main__":
    reason = why_skip()
    if reason is not None:
        print(f"SKIP: needs a real Hopper-or-newer NVIDIA GPU: {reason}")
        sys.exit(0)
    measured = measure()
    measured["checks"] = verdict(measured)
    print(json.dumps(measured, indent=2))
    write(measured)
    sys.exit(0 if all(measured["checks"].values()) else 1)
