"""A client cannot exceed its MPS share by rewriting its own environment: measured on a real GPU
with the node agent's own code (MpsManager daemons, MpsLimitKeeper setting the daemon's and
servers' limits from the pods placed on the GPU, Allocate's environment and mounts).

Every client runs the way a container does (its own mount namespace with Allocate's mounts)
and re-exports CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100 and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=16G:

- ``env_only``: the largest share placed on the GPU is 100 % (what limits in the environment
  alone amount to): the client runs at full speed and allocates 3 GiB;
- ``daemon_limit``: a 25 % / 2 GiB pod is the largest placed: bf16 GEMM near 25 % of full
  speed, the 3 GiB allocation refused;
- ``running_server``: a server started at 100 % by a waiting client is lowered to 25 % / 2 GiB
  while it runs: its next client is capped the same way;
- ``pipe_unset``: the client also unsets CUDA_MPS_PIPE_DIRECTORY; Allocate mounted the pipe
  directory where CUDA looks by default, so it still reaches the daemon and is capped;
- ``empty_pipe_dir``: the client points CUDA at an empty directory: it runs outside MPS, at
  full speed. Only compute mode EXCLUSIVE_PROCESS (an admin's step; never changed here) closes
  that; the GPU's compute mode is recorded.

Writes $OUT/mps_limits_gpu.json (bench/results/security.json takes it in). Skips without a GPU.

    PYTHONPATH=. python3 -m pytest --noconftest -p no:cacheprovider -s \
        tests/gpu/test_mps_limits_gpu.py
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gpushare.api.inventory import GpuInfo
from gpushare.api.names import (
    ANN_BIND_TIME,
    ANN_GPU_UUID,
    ANN_MEMORY_LIMIT,
    ANN_STATE,
    ANN_THREAD_PERCENT,
)
from gpushare.api.pod import PodInfo, pod_info
from gpushare.node.core.answer import AllocationContext, ContainerAllocation
from gpushare.node.deviceplugin.response import allocation_for_pod
from gpushare.node.mps.limits import MpsLimitKeeper
from gpushare.node.mps.manager import MpsManager
from tests.gpu.mps_helpers import CONTAINERIZED, SKIP, WORKER  # skips this module too

pytestmark = pytest.mark.gpu
GIB = 2**30
GEMM_S = float(os.environ.get("GPUSHARE_LIMITS_GEMM_S", "3"))
RESULTS: dict[str, Any] = {"phases": {}}
assert SKIP is None


def out_dir() -> Path:
    return Path(os.environ.get("OUT") or tempfile.gettempdir())


def manifest(uuid: str, threads: int, memory: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"p{threads}",
            "annotations": {
                ANN_GPU_UUID: uuid,
                ANN_THREAD_PERCENT: str(threads),
                ANN_MEMORY_LIMIT: str(memory),
                ANN_BIND_TIME: "2026-11-01T00:00:00Z",
                ANN_STATE: "allocated",
            },
        },
        "status": {"phase": "Running"},
    }


@pytest.fixture(scope="module")
def rig() -> Iterator[tuple[GpuInfo, MpsManager, MpsLimitKeeper, ContainerAllocation]]:
    from gpushare.node.gpu.nvml import NvmlBackend  # noqa: PLC0415  (only where NVML exists)

    backend = NvmlBackend()
    gpu = backend.inventory()[0]
    root = Path(tempfile.mkdtemp(prefix="gslim", dir="/tmp"))
    mode = "private" if CONTAINERIZED else "host"
    manager = MpsManager(root=root, simulated=False, shm_mode=mode, set_exclusive_process=False)
    if not manager.ensure([gpu.uuid])[gpu.uuid].up and mode == "private":
        manager.stop_all()
        manager = MpsManager(
            root=root, simulated=False, shm_mode="host", set_exclusive_process=False
        )
        manager.ensure([gpu.uuid])
    keeper = MpsLimitKeeper(mps=manager, gpu_memory=lambda: {gpu.uuid: gpu.memory_bytes}, hold_s=0)
    ctx = AllocationContext(node_name="gpu-test", gpus={gpu.uuid: gpu}, mps=manager)
    pod = PodInfo(
        namespace="t",
        name="p25",
        uid="u25",
        annotations=manifest(gpu.uuid, 25, 2 * GIB)["metadata"]["annotations"],
        requested_slices=(25,),
    )
    from gpushare.api.placement import parse_placement  # noqa: PLC0415

    placement = parse_placement(pod.annotations)
    assert placement is not None
    allocation, _ = allocation_for_pod(ctx, pod, placement, [])
    import pynvml  # noqa: PLC0415

    RESULTS.update(
        gpu_model=gpu.model,
        driver=pynvml.nvmlSystemGetDriverVersion(),
        compute_mode=manager.compute_mode(gpu.uuid),
        shm_mode=manager.shm_mode,
        containerized_mounts=CONTAINERIZED,
        allocate_env=allocation.envs,
        allocate_mounts={m.container_path: m.host_path for m in allocation.mounts},
    )
    try:
        yield gpu, manager, keeper, allocation
    finally:
        log = manager.paths(gpu.uuid).log / "control.log"
        if log.exists():
            (out_dir() / "mps_limits_control.log").write_text(log.read_text()[-20000:])
        manager.stop_all()
        shutil.rmtree(root, ignore_errors=True)
        RESULTS["date"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        summarize()
        (out_dir() / "mps_limits_gpu.json").write_text(json.dumps(RESULTS, indent=2))
        print(json.dumps(RESULTS, indent=2))


def command(allocation: ContainerAllocation, args: list[str]) -> list[str]:
    python = [sys.executable, str(WORKER), *args]
    if not CONTAINERIZED:
        return python
    script = " && ".join(
        f'mkdir -p "{m.container_path}" && mount --bind "{m.host_path}" "{m.container_path}"'
        for m in allocation.mounts
    )
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
            f'{script} && exec "$@"', "container", *python]  # fmt: skip


def hostile_env(
    allocation: ContainerAllocation, manager: MpsManager, **change: str | None
) -> dict[str, str]:
    """Allocate's environment, then what the tenant's own code does to it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "NVIDIA_VISIBLE"))}
    env.update(allocation.envs)
    if not CONTAINERIZED:
        env["CUDA_MPS_PIPE_DIRECTORY"] = str(manager.paths(env["CUDA_VISIBLE_DEVICES"]).pipe)
    env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = "100"
    env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = "0=16G"
    for key, value in change.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def run(allocation: ContainerAllocation, env: dict[str, str], args: list[str]) -> dict[str, Any]:
    done = subprocess.run(
        command(allocation, args), env=env, capture_output=True, text=True, timeout=180, check=False
    )
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        return {"error": (done.stderr or done.stdout)[-500:], "rc": done.returncode}
    return dict(json.loads(lines[-1]))


