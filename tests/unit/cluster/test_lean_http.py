"""The extender port's HTTP server (gpushare.cluster.lean_http) as a client sees it: requests
on one connection answered in order, every malformed or oversized request refused with its
status and reason, slow bodies and slow handlers cut at the deadline, and the server answering
the next connection after each."""

import asyncio
import socket
import time
from collections.abc import Iterator

import pytest

from gpushare.cluster.lean_http import Limits, Request, Response, Routes
from tests.fixtures.threaded_listener import ThreadedListener

LIMITS = Limits(max_connections=8, idle_timeout_s=2.0, deadline_s=0.5, max_body_bytes=1000)


def _routes() -> Routes:
    def echo(request: Request) -> Response:
        return Response(200, request.body, content_type="application/json")

    async def later(request: Request) -> Response:
        await asyncio.sleep(0.01)
        return Response.text(200, f"later {len(request.body)}\n")

    async def stuck(_: Request) -> Response:
        await asyncio.sleep(60)
        return Response.text(200, "never\n")

    def broken(_: Request) -> Response:
        raise RuntimeError("a bug")

    return {
        ("POST", "/echo"): echo,
        ("POST", "/later"): later,
        ("POST", "/stuck"): stuck,
        ("GET", "/broken"): broken,
        ("GET", "/healthz"): lambda _: Response.text(200, "ok\n"),
    }


class Served(ThreadedListener):
    def __init__(self) -> None:
        super().__init__(_routes(), LIMITS)

    def exchange(self, data: bytes, *, wait_s: float = 5.0) -> bytes:
        """Send ``data`` and read until the server closes (or ``wait_s`` passes)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=wait_s) as s:
            s.sendall(data)
            out = b""
            try:
                while chunk := s.recv(65536):
                    out += chunk
            except (ConnectionResetError, TimeoutError):
                pass
            return out

    def healthy(self) -> bool:
        answer = self.exchange(b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n")
        return answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"ok\n")


@pytest.fixture
def served() -> Iterator[Served]:
    s = Served()
    yield s
    s.close()


def post(path: str, body: bytes, *, extra: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode()
        + body
    )


def test_requests_on_one_connection_are_answered_in_order(served: Served) -> None:
    """Keep-alive and pipelining, an awaited handler between two answered at once."""
    data = (
        post("/echo", b'{"a":1}')
        + post("/later", b"xyz")
        + post("/echo", b"[2]", extra="Connection: close\r\n")
    )
    answer = served.exchange(data)
    parts = answer.split(b"HTTP/1.1 ")
    assert [p.split(b"\r\n")[0] for p in parts[1:]] == [b"200 OK"] * 3
    assert parts[1].endswith(b'{"a":1}') and parts[2].endswith(b"later 3\n")
    assert parts[3].endswith(b"[2]") and b"Connection: close" in parts[3]


def test_a_body_sent_in_pieces_is_read_whole(served: Served) -> None:
    with socket.create_connection(("127.0.0.1", served.port), timeout=5) as s:
        s.sendall(b"POST /echo HTTP/1.1\r\nContent-Length: 10\r\nExpect: 100-continue\r\n\r\n")
        assert s.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
        s.sendall(b"01234")
        time.sleep(0.05)
        s.sendall(b"56789")
        answer = s.recv(1000)
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"0123456789")


@pytest.mark.parametrize(
    ("data", "status", "reason"),
    [
        (b"GARBAGE\r\n\r\n", b"400", b"malformed request line"),
        (b"GET /healthz HTTP/2.0\r\n\r\n", b"505", b"HTTP/1.0 or HTTP/1.1"),
        (b"POST /echo HTTP/1.1\r\nBad Header\r\n\r\n", b"400", b"malformed header"),
        (b"POST /echo HTTP/1.1\r\nContent-Length: -5\r\n\r\n", b"400", b"Content-Length"),
        (
            b"POST /echo HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            b"400",
            b"Content-Length",
        ),
        (
            b"POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
            b"411",
            b"send Content-Length",
        ),
        (b"POST /echo HTTP/1.1\r\nContent-Length: 5000\r\n\r\n", b"413", b"over 1000 bytes"),
        (b"GET /x HTTP/1.1\r\nA: " + b"a" * 20000 + b"\r\n\r\n", b"431", b"too large"),
        (b"GET /nowhere HTTP/1.1\r\nConnection: close\r\n\r\n", b"404", b"no such path"),
        (b"GET /echo HTTP/1.1\r\nConnection: close\r\n\r\n", b"405", b"not allowed"),
        (b"GET /broken HTTP/1.1\r\nConnection: close\r\n\r\n", b"500", b"internal error"),
    ],
)
def test_bad_requests_are_refused_with_the_reason(
    served: Served, data: bytes, status: bytes, reason: bytes
) -> None:
    answer = served.exchange(data)
    assert answer.startswith(b"HTTP/1.1 " + status), answer[:200]
    assert reason in answer and b"gpushare" in answer
    assert served.healthy()


def test_a_body_that_never_finishes_and_a_stuck_handler_get_503_at_the_deadline(
    served: Served,
) -> None:
    for data in (
        b"POST /echo HTTP/1.1\r\nContent-Length: 100\r\n\r\n{",
        post("/stuck", b"{}"),
    ):
        started = time.monotonic()
        answer = served.exchange(data)
        assert answer.startswith(b"HTTP/1.1 503") and b"no answer within 0.5s" in answer
        assert time.monotonic() - started < 3
    assert served.healthy()


def test_http_1_0_is_answered_and_closed(served: Served) -> None:
    answer = served.exchange(b"GET /healthz HTTP/1.0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"ok\n")
