"""The agent asking gpushare-mps-launcher for a GPU's MPS daemon, through files in the MPS root.

No GPU here, so no daemon can start: these check what the agent reports when the launcher
fails, is missing, or finds hostile files. A daemon started this way on a real GPU, and pods
keeping it across agent restarts, is tests/gpu_cluster/test_restart_faults.py.
"""

import threading
import time
from pathlib import Path

import pytest

from gpushare.node.mps.launch import (
    ANSWER_FILE,
    REQUEST_FILE,
    LaunchError,
    pending_requests,
    request_launch,
)
from gpushare.node.mps.launcher import build_parser, main, serve
from gpushare.node.mps.manager import MpsManager

GPU = "GPU-aaaaaaaa-0000-0000-0000-000000000000"


def launcher(root: Path) -> tuple[threading.Event, threading.Thread]:
    """A launcher serving ``root`` in a thread, whose daemons cannot start (no binary)."""
    manager = MpsManager(root=root, simulated=False, control_binary="nvidia-cuda-mps-control-x")
    stop = threading.Event()
    thread = threading.Thread(target=serve, args=(manager, stop), kwargs={"poll_s": 0.02})
    thread.start()
    return stop, thread


def test_the_agent_reports_the_launchers_failure_as_its_gpu_down(tmp_path: Path) -> None:
    stop, thread = launcher(tmp_path)
    try:
        agent = MpsManager(root=tmp_path, simulated=False, daemons="launcher")
        status = agent.ensure([GPU])[GPU]
    finally:
        stop.set()
        thread.join()
    assert not status.up
    assert "gpushare-mps-launcher could not start it" in status.reason
    assert "nvidia-cuda-mps-control-x is not on PATH" in status.reason
    # Answered and done: no request left for the launcher to retry.
    assert not (tmp_path / GPU / REQUEST_FILE).exists()


def test_without_a_launcher_the_agent_says_which_container_to_look_at(tmp_path: Path) -> None:
    agent = MpsManager(root=tmp_path, simulated=False, daemons="launcher", start_timeout_s=0.0)
    status = agent.ensure([GPU])[GPU]
    assert not status.up
    assert "did not answer" in status.reason and "mps-launcher container" in status.reason
    assert "-mps-daemons pod on this node" in status.reason
    # The request stays: a launcher that starts later serves it.
    assert (tmp_path / GPU / REQUEST_FILE).read_text().strip()


def test_an_answer_to_another_request_is_not_taken(tmp_path: Path) -> None:
    gpu_dir = tmp_path / GPU
    gpu_dir.mkdir()

    def stale_answer() -> None:
        time.sleep(0.05)
        (gpu_dir / ANSWER_FILE).write_text('{"id": "0123", "pid": 42}')

    writer = threading.Thread(target=stale_answer)
    writer.start()
    with pytest.raises(LaunchError, match="did not answer"):
        request_launch(gpu_dir, timeout_s=0.3, poll_s=0.01)
    writer.join()


def test_hostile_files_in_the_mps_root_are_not_served(tmp_path: Path) -> None:
    """Only <root>/<GPU uuid>/launch-request with a hex id is a request. Pods can write the
    pipe directory (mounted into them), so a file there must not start anything."""
    gpu_dir = tmp_path / GPU
    (gpu_dir / "pipe").mkdir(parents=True)
    (gpu_dir / "pipe" / REQUEST_FILE).write_text("abcd\n")
    (tmp_path / "not-a-gpu").mkdir()
    (tmp_path / "not-a-gpu" / REQUEST_FILE).write_text("abcd\n")
    (gpu_dir / REQUEST_FILE).write_text("$(reboot)\n")
    assert pending_requests(tmp_path) == []
    assert not (gpu_dir / REQUEST_FILE).exists()  # malformed: removed, not read forever
    (gpu_dir / REQUEST_FILE).write_text("abcd\n")
    assert pending_requests(tmp_path) == [(gpu_dir, "abcd")]


def test_launcher_flags_are_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["--mps-root", str(tmp_path), "--mps-shm", "host"])
    assert (args.mps_root, args.mps_shm) == (tmp_path, "host")
    assert main(["--mps-root", str(tmp_path), "--poll-seconds", "0"]) == 2
    assert "--poll-seconds must be 0.01..60" in capsys.readouterr().err
