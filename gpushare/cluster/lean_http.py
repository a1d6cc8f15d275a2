"""A small HTTP/1.1 server for the extender's port: kube-scheduler's filter, prioritize and bind
calls, the kubelet's probes and Prometheus' scrapes.

Why not aiohttp's web server, as the webhook port uses: kube-scheduler waits for each filter
call inside its scheduling cycle, one pod at a time, and at 5,000 nodes aiohttp's request and
response objects, routing and middleware were about 12 % of the controller's one busy thread,
as much as the filter's own loop over the offered nodes (docs/scale.md, "The extender's HTTP
server"). Here a request is parsed with bytes methods (done in C) and a handler that answers at
once (filter, prioritize, the probes) runs and is answered inside the callback that read the
request: no task, no extra turn of the event loop for other work to get in first.

What it accepts: HTTP/1.0 and 1.1 requests with a Content-Length body (kube-scheduler, the
kubelet, Prometheus and curl send those), keep-alive, one request at a time per connection.
What it refuses, with the status and a reason: a malformed request line or header (400), a
chunked body (411), a head over MAX_HEAD_BYTES (431), a body over the server's limit (413),
an unknown path (404) or method (405). Bounds: at most ``max_connections`` connections (one
more is closed at once), a connection that sends no complete request for ``idle_timeout_s`` is
closed, a body not complete within ``deadline_s`` of its head gets 503, and so does a handler
that has not answered by then.
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 16 * 1024
"""Request line and headers together (aiohttp allows 8190 bytes a line)."""
MAX_HEADERS = 100
TEXT = "text/plain; charset=utf-8"
_REASONS = {int(s): s.phrase for s in HTTPStatus}


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str
    """The target without its query."""
    headers: Mapping[str, str]
    """Lower-case names; a header sent twice keeps its last value."""
    body: bytes


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes
    content_type: str = TEXT
    headers: tuple[tuple[str, str], ...] = ()

    @classmethod
    def text(cls, status: int, text: str, **kw: Any) -> "Response":
        return cls(status, text.encode(), **kw)


Handler = Callable[[Request], "Response | Awaitable[Response]"]
Routes = Mapping[tuple[str, str], Handler]
"""(method, path) -> handler. A handler returning a Response is answered at once; one
returning an awaitable is awaited (reading from its connection pauses meanwhile)."""


class _RefusedError(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


@dataclass
class _Head:
    method: str
    path: str
    headers: dict[str, str]
    length: int
    keep_alive: bool
    end: int
    """Where the body starts in the buffer."""


@dataclass
class Limits:
    max_connections: int
    idle_timeout_s: float
    deadline_s: float
    max_body_bytes: int


@dataclass
class LeanServer:
    """The server: :meth:`start` listens, :meth:`stop` closes it and every connection."""

    routes: Routes
    limits: Limits
    connections: set["_Connection"] = field(default_factory=set)
    _server: asyncio.Server | None = None

    async def start(
        self, host: str, port: int, *, ssl_context: Any = None, reuse_port: bool = False
    ) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self),
            host,
            port,
            ssl=ssl_context,
            reuse_address=True,
            reuse_port=reuse_port or None,
        )

    @property
    def port(self) -> int:
        """The port listened on (the one picked when started with port 0)."""
        assert self._server is not None and self._server.sockets
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for conn in list(self.connections):
            conn.close()
        await self._server.wait_closed()
        self._server = None


class _Connection(asyncio.Protocol):
    """One client connection: reads requests one at a time, answers each in order."""

    def __init__(self, server: LeanServer) -> None:
        self.server = server
        self.limits = server.limits
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.busy = False
        self.head: _Head | None = None
        self.loop = asyncio.get_running_loop()
        self.timer: asyncio.TimerHandle | None = None
        self.due = 0.0
        """When the connection must next have moved on: a complete request by then (idle), or
        the body of the head read (``head`` set). One timer per connection checks it, so a
        request costs no timer of its own."""
        self.task: asyncio.Future[None] | None = None

    # ---- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if len(self.server.connections) >= self.limits.max_connections:
            log.warning(
                "connection refused: too many open", extra={"open": self.limits.max_connections}
            )
            transport.close()
            self.transport = None
            return
        self.server.connections.add(self)
        self._expect(self.limits.idle_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self._stop_timer()
        self.transport = None

    def data_received(self, data: bytes) -> None:
        if self.transport is None:
            return
        self.buffer += data
        if not self.busy:
            self._serve()

    # ---- requests ------------------------------------------------------------------------

    def _serve(self) -> None:
        """Answer every complete request in the buffer, in order, until one must be awaited."""
        while self.transport is not None and not self.busy:
            try:
                request, keep_alive = self._next_request()
            except _RefusedError as refusal:
                self._answer(Response.text(refusal.status, f"gpushare: {refusal.reason}\n"))
                self.close()
                return
            if request is None:
                return
            self._dispatch(request, keep_alive)

    def _next_request(self) -> tuple[Request | None, bool]:
        """The next complete request (None: not all here yet) and whether to keep the
        connection; raises _RefusedError for one that cannot be served."""
        buf = self.buffer
        if self.head is None:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD_BYTES:
                    raise _RefusedError(431, "request head too large")
                return None, True
            if end > MAX_HEAD_BYTES:
                raise _RefusedError(431, "request head too large")
            self.head = _parse_head(bytes(buf[:end]), end + 4, self.limits.max_body_bytes)
            if len(buf) < self.head.end + self.head.length:
                # The body follows: it must be complete within the deadline.
                self._expect(self.limits.deadline_s)
                if self.head.headers.get("expect", "").lower() == "100-continue":
                    self._write(b"HTTP/1.1 100 Continue\r\n\r\n")
        head = self.head
        stop = head.end + head.length
        if len(buf) < stop:
            return None, True
        body = bytes(buf[head.end : stop])
        del buf[:stop]
        self.head = None
        return Request(head.method, head.path, head.headers, body), head.keep_alive

    def _dispatch(self, request: Request, keep_alive: bool) -> None:
        routes = self.server.routes
        handler = routes.get((request.method, request.path))
        if handler is None:
            if any(path == request.path for _, path in routes):
                self._finish(Response.text(405, "gpushare: method not allowed\n"), keep_alive)
            else:
                self._finish(Response.text(404, "gpushare: no such path\n"), keep_alive)
            return
        try:
            result = handler(request)
        except Exception:
            log.exception("HTTP handler failed", extra={"path": request.path})
            result = Response.text(500, "gpushare: internal error\n")
        if isinstance(result, Response):
            self._finish(result, keep_alive)
            return
        self.busy = True
        assert self.transport is not None
        self.transport.pause_reading()
        self.task = asyncio.ensure_future(self._await(result, request.path, keep_alive))

    async def _await(self, result: Awaitable[Response], path: str, keep_alive: bool) -> None:
        try:
            async with asyncio.timeout(self.limits.deadline_s):
                response = await result
        except TimeoutError:
            response = Response.text(
                503, f"gpushare: no answer within {self.limits.deadline_s:g}s; retry\n"
            )
        except Exception:
            log.exception("HTTP handler failed", extra={"path": path})
            response = Response.text(500, "gpushare: internal error\n")
        self.busy, self.task = False, None
        if self.transport is None:
            return  # the client went away meanwhile
        self._finish(response, keep_alive)
        if self.transport is not None:
            self.transport.resume_reading()
            self._serve()

    def _finish(self, response: Response, keep_alive: bool) -> None:
        self._answer(response, close=not keep_alive)
        if keep_alive:
            self._expect(self.limits.idle_timeout_s)
        else:
            self.close()

    def _answer(self, response: Response, *, close: bool = True) -> None:
        extra = "".join(f"{k}: {v}\r\n" for k, v in response.headers)
        reason = _REASONS.get(response.status, "Unknown")
        head = (
            f"HTTP/1.1 {response.status} {reason}\r\n"
            f"Content-Type: {response.content_type}\r\n"
            f"Content-Length: {len(response.body)}\r\n"
            f"{extra}{'Connection: close' + chr(13) + chr(10) if close else ''}\r\n"
        )
        self._write(head.encode("latin-1") + response.body)

    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    # ---- timers --------------------------------------------------------------------------

    def _expect(self, seconds: float) -> None:
        """The connection must move on within ``seconds`` from now."""
        self.due = self.loop.time() + seconds
        if self.timer is None or self.timer.when() > self.due:
            self._stop_timer()
            self.timer = self.loop.call_at(self.due, self._check)

    def _stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _check(self) -> None:
        self.timer = None
        if self.transport is None:
            return
        if self.busy or self.loop.time() < self.due:
            # A handler is at work (it has its own deadline), or the connection moved on.
            self.timer = self.loop.call_at(max(self.due, self.loop.time() + 0.1), self._check)
            return
        if self.head is not None:
            # A head whose body did not all come within the deadline.
            deadline = self.limits.deadline_s
            self._answer(Response.text(503, f"gpushare: no answer within {deadline:g}s; retry\n"))
        # Else no complete request for the idle timeout (nothing sent, or a head sent slowly).
        self.close()

    def close(self) -> None:
        self._stop_timer()
        if self.transport is not None:
            self.transport.close()
            self.transport = None
        self.server.connections.discard(self)


def _parse_head(raw: bytes, end: int, max_body: int) -> _Head:
    """The request line and headers of ``raw`` (without the blank line)."""
    lines = raw.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[0].isalpha() or not parts[1].startswith(b"/"):
        raise _RefusedError(400, "malformed request line")
    version = parts[2]
    if version not in (b"HTTP/1.1", b"HTTP/1.0"):
        raise _RefusedError(505, "HTTP/1.0 or HTTP/1.1 only")
    if len(lines) - 1 > MAX_HEADERS:
        raise _RefusedError(431, f"more than {MAX_HEADERS} headers")
    headers: dict[str, str] = {}
    lengths: set[bytes] = set()
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip() or b" " in name:
            raise _RefusedError(400, "malformed header line")
        key = name.decode("latin-1").lower()
        text = value.strip()
        if key == "content-length":
            lengths.add(text)
        headers[key] = text.decode("latin-1")
    if "transfer-encoding" in headers:
        raise _RefusedError(411, "chunked bodies are not accepted: send Content-Length")
    length = 0
    if lengths:
        (text,) = lengths if len(lengths) == 1 else (b"",)
        if not text.isdigit() or len(text) > 12:
            raise _RefusedError(400, "Content-Length must be one non-negative integer")
        length = int(text)
    if length > max_body:
        raise _RefusedError(413, f"body over {max_body} bytes")
    connection = headers.get("connection", "").lower()
    keep = connection != "close" if version == b"HTTP/1.1" else connection == "keep-alive"
    target = parts[1].decode("latin-1")
    return _Head(parts[0].decode("ascii"), target.partition("?")[0], headers, length, keep, end)