def gemm(allocation: ContainerAllocation, env: dict[str, str]) -> float:
    barrier = Path(tempfile.mkdtemp(prefix="gsbar"))
    (barrier / "go").touch()
    os.chmod(barrier, 0o777)
    out = run(allocation, env, ["gemm", str(GEMM_S), str(barrier)])
    return round(float(out.get("tflops", -1.0)), 1)


def alloc_3g(allocation: ContainerAllocation, env: dict[str, str]) -> dict[str, Any]:
    out = run(allocation, env, ["memory", "1024", "3072"])
    return {"1GiB_ok": out.get("small_ok"), "3GiB_refused": out.get("big_refused"),
            "error": out.get("error") or out.get("rc")}  # fmt: skip


def phase(name: str, **values: Any) -> None:
    RESULTS["phases"][name] = values
    print(name, values, flush=True)


def test_env_only_limits_let_a_client_take_the_whole_gpu(rig: Any) -> None:
    gpu, manager, keeper, allocation = rig
    keeper.sync([pod_info(manifest(gpu.uuid, 100, gpu.memory_bytes))])
    env = hostile_env(allocation, manager)
    phase("env_only", tflops=gemm(allocation, env), memory=alloc_3g(allocation, env),
          server_limits=str(manager.limits(gpu.uuid)))  # fmt: skip


