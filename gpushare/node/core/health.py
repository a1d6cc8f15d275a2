"""Which GPUs' slices are advertised Healthy, and a version counter ListAndWatch waits on.

A GPU is healthy when the backend has reported no fatal error for it and its MPS daemon is up;
each reason is tracked separately so a restarted daemon does not hide an XID and vice versa.
"""

import threading
from collections.abc import Iterable


class DeviceHealth:
    """Thread-safe health per GPU with change notification."""

    def __init__(self, uuids: Iterable[str]) -> None:
        self._cond = threading.Condition()
        self._uuids = list(uuids)
        self._problems: dict[str, dict[str, str]] = {u: {} for u in self._uuids}
        self._version = 0
        self._closed = False

    @property
    def uuids(self) -> list[str]:
        return list(self._uuids)

    def set_problem(self, uuid: str, source: str, problem: str | None) -> bool:
        """Set (or clear, with None) one source's problem with a GPU; True if health changed."""
        with self._cond:
            if uuid not in self._problems:
                return False
            problems = self._problems[uuid]
            before = not problems
            if problem is None:
                problems.pop(source, None)
            else:
                problems[source] = problem
            changed = before != (not problems)
            if changed or problem is not None:
                self._version += 1
                self._cond.notify_all()
            return changed

    def healthy(self, uuid: str) -> bool:
        with self._cond:
            return not self._problems.get(uuid, {"unknown": "not on this node"})

    def problems(self, uuid: str) -> dict[str, str]:
        with self._cond:
            return dict(self._problems.get(uuid, {}))

    def snapshot(self) -> tuple[int, dict[str, bool]]:
        with self._cond:
            return self._version, {u: not p for u, p in self._problems.items()}

    def wait_change(self, version: int, timeout_s: float) -> int:
        """Block until the version moves past ``version``, close(), or the timeout; new version."""
        with self._cond:
            self._cond.wait_for(lambda: self._version != version or self._closed, timeout_s)
            return self._version

    def close(self) -> None:
        """Wake every waiter for good (streams end)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        with self._cond:
            return self._closed
