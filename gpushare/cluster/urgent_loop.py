"""The controller's event loop: requests a caller is waiting on are read before queued work.

kube-scheduler waits for each extender filter and prioritize call inside its scheduling cycle,
one pod at a time, while the controller's one thread also decodes watch events, applies them to
its view and runs binds. asyncio's loop runs, each turn, the callbacks already queued (a watch
slice, a bind's next step) before the sockets its poll found readable, so a filter request
waited behind them: at 5,000 nodes kube-scheduler saw the extender call take about 2.3 ms where
the controller's handler took about 1.0 (docs/scale.md, "Urgent sockets").

:class:`UrgentLoop` is asyncio's selector loop that puts the read callbacks of the sockets marked
with :func:`mark_urgent` (the extender port's connections, answered inside that callback) first
in the turn. Everything else still runs in the same turn, so nothing starves; it only goes
second. The reordering uses the selector loop's internal queue (``_ready``) and event hook
(``_process_events``), the same in CPython 3.8 to 3.13; where they are missing the loop runs
as asyncio's plain one (:attr:`UrgentLoop.reordering` is False, logged once).
"""

import asyncio
import collections
import logging
import selectors
from typing import Any

log = logging.getLogger(__name__)


class UrgentLoop(asyncio.SelectorEventLoop):
    """asyncio's selector loop, marked sockets' readiness handled first in each turn."""

    def __init__(self) -> None:
        super().__init__()
        self._urgent_fds: set[int] = set()
        ready = getattr(self, "_ready", None)
        self.reordering = isinstance(ready, collections.deque) and callable(
            getattr(super(), "_process_events", None)
        )
        if not self.reordering:
            log.warning("event loop: urgent sockets not supported here; serving in plain order")

    def mark(self, fd: int) -> None:
        self._urgent_fds.add(fd)

    def unmark(self, fd: int) -> None:
        self._urgent_fds.discard(fd)

    @property
    def urgent_fds(self) -> frozenset[int]:
        return frozenset(self._urgent_fds)

    def _process_events(self, event_list: list[tuple[selectors.SelectorKey, int]]) -> None:
        process: Any = super()._process_events  # type: ignore[misc]
        urgent = self._urgent_fds
        if not urgent or not self.reordering:
            process(event_list)
            return
        first = [event for event in event_list if event[0].fd in urgent]
        if not first:
            process(event_list)
            return
        process([event for event in event_list if event[0].fd not in urgent])
        ready: collections.deque[object] = self._ready  # type: ignore[attr-defined]
        before = len(ready)
        process(first)
        ready.rotate(len(ready) - before)  # the callbacks just added move to the front, in order


def _loop_and_fd(transport: asyncio.BaseTransport) -> tuple[UrgentLoop, int] | None:
    loop = asyncio.get_running_loop()
    if not isinstance(loop, UrgentLoop):
        return None
    sock = transport.get_extra_info("socket")
    if sock is None:
        return None
    fd = sock.fileno()
    return (loop, fd) if fd >= 0 else None


def mark_urgent(transport: asyncio.BaseTransport) -> int | None:
    """Read ``transport``'s socket first in each turn of an :class:`UrgentLoop` (a no-op on
    another loop). Returns the file descriptor marked, for :func:`unmark_urgent`: a closed
    socket's number is reused by the next one opened, so it must be unmarked when lost."""
    found = _loop_and_fd(transport)
    if found is None:
        return None
    loop, fd = found
    loop.mark(fd)
    return fd


def unmark_urgent(fd: int | None) -> None:
    """Undo :func:`mark_urgent` (its return value; None does nothing)."""
    if fd is None:
        return
    loop = asyncio.get_running_loop()
    if isinstance(loop, UrgentLoop):
        loop.unmark(fd)
