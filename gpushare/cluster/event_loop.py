"""The controller's event loop, timed: how long each turn keeps the loop from polling.

The controller serves kube-scheduler's extender calls, the webhook, watches and binds on one
thread. A request that arrives while the loop is running a turn (the callbacks found ready at
its last poll: a watch slice, a bind's step, another request) waits until that turn ends, and
kube-scheduler waits for each filter call inside its scheduling cycle. :class:`TurnStats`
counts the turns and the time they take; its ``delay_s`` grows by T**2 / 2 for a turn of T
seconds, so its rate is the mean time a request arriving at a random moment waits for the turn
in progress (docs/observability.md, "The controller's event loop"). At 5,000 nodes the loop was
busy 83-86 % of the scale bench's extender phase and that wait was 0.7-1.0 ms, most of what
kube-scheduler saw of a filter call beyond the handler's own 1.0 ms; reordering the loop's work
did not shorten it (docs/scale.md, "The controller's event loop").

:class:`ControllerLoop` is asyncio's selector loop with a selector that times the gap between
one poll returning and the next poll starting; nothing else changes.
"""

import asyncio
import bisect
import selectors
import time
from dataclasses import dataclass, field

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
    """asyncio's selector loop whose turns are counted in :attr:`turns`."""

    def __init__(self) -> None:
        self.turns = TurnStats()
        super().__init__(_TimedSelector(self.turns))
