"""A CUDA client for tests/gpu/test_mps_gpu.py, run with the environment Allocate returned.

    python mps_worker.py gemm <seconds> <barrier dir>   -> {"tflops": ..., "pid": ...}
    python mps_worker.py memory <small MiB> <big MiB>  -> {"small_ok": ..., "big_refused": ...}
    python mps_worker.py identity                      -> {"uuid": ..., "devices": ...}
    python mps_worker.py hold <seconds>                -> {"holding": true}, then sleeps

Prints one JSON line on stdout. Standalone on purpose: only torch and the standard library.
"""

import json
import os
import sys
import time
from pathlib import Path

import torch


def report(**values: object) -> None:
    print(json.dumps({"pid": os.getpid(), **values}), flush=True)


def device_uuid() -> str:
    raw = str(torch.cuda.get_device_properties(0).uuid)
    return raw if raw.startswith("GPU-") else f"GPU-{raw}"


def gemm(seconds: float, barrier: Path) -> None:
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        torch.mm(a, b)
    torch.cuda.synchronize()
    (barrier / f"ready-{os.getpid()}").touch()
    while not (barrier / "go").exists():
        time.sleep(0.005)
    count = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(10):
            torch.mm(a, b)
        torch.cuda.synchronize()
        count += 10
    elapsed = time.perf_counter() - start
    report(
        tflops=2 * n**3 * count / elapsed / 1e12,
        gemms=count,
        seconds=elapsed,
        uuid=device_uuid(),
        devices=torch.cuda.device_count(),
    )


def memory(small_mib: int, big_mib: int) -> None:
    small = torch.empty(small_mib * 2**20, dtype=torch.uint8, device="cuda")
    small.fill_(1)
    torch.cuda.synchronize()
    refused, error = False, ""
    try:
        big = torch.empty(big_mib * 2**20, dtype=torch.uint8, device="cuda")
        big.fill_(1)
        torch.cuda.synchronize()
    except (torch.OutOfMemoryError, RuntimeError) as exc:
        refused, error = True, str(exc).splitlines()[0][:200]
    report(small_ok=True, big_refused=refused, error=error, uuid=device_uuid())


def identity() -> None:
    torch.zeros(1, device="cuda")
    report(uuid=device_uuid(), devices=torch.cuda.device_count())


def hold(seconds: float) -> None:
    """Stay connected (keeps the MPS server running) for ``seconds``."""
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    report(holding=True)
    time.sleep(seconds)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "gemm":
        gemm(float(sys.argv[2]), Path(sys.argv[3]))
    elif mode == "memory":
        memory(int(sys.argv[2]), int(sys.argv[3]))
    elif mode == "identity":
        identity()
    elif mode == "hold":
        hold(float(sys.argv[2]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
