"""The controller's event loop: it polls between callbacks, and times its turns.

The controller serves kube-scheduler's extender calls, the webhook, watches and binds on one
thread. asyncio's loop runs, each turn, every callback found ready at its last poll (a watch
slice, a bind's next step, a task woken by an answer) before it polls again, so a filter call
arriving meanwhile waited for all of them. At 5,000 nodes the loop was busy 83 % of the
extender phase in turns of 0.5 ms on average, up to 4 ms at the 99th percentile, and a request
waited 0.8 ms for the turn in progress: most of what kube-scheduler saw beyond the handler's
own 1.0 ms (docs/scale.md, "The controller's event loop").

:class:`ControllerLoop` is asyncio's selector loop that runs one queued callback per turn, after
what the turn's poll found ready (a request) and before the timers that fell due; the other
queued callbacks wait for the next turns. A request so waits for the callback in progress, not
for the turn; and long work (a watch burst) can ask :meth:`ControllerLoop.requests_waiting`
between its steps and give way at once.
Callbacks queued with ``call_soon`` or ``call_soon_threadsafe`` keep their order (each thread's
among its own), and each turn still runs the oldest, so nothing starves. It does this by
holding the rest of the loop's ready queue (``_ready``) aside around ``_run_once``, internals
that are the same in CPython 3.8 to 3.14; where they are missing it runs as asyncio's own loop
(:attr:`ControllerLoop.polls_between`).

:class:`TurnStats` counts the turns and their length; its ``delay_s`` grows by T**2 / 2 for a
turn of T seconds, so its rate is the mean time a request arriving at a random moment waits for
the turn in progress (docs/observability.md, "The controller's event loop").
"""

import asyncio
import bisect
import collections
import contextlib
import logging
import select
import selectors
import threading
import time
from collections.abc import Callable
from contextvars import Context
from dataclasses import dataclass, field
from typing import TypeVarTuple

log = logging.getLogger(__name__)
_Ts = TypeVarTuple("_Ts")

TURN_BUCKETS = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5)
"""Upper bounds (seconds) of the turn-length histogram; a last bucket takes the rest."""


@dataclass
class TurnStats:
    """The loop's turns so far (plain numbers: recording one costs well under a microsecond)."""

    turns: int = 0
    busy_s: float = 0.0
    delay_s: float = 0.0
    """Sum over turns of T**2 / 2: its rate is the mean wait of a request arriving at random."""
    counts: list[int] = field(default_factory=lambda: [0] * (len(TURN_BUCKETS) + 1))
    """Turns per bucket of :data:`TURN_BUCKETS` (not cumulative), the last one above them."""

    def add(self, seconds: float) -> None:
        self.turns += 1
        self.busy_s += seconds
        self.delay_s += seconds * seconds / 2
        self.counts[bisect.bisect_left(TURN_BUCKETS, seconds)] += 1


class _TimedSelector(selectors.DefaultSelector):
    """The platform's default selector; each ``select`` ends the turn begun by the last one."""

    def __init__(self, stats: TurnStats) -> None:
        super().__init__()
        self.stats = stats
        self._began: float | None = None

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if self._began is not None:
            self.stats.add(time.perf_counter() - self._began)
        try:
            ready: list[tuple[selectors.SelectorKey, int]] = super().select(timeout)
            return ready
        finally:
            self._began = time.perf_counter()


class ControllerLoop(asyncio.SelectorEventLoop):
    """asyncio's selector loop that polls between queued callbacks (module doc); its turns are
    counted in :attr:`turns`."""

    _ready: collections.deque[asyncio.Handle]
    """asyncio's queue of callbacks to run (not in its type stubs)."""

    def __init__(self) -> None:
        self.turns = TurnStats()
        super().__init__(_TimedSelector(self.turns))
        ready = getattr(self, "_ready", None)
        self.polls_between = (
            isinstance(ready, collections.deque)
            and callable(getattr(super(), "_run_once", None))
            and callable(getattr(super(), "_process_events", None))
        )
        if not self.polls_between:
            log.warning("event loop: cannot poll between callbacks here; running them per turn")
        self._hold_lock = threading.RLock()
        self._holding = False
        self._owner = 0
        self._late: list[asyncio.Handle] = []
        """Other threads' callbacks added while a turn held the queue: queued after it."""
        self._requests = select.epoll() if hasattr(select, "epoll") else None
        """The request sockets (:meth:`watch_requests`), polled by :meth:`requests_waiting`."""

    def watch_requests(self, fd: int) -> None:
        """Count socket ``fd`` (a connection callers wait on) in :meth:`requests_waiting`."""
        if self._requests is not None:
            with contextlib.suppress(OSError):
                self._requests.register(fd, select.EPOLLIN)

    def unwatch_requests(self, fd: int) -> None:
        if self._requests is not None:
            with contextlib.suppress(OSError, KeyError):
                self._requests.unregister(fd)

    def requests_waiting(self) -> bool:
        """Has a request socket unread bytes now (one system call, no wait)? Long-running work
        (a watch burst) asks between its steps and gives way when so."""
        return self._requests is not None and bool(self._requests.poll(0))

    def _process_events(self, event_list: list[tuple[selectors.SelectorKey, int]]) -> None:
        process: Callable[[list[tuple[selectors.SelectorKey, int]]], None]
        process = super()._process_events  # type: ignore[misc]
        if not self._holding or not event_list or not self._ready:
            process(event_list)
            return
        # The turn's one queued callback goes after what the poll found ready.
        first = self._ready.popleft()
        process(event_list)
        self._ready.append(first)

    def close(self) -> None:
        if self._requests is not None:
            self._requests.close()
        super().close()

    def call_soon_threadsafe(
        self,
        callback: Callable[[*_Ts], object],
        *args: *_Ts,
        context: Context | None = None,
    ) -> asyncio.Handle:
        """As asyncio's, but while a turn holds queued callbacks aside, another thread's
        callback waits behind them (its earlier ones may be among them: each thread's callbacks
        keep their order)."""
        with self._hold_lock:
            if self._holding and threading.get_ident() != self._owner:
                handle = asyncio.Handle(callback, args, self, context)
                self._late.append(handle)
                return handle
            return super().call_soon_threadsafe(callback, *args, context=context)

    def _run_once(self) -> None:
        run_once: Callable[[], None] = super()._run_once  # type: ignore[misc]
        if not self.polls_between:
            run_once()
            return
        ready = self._ready
        if len(ready) <= 1:
            run_once()
            return
        with self._hold_lock:  # no other thread adds to the queue from here ...
            self._owner = threading.get_ident()
            held = ready
            self._ready = collections.deque((held.popleft(),))
            self._holding = True
        try:
            run_once()
        finally:
            with self._hold_lock:  # ... to here: its callbacks went to ``_late``
                turn = self._ready
                self._ready = held
                held.extend(turn)
                held.extend(self._late)
                self._late = []
                self._holding = False


def watch_requests(transport: asyncio.BaseTransport) -> int | None:
    """Mark ``transport``'s socket as one callers wait on, where the running loop is a
    :class:`ControllerLoop`; the descriptor to give :func:`unwatch_requests` when it closes (a
    closed socket's number is reused by the next one opened)."""
    loop = asyncio.get_running_loop()
    sock = transport.get_extra_info("socket")
    if not isinstance(loop, ControllerLoop) or sock is None or sock.fileno() < 0:
        return None
    loop.watch_requests(sock.fileno())
    return int(sock.fileno())


def unwatch_requests(fd: int | None) -> None:
    loop = asyncio.get_running_loop()
    if fd is not None and isinstance(loop, ControllerLoop):
        loop.unwatch_requests(fd)
