"""HTTP/1.1 requests to the API server over kept connections, for the controller's hot writes:
a Binding per pod, the patches that place DRA claims.

aiohttp's client (session, request and response objects, connector, timers, cookie handling)
was about 12 % of the controller's one busy thread at 5,000 nodes for one Binding POST per pod,
more than the bind's own work (docs/scale.md, "The extender's HTTP server"). Here a request is
one write of bytes made with an f-string and its answer is parsed with bytes methods; up to
``keep`` connections are kept open between requests (binds run concurrently) and one kept
longer than ``idle_s`` is closed instead of reused (the API server closes idle ones itself).

Requests are not retried: a write may have reached the API server before its connection broke,
and the caller (a bind) decides what to do with the error. Answers: Content-Length, chunked or
close-delimited bodies, at most MAX_ANSWER_BYTES.
"""

import asyncio
import ssl
from collections.abc import Mapping
from urllib.parse import urlsplit

MAX_ANSWER_BYTES = 64 * 2**20
USER_AGENT = "gpushare-controller"
KEEP_CONNECTIONS = 64
"""Idle connections kept: as many as the controller has writes in flight at once (the DRA
allocator's MAX_WRITES pods). With 16 kept, every burst past 16 closed its extra connections
and the next burst opened them again: TLS handshakes were 10 % of the controller's thread in
the scale bench's DRA phase (docs/scale.md). A connection is opened only for a request that
finds none idle; one idle past ``idle_s`` is closed when next taken."""


class AnswerError(ConnectionError):
    """The API server's answer could not be read (broken connection, malformed or oversized
    answer): an OSError, so callers see the server as unreachable for this request."""


class ApiConnections:
    """Kept connections to one API server (``server``: its URL, path prefix included)."""

    def __init__(
        self,
        server: str,
        tls: ssl.SSLContext | None,
        *,
        keep: int = KEEP_CONNECTIONS,
        idle_s: float = 20.0,
    ) -> None:
        url = urlsplit(server)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"API server URL {server!r} is not http(s)://host[:port][/path]")
        self.host = url.hostname
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.prefix = url.path.rstrip("/")
        self.tls = tls if url.scheme == "https" else None
        if url.scheme == "https" and self.tls is None:
            self.tls = ssl.create_default_context()
        self.authority = url.netloc.rpartition("@")[2]
        self.keep, self.idle_s = keep, idle_s
        self._idle: list[_Connection] = []

    async def request(
        self,
        method: str,
        path: str,
        body: bytes,
        headers: Mapping[str, str],
        *,
        timeout: float,
    ) -> tuple[int, bytes]:
        """(status, body) of one request; raises OSError (TimeoutError, AnswerError, ...) when
        no answer came."""
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        head = (
            f"{method} {self.prefix}{path} HTTP/1.1\r\nHost: {self.authority}\r\n"
            f"User-Agent: {USER_AGENT}\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
        )
        async with asyncio.timeout(timeout):
            conn = self._take() or await self._open()
            try:
                status, answer, keep_alive = await conn.exchange(head.encode("latin-1") + body)
            except BaseException:
                conn.close()
                raise
        if keep_alive and len(self._idle) < self.keep:
            conn.idle_since = asyncio.get_running_loop().time()
            self._idle.append(conn)
        else:
            conn.close()
        return status, answer

    def _take(self) -> "_Connection | None":
        now = asyncio.get_running_loop().time()
        while self._idle:
            conn = self._idle.pop()
            if conn.open and now - conn.idle_since < self.idle_s:
                return conn
            conn.close()
        return None

    async def _open(self) -> "_Connection":
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(
            _Connection,
            self.host,
            self.port,
            ssl=self.tls,
            server_hostname=self.host if self.tls is not None else None,
        )
        return conn

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()


class _Connection(asyncio.Protocol):
    """One connection: one request in flight at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.waiter: asyncio.Future[tuple[int, bytes, bool]] | None = None
        self.open = False
        self.idle_since = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport, self.open = transport, True

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        waiter, self.waiter = self.waiter, None
        if waiter is None or waiter.done():
            return
        try:
            answer = _parse(self.buffer, eof=True)
        except AnswerError as bad:
            waiter.set_exception(bad)
            return
        if answer is None:
            waiter.set_exception(AnswerError(f"the API server closed the connection ({exc})"))
        else:
            waiter.set_result((answer[0], answer[1], False))

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        waiter = self.waiter
        if waiter is None or waiter.done():
            if len(self.buffer) > MAX_ANSWER_BYTES:
                self.close()
            return
        try:
            answer = _parse(self.buffer, eof=False)
        except AnswerError as bad:
            self.waiter = None
            waiter.set_exception(bad)
            self.close()
            return
        if answer is not None:
            self.waiter = None
            self.buffer.clear()
            waiter.set_result(answer)

    async def exchange(self, request: bytes) -> tuple[int, bytes, bool]:
        """Send ``request``; its (status, body, connection reusable)."""
        if self.transport is None or not self.open:
            raise AnswerError("connection closed")
        self.buffer.clear()
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return await self.waiter

    def close(self) -> None:
        self.open = False
        if self.transport is not None:
            self.transport.close()


def _parse(buf: bytearray, *, eof: bool) -> tuple[int, bytes, bool] | None:
    """(status, body, keep-alive) of the complete answer in ``buf``; None while incomplete."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        if len(buf) > 64 * 1024:
            raise AnswerError("answer head over 64 KiB")
        return None
    lines = bytes(buf[:end]).split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise AnswerError(f"not an HTTP/1.x answer: {lines[0][:80]!r}")
    status = int(parts[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip().lower()
    keep = headers.get(b"connection") != b"close" and parts[0] == b"HTTP/1.1"
    start = end + 4
    if 100 <= status < 200:  # an interim answer: the final one follows
        del buf[:start]
        return _parse(buf, eof=eof)
    if status in (204, 304):
        return status, b"", keep
    length = headers.get(b"content-length")
    if length is not None:
        if not length.isdigit() or int(length) > MAX_ANSWER_BYTES:
            raise AnswerError(f"bad Content-Length {length[:20]!r}")
        stop = start + int(length)
        return (status, bytes(buf[start:stop]), keep) if len(buf) >= stop else None
    if headers.get(b"transfer-encoding") == b"chunked":
        body = _chunks(buf, start)
        return None if body is None else (status, body, keep)
    if len(buf) - start > MAX_ANSWER_BYTES:
        raise AnswerError("answer over the limit")
    return (status, bytes(buf[start:]), False) if eof else None


def _chunks(buf: bytearray, at: int) -> bytes | None:
    """A chunked body from ``at`` (None while incomplete); trailers are ignored."""
    out = bytearray()
    while True:
        line_end = buf.find(b"\r\n", at)
        if line_end < 0:
            return None
        size_text = bytes(buf[at:line_end]).split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise AnswerError(f"bad chunk size {size_text[:20]!r}") from None
        if size == 0:
            return bytes(out) if buf.find(b"\r\n\r\n", line_end) >= 0 else None
        start = line_end + 2
        if len(buf) < start + size + 2:
            return None
        out += buf[start : start + size]
        if len(out) > MAX_ANSWER_BYTES:
            raise AnswerError("answer over the limit")
        at = start + size + 2
