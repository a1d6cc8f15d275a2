"""The real MPS manager and Allocate's environment on real NVIDIA GPUs (H100/H200).

Runs gpushare's MpsManager (one ``nvidia-cuda-mps-control -d`` per GPU) and CUDA clients
started the way a container is: in their own mount namespace with the mounts Allocate returns
(the GPU's MPS pipe and log directories, its daemon's shm as /dev/shm) and exactly the
environment Allocate returns. Checks: one daemon per GPU, adoption, throughput capped by the
active-thread percentage, both clients on one MPS server, the memory limit refusing an
over-limit allocation, confinement to the GPU, restart after a daemon dies.

Skips itself (loudly) without a GPU. Results go to $OUT/deviceplugin_gpu.json when $OUT is
set (the GPU host), else next to the pytest temp dir; ``bench.deviceplugin.results``
merges them into bench/results/deviceplugin.json. Needs only torch, nvidia-ml-py and pytest:

    PYTHONPATH=. python3 -m pytest --noconftest -p no:cacheprovider tests/gpu -x -s
"""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gpushare.api.inventory import GpuInfo
from gpushare.node.core.answer import ContainerAllocation
from gpushare.node.mps.manager import MpsManager
from tests.gpu.mps_helpers import (
    CONTAINERIZED,
    GIB,
    WORKER,
    allocate,
    client_env,
)

pytestmark = pytest.mark.gpu


from gpushare.node.gpu.nvml import NvmlBackend  # noqa: E402  (only where NVML exists)

RESULTS: dict[str, Any] = {"gpu": {}}


def out_dir() -> Path:
    return Path(os.environ.get("OUT") or tempfile.gettempdir())


@pytest.fixture(scope="module")
def backend() -> Iterator[NvmlBackend]:
    nvml = NvmlBackend()
    yield nvml
    nvml.close()


@pytest.fixture(scope="module")
def gpus(backend: NvmlBackend) -> list[GpuInfo]:
    import pynvml  # noqa: PLC0415

    found = backend.inventory()[:2]
    RESULTS["gpu_model"] = found[0].model
    RESULTS["gpu"].update(
        driver=pynvml.nvmlSystemGetDriverVersion(),
        gpus_used=len(found),
        sm_count=found[0].sm_count,
        compute_capability=found[0].compute_capability,
        memory_bytes=found[0].memory_bytes,
    )
    return found


@pytest.fixture(scope="module")
def mps(gpus: list[GpuInfo]) -> Iterator[MpsManager]:
    # Short root: unix socket paths under the pipe directory must stay below 108 bytes.
    root = Path(tempfile.mkdtemp(prefix="gsmps", dir="/tmp"))
    changes: list[tuple[str, bool, str]] = []
    mode = "private" if CONTAINERIZED else "host"
    manager = MpsManager(
        root=root,
        simulated=False,
        shm_mode=mode,
        on_change=lambda *c: changes.append(c),
        set_exclusive_process=False,  # tests never change a real GPU's compute mode
    )
    status = manager.ensure(g.uuid for g in gpus)
    if not all(s.up for s in status.values()) and mode == "private":
        manager.stop_all()
        mode = "host"
        manager = MpsManager(
            root=root,
            simulated=False,
            shm_mode=mode,
            on_change=lambda *c: changes.append(c),
            set_exclusive_process=False,
        )
        manager.ensure(g.uuid for g in gpus)
    RESULTS["gpu"]["shm_mode"] = mode
    RESULTS["gpu"]["containerized_mounts"] = CONTAINERIZED
    manager.changes = changes  # type: ignore[attr-defined]
    try:
        yield manager
    finally:
        logs = []
        for gpu in gpus:
            for name in ("control.log", "server.log"):
                path = manager.paths(gpu.uuid).log / name
                if path.exists():
                    logs.append(
                        f"==== {gpu.uuid} {name}\n{path.read_text(errors='replace')[-20000:]}"
                    )
        manager.stop_all()
        time.sleep(0.5)
        RESULTS["gpu"]["mps_processes_left_after_stop"] = sum(
            1
            for proc in Path("/proc").iterdir()
            if proc.name.isdigit() and b"nvidia-cuda-mps" in _read(proc / "cmdline")
        )
        (out_dir() / "mps_logs.txt").write_text("\n".join(logs))
        RESULTS["gpu"]["date"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        (out_dir() / "deviceplugin_gpu.json").write_text(json.dumps(RESULTS, indent=2))
        print(json.dumps(RESULTS, indent=2))
        shutil.rmtree(root, ignore_errors=True)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def client_command(allocation: ContainerAllocation, args: Sequence[str]) -> list[str]:
    """The worker as a container would run: its own mount namespace with Allocate's mounts."""
    python = [sys.executable, str(WORKER), *args]
    if not CONTAINERIZED:
        return python
    script = " && ".join(
        f'mkdir -p "{m.container_path}" && mount --bind "{m.host_path}" "{m.container_path}"'
        for m in allocation.mounts
    )
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--",
        "sh",
        "-c",
        f'{script} && exec "$@"',
        "container",
        *python,
    ]


