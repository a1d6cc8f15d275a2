"""Per-pod GPU memory: NVML process (PID) -> /proc/<pid>/cgroup -> pod UID and container ID
(gpushare.node.core.cgroups reads the cgroup file), cached per PID."""

import logging
from collections.abc import Iterable
from pathlib import Path

from gpushare.node.core.cgroups import CgroupOwner, parse_cgroup

log = logging.getLogger(__name__)


class ProcessResolver:
    """Caches PID -> owner so each process's cgroup file is read once while it lives."""

    def __init__(self, *, proc_root: Path = Path("/proc")) -> None:
        self._proc_root = proc_root
        self._cache: dict[int, CgroupOwner | None] = {}

    def resolve(self, pid: int) -> CgroupOwner | None:
        if pid in self._cache:
            return self._cache[pid]
        try:
            text = (self._proc_root / str(pid) / "cgroup").read_text()
        except OSError as exc:
            # Gone already, or the host /proc is not visible: say so once per PID.
            log.debug("cannot read cgroup of pid %d: %s", pid, exc)
            owner = None
        else:
            owner = parse_cgroup(text)
        self._cache[pid] = owner
        return owner

    def forget_except(self, live_pids: Iterable[int]) -> None:
        """Drop cached PIDs that no GPU lists any more (PIDs get reused)."""
        live = set(live_pids)
        for pid in [p for p in self._cache if p not in live]:
            del self._cache[pid]
