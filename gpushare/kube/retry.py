"""One retry policy for calls to the API server: which failures are worth trying again
(:func:`transient`: no answer, 429 or a 5xx) and how long to wait between tries
(:class:`Backoff`: doubling up to a ceiling). Each caller picks its own ceiling and how long it
may keep trying; none compares status codes or sleeps a hand-written schedule.
"""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from gpushare.kube.errors import ServerError, TooManyRequestsError, UnreachableError, wrap

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    """Waits between tries: ``first_s``, then doubling, never more than ``most_s``."""

    first_s: float = 0.5
    most_s: float = 10.0

    def delays(self) -> Iterator[float]:
        delay = self.first_s
        while True:
            yield delay
            delay = min(self.most_s, delay * 2)


def transient(exc: BaseException) -> bool:
    """A failure worth trying again: no answer, 429 (throttled) or a 5xx."""
    return isinstance(wrap(exc, ""), (UnreachableError, TooManyRequestsError, ServerError))


TRANSIENT_RETRY_S = 20.0
"""How long Allocate's API calls ride out an API server restart before failing the pod: the
kubelet admits pods while the API server is down, and failing Allocate then loses the pod."""
NODE_BACKOFF = Backoff(first_s=0.2, most_s=2.0)


def retry_transient(
    call: Callable[[], T],
    *,
    what: str,
    deadline_s: float = TRANSIENT_RETRY_S,
    backoff: Backoff = NODE_BACKOFF,
) -> T:
    """Run ``call`` (blocking), retrying :func:`transient` failures for ``deadline_s``; any
    other failure, or the last one, is raised as it came."""
    deadline = time.monotonic() + deadline_s
    for delay in backoff.delays():
        try:
            return call()
        except Exception as exc:
            if not transient(exc) or time.monotonic() + delay > deadline:
                raise
            log.warning(
                "API server unavailable; retrying", extra={"action": what, "error": str(exc)}
            )
            time.sleep(delay)
    raise AssertionError("unreachable")  # delays() never ends


async def keep_trying(
    call: Callable[[], Awaitable[T]],
    *,
    what: str,
    backoff: Backoff,
    attempts: int | None = None,
) -> T:
    """Await ``call`` until it succeeds, whatever fails (logged as ``what``), at most
    ``attempts`` times (None: forever); the last failure is raised."""
    tries = 0
    for delay in backoff.delays():
        try:
            return await call()
        except Exception as exc:
            tries += 1
            if attempts is not None and tries >= attempts:
                raise
            log.warning(f"{what} failed; retrying", extra={"error": str(exc)})
            await asyncio.sleep(delay)
    raise AssertionError("unreachable")  # delays() never ends
