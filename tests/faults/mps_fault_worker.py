"""CUDA clients for tests/gpu/test_mps_fault_gpu.py, run with the environment Allocate returned.

    python mps_fault_worker.py victim <barrier dir> <linger 0|1>
        GEMMs until one fails; linger=1 keeps the broken process alive (a server that catches
        the error and goes on) until <barrier>/stop appears.
    python mps_fault_worker.py fault <barrier dir>
        Waits for <barrier>/go, then writes to an unmapped device address (a PTX kernel loaded
        through the driver API; an out-of-bounds index with a device-side assert if the PTX
        cannot be loaded).
    python mps_fault_worker.py fault-after <seconds>
        The same fault, after sleeping <seconds> once its context is up (in a pod, where no
        barrier directory is shared: tests/gpu_cluster).
    python mps_fault_worker.py probe
        A fresh MPS client through the driver API only (fast start): context, allocation,
        memset, synchronize. Exit 0 when the server took it and the work ran.

Prints one JSON line on stdout. Standalone on purpose: only torch, ctypes and the standard
library (probe needs no torch).
"""

import ctypes
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

BAD_ADDRESS = 0x1000
PTX = b"""
.version 7.0
.target sm_70
.address_size 64

.visible .entry gpushare_bad_store(.param .u64 target)
{
    .reg .b32 %r<2>;
    .reg .b64 %rd<2>;
    ld.param.u64 %rd1, [target];
    mov.u32 %r1, 42;
    st.global.u32 [%rd1], %r1;
    ret;
}
"""


def report(**values: Any) -> None:
    print(json.dumps({"pid": os.getpid(), **values}), flush=True)


def libcuda() -> Any:
    return ctypes.CDLL("libcuda.so.1")


def victim(barrier: Path, linger: bool) -> None:
    import torch  # noqa: PLC0415

    n = 4096
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    torch.mm(a, b)
    torch.cuda.synchronize()
    (barrier / f"ready-victim-{os.getpid()}").touch()
    gemms, last_ok = 0, time.time()
    deadline = time.time() + 120
    while time.time() < deadline and not (barrier / "stop").exists():
        try:
            for _ in range(4):
                torch.mm(a, b)
            torch.cuda.synchronize()
        except Exception as exc:
            failed_at = time.time()
            report(
                role="victim",
                failed=True,
                failed_at=failed_at,
                last_ok_at=last_ok,
                gemms=gemms,
                error=str(exc).splitlines()[0][:300],
            )
            if linger:
                while not (barrier / "stop").exists() and time.time() < deadline:
                    time.sleep(0.05)
            sys.exit(3)
        gemms += 4
        last_ok = time.time()
    report(role="victim", failed=False, gemms=gemms)


def _ptx_fault() -> tuple[int, str]:
    cuda = libcuda()
    module, function = ctypes.c_void_p(), ctypes.c_void_p()
    rc = cuda.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(PTX))
    if rc != 0:
        return -rc, "cuModuleLoadData failed"
    rc = cuda.cuModuleGetFunction(ctypes.byref(function), module, b"gpushare_bad_store")
    if rc != 0:
        return -rc, "cuModuleGetFunction failed"
    target = ctypes.c_uint64(BAD_ADDRESS)
    params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(target), ctypes.c_void_p))
    rc = cuda.cuLaunchKernel(function, 1, 1, 1, 32, 1, 1, 0, None, params, None)
    if rc != 0:
        return rc, "cuLaunchKernel"
    return cuda.cuCtxSynchronize(), "illegal store"


def _fault_ready() -> Any:
    import torch  # noqa: PLC0415

    x = torch.ones(1024, device="cuda")
    torch.mm(torch.ones(64, 64, device="cuda"), torch.ones(64, 64, device="cuda"))
    torch.cuda.synchronize()
    return x


def fault(barrier: Path) -> None:
    x = _fault_ready()
    (barrier / f"ready-fault-{os.getpid()}").touch()
    while not (barrier / "go").exists():
        time.sleep(0.002)
    _fault_now(x)


def fault_after(delay_s: float) -> None:
    x = _fault_ready()
    report(role="faulter", ready=time.time())
    time.sleep(delay_s)
    _fault_now(x)


def _fault_now(x: Any) -> None:
    import torch  # noqa: PLC0415

    fault_at = time.time()
    rc, how = _ptx_fault()
    if rc < 0:  # the PTX could not be loaded: fall back to a device-side assert
        how = f"device-side assert ({how} {-rc})"
        fault_at = time.time()
        try:
            index = torch.tensor([1 << 30], device="cuda")
            x[index] = 2.0
            torch.cuda.synchronize()
            rc = 0
        except Exception as exc:
            rc = 710
            how += f": {str(exc).splitlines()[0][:200]}"
    after = ""
    try:
        torch.cuda.synchronize()
    except Exception as exc:
        after = str(exc).splitlines()[0][:300]
    report(role="faulter", fault_at=fault_at, rc=rc, how=how, torch_error=after)
    sys.exit(4)


def probe() -> None:
    started = time.time()
    cuda = libcuda()
    context, device, pointer = ctypes.c_void_p(), ctypes.c_int(), ctypes.c_uint64()
    steps = (
        ("cuInit", lambda: cuda.cuInit(0)),
        ("cuDeviceGet", lambda: cuda.cuDeviceGet(ctypes.byref(device), 0)),
        ("cuCtxCreate", lambda: cuda.cuCtxCreate_v2(ctypes.byref(context), 0, device)),
        ("cuMemAlloc", lambda: cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(1 << 20))),
        ("cuMemsetD32", lambda: cuda.cuMemsetD32_v2(pointer, 7, ctypes.c_size_t(1 << 18))),
        ("cuCtxSynchronize", cuda.cuCtxSynchronize),
    )
    for name, step in steps:
        rc = step()
        if rc != 0:
            report(role="probe", ok=False, step=name, rc=rc, started=started, at=time.time())
            sys.exit(1)
    report(role="probe", ok=True, started=started, at=time.time())


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "victim":
        victim(Path(sys.argv[2]), sys.argv[3] == "1")
    elif mode == "fault":
        fault(Path(sys.argv[2]))
    elif mode == "fault-after":
        fault_after(float(sys.argv[2]))
    elif mode == "probe":
        probe()
    else:
        raise SystemExit(f"unknown mode {mode!r}")
