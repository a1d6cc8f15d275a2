"""A small HTTP/1.1 server for the extender's port (kube-scheduler's filter, prioritize and
bind calls, the kubelet's probes, Prometheus' scrapes) and the admission webhook's.

Why not aiohttp's web server: kube-scheduler waits for each filter call inside its scheduling
cycle, one pod at a time, and at 5,000 nodes aiohttp's request and response objects, routing
and middleware were about 12 % of the controller's one busy thread (docs/scale.md, "The
extender's HTTP server"). Here a request is parsed with bytes methods and a handler that
answers at once (filter, prioritize, the probes) runs and is answered inside the callback that
read the request: no task, no extra turn of the event loop for other work to get in first.

It takes HTTP/1.0 and 1.1 requests with a Content-Length body, keep-alive, one request at a
time per connection, and refuses, with the status and a reason, what
:mod:`gpushare.cluster.http_head` refuses of a head, an unknown path (404) or method (405).
Bounds: at most ``max_connections`` connections, one idle for ``idle_timeout_s`` closed, a
body not complete within ``body_deadline_s`` (default ``deadline_s``) of its head and a
handler that has not answered by then get 503. Per client (its address), for a port any pod
can reach (docs/security.md, "Every HTTP server is bounded"): with ``per_client_connections``
one more connection of a client at its bound is closed as it is accepted, before any
transport or TLS handshake is made for it; over ``max_connections`` the oldest idle
connection of the client holding the most is closed; with ``body_budget_bytes`` the bodies
being received (counted by their Content-Length when the head arrives) stay within that many
bytes, a client's within ``per_client_body_bytes``, or the head gets 503 before any of its
body is read.
"""

import asyncio
import logging
import socket
from collections.abc import Awaitable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from gpushare.cluster.http_head import (
    MAX_HEAD_BYTES,
    TEXT,
    Handler,
    Head,
    Limits,
    RefusedError,
    Request,
    Response,
    Routes,
    parse_head,
)

__all__ = ["TEXT", "Handler", "LeanServer", "Limits", "Request", "Response", "Routes"]

log = logging.getLogger(__name__)

BACKLOG = 1024
"""The listen queue: a burst of connections waits there to be accepted."""
ACCEPTS_PER_TURN = 16
"""Connections taken per turn of the loop: a burst is accepted in short turns, between which
a filter call already read is answered."""

_REASONS = {int(s): s.phrase for s in HTTPStatus}


