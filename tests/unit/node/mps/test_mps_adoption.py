"""A restarted node agent adopts the MPS daemons gpushare-mps-launcher runs in its own pod, and
a daemon that does not answer is replaced, never doubled (docs/node-agent.md, "MPS daemons").

No GPU here: ``nvidia-cuda-mps-control`` is the stand-in of fake_mps_control.py, a real
process with a pid file and a control pipe. The real daemon kept across agent restarts under
running CUDA pods is tests/gpu_cluster/test_restart_faults.py.
"""

import contextlib
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpushare.node.mps.launch import REQUEST_FILE
from gpushare.node.mps.launcher import serve
from gpushare.node.mps.manager import PID_FILE, DaemonStarter, MpsManager
from gpushare.node.mps.procs import control_daemons, pid_alive

GPU = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
Events = list[tuple[str, str, str, bool]]


@pytest.fixture
def control(tmp_path: Path) -> Iterator[str]:
    """The stand-in installed as <tmp>/bin/nvidia-cuda-mps-control; its daemons end after."""
    binary = tmp_path / "bin" / "nvidia-cuda-mps-control"
    binary.parent.mkdir()
    source = (Path(__file__).parent / "fake_mps_control.py").read_text()
    binary.write_text(f"#!{sys.executable}\n{source}")
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    yield str(binary)
    for pid in control_daemons(tmp_path / "mps" / GPU / "pipe"):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def manager(
    root: Path,
    control: str,
    events: Events | None = None,
    *,
    daemons: DaemonStarter = "own",
    start_timeout_s: float = 5.0,
) -> MpsManager:
    return MpsManager(
        root=root,
        simulated=False,
        shm_mode="host",
        control_binary=control,
        start_timeout_s=start_timeout_s,
        daemons=daemons,
        on_event=None if events is None else lambda *e: events.append(e),
    )


@contextlib.contextmanager
def launcher(root: Path, control: str) -> Iterator[None]:
    """gpushare-mps-launcher serving ``root`` (its pod, as far as the agent can tell)."""
    stop = threading.Event()
    thread = threading.Thread(
        target=serve, args=(manager(root, control), stop), kwargs={"poll_s": 0.02}
    )
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def starts(root: Path) -> list[int]:
    """PIDs of every daemon the stand-in started for the GPU, in order."""
    log = root / GPU / "log" / "control.log"
    return [int(line.split()[1]) for line in log.read_text().splitlines()] if log.exists() else []


def test_a_restarted_agent_adopts_the_launchers_daemon_without_asking(
    tmp_path: Path, control: str
) -> None:
    root = tmp_path / "mps"
    with launcher(root, control):
        first = manager(root, control, daemons="launcher").ensure([GPU])[GPU]
    assert first.up and not first.adopted and first.pid is not None
    # The agent's pod is replaced; the launcher's pod is not asked for anything (stopped here,
    # so a request would time out): the new agent finds the daemon through its pipe directory.
    events: Events = []
    again = manager(root, control, events, daemons="launcher", start_timeout_s=0.0)
    status = again.ensure([GPU])[GPU]
    assert status.up and status.adopted and status.pid == first.pid
    assert starts(root) == [first.pid]  # one daemon, started once
    assert not (root / GPU / REQUEST_FILE).exists()
    assert [(e[1], e[3]) for e in events] == [("GpushareMpsDaemonAdopted", False)]
    assert GPU in events[0][2] and str(first.pid) in events[0][2]


def test_a_daemon_that_does_not_answer_is_replaced_never_doubled(
    tmp_path: Path, control: str
) -> None:
    root = tmp_path / "mps"
    with launcher(root, control):
        old = manager(root, control, daemons="launcher").ensure([GPU])[GPU].pid
        assert old is not None
        (root / GPU / "log" / "hang").write_text(f"{old}\n")
        events: Events = []
        status = manager(root, control, events, daemons="launcher").ensure([GPU])[GPU]
    assert status.up and not status.adopted and status.pid not in (None, old)
    assert not pid_alive(old) or _zombie(old)
    assert control_daemons(root / GPU / "pipe") == [status.pid]
    assert [(e[1], e[3]) for e in events] == [("GpushareMpsDaemonReplaced", True)]
    assert GPU in events[0][2] and f"in place of pid {old}" in events[0][2]


def test_a_daemon_whose_pid_file_is_gone_is_not_doubled(tmp_path: Path, control: str) -> None:
    """A stale pipe directory (the pid file removed, the daemon still there): the new daemon
    is the only one on the GPU's pipe directory."""
    root = tmp_path / "mps"
    agent = manager(root, control)
    old = agent.ensure([GPU])[GPU].pid
    assert old is not None
    (root / GPU / "pipe" / PID_FILE).unlink()
    status = manager(root, control).ensure([GPU])[GPU]
    assert status.up and status.pid != old
    assert control_daemons(root / GPU / "pipe") == [status.pid]


def test_a_pid_file_naming_another_process_is_neither_adopted_nor_killed(
    tmp_path: Path, control: str
) -> None:
    """A pid reused by some other process after the daemon died is left alone."""
    root = tmp_path / "mps"
    sleeper = subprocess.Popen([shutil.which("sleep") or "sleep", "30"])
    try:
        (root / GPU / "pipe").mkdir(parents=True)
        (root / GPU / "pipe" / PID_FILE).write_text(f"{sleeper.pid}\n")
        events: Events = []
        status = manager(root, control, events).ensure([GPU])[GPU]
        assert status.up and not status.adopted and status.pid != sleeper.pid
        assert sleeper.poll() is None  # still running
        assert [e[1] for e in events] == ["GpushareMpsDaemonStarted"]
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_health_check_reports_a_dead_daemon_once_and_restarts_it(
    tmp_path: Path, control: str
) -> None:
    root = tmp_path / "mps"
    events: Events = []
    agent = manager(root, control, events)
    old = agent.ensure([GPU])[GPU].pid
    assert old is not None
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while pid_alive(old) and not _zombie(old) and time.monotonic() < deadline:
        time.sleep(0.02)
    status = agent.check()[GPU]
    assert status.up and status.pid != old and status.restarts == 1
    reasons = [e[1] for e in events]
    assert reasons == [
        "GpushareMpsDaemonStarted",
        "GpushareMpsDaemonDown",
        "GpushareMpsDaemonStarted",
    ]


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return False
