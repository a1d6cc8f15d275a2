"""The controller's event loop (gpushare.cluster.event_loop) as an operator reads it on
/metrics: a callback that keeps the loop busy shows as a long turn, and the mean wait of a
request arriving meanwhile follows from the turns."""

import asyncio
import time

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpushare.cluster.event_loop import ControllerLoop, TurnStats
from gpushare.cluster.metrics import Metrics


def _busy_for(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_a_busy_callback_is_one_long_turn_and_idle_time_is_not_counted() -> None:
    async def main() -> TurnStats:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, ControllerLoop)
        loop.call_soon(_busy_for, 0.03)
        await asyncio.sleep(0.1)  # idle in the poll: not a turn's time
        return loop.turns

    with asyncio.Runner(loop_factory=ControllerLoop) as runner:
        turns = runner.run(main())
    assert turns.turns >= 2
    # The busy callback (with room for a loaded machine), not the 0.1 s asleep in the poll.
    assert 0.03 <= turns.busy_s < 0.12
    assert turns.counts[-1] == 0 and sum(turns.counts) == turns.turns
    # One turn of ~30 ms dominates: T**2 / 2 of it (the sleep counted would add 0.005).
    assert 0.03**2 / 2 <= turns.delay_s < 0.08**2 / 2


def test_the_turns_are_exported_as_a_histogram_and_a_delay_counter() -> None:
    stats = TurnStats()
    for seconds in (0.00005, 0.0003, 0.004, 0.7):
        stats.add(seconds)
    metrics = Metrics()
    metrics.watch_loop(stats)
    text = generate_latest(metrics.registry).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    turn = families["gpushare_controller_loop_turn_seconds"]
    buckets = {s.labels["le"]: s.value for s in turn.samples if s.name.endswith("_bucket")}
    assert buckets["0.0001"] == 1 and buckets["0.0005"] == 2 and buckets["0.005"] == 3
    assert buckets["0.5"] == 3 and buckets["+Inf"] == 4
    delay = families["gpushare_controller_loop_delay_seconds"].samples[0].value
    assert abs(delay - sum(s * s / 2 for s in (0.00005, 0.0003, 0.004, 0.7))) < 1e-12