@dataclass
class LeanServer:
    """The server: :meth:`start` listens, :meth:`stop` closes it and every connection."""

    routes: Routes
    limits: Limits
    connections: set["_Connection"] = field(default_factory=set)
    clients: dict[str, list["_Connection"]] = field(default_factory=dict)
    """Per client address, its connections in the order they opened (with per-client
    bounds only)."""
    receiving: dict[str, int] = field(default_factory=dict)
    """Per client address, the body bytes it has announced and not finished sending."""
    receiving_total: int = 0
    tls: Any = None
    """The SSL context TLS is started with after the per-client check (``tls_after_accept``)."""
    refused: int = 0
    """Connections refused or closed by a bound, and heads refused by the body budget."""
    accepting: dict[str, int] = field(default_factory=dict)
    """Per client address, connections accepted and not yet made (a TLS handshake runs)."""
    _sockets: list[socket.socket] = field(default_factory=list)
    _ssl: Any = None
    _tasks: set["asyncio.Task[None]"] = field(default_factory=set)

    async def start(
        self,
        host: str,
        port: int,
        *,
        ssl_context: Any = None,
        reuse_port: bool = False,
        tls_after_accept: bool = False,
    ) -> None:
        """Listen. With ``tls_after_accept`` (and ``ssl_context``) connections are accepted as
        plain TCP, checked against the per-client bounds, and only then start TLS. Accepting
        is this server's own (:meth:`_accept`): a client at its bound is refused before any
        transport is made for it, and at most ACCEPTS_PER_TURN connections are taken per turn
        of the loop, so a flood of connections costs the loop a few microseconds each, in
        short turns."""
        loop = asyncio.get_running_loop()
        if tls_after_accept and ssl_context is not None:
            self.tls, ssl_context = ssl_context, None
        self._ssl = ssl_context
        infos = await loop.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        sockets: list[socket.socket] = []
        try:
            for family, kind, proto, _, address in dict.fromkeys(infos):
                sock = socket.socket(family, kind, proto)
                sockets.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if reuse_port:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind(address)
                sock.listen(BACKLOG)
                sock.setblocking(False)
        except OSError:
            for sock in sockets:
                sock.close()
            raise
        self._sockets = sockets
        for sock in sockets:
            loop.add_reader(sock.fileno(), self._accept, sock)

    def _accept(self, sock: socket.socket) -> None:
        """Take the connections waiting (at most ACCEPTS_PER_TURN): one of a client at its
        bound is closed at once, the others made into connections."""
        loop = asyncio.get_running_loop()
        bound = self.limits.per_client_connections
        for _ in range(ACCEPTS_PER_TURN):
            try:
                conn, address = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of file descriptors, and the like
                log.warning("accept failed", extra={"error": str(exc)})
                return
            client = str(address[0]) if isinstance(address, tuple) and address else ""
            pending = self.accepting.get(client, 0)
            if bound and len(self.clients.get(client, ())) + pending >= bound:
                conn.close()
                self.refuse()
                continue
            conn.setblocking(False)
            self.accepting[client] = pending + 1
            task = loop.create_task(self._made(conn, client))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _made(self, conn: socket.socket, client: str) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.connect_accepted_socket(
                lambda: _Connection(self),
                conn,
                ssl=self._ssl,
                ssl_handshake_timeout=self.limits.tls_handshake_s if self._ssl else None,
            )
        except (OSError, TimeoutError, ValueError, asyncio.CancelledError):
            conn.close()  # a handshake that failed or took too long
        finally:
            left = self.accepting.get(client, 1) - 1
            if left > 0:
                self.accepting[client] = left
            else:
                self.accepting.pop(client, None)

    def refuse(self) -> None:
        """Count a connection or body a bound refused; logged at the 1st, 10th, 100th and
        every 1000th, so that a flood of them costs no log line each (a flooder made the
        controller write 6,470 in a minute on its loop)."""
        self.refused += 1
        if self.refused in (1, 10, 100) or self.refused % 1000 == 0:
            log.warning(
                "connections refused by a bound",
                extra={"refused": self.refused, "open": len(self.connections)},
            )

    @property
    def port(self) -> int:
        """The port listened on (the one picked when started with port 0)."""
        assert self._sockets
        return int(self._sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if not self._sockets:
            return
        loop = asyncio.get_running_loop()
        for sock in self._sockets:
            loop.remove_reader(sock.fileno())
            sock.close()
        self._sockets = []
        for task in list(self._tasks):
            task.cancel()
        for conn in list(self.connections):
            conn.close()


class _Connection(asyncio.Protocol):
    """One client connection: reads requests one at a time, answers each in order."""

    def __init__(self, server: LeanServer) -> None:
        self.server = server
        self.limits = server.limits
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.busy = False
        self.head: Head | None = None
        self.loop = asyncio.get_running_loop()
        self.timer: asyncio.TimerHandle | None = None
        self.due = 0.0
        """When the connection must next have moved on: a complete request by then (idle), or
        the body of the head read (``head`` set). One timer per connection checks it, so a
        request costs no timer of its own."""
        self.task: asyncio.Future[None] | None = None
        self.client = ""
        self.announced = 0
        """Body bytes of the current head counted against the body budgets."""
        self.handshaking = False
        self.certified = False

    # ---- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        server, limits = self.server, self.limits
        if limits.per_client_connections:
            peer = transport.get_extra_info("peername")
            self.client = str(peer[0]) if isinstance(peer, tuple) and peer else ""
            if not self._make_room():
                server.refuse()
                transport.abort()
                self.transport = None
                return
            server.clients.setdefault(self.client, []).append(self)
        elif len(server.connections) >= limits.max_connections:
            server.refuse()
            transport.close()
            self.transport = None
            return
        server.connections.add(self)
        if server.tls is not None:
            # The bounds are checked; only now the handshake (its CPU) is spent.
            transport.pause_reading()
            self.handshaking = True
            self._expect(limits.tls_handshake_s)
            self.task = asyncio.ensure_future(self._start_tls(transport))
            return
        self._expect(limits.idle_timeout_s)

    async def _start_tls(self, raw: asyncio.Transport) -> None:
        try:
            secure = await self.loop.start_tls(
                raw,
                self,
                self.server.tls,
                server_side=True,
                ssl_handshake_timeout=self.limits.tls_handshake_s,
            )
        except (OSError, TimeoutError, ValueError, asyncio.CancelledError):
            # ssl.SSLError is an OSError: a client that is no TLS client, or went away.
            raw.abort()
            self._forget()
            return
        self.task, self.handshaking = None, False
        if self.transport is None or secure is None:  # closed by a bound meanwhile
            if secure is not None:
                secure.close()
            return
        self.transport = secure
        self.certified = bool(secure.get_extra_info("peercert"))
        self._expect(self.limits.idle_timeout_s)
        if self.buffer:
            self._serve()

    def _make_room(self) -> bool:
        """Room for this connection under the per-client and total bounds: none at the
        client's own bound; at the total bound, the oldest idle connection of the client
        holding the most is closed for it. False: no room."""
        server, limits = self.server, self.limits
        if len(server.clients.get(self.client, ())) >= limits.per_client_connections:
            return False
        if len(server.connections) >= limits.max_connections:
            biggest = max(server.clients.values(), key=len, default=[])
            idle = next((c for c in biggest if c.idle), None)
            if idle is None:
                return False
            server.refuse()
            idle.close()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self._forget()

    def _forget(self) -> None:
        """The connection is gone: its slot, its body budget and its timer are freed."""
        server = self.server
        server.connections.discard(self)
        if self.client or self.limits.per_client_connections:
            mine = server.clients.get(self.client)
            if mine is not None and self in mine:
                mine.remove(self)
                if not mine:
                    del server.clients[self.client]
        self._release_body()
        self._stop_timer()
        self.transport = None

    @property
    def idle(self) -> bool:
        """Between requests: nothing received of the next one, none being answered."""
        return not (self.busy or self.buffer or self.head is not None or self.handshaking)

    def _reserve_body(self, length: int) -> None:
        """Count ``length`` body bytes against the budgets; RefusedError (503) over them."""
        limits, server = self.limits, self.server
        if not limits.body_budget_bytes:
            return
        mine = server.receiving.get(self.client, 0)
        if (limits.per_client_body_bytes and mine + length > limits.per_client_body_bytes) or (
            server.receiving_total + length > limits.body_budget_bytes
        ):
            server.refuse()
            raise RefusedError(503, "too many request bodies in flight; retry")
        server.receiving[self.client] = mine + length
        server.receiving_total += length
        self.announced = length

    def _release_body(self) -> None:
        if not self.announced:
            return
        server = self.server
        left = server.receiving.get(self.client, 0) - self.announced
        if left > 0:
            server.receiving[self.client] = left
        else:
            server.receiving.pop(self.client, None)
        server.receiving_total -= self.announced
        self.announced = 0

    def data_received(self, data: bytes) -> None:
        if self.transport is None:
            return
        self.buffer += data
        # During start_tls the TLS layer may hand over the first request before start_tls
        # returns the TLS transport: answered on the raw one it went out unencrypted.
        if not self.busy and not self.handshaking:
            self._serve()

    # ---- requests ------------------------------------------------------------------------

    def _serve(self) -> None:
        """Answer every complete request in the buffer, in order, until one must be awaited."""
        while self.transport is not None and not self.busy:
            try:
                request, keep_alive = self._next_request()
            except RefusedError as refusal:
                self._answer(Response.text(refusal.status, f"gpushare: {refusal.reason}\n"))
                self.close()
                return
            if request is None:
                return
            self._dispatch(request, keep_alive)

    def _next_request(self) -> tuple[Request | None, bool]:
        """The next complete request (None: not all here yet) and whether to keep the
        connection; raises RefusedError for one that cannot be served."""
        buf = self.buffer
        if self.head is None:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD_BYTES:
                    raise RefusedError(431, "request head too large")
                return None, True
            if end > MAX_HEAD_BYTES:
                raise RefusedError(431, "request head too large")
            head = parse_head(bytes(buf[:end]), end + 4, self.limits.max_body_bytes)
            if len(buf) < head.end + head.length:
                # The body follows: it must be complete within the deadline, and fit the budget.
                self._reserve_body(head.length)
                self._expect(self.limits.body_deadline_s or self.limits.deadline_s)
                if head.headers.get("expect", "").lower() == "100-continue":
                    self._write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self.head = head
        head = self.head
        stop = head.end + head.length
        if len(buf) < stop:
            return None, True
        body = bytes(buf[head.end : stop])
        del buf[:stop]
        self.head = None
        self._release_body()
        request = Request(head.method, head.path, head.headers, body, self.client, self.certified)
        return request, head.keep_alive

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
        transport = self.transport
        self._forget()
        if transport is not None:
            transport.close()
        if self.task is not None and self.handshaking:
            self.task.cancel()
