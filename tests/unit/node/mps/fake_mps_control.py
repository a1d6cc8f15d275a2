"""A stand-in for ``nvidia-cuda-mps-control`` in unit tests (no GPU here), installed under that
name so the manager's process checks see it. It does what the manager relies on:

- ``-d``: daemonize (double fork, new session); the daemon writes
  ``$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid`` and the ``control`` pipe, appends
  ``start <pid>`` to ``$CUDA_MPS_LOG_DIRECTORY/control.log`` and runs until SIGTERM;
- no flag: a client; reads one command on stdin and answers when the pid file names a live
  daemon that does not hang (``$CUDA_MPS_LOG_DIRECTORY/hang`` holds the pids that do), else
  exits 1. ``quit`` ends the daemon.

The real daemon on a real GPU: tests/gpu/test_mps_gpu.py, tests/gpu_cluster.
"""

import os
import signal
import sys
import time
from pathlib import Path

PID_FILE = "nvidia-cuda-mps-control.pid"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def daemon(pipe: Path, log: Path) -> int:
    if os.fork():
        # The parent returns once the daemon is up, as the real one does.
        for _ in range(200):
            if (pipe / PID_FILE).exists() and (pipe / "control").exists():
                return 0
            time.sleep(0.01)
        return 1
    os.setsid()
    if os.fork():
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # like the real daemon: the caller's pipes are not held open
        os.dup2(devnull, fd)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    with (log / "control.log").open("a") as out:
        out.write(f"start {os.getpid()}\n")
    (pipe / "control").touch()
    (pipe / PID_FILE).write_text(f"{os.getpid()}\n")
    while pipe.is_dir():  # a test's temporary directory gone: nothing left to serve
        time.sleep(0.2)
    return 0


def client(pipe: Path, log: Path) -> int:
    command = sys.stdin.read().strip()
    try:
        pid = int((pipe / PID_FILE).read_text())
    except (OSError, ValueError):
        pid = 0
    hung = (log / "hang").read_text().split() if (log / "hang").exists() else []
    if not pid or not _alive(pid) or str(pid) in hung:
        print("Cannot find MPS control daemon process", file=sys.stderr)
        return 1
    if command == "quit":
        os.kill(pid, signal.SIGTERM)
    elif command == "get_default_active_thread_percentage":
        print("100.0")
    return 0


if __name__ == "__main__":
    pipe_dir = Path(os.environ["CUDA_MPS_PIPE_DIRECTORY"])
    log_dir = Path(os.environ["CUDA_MPS_LOG_DIRECTORY"])
    run = daemon if "-d" in sys.argv[1:] else client
    sys.exit(run(pipe_dir, log_dir))
