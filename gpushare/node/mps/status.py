"""What the MPS manager (:mod:`gpushare.node.mps.manager`) knows of one GPU's control
daemon: its host paths, its status as last checked, and the error it raises when a daemon
cannot be started or does not answer."""

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class MpsPaths:
    """Host paths of one GPU's daemon."""

    root: Path
    pipe: Path
    log: Path
    shm: Path


@dataclass(frozen=True)
class DaemonStatus:
    """What the manager knows about one GPU's control daemon."""

    uuid: str
    up: bool
    pid: int | None = None
    adopted: bool = False
    restarts: int = 0
    simulated: bool = False
    reason: str = ""
    server_pids: tuple[int, ...] = ()
    """MPS server processes the control daemon reports (``get_server_list``)."""


class MpsError(RuntimeError):
    """A daemon could not be started or does not answer."""


def parse_server_list(text: str) -> tuple[int, ...]:
    """``get_server_list`` prints one server PID per line; anything else is ignored."""
    return tuple(int(line) for line in (raw.strip() for raw in text.splitlines()) if line.isdigit())
