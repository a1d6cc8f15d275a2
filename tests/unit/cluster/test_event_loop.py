"""The controller's event loop (gpushare.cluster.event_loop): a request that arrives while
callbacks are queued is served after the one in progress, not after all of them (asyncio's own
loop serves it last); queued callbacks keep their order, none is lost or starved, also when
other threads add some; and on /metrics a busy callback shows as a long turn."""

import asyncio
import socket
import threading
import time
from collections.abc import Callable

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpushare.cluster.event_loop import ControllerLoop, TurnStats
from gpushare.cluster.lean_http import LeanServer, Limits, Response
from gpushare.cluster.metrics import Metrics


def _busy_for(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _served_after(loop_factory: Callable[[], asyncio.AbstractEventLoop]) -> list[str]:
    """Five callbacks queued in one turn, a socket made readable in the same turn: the order
    they run in."""
    order: list[str] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        sock, peer = socket.socketpair()
        sock.setblocking(False)
        loop.add_reader(sock.fileno(), lambda: order.append("request") or sock.recv(64))
        done = loop.create_future()

        def arrive() -> None:
            peer.send(b"x")
            for i in range(5):
                loop.call_soon(order.append, f"queued {i}")
            loop.call_soon(loop.call_soon, done.set_result, None)

        loop.call_soon(arrive)
        await done
        await asyncio.sleep(0.01)
        loop.remove_reader(sock.fileno())
        sock.close()
        peer.close()

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(main())
    return order


def test_a_request_goes_before_the_callbacks_queued_when_it_arrived() -> None:
    order = _served_after(ControllerLoop)
    assert order == ["request", "queued 0", "queued 1", "queued 2", "queued 3", "queued 4"]


def test_asyncio_loop_serves_it_after_every_queued_callback() -> None:
    """What ControllerLoop changes (the check above can fail)."""
    assert _served_after(asyncio.SelectorEventLoop)[-1] == "request"


def test_queued_callbacks_keep_their_order_and_all_run_with_other_threads_adding() -> None:
    ran: list[int] = []
    from_thread: list[int] = []
    count = 20_000

    async def main() -> None:
        loop = asyncio.get_running_loop()
        done = asyncio.Event()

        def feed() -> None:
            for i in range(count):
                loop.call_soon_threadsafe(from_thread.append, i)
            loop.call_soon_threadsafe(done.set)

        for i in range(count):
            loop.call_soon(ran.append, i)
        thread = threading.Thread(target=feed)
        thread.start()
        # Tasks and timers meanwhile, as the controller has.
        await asyncio.gather(*(asyncio.sleep(0.001 * (i % 5)) for i in range(500)))
        await done.wait()
        thread.join()

    with asyncio.Runner(loop_factory=ControllerLoop) as runner:
        runner.run(main())
    assert ran == list(range(count))
    assert from_thread == list(range(count))


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
    assert 0.03 <= turns.busy_s < 0.08  # the busy callback, not the 0.1 s asleep
    assert turns.counts[-1] == 0 and sum(turns.counts) == turns.turns
    # One turn of ~30 ms dominates: T**2 / 2 of it.
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


def test_work_in_progress_can_see_a_request_waiting_on_the_extender_port() -> None:
    """A watch burst asks ``requests_waiting`` between events (gpushare.kube.informer): true
    while a request on a lean-server connection is unread, false once it is answered, and the
    connection's socket is forgotten when it closes."""
    seen: list[bool] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, ControllerLoop)
        server = LeanServer(
            {("POST", "/filter"): lambda r: Response(200, r.body)},
            Limits(max_connections=4, idle_timeout_s=5, deadline_s=1, max_body_bytes=100),
        )
        await server.start("127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        while not server.connections:
            await asyncio.sleep(0.001)
        seen.append(loop.requests_waiting())
        done = loop.create_future()

        def busy_until_request() -> None:  # one long callback, as a watch burst
            writer.write(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
            deadline = time.perf_counter() + 2
            while not loop.requests_waiting() and time.perf_counter() < deadline:
                pass
            seen.append(loop.requests_waiting())
            done.set_result(None)

        loop.call_soon(busy_until_request)
        await done
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        seen.append(loop.requests_waiting())
        writer.close()
        await writer.wait_closed()
        while server.connections:
            await asyncio.sleep(0.001)
        await server.stop()

    with asyncio.Runner(loop_factory=ControllerLoop) as runner:
        runner.run(main())
    assert seen == [False, True, False]