def test_daemon_limits_bound_a_client_that_reexports_100(rig: Any) -> None:
    gpu, manager, keeper, allocation = rig
    keeper.sync([pod_info(manifest(gpu.uuid, 25, 2 * GIB))])
    env = hostile_env(allocation, manager)
    result = {"tflops": gemm(allocation, env), "memory": alloc_3g(allocation, env)}
    phase("daemon_limit", **result, server_limits=str(manager.limits(gpu.uuid)))
    assert result["memory"]["3GiB_refused"] is True


def test_a_running_servers_new_clients_are_lowered_too(rig: Any) -> None:
    gpu, manager, keeper, allocation = rig
    keeper.sync([pod_info(manifest(gpu.uuid, 100, gpu.memory_bytes))])
    holder_env = hostile_env(allocation, manager)
    holder = subprocess.Popen(
        command(allocation, ["hold", "40"]),
        env=holder_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert holder.stdout is not None
        first = holder.stdout.readline()
        servers = manager.query(gpu.uuid, "get_server_list").split()
        keeper.sync([pod_info(manifest(gpu.uuid, 25, 2 * GIB))])
        env = hostile_env(allocation, manager)
        result = {"tflops": gemm(allocation, env), "memory": alloc_3g(allocation, env)}
        phase("running_server", **result, servers_before=servers, holder=first.strip(),
              servers_after=manager.query(gpu.uuid, "get_server_list").split())  # fmt: skip
    finally:
        holder.kill()
        holder.wait(10)


def test_unsetting_the_pipe_directory_still_reaches_the_daemon(rig: Any) -> None:
    gpu, manager, keeper, allocation = rig
    if not CONTAINERIZED:
        phase("pipe_unset", skipped="no mount namespaces here: cannot mount /tmp/nvidia-mps")
        pytest.skip("needs mount namespaces")
    keeper.sync([pod_info(manifest(gpu.uuid, 25, 2 * GIB))])
    env = hostile_env(allocation, manager, CUDA_MPS_PIPE_DIRECTORY=None)
    phase("pipe_unset", tflops=gemm(allocation, env), memory=alloc_3g(allocation, env))


def test_an_empty_pipe_directory_leaves_mps_unless_the_gpu_is_exclusive_process(rig: Any) -> None:
    gpu, manager, keeper, allocation = rig
    keeper.sync([pod_info(manifest(gpu.uuid, 25, 2 * GIB))])
    empty = Path(tempfile.mkdtemp(prefix="gsempty"))
    os.chmod(empty, 0o777)
    env = hostile_env(allocation, manager, CUDA_MPS_PIPE_DIRECTORY=str(empty))
    if CONTAINERIZED:
        env["CUDA_MPS_PIPE_DIRECTORY"] = "/tmp/gs-empty"
        empty_mount = ContainerAllocation(envs=allocation.envs, mounts=[
            *[m for m in allocation.mounts if m.container_path != "/tmp/nvidia-mps"]])  # fmt: skip
        tflops = gemm(empty_mount, env)
    else:
        tflops = gemm(allocation, env)
    phase("empty_pipe_dir", tflops=tflops, compute_mode=RESULTS.get("compute_mode"))


def summarize() -> None:
    phases = RESULTS["phases"]
    full = (phases.get("env_only") or {}).get("tflops") or 0.0
    capped = [
        phases[name]
        for name in ("daemon_limit", "running_server", "pipe_unset")
        if "tflops" in phases.get(name, {})
    ]
    bound = 0.45 * full
    RESULTS["bounded_by_server"] = bool(
        full > 0
        and capped
        and all(0 < p["tflops"] <= bound for p in capped)
        and all(p["memory"].get("3GiB_refused") is True for p in capped)
    )
    RESULTS["criterion"] = (
        "each capped phase: TFLOP/s <= 45% of the env_only phase (25% share) and the 3 GiB "
        "allocation refused under the 2 GiB server limit"
    )