def start_client(
    allocation: ContainerAllocation, mps: MpsManager, *args: str
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        client_command(allocation, args),
        env=client_env(allocation, mps),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(
    proc: subprocess.Popen[str], timeout_s: float = 180, *, check: bool = True
) -> dict[str, Any]:
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if not check and not (proc.returncode == 0 and lines):
        return {"failed": True, "error": err.strip().splitlines()[-1:] or [""]}
    assert proc.returncode == 0 and lines, f"client failed ({proc.returncode}):\n{err[-3000:]}"
    return json.loads(lines[-1])  # type: ignore[no-any-return]


def run_gemms(
    mps: MpsManager,
    allocations: Sequence[ContainerAllocation],
    seconds: float,
    *,
    nvml: NvmlBackend | None = None,
) -> tuple[list[dict[str, Any]], list[int], list[int]]:
    """Start the clients, release them together, return their results plus the MPS servers and
    clients the control daemon listed while they ran. With ``nvml``, also record what the NVML
    backend reported meanwhile (processes, GPM pipes) in RESULTS."""
    barrier = Path(tempfile.mkdtemp(prefix="gsbar", dir="/tmp"))
    procs = [start_client(a, mps, "gemm", str(seconds), str(barrier)) for a in allocations]
    try:
        deadline = time.monotonic() + 180
        while len(list(barrier.glob("ready-*"))) < len(procs):
            assert time.monotonic() < deadline, "clients never got ready"
            assert all(p.poll() is None for p in procs), "a client died before its GEMMs"
            time.sleep(0.05)
        (barrier / "go").touch()
        uuid = allocations[0].envs["CUDA_VISIBLE_DEVICES"]
        if nvml is not None:
            nvml.sample(uuid)  # GPM rates are over the interval since the previous reading
        time.sleep(min(1.0, seconds / 2))
        if nvml is not None:
            reading = nvml.sample(uuid)
            RESULTS["gpu"]["nvml_during_gemms"] = {
                "pipes": {k: None if v is None else round(v, 3) for k, v in reading.pipes.items()},
                "sm_occupancy": reading.sm_occupancy_ratio,
                "utilization": reading.utilization_ratio,
                "mps_client_pids": sorted(p.pid for p in nvml.processes(uuid) if p.mps_client),
            }
        servers = [int(x) for x in mps.query(uuid, "get_server_list").split() if x.isdigit()]
        seen: list[int] = []
        for server in servers:
            listed = mps.query(uuid, f"get_client_list {server}")
            seen += [int(x) for x in listed.split() if x.isdigit()]
        results = [finish(p) for p in procs]
        return results, seen, servers
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        shutil.rmtree(barrier, ignore_errors=True)


def test_one_daemon_per_gpu_answers_on_its_own_pipe(mps: MpsManager, gpus: list[GpuInfo]) -> None:
    status = mps.status()
    assert all(status[g.uuid].up for g in gpus), status
    pids = {status[g.uuid].pid for g in gpus}
    assert None not in pids and len(pids) == len(gpus)
    for gpu in gpus:
        mps.query(gpu.uuid, "get_server_list")  # answers through this GPU's pipe
    RESULTS["gpu"]["daemons"] = len(pids)


def test_a_new_manager_adopts_running_daemons(mps: MpsManager, gpus: list[GpuInfo]) -> None:
    before = {u: s.pid for u, s in mps.status().items()}
    again = MpsManager(
        root=mps.root, simulated=False, shm_mode=mps.shm_mode, set_exclusive_process=False
    )
    status = again.ensure(g.uuid for g in gpus)
    assert all(status[g.uuid].adopted and status[g.uuid].pid == before[g.uuid] for g in gpus)
    RESULTS["gpu"]["adopted"] = True


def test_thread_percentage_caps_throughput(mps: MpsManager, gpus: list[GpuInfo]) -> None:
    gpu = gpus[0].uuid
    measured = {}
    for percent in (100, 70, 30):
        # 100 %: a half-GPU pod given all threads (a whole-GPU pod would bypass MPS).
        allocation = allocate(mps, gpus, gpu, threads=percent, memory=16 * GIB, slices=50)
        assert allocation.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == str(percent)
        (result,), _, _ = run_gemms(mps, [allocation], seconds=3.0)
        measured[percent] = result["tflops"]
    RESULTS["mps"] = [{"percent": p, "tflops": round(t, 1)} for p, t in sorted(measured.items())]
    assert measured[30] < measured[70] < measured[100] * 1.05
    assert measured[30] < 0.6 * measured[100]
    assert measured[70] > 1.3 * measured[30]


def test_two_clients_share_one_mps_server(
    mps: MpsManager, gpus: list[GpuInfo], backend: NvmlBackend
) -> None:
    gpu = gpus[0].uuid
    small = allocate(mps, gpus, gpu, threads=30, memory=16 * GIB)
    large = allocate(mps, gpus, gpu, threads=70, memory=16 * GIB)
    results, seen, servers = run_gemms(mps, [small, large], seconds=4.0, nvml=backend)
    pids = {r["pid"] for r in results}
    RESULTS["mps_concurrent"] = [
        {"percent": 30, "tflops": round(results[0]["tflops"], 1)},
        {"percent": 70, "tflops": round(results[1]["tflops"], 1)},
    ]
    RESULTS["gpu"]["mps_servers_seen"] = len(servers)
    RESULTS["gpu"]["mps_clients_seen"] = sorted(set(seen) & pids) == sorted(pids)
    assert len(servers) == 1
    assert pids <= set(seen), f"MPS server lists {seen}, clients were {pids}"
    assert results[1]["tflops"] > results[0]["tflops"]
    # The NVML backend (what the exporter reads) saw both clients and the tensor pipe busy.
    nvml = RESULTS["gpu"]["nvml_during_gemms"]
    assert pids <= set(nvml["mps_client_pids"]), nvml
    if float(gpus[0].compute_capability or 0) >= 9.0:
        assert (nvml["pipes"].get("tensor_hmma") or 0) > 0.2, nvml


def test_memory_limit_refuses_an_over_limit_allocation(
    mps: MpsManager, gpus: list[GpuInfo]
) -> None:
    gpu = gpus[0].uuid
    capped = allocate(mps, gpus, gpu, threads=50, memory=2 * GIB)
    assert capped.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=2048M"
    limited = finish(start_client(capped, mps, "memory", "1024", "3072"))
    # Control: the same client without a limit gets the 3 GiB, so the limit is what refused it.
    free = ContainerAllocation(
        envs={k: v for k, v in capped.envs.items() if k != "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"},
        mounts=capped.mounts,
    )
    unlimited = finish(start_client(free, mps, "memory", "1024", "3072"))
    # For the record: does the UUID form of the variable work too?
    by_uuid = ContainerAllocation(
        envs={**capped.envs, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"{gpu}=2048M"},
        mounts=capped.mounts,
    )
    uuid_form = finish(start_client(by_uuid, mps, "memory", "1024", "3072"), check=False)
    RESULTS["memory_limit_enforced"] = bool(limited["big_refused"])
    RESULTS["gpu"]["memory_limit_error"] = limited["error"]
    RESULTS["gpu"]["no_limit_allocation_ok"] = not unlimited["big_refused"]
    RESULTS["gpu"]["uuid_form_limit"] = (
        f"client failed: {uuid_form['error']}"
        if uuid_form.get("failed")
        else ("enforced" if uuid_form["big_refused"] else "ignored")
    )
    assert limited["small_ok"] and limited["big_refused"], limited
    assert not unlimited["big_refused"], unlimited


def test_each_container_sees_only_its_gpu(mps: MpsManager, gpus: list[GpuInfo]) -> None:
    if len(gpus) < 2:
        RESULTS["gpu"]["confinement"] = "not run: one GPU"
        pytest.skip("needs two GPUs")
    seen = {}
    for gpu in gpus:
        allocation = allocate(mps, gpus, gpu.uuid, threads=40, memory=4 * GIB)
        seen[gpu.uuid] = finish(start_client(allocation, mps, "identity"))
    RESULTS["gpu"]["confinement"] = {
        u: r["uuid"] == u and r["devices"] == 1 for u, r in seen.items()
    }
    for uuid, result in seen.items():
        assert result["devices"] == 1
        assert result["uuid"] == uuid


def test_a_dead_daemon_is_restarted_and_its_gpu_reported_down_meanwhile(
    mps: MpsManager, gpus: list[GpuInfo]
) -> None:
    gpu = gpus[-1].uuid
    old = mps.status()[gpu].pid
    assert old is not None
    mps.changes.clear()  # type: ignore[attr-defined]
    os.kill(old, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(old, os.WNOHANG)
    status = mps.check_one(gpu)
    assert status.up and status.pid != old and status.restarts == 1
    assert [up for uuid, up, _ in mps.changes if uuid == gpu] == [False, True]  # type: ignore[attr-defined]
    allocation = allocate(mps, gpus, gpu, threads=40, memory=4 * GIB)
    assert finish(start_client(allocation, mps, "identity"))["uuid"] == gpu
    RESULTS["gpu"]["restart_after_kill"] = True
