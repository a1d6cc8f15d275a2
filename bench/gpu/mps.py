"""A private MPS control daemon for the benchmark (never touches the GPU's compute mode)."""

import logging
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from gpushare.api.names import CLASS_BATCH, MPS_PRIORITY_BY_CLASS

log = logging.getLogger("bench.gpu")

CONTROL = "nvidia-cuda-mps-control"


def client_env(
    *,
    pipe_dir: Path | None,
    thread_percent: int | None,
    priority: int | None,
    memory_limit_mib: int | None = None,
) -> dict[str, str]:
    """Environment one MPS client needs: where the daemon listens, its cap, priority and
    pinned-memory limit (device ordinal 0: each client sees one GPU)."""
    env: dict[str, str] = {}
    if pipe_dir is None:
        return env
    env["CUDA_MPS_PIPE_DIRECTORY"] = str(pipe_dir)
    if thread_percent is not None:
        if not 1 <= thread_percent <= 100:
            raise ValueError(f"thread_percent must be 1..100, got {thread_percent}")
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(thread_percent)
    if priority is not None:
        if priority not in (0, 1):
            raise ValueError(f"MPS client priority must be 0 or 1, got {priority}")
        env["CUDA_MPS_CLIENT_PRIORITY"] = str(priority)
    if memory_limit_mib is not None:
        if memory_limit_mib < 1:
            raise ValueError(f"memory_limit_mib must be >= 1, got {memory_limit_mib}")
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={memory_limit_mib}M"
    return env


def priority_for(gpu_class: str) -> int:
    return MPS_PRIORITY_BY_CLASS.get(gpu_class, MPS_PRIORITY_BY_CLASS[CLASS_BATCH])


class MpsDaemon:
    """``nvidia-cuda-mps-control -d`` with its own pipe and log directories. It never changes
    the GPU's compute mode (the no-MPS schemes need the default mode; setting EXCLUSIVE_PROCESS
    is the node agent's, off on every benchmark and test path).

    Stopped with ``echo quit | nvidia-cuda-mps-control``; the directories are removed after.
    """

    def __init__(self, *, gpu: str) -> None:
        self.gpu = gpu
        self.root = Path(tempfile.mkdtemp(prefix="gpushare-bench-mps-"))
        self.pipe_dir = self.root / "pipe"
        self.log_dir = self.root / "log"
        self.running = False

    def _env(self) -> dict[str, str]:
        return {
            **os.environ,
            "CUDA_VISIBLE_DEVICES": self.gpu,
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir),
            "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir),
        }

    def start(self) -> None:
        if shutil.which(CONTROL) is None:
            raise RuntimeError(f"{CONTROL} is not on PATH; install the NVIDIA driver utilities")
        self.pipe_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run([CONTROL, "-d"], env=self._env(), check=True, timeout=30)
        deadline = time.monotonic() + 10
        while not (self.pipe_dir / "control").exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"MPS control pipe did not appear; log: {self.log_tail()}")
            time.sleep(0.05)
        self.running = True
        log.info("MPS control daemon up (pipe dir %s)", self.pipe_dir)

    def command(self, text: str) -> str:
        out = subprocess.run(
            [CONTROL],
            input=text + "\n",
            env=self._env(),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        return out.stdout.strip()

    def stop(self) -> None:
        if self.running:
            self.command("quit")
            deadline = time.monotonic() + 15
            while (self.pipe_dir / "control").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            self.running = False
            log.info("MPS control daemon stopped")
        shutil.rmtree(self.root, ignore_errors=True)

    def log_tail(self, lines: int = 10) -> str:
        parts = []
        for name in ("control.log", "server.log"):
            path = self.log_dir / name
            if path.exists():
                parts.append(name + ": " + " | ".join(path.read_text().splitlines()[-lines:]))
        return "; ".join(parts) or "(no MPS logs)"

    def __enter__(self) -> "MpsDaemon":
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
