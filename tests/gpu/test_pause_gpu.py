"""Pausing an MPS client gives its compute back at once and loses nothing: measured on a real
GPU with the node agent's own freezer (``gpushare.node.pausing.freezer.Freezer``, the code that
freezes a pod's containers) and MPS daemon (``MpsManager``), outside Kubernetes.

Two bf16 GEMM clients of one MPS daemon, each in a cgroup of its own (as each container is):
``guaranteed`` reports its TFLOP/s every second; ``opportunistic`` computes fixed inputs and
compares every second's result with the first (``tests/gpu_cluster/gemm_worker.py``, mode
``checked``). Timeline: the guaranteed client alone, both, the opportunistic one frozen, thawed,
both again. Checked: the guaranteed client keeps >= 0.95 of its solo rate while its neighbour is
frozen; the frozen client makes no progress; it computes again within 2 s of the thaw; its
results stay identical to the reference (docs/node-agent.md, "Pausing a pod").

Writes $OUT/pause_gpu.json. Needs root and cgroup v2 (the GPU hosts); skips without a GPU.

    PYTHONPATH=. python3 -m pytest --noconftest -p no:cacheprovider -s tests/gpu/test_pause_gpu.py
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gpushare.api.placement import parse_placement
from gpushare.api.pod import PodInfo
from gpushare.node.core.answer import AllocationContext
from gpushare.node.deviceplugin.response import allocation_for_pod
from gpushare.node.mps.manager import MpsManager
from gpushare.node.pausing.freezer import Freezer
from tests.gpu.mps_helpers import SKIP  # skips this module too
from tests.gpu.test_mps_limits_gpu import manifest

pytestmark = pytest.mark.gpu
assert SKIP is None
GEMM_WORKER = Path(__file__).resolve().parents[1] / "gpu_cluster" / "gemm_worker.py"
CGROUP_ROOT = Path("/sys/fs/cgroup")
READY_WAIT_S = 60.0
"""Longest a worker may take to start CUDA and say it is ready."""
SOLO_S, BOTH_S, PAUSED_S, AFTER_S = 7.0, 7.0, 8.0, 8.0
"""How long each phase lasts; its first second is left out of its rate (settling)."""


def out_dir() -> Path:
    return Path(os.environ.get("OUT") or tempfile.gettempdir())


def spawn(cgroup: Path, env: dict[str, str], args: list[str], log: Path) -> subprocess.Popen[bytes]:
    """Start the worker as the first process of ``cgroup`` (it never runs outside it)."""
    script = f'echo $$ > "{cgroup}/cgroup.procs" && exec "$@"'
    cmd = ["sh", "-c", script, "worker", sys.executable, str(GEMM_WORKER), *args]
    return subprocess.Popen(cmd, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def lines(log: Path) -> list[dict[str, Any]]:
    out = []
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def rate(rows: list[dict[str, Any]], since: float, until: float) -> float | None:
    """Median TFLOP/s of the one-second windows that ended in (since + 1, until]."""
    got = [r["tflops"] for r in rows if "tflops" in r and since + 1.0 < r["t"] <= until]
    return round(statistics.median(got), 1) if got else None


def wait_ready(log: Path, proc: subprocess.Popen[bytes]) -> float:
    deadline = time.time() + READY_WAIT_S
    while time.time() < deadline:
        if log.exists() and any("ready" in r for r in lines(log)):
            return time.time()
        if proc.poll() is not None:
            raise AssertionError(f"worker ended before it was ready: {log.read_text()[-2000:]}")
        time.sleep(0.2)
    raise AssertionError(f"worker not ready within {READY_WAIT_S:.0f} s")


def test_a_frozen_client_gives_its_compute_back_and_loses_nothing() -> None:
    if not (CGROUP_ROOT / "cgroup.controllers").is_file():
        pytest.skip("needs cgroup v2 at /sys/fs/cgroup (the GPU hosts have it)")
    from gpushare.node.gpu.nvml import NvmlBackend  # noqa: PLC0415  (only where NVML exists)

    gpu = NvmlBackend().inventory()[0]
    root = Path(tempfile.mkdtemp(prefix="gspause", dir="/tmp"))
    manager = MpsManager(root=root, simulated=False, shm_mode="host", set_exclusive_process=False)
    assert manager.ensure([gpu.uuid])[gpu.uuid].up
    annotations = manifest(gpu.uuid, 100, gpu.memory_bytes)["metadata"]["annotations"]
    pod = PodInfo(
        namespace="t", name="p", uid="u", annotations=annotations, requested_slices=(100,)
    )
    placement = parse_placement(pod.annotations)
    assert placement is not None
    ctx = AllocationContext(node_name="gpu-test", gpus={gpu.uuid: gpu}, mps=manager)
    allocation, _ = allocation_for_pod(ctx, pod, placement, [])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "NVIDIA_VISIBLE"))}
    env.update(allocation.envs)
    env["CUDA_MPS_PIPE_DIRECTORY"] = str(manager.paths(gpu.uuid).pipe)
    parent = CGROUP_ROOT / f"gpushare-pause-test-{os.getpid()}"
    groups = {name: parent / name for name in ("guaranteed", "opportunistic")}
    logs = {name: root / f"{name}.log" for name in groups}
    freezer = Freezer(CGROUP_ROOT)
    result: dict[str, Any] = {"gpu_model": gpu.model, "gpu_uuid": gpu.uuid}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for group in groups.values():
            group.mkdir(parents=True)
        began = time.time()
        g_until = began + 2 * READY_WAIT_S + SOLO_S + BOTH_S + PAUSED_S + AFTER_S + 5
        procs.append(spawn(groups["guaranteed"], env, ["gemm", str(g_until)], logs["guaranteed"]))
        solo_from = wait_ready(logs["guaranteed"], procs[0])
        time.sleep(SOLO_S)
        o_until = time.time() + READY_WAIT_S + BOTH_S + PAUSED_S + AFTER_S
        procs.append(
            spawn(groups["opportunistic"], env, ["checked", str(o_until)], logs["opportunistic"])
        )
        both_from = wait_ready(logs["opportunistic"], procs[1])
        solo_until = both_from  # the guaranteed client was alone until then
        time.sleep(BOTH_S)
        asked = time.time()
        freezer.freeze({"opportunistic": groups["opportunistic"]})
        result["freeze_in_effect_s"] = round(time.time() - asked, 3)
        time.sleep(PAUSED_S)
        thawed_at = time.time()
        freezer.thaw({"opportunistic": groups["opportunistic"]})
        result["thaw_in_effect_s"] = round(time.time() - thawed_at, 3)
        time.sleep(AFTER_S)
        after_until = time.time()
        for proc in procs:
            proc.wait(timeout=g_until - time.time() + 60)
        g, o = lines(logs["guaranteed"]), lines(logs["opportunistic"])
        result.update(
            guaranteed_solo_tflops=rate(g, solo_from, solo_until),
            guaranteed_beside_tflops=rate(g, both_from, asked),
            guaranteed_neighbour_paused_tflops=rate(g, asked, thawed_at),
            guaranteed_after_tflops=rate(g, thawed_at + 1.0, after_until),
            opportunistic_beside_tflops=rate(o, both_from, asked),
            opportunistic_after_tflops=rate(o, thawed_at + 1.0, after_until),
            opportunistic_windows_while_paused=sum(
                1 for r in o if "tflops" in r and asked + 1.5 < r["t"] < thawed_at
            ),
            opportunistic_result_same=next(
                (r["result_same"] for r in o if "result_same" in r), None
            ),
            opportunistic_seconds=[
                [round(r["t"] - began, 2), round(r["tflops"], 1)] for r in o if "tflops" in r
            ],
        )
        # The first window ending after the thaw that did work ends at most 1 s after the work
        # began again: its end - 1 s bounds when the client computed again.
        resumed = [r["t"] for r in o if "tflops" in r and r["t"] > thawed_at and r["tflops"] > 0]
        result["resumed_within_s"] = round(resumed[0] - 1.0 - thawed_at, 2) if resumed else None
        solo, paused = (
            result["guaranteed_solo_tflops"],
            result["guaranteed_neighbour_paused_tflops"],
        )
        result["guaranteed_paused_vs_solo"] = round(paused / solo, 3) if solo and paused else None
        result["checks"] = {
            "guaranteed >= 0.95 of solo while neighbour paused": (
                result["guaranteed_paused_vs_solo"] or 0
            )
            >= 0.95,
            "no progress while paused": result["opportunistic_windows_while_paused"] == 0,
            "resumed within 2 s": result["resumed_within_s"] is not None
            and result["resumed_within_s"] <= 2.0,
            "result identical": result["opportunistic_result_same"] is True,
        }
    finally:
        for proc in procs:
            if proc.poll() is None:
                freezer.thaw({"opportunistic": groups["opportunistic"]})
                proc.kill()
        for group in [*groups.values(), parent]:
            for _ in range(50):  # a killed process leaves its cgroup a moment later
                try:
                    group.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)
        manager.stop_all()
        result["date"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        (out_dir() / "pause_gpu.json").write_text(json.dumps(result, indent=2))
        result["worker_tails"] = {
            name: log.read_text()[-1500:] for name, log in logs.items() if log.exists()
        }
        shutil.rmtree(root, ignore_errors=True)
        print(json.dumps(result, indent=2))
    assert all(result["checks"].values()), result["checks"]
