"""What the real-GPU MPS tests share: whether this machine can run them (``SKIP``: importing this
module skips the importing test module, loudly, without a GPU), the MPS client worker, and
Allocate's answer for a pod placed on a GPU, as a container would get it."""

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpushare.api.inventory import GpuInfo
from gpushare.api.names import (
    ANN_BIND_TIME,
    ANN_CLASS,
    ANN_GPU_UUID,
    ANN_MEMORY_LIMIT,
    ANN_STATE,
    ANN_THREAD_PERCENT,
)
from gpushare.api.placement import parse_placement
from gpushare.api.pod import PodInfo
from gpushare.node.core.answer import AllocationContext, ContainerAllocation
from gpushare.node.deviceplugin.response import allocation_for_pod
from gpushare.node.mps.manager import MpsManager

HERE = Path(__file__).resolve().parent


WORKER = HERE / "mps_worker.py"


GIB = 2**30


MIB = 2**20


EXTRA_BIN = ("/usr/local/nvidia/bin", "/usr/bin", "/usr/local/bin")


def _why_skip() -> str | None:
    for directory in EXTRA_BIN:
        if directory not in os.environ.get("PATH", "").split(":") and Path(directory).is_dir():
            os.environ["PATH"] = f"{os.environ.get('PATH', '')}:{directory}"
    try:
        import pynvml  # noqa: PLC0415

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
    except Exception as exc:
        return f"no NVIDIA GPU or driver here ({exc})"
    if count == 0:
        return "NVML sees no GPU"
    if shutil.which("nvidia-cuda-mps-control") is None:
        return "nvidia-cuda-mps-control is not installed"
    if importlib.util.find_spec("torch") is None:
        return "PyTorch is not installed (the CUDA clients use it)"
    return None


SKIP = _why_skip()


if SKIP:
    print(f"\n{'=' * 70}\nSKIPPING tests/gpu: {SKIP}\n{'=' * 70}", file=sys.stderr)
    pytest.skip(f"needs a real NVIDIA GPU with MPS: {SKIP}", allow_module_level=True)


def _can_unshare() -> bool:
    probe = subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            "mount -t tmpfs none /mnt && umount /mnt",
        ],
        capture_output=True,
        check=False,
    )
    return probe.returncode == 0


CONTAINERIZED = _can_unshare()


def pod(
    gpu: str, *, threads: int, memory: int, cls: str = "batch", slices: int | None = None
) -> PodInfo:
    return PodInfo(
        namespace="gpu-test",
        name=f"p{threads}",
        uid=f"u{threads}",
        annotations={
            ANN_GPU_UUID: gpu,
            ANN_THREAD_PERCENT: str(threads),
            ANN_MEMORY_LIMIT: str(memory),
            ANN_BIND_TIME: "2026-11-01T00:00:00Z",
            ANN_STATE: "assumed",
            ANN_CLASS: cls,
        },
        requested_slices=(slices or threads,),
    )


def allocate(
    mps: MpsManager,
    gpus: list[GpuInfo],
    gpu: str,
    *,
    threads: int,
    memory: int,
    slices: int | None = None,
) -> ContainerAllocation:
    """What Allocate answers for a pod asking ``slices`` (default: threads) placed on ``gpu``."""
    ctx = AllocationContext(node_name="gpu-test", gpus={g.uuid: g for g in gpus}, mps=mps)
    placed = pod(gpu, threads=threads, memory=memory, slices=slices)
    placement = parse_placement(placed.annotations)
    assert placement is not None
    allocation, _ = allocation_for_pod(ctx, placed, placement, [])
    return allocation


def client_env(allocation: ContainerAllocation, mps: MpsManager) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "NVIDIA_VISIBLE"))}
    env.update(allocation.envs)
    if not CONTAINERIZED:
        # Without mount namespaces the client reaches the host paths directly.
        uuid = allocation.envs["CUDA_VISIBLE_DEVICES"]
        env["CUDA_MPS_PIPE_DIRECTORY"] = str(mps.paths(uuid).pipe)
        env["CUDA_MPS_LOG_DIRECTORY"] = str(mps.paths(uuid).log)
    return env
