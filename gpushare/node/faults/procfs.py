"""Client PIDs (as an MPS server logs them) to pods, through ``/proc``: the cgroup of a
host PID, or the ``NSpid`` of the GPU's client processes for a PID seen in a container."""

from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path

from gpushare.node.core.cgroups import parse_cgroup


def _nspids(proc_root: Path, pid: int) -> list[int]:
    """``NSpid`` of a process: its PID in each PID namespace, outermost first."""
    try:
        for line in (proc_root / str(pid) / "status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return [int(x) for x in line.split()[1:]]
    except (OSError, ValueError):
        pass
    return []


def _pod_of_host_pid(proc_root: Path, pid: int) -> str | None:
    try:
        owner = parse_cgroup((proc_root / str(pid) / "cgroup").read_text())
    except OSError:
        return None
    return owner.pod_uid if owner else None


class PodResolver:
    """Client PID (as the MPS server logs it) -> pod UID.

    The server may log a host PID or, for a client in a container's PID namespace, the PID the
    client sees; the second is matched against the innermost ``NSpid`` of the GPU's live
    client processes (``candidates``, host PIDs from NVML), and only when exactly one pod
    matches. Results are cached, because a faulting client is often gone by the time its fault
    is read."""

    def __init__(
        self,
        *,
        proc_root: Path = Path("/proc"),
        candidates: Callable[[str], Iterable[int]] | None = None,
        cache_size: int = 4096,
    ) -> None:
        self.proc_root = proc_root
        self.candidates = candidates
        self._cache: dict[tuple[str, int], str] = {}
        self._order: deque[tuple[str, int]] = deque()
        self._cache_size = cache_size

    def remember(self, gpu_uuid: str, pid: int) -> str | None:
        key = (gpu_uuid, pid)
        if key in self._cache:
            return self._cache[key]
        uid = self._lookup(gpu_uuid, pid)
        if uid is not None:
            self._cache[key] = uid
            self._order.append(key)
            while len(self._order) > self._cache_size:
                self._cache.pop(self._order.popleft(), None)
        return uid

    def _lookup(self, gpu_uuid: str, pid: int) -> str | None:
        live = list(self.candidates(gpu_uuid)) if self.candidates else []
        if pid in live or not live:
            found = _pod_of_host_pid(self.proc_root, pid)
            if found is not None or pid in live:
                return found
        owners = {
            _pod_of_host_pid(self.proc_root, host)
            for host in live
            if (ns := _nspids(self.proc_root, host)) and len(ns) > 1 and ns[-1] == pid
        }
        owners.discard(None)
        if len(owners) == 1:
            return owners.pop()
        return _pod_of_host_pid(self.proc_root, pid) if live else None
