"""MPS manager behaviour that needs no GPU (the real daemons are exercised in tests/gpu/)."""

import stat
from pathlib import Path

from gpushare.node.mps.manager import MpsManager
from gpushare.node.mps.status import parse_server_list

GPU = "GPU-aaaaaaaa-0000-0000-0000-000000000000"


def test_simulated_manager_prepares_the_directories_pods_mount(tmp_path: Path) -> None:
    manager = MpsManager(root=tmp_path, simulated=True)
    status = manager.ensure([GPU])[GPU]
    assert status.up and status.simulated and status.pid is None
    paths = manager.paths(GPU)
    for directory in (paths.pipe, paths.log, paths.shm):
        assert directory.is_dir()
        assert stat.S_IMODE(directory.stat().st_mode) == 0o1777
    assert manager.client_shm(GPU) == paths.shm
    host = MpsManager(root=tmp_path, simulated=True, shm_mode="host")
    assert host.client_shm(GPU) == Path("/dev/shm")


def test_a_daemon_that_cannot_start_marks_its_gpu_down(tmp_path: Path) -> None:
    changes: list[tuple[str, bool, str]] = []
    manager = MpsManager(
        root=tmp_path,
        simulated=False,
        control_binary="nvidia-cuda-mps-control-missing",
        on_change=lambda uuid, up, why: changes.append((uuid, up, why)),
    )
    status = manager.ensure([GPU])[GPU]
    assert not status.up
    assert "not on PATH" in status.reason
    assert changes == [(GPU, False, status.reason)]
    assert not manager.is_up(GPU)
    # The health check tries again, counts the restart, and stays down.
    again = manager.check()[GPU]
    assert not again.up and again.restarts == 1


def test_server_list_parsing_ignores_noise() -> None:
    assert parse_server_list("1234\n 5678 \nSome warning\n") == (1234, 5678)
    assert parse_server_list("") == ()
