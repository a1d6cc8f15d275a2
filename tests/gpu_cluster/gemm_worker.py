"""Runs inside the gpu_cluster tests' pods (``python -c`` with this file's text): CUDA work
whose rate the test reads from the pod's log, one JSON object a line.

Modes (argv[1]):
  gemm UNTIL   bf16 8192^3 GEMMs until the epoch second UNTIL; one line a second with the
               TFLOP/s of that second (``{"t": ..., "tflops": ...}``).
  alloc MIB..  allocate each size in MiB on the GPU, keep it, and report which were refused.
  latency UNTIL  small fp16 GEMMs one at a time (a latency-class service), one line a second
               with that second's median and 99th-percentile time per GEMM in ms.
  devices      the GPUs the container sees: their count and NVML UUIDs (``GPU-...``), after a
               GEMM on each, so a device that is visible but unusable shows as an error.
  checked UNTIL  bf16 GEMMs of fixed inputs until UNTIL, each second's result compared with
               the one computed first (``"same"``), ending with ``{"result_same": ...}``: work
               paused and resumed must give the result it would have given.

The first line names the CUDA_MPS_* settings the device plugin gave the container. Without
CUDA (a rehearsal on the simulated backend) the same loops run on the CPU and every line says
"device": "cpu", so the test can check the plumbing and skip the GPU figures.
"""

import json
import os
import statistics
import sys
import time


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def main() -> int:
    mode = sys.argv[1]
    emit(env={k: v for k, v in sorted(os.environ.items()) if k.startswith(("CUDA_", "NVIDIA_"))})
    try:
        import torch  # noqa: PLC0415  (optional: a rehearsal without PyTorch runs on the CPU)
    except ImportError:
        torch = None
    cuda = torch is not None and torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    if mode == "alloc":
        return alloc([int(m) for m in sys.argv[2:]], torch, cuda)
    if mode == "devices":
        return devices(torch, cuda)
    until = float(sys.argv[2])
    if mode == "gemm":
        return gemm(until, torch, device)
    if mode == "checked":
        return checked(until, torch, device)
    if mode == "latency":
        return latency(until, torch, device)
    emit(error=f"unknown mode {mode!r}")
    return 2


def gemm(until: float, torch, device: str) -> int:
    n = 8192 if device == "cuda" else 256
    if torch is None:
        return pure_python(until)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    flop = 2.0 * n**3
    for _ in range(3):
        a @ b
    sync(torch, device)
    emit(ready=time.time(), device=device, n=n)
    while time.time() < until:
        t0 = time.perf_counter()
        count = 0
        while time.perf_counter() - t0 < 1.0:
            for _ in range(4):
                a @ b
            sync(torch, device)
            count += 4
        dt = time.perf_counter() - t0
        emit(t=time.time(), tflops=count * flop / dt / 1e12, device=device)
    return 0


def checked(until: float, torch, device: str) -> int:
    if torch is None:
        pure_python(until)
        emit(finished=time.time(), result_same=True, device="cpu")
        return 0
    n = 8192 if device == "cuda" else 256
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    gen = torch.Generator(device=device).manual_seed(65)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    reference = (a @ b).float().sum().item()
    sync(torch, device)
    emit(ready=time.time(), device=device, n=n, reference=reference)
    flop, all_same = 2.0 * n**3, True
    while time.time() < until:
        t0 = time.perf_counter()
        count = 0
        while time.perf_counter() - t0 < 1.0:
            c = a @ b
            count += 1
        same = (c.float().sum().item()) == reference  # also waits for the GEMMs
        all_same = all_same and same
        dt = time.perf_counter() - t0
        emit(t=time.time(), tflops=count * flop / dt / 1e12, same=same, device=device)
    emit(finished=time.time(), result_same=all_same, device=device)
    return 0


def latency(until: float, torch, device: str) -> int:
    if torch is None:
        return pure_python(until)
    n = 2048 if device == "cuda" else 128
    dtype = torch.float16 if device == "cuda" else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(10):
        a @ b
    sync(torch, device)
    emit(ready=time.time(), device=device, n=n)
    while time.time() < until:
        times = []
        t_end = time.perf_counter() + 1.0
        while time.perf_counter() < t_end:
            t0 = time.perf_counter()
            a @ b
            sync(torch, device)
            times.append((time.perf_counter() - t0) * 1000)
            time.sleep(0.005)
        times.sort()
        p99 = times[min(len(times) - 1, int(0.99 * len(times)))]
        emit(t=time.time(), p50_ms=statistics.median(times), p99_ms=p99, device=device)
    return 0


def alloc(sizes_mib: list[int], torch, cuda: bool) -> int:
    if not cuda:
        emit(device="cpu", skipped="no CUDA: nothing to allocate")
        return 0
    kept = []
    for mib in sizes_mib:
        try:
            kept.append(torch.empty(mib * 2**20, dtype=torch.uint8, device="cuda"))
            torch.cuda.synchronize()
            emit(alloc_mib=mib, ok=True)
        except Exception as exc:
            emit(alloc_mib=mib, ok=False, error=str(exc).splitlines()[0][:200])
    return 0


def devices(torch, cuda: bool) -> int:
    if not cuda:
        emit(device="cpu", gpus=[], skipped="no CUDA: no devices to list")
        return 0
    uuids = []
    for i in range(torch.cuda.device_count()):
        a = torch.randn(1024, 1024, device=f"cuda:{i}")
        (a @ a).sum().item()
        uuid = str(torch.cuda.get_device_properties(i).uuid).removeprefix("GPU-")
        uuids.append(f"GPU-{uuid}")
    emit(device="cuda", gpus=uuids)
    return 0


def sync(torch, device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def pure_python(until: float) -> int:
    emit(ready=time.time(), device="cpu", n=0)
    while time.time() < until:
        t0 = time.perf_counter()
        ops = 0
        while time.perf_counter() - t0 < 1.0:
            sum(i * i for i in range(10000))
            ops += 20000
        emit(t=time.time(), tflops=ops / (time.perf_counter() - t0) / 1e12, device="cpu")
    return 0


if __name__ == "__main__":
    sys.exit(main())
