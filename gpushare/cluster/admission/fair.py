"""The admission process's pacing: reviews worked one at a time, each client's in turn and for
a share of the time only (:class:`FairQueue`), and budgets of log lines and of lookups a client
may cost (:class:`LogBudget`): what a flood of reviews sends waits behind itself
(gpushare.cluster.admission; docs/security.md, "The webhook's port is no lever on the
controller")."""

import asyncio
import concurrent.futures
import functools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from gpushare.cluster.lean_http import Response


class LookupBudgetError(Exception):
    """A client asked for more lookups than its budget (the review is refused: 429-like)."""


@dataclass
class LogBudget:
    """At most ``per_second`` of something a second (a bucket of that many): log lines, or a
    client's lookups the cache could not answer."""

    per_second: float
    tokens: float = 0.0
    last: float = field(default_factory=time.monotonic)

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.per_second, self.tokens + (now - self.last) * self.per_second)
        self.last = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


@dataclass
class FairQueue:
    """Reviews worked one at a time on one thread, taking each client's next in turn, and
    for at most MAX_DUTY of the time: after a review of T seconds the next starts no sooner
    than T * (1 / MAX_DUTY - 1) later, so a flood of reviews keeps this process at a quarter
    of a core whatever it sends (its reviews wait behind their own, the API server's get
    their turn)."""

    worker: concurrent.futures.ThreadPoolExecutor = field(
        default_factory=lambda: concurrent.futures.ThreadPoolExecutor(1, "review")
    )
    waiting: dict[str, deque[tuple[Callable[[], Response], asyncio.Future[Response]]]] = field(
        default_factory=dict
    )
    turn: deque[str] = field(default_factory=deque)
    running: bool = False
    rested_until: float = 0.0
    """When the worker may start the next review (its duty cycle)."""
    duty: float = 0.25
    started: float = 0.0

    def submit(self, client: str, work: Callable[[], Response]) -> asyncio.Future[Response]:
        future: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        queue = self.waiting.get(client)
        if queue is None:
            queue = self.waiting[client] = deque()
            self.turn.append(client)
        queue.append((work, future))
        self._next()
        return future

    def _next(self) -> None:
        loop = asyncio.get_running_loop()
        wait = self.rested_until - loop.time()
        if wait > 0 and not self.running and self.turn:
            self.running = True  # resting: the next review starts when the rest ends
            loop.call_later(wait, self._rested)
            return
        while not self.running and self.turn:
            client = self.turn.popleft()
            queue = self.waiting[client]
            work, future = queue.popleft()
            if queue:
                self.turn.append(client)
            else:
                del self.waiting[client]
            if future.done():  # its connection gave up (deadline)
                continue
            self.running = True
            self.started = loop.time()
            done = asyncio.wrap_future(self.worker.submit(work))
            done.add_done_callback(functools.partial(self._finished, future=future))

    def _rested(self) -> None:
        self.running = False
        self.rested_until = 0.0
        self._next()

    def _finished(
        self, done: "asyncio.Future[Response]", *, future: asyncio.Future[Response]
    ) -> None:
        self.running = False
        now = asyncio.get_running_loop().time()
        self.rested_until = now + (now - self.started) * (1 / self.duty - 1)
        if not future.done():
            if done.exception() is not None:
                future.set_exception(done.exception())  # type: ignore[arg-type]
            else:
                future.set_result(done.result())
        self._next()
