"""The controller's event loop (gpushare.cluster.urgent_loop): a request on the extender port is
answered before the work that was already queued when it arrived, on asyncio's plain loop it is
not; the rest still runs in the same turn, and a closed connection's socket number stops being
urgent (the next socket opened reuses it)."""

import asyncio
import socket
from collections.abc import Callable

from gpushare.cluster.lean_http import LeanServer, Limits, Request, Response
from gpushare.cluster.urgent_loop import UrgentLoop

LIMITS = Limits(max_connections=4, idle_timeout_s=5.0, deadline_s=1.0, max_body_bytes=1000)


def _turn_order(
    loop_factory: Callable[[], asyncio.AbstractEventLoop], *, mark: bool = True
) -> list[str]:
    """Two readable sockets, one marked urgent (with ``mark``, where the loop has marks), and
    two callbacks queued in the turn before: the order the next turn runs them in."""
    order: list[str] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        plain, plain_peer = socket.socketpair()
        urgent, urgent_peer = socket.socketpair()
        for sock in (plain, urgent):
            sock.setblocking(False)
        loop.add_reader(plain.fileno(), lambda: order.append("plain socket") or plain.recv(64))
        loop.add_reader(urgent.fileno(), lambda: order.append("urgent socket") or urgent.recv(64))
        if mark and isinstance(loop, UrgentLoop):
            loop.mark(urgent.fileno())
        done = loop.create_future()

        def kick() -> None:  # one turn: both sockets become readable, two callbacks queue
            urgent_peer.send(b"x")
            plain_peer.send(b"x")
            loop.call_soon(order.append, "queued 1")
            loop.call_soon(order.append, "queued 2")
            loop.call_soon(loop.call_soon, done.set_result, None)

        loop.call_soon(kick)
        await done
        for sock in (plain, urgent):
            loop.remove_reader(sock.fileno())
            sock.close()
        plain_peer.close()
        urgent_peer.close()

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(main())
    return order


def test_a_marked_socket_is_read_before_queued_work_and_the_rest_still_runs() -> None:
    order = _turn_order(UrgentLoop)
    assert order[0] == "urgent socket"
    assert sorted(order) == ["plain socket", "queued 1", "queued 2", "urgent socket"]
    assert order.index("queued 1") < order.index("queued 2")


def test_the_plain_loop_runs_queued_work_first() -> None:
    """What the urgent loop changes: asyncio's own order (the check above can fail)."""
    order = _turn_order(asyncio.SelectorEventLoop)
    assert order[:2] == ["queued 1", "queued 2"]


def test_an_extender_request_is_answered_before_work_queued_when_it_arrived() -> None:
    order: list[str] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, UrgentLoop) and loop.reordering

        def filter_verb(request: Request) -> Response:
            order.append("filter")
            return Response(200, request.body, content_type="application/json")

        server = LeanServer({("POST", "/filter"): filter_verb}, LIMITS)
        await server.start("127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        while not server.connections:
            await asyncio.sleep(0.001)
        assert len(loop.urgent_fds) == 1  # the server's side, not the client's

        def arrive() -> None:
            writer.write(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
            loop.call_soon(order.append, "watch slice")

        loop.call_soon(arrive)
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        writer.close()
        await writer.wait_closed()
        while server.connections:
            await asyncio.sleep(0.001)
        assert loop.urgent_fds == frozenset()  # the number a closed socket leaves is not urgent
        await server.stop()

    with asyncio.Runner(loop_factory=UrgentLoop) as runner:
        runner.run(main())
    assert order == ["filter", "watch slice"]


def test_the_urgent_loop_keeps_asyncio_order_when_no_marked_socket_is_readable() -> None:
    def factory() -> asyncio.AbstractEventLoop:
        loop = UrgentLoop()
        loop.mark(10_000)  # a number no socket of the test has
        return loop

    assert _turn_order(factory, mark=False)[:2] == ["queued 1", "queued 2"]
