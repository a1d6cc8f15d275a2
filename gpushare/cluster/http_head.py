"""What :mod:`gpushare.cluster.lean_http` serves, in its own words: a request, a response, the
server's bounds, and the head of an HTTP/1.1 request (its request line and headers) as it reads
it: parsed with bytes methods (done in C), and refused, with the status and a
reason, when it is malformed (400), names another version (505), holds too many headers (431),
asks for a chunked body (411), a body in a Content-Encoding but identity (415) or one over the
server's limit (413), before any of the body is read."""

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

MAX_HEAD_BYTES = 16 * 1024
"""Request line and headers together (aiohttp allows 8190 bytes a line)."""
MAX_HEADERS = 100


TEXT = "text/plain; charset=utf-8"


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str
    """The target without its query."""
    headers: Mapping[str, str]
    """Lower-case names; a header sent twice keeps its last value."""
    body: bytes
    client: str = ""
    """The client's address (its IP), as the per-client bounds count it."""
    certified: bool = False
    """The client presented a certificate the server's client CA signed (TLS started after
    accept, ``LeanServer.start(tls_after_accept=True)``)."""


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


@dataclass
class Limits:
    max_connections: int
    idle_timeout_s: float
    deadline_s: float
    max_body_bytes: int
    per_client_connections: int = 0
    """Most connections one client address holds (0: no per-client bound)."""
    body_budget_bytes: int = 0
    """Most body bytes being received at once over every connection (0: no bound)."""
    per_client_body_bytes: int = 0
    """Most body bytes one client has being received at once (0: no bound)."""
    body_deadline_s: float = 0.0
    """A body must be complete this long after its head (0: ``deadline_s``)."""
    tls_handshake_s: float = 10.0
    """A TLS handshake begun after the per-client check must end within this."""


class RefusedError(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


@dataclass
class Head:
    method: str
    path: str
    headers: dict[str, str]
    length: int
    keep_alive: bool
    end: int
    """Where the body starts in the buffer."""


def parse_head(raw: bytes, end: int, max_body: int) -> Head:
    """The request line and headers of ``raw`` (without the blank line)."""
    lines = raw.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[0].isalpha() or not parts[1].startswith(b"/"):
        raise RefusedError(400, "malformed request line")
    version = parts[2]
    if version not in (b"HTTP/1.1", b"HTTP/1.0"):
        raise RefusedError(505, "HTTP/1.0 or HTTP/1.1 only")
    if len(lines) - 1 > MAX_HEADERS:
        raise RefusedError(431, f"more than {MAX_HEADERS} headers")
    headers: dict[str, str] = {}
    lengths: set[bytes] = set()
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip() or b" " in name:
            raise RefusedError(400, "malformed header line")
        key = name.decode("latin-1").lower()
        text = value.strip()
        if key == "content-length":
            lengths.add(text)
        headers[key] = text.decode("latin-1")
    if "transfer-encoding" in headers:
        raise RefusedError(411, "chunked bodies are not accepted: send Content-Length")
    encoding = headers.get("content-encoding")
    if encoding is not None and encoding.lower() not in ("", "identity"):
        raise RefusedError(
            415, f"Content-Encoding {encoding[:40]!r} is not accepted: send the body as is"
        )
    length = 0
    if lengths:
        (text,) = lengths if len(lengths) == 1 else (b"",)
        if not text.isdigit() or len(text) > 12:
            raise RefusedError(400, "Content-Length must be one non-negative integer")
        length = int(text)
    if length > max_body:
        raise RefusedError(413, f"body over {max_body} bytes")
    connection = headers.get("connection", "").lower()
    keep = connection != "close" if version == b"HTTP/1.1" else connection == "keep-alive"
    target = parts[1].decode("latin-1")
    return Head(parts[0].decode("ascii"), target.partition("?")[0], headers, length, keep, end)
