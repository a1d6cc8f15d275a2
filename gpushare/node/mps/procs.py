"""Finding MPS control daemons among the host's processes.

A GPU's daemon is adopted through the pid file it writes in its pipe directory
(gpushare.node.mps.manager). That file can be missing or stale (a daemon left by an older agent,
a pipe directory emptied by hand) while the daemon still runs, so before starting a new daemon
the manager also looks for control daemons by the pipe directory in their environment: two
daemons on one pipe directory would serve one GPU's pods from two MPS servers
(docs/node-agent.md, "MPS daemons"). Reading another process's environment needs root in the
host's PID namespace, what the chart gives gpushare-mps-launcher; elsewhere nothing is found.
"""

import contextlib
import os
import signal
import time
from pathlib import Path

CONTROL_BINARY = "nvidia-cuda-mps-control"
PIPE_VARIABLE = b"CUDA_MPS_PIPE_DIRECTORY="


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def end_process(pid: int) -> None:
    """SIGTERM, and SIGKILL if the process is still there 2.5 s later."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    for _ in range(50):
        if not pid_alive(pid):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def cmdline(pid: int) -> str:
    """The process's command line, arguments joined by spaces; "" when it cannot be read."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def control_daemons(pipe: Path, *, proc: Path = Path("/proc")) -> list[int]:
    """PIDs of the live control daemons (``nvidia-cuda-mps-control -d``) whose
    ``CUDA_MPS_PIPE_DIRECTORY`` is ``pipe``, lowest first."""
    target = os.path.normpath(pipe)
    found = []
    try:
        entries = list(proc.iterdir())
    except OSError:
        return []
    for entry in entries:
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
            if b"-d" not in args or not any(
                os.path.basename(arg) == CONTROL_BINARY.encode() for arg in args
            ):
                continue
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        values = (v[len(PIPE_VARIABLE) :] for v in environ if v.startswith(PIPE_VARIABLE))
        if any(os.path.normpath(os.fsdecode(v)) == target for v in values):
            found.append(int(entry.name))
    return sorted(found)
