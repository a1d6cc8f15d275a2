"""The exporter on a real NVIDIA GPU (Hopper or newer): pipe metrics follow the load, and a
process's exported GPU memory follows its allocations.

Skips itself (loudly) without a GPU, torch or GPM. The full measured record (three loads, raw
GPM cross-check, pod-like cgroup, scrape timings) is bench/exporter/gpu_check.py; this test is
the pass/fail part, runnable with only torch, nvidia-ml-py, prometheus-client and pytest:

    PYTHONPATH=. python3 -m pytest --noconftest -p no:cacheprovider \
        tests/gpu/test_exporter_gpu.py -s
"""

import importlib.util
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytestmark = pytest.mark.gpu

GIB = 2**30


def _why_skip() -> str | None:
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    if importlib.util.find_spec("pynvml") is None:
        return "nvidia-ml-py is not installed"
    import pynvml  # noqa: PLC0415

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return f"NVML does not start ({exc})"
    try:
        if pynvml.nvmlDeviceGetCount() == 0:
            return "no GPU"
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        major, _ = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        if major < 9:
            return "GPU 0 is older than Hopper: no GPM per-pipe counters"
    finally:
        pynvml.nvmlShutdown()
    return None


SKIP = _why_skip()
if SKIP is not None:
    pytest.skip(f"needs a real Hopper-or-newer NVIDIA GPU: {SKIP}", allow_module_level=True)

from gpushare.node.exporter import SamplerSettings, build_exporter  # noqa: E402
from gpushare.node.exporter.sampler import GpmSampler  # noqa: E402
from gpushare.node.gpu.nvml import NvmlBackend  # noqa: E402

LOAD = r"""
import json, sys, time, torch
dtype = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp64": torch.float64}[sys.argv[1]]
torch.backends.cuda.matmul.allow_tf32 = False
n = 8192 if dtype != torch.float64 else 6144
a = torch.randn(n, n, device="cuda", dtype=dtype); b = torch.randn_like(a); c = a @ b
torch.cuda.synchronize()
free0, _ = torch.cuda.mem_get_info()
print(json.dumps({"phase": "ready"}), flush=True)
t0 = time.time()
while time.time() - t0 < 6:
    torch.matmul(a, b, out=c); torch.cuda.synchronize()
extra = torch.ones(2 * 2**30, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
free1, _ = torch.cuda.mem_get_info()
print(json.dumps({"phase": "grown", "device_growth": free0 - free1}), flush=True)
t0 = time.time()
while time.time() - t0 < 4:
    torch.matmul(a, b, out=c); torch.cuda.synchronize()
"""


@pytest.fixture(scope="module")
def exporter() -> Iterator[Any]:
    backend = NvmlBackend()
    handle = build_exporter(
        backend=backend,
        node_name="gpu-test",
        placements=list,
        settings=SamplerSettings(interval_s=0.5, history_s=60),
    )
    handle.start()
    try:
        yield handle
    finally:
        handle.stop()
        backend.close()


def _memory_of(sampler: GpmSampler, pid: int) -> int | None:
    for reading in sampler.readings():
        for proc in reading.processes or ():
            if proc.pid == pid:
                return proc.used_memory_bytes
    return None


def _run(kind: str, exporter: Any) -> tuple[dict[str, Any], int | None, int | None, int]:
    proc = subprocess.Popen([sys.executable, "-c", LOAD, kind], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    json.loads(proc.stdout.readline())
    time.sleep(1.5)
    start = time.monotonic()
    time.sleep(3.5)
    gpu = exporter.sampler.gpus()[0]
    profile = exporter.profiler.profile(gpu=gpu.uuid, window_s=time.monotonic() - start)
    before = _memory_of(exporter.sampler, proc.pid)
    grown = json.loads(proc.stdout.readline())
    time.sleep(1.5)
    after = _memory_of(exporter.sampler, proc.pid)
    proc.wait(60)
    return profile.to_json(), before, after, int(grown["device_growth"])


@pytest.mark.parametrize(
    ("kind", "pipe"), [("bf16", "tensor_hmma"), ("fp32", "fp32"), ("fp64", "tensor_dmma")]
)
def test_gemm_moves_its_own_pipe_and_exported_memory_follows_it(
    kind: str, pipe: str, exporter: Any
) -> None:
    profile, before, after, growth = _run(kind, exporter)
    print(kind, json.dumps({k: profile[k] for k in ("fp16", "fp32", "fp64", "tensor_hmma",
                                                    "tensor_dmma", "sm_occupancy")}))  # fmt: skip
    assert profile[pipe] > 0.3
    others = {"tensor_hmma", "fp32", "tensor_dmma", "fp16"} - {pipe}
    assert all(profile[o] < 0.1 for o in others), profile
    assert profile["utilization"] > 0.9  # NVML: "busy", whatever the pipe
    assert before is not None and after is not None
    # The process is alone on the GPU: what the device lost is what NVML charges it.
    assert abs((after - before) - growth) <= 16 * 2**20
