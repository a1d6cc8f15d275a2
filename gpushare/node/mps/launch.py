"""Asking another process to start a GPU's MPS daemon, so the daemon outlives the agent's container.

When a container stops, the runtime kills every process left in its cgroup, also for hostPID
containers: MPS daemons the node agent started in its own container died with it, and the
running pods on their GPUs failed ("the remote procedural call between the MPS server and the
MPS client failed"; two H200s, bench/results/gpu-cluster.md). With ``--mps-daemons launcher``
the agent asks ``gpushare-mps-launcher`` (``gpushare.node.mps.launcher``: the chart's
``<release>-mps-daemons`` DaemonSet, which rolling or deleting the agent's pod leaves alone) to
start them, through two files in the GPU's MPS directory, which only root in those two
containers can write (pods get its ``pipe`` and ``shm`` subdirectories, never the directory):

- ``<mps-root>/<uuid>/launch-request``: the agent's request, one line: a request id;
- ``<mps-root>/<uuid>/launch-answer``: the launcher's answer, JSON ``{"id", "pid"}`` or
  ``{"id", "error"}``.

The launcher only makes sure a daemon is up (adopts one that answers, else starts one). Every
decision (which GPUs, compute mode, health checks, limits) stays with the agent
(docs/node-agent.md, "MPS daemons").
"""

import contextlib
import json
import os
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

REQUEST_FILE = "launch-request"
ANSWER_FILE = "launch-answer"

_REQUEST_ID = re.compile(r"^[0-9a-f]{1,64}$")
_GPU_DIR = re.compile(r"^(GPU|MIG)-[0-9A-Za-z-]{1,80}$")
"""A GPU's directory under the MPS root is named by its NVML UUID."""


class LaunchError(Exception):
    """The launcher refused, failed, or did not answer."""


@dataclass(frozen=True)
class Answer:
    """The launcher's answer to one request."""

    request_id: str
    pid: int | None = None
    error: str = ""


def _write_atomic(path: Path, text: str) -> None:
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_text(text)
    partial.chmod(0o600)
    partial.replace(path)


def request_launch(gpu_dir: Path, *, timeout_s: float, poll_s: float = 0.1) -> int:
    """Ask the launcher for a running daemon in ``gpu_dir`` (``<mps-root>/<uuid>``); its pid.

    LaunchError when the launcher answers with an error or does not answer in ``timeout_s``.
    """
    request_id = secrets.token_hex(8)
    with contextlib.suppress(FileNotFoundError):
        (gpu_dir / ANSWER_FILE).unlink()
    _write_atomic(gpu_dir / REQUEST_FILE, request_id + "\n")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        answer = read_answer(gpu_dir)
        if answer is not None and answer.request_id == request_id:
            if answer.pid is None:
                raise LaunchError(f"gpushare-mps-launcher could not start it: {answer.error}")
            return answer.pid
        time.sleep(poll_s)
    raise LaunchError(
        f"gpushare-mps-launcher did not answer {gpu_dir / REQUEST_FILE} within {timeout_s:.0f} s; "
        "is the mps-launcher container on this node running, with this MPS root? (the chart's "
        "<release>-mps-daemons pod on this node: kubectl logs <pod> -c mps-launcher; "
        "docs/node-agent.md, 'MPS daemons')"
    )


def read_answer(gpu_dir: Path) -> Answer | None:
    """The launcher's last answer in ``gpu_dir``; None when there is none or it is unreadable."""
    try:
        doc = json.loads((gpu_dir / ANSWER_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("id"), str):
        return None
    pid = doc.get("pid")
    if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0:
        return Answer(doc["id"], pid=pid)
    return Answer(doc["id"], error=str(doc.get("error") or "no pid in the answer")[:500])


def pending_requests(root: Path) -> list[tuple[Path, str]]:
    """(GPU directory, request id) of each well-formed request under ``root``, oldest first.

    A request file with a malformed id (the agent never writes one) is removed, so a bad write
    is not read again on every pass; the agent that waits on it times out and says so.
    """
    found: list[tuple[float, Path, str]] = []
    try:
        entries = list(root.iterdir())
    except OSError:
        return []
    for gpu_dir in entries:
        if not _GPU_DIR.match(gpu_dir.name):
            continue
        request = gpu_dir / REQUEST_FILE
        try:
            text = request.read_text(errors="replace")[:200].strip()
            mtime = request.stat().st_mtime
        except OSError:
            continue
        if not _REQUEST_ID.match(text):
            with contextlib.suppress(OSError):
                request.unlink()
            continue
        found.append((mtime, gpu_dir, text))
    return [(gpu_dir, request_id) for _, gpu_dir, request_id in sorted(found)]


def answer(gpu_dir: Path, request_id: str, *, pid: int | None = None, error: str = "") -> None:
    """Write the answer to ``request_id`` and remove the request, unless a newer one replaced it."""
    doc: dict[str, object] = {"id": request_id}
    if pid is not None:
        doc["pid"] = pid
    else:
        doc["error"] = error[:500] or "failed"
    _write_atomic(gpu_dir / ANSWER_FILE, json.dumps(doc) + "\n")
    request = gpu_dir / REQUEST_FILE
    with contextlib.suppress(OSError):
        if request.read_text().strip() == request_id:
            request.unlink()
