"""The node side's one HTTP server: /metrics from one CollectorRegistry, /healthz, and extra
routes (the exporter's ``/profile``, see ``gpushare.node.extension``), in a thread of its own.

The agent and the standalone exporter (``python -m bench.exporter.standalone``, development
only) both serve with it.
It is bounded (issue #45: it held a thread per idle connection, without a timeout): at most
``max_connections`` connections at once, a read that waits ``idle_timeout_s`` ends its
connection, and every connection is cut ``deadline_s`` after it opened. One client address
holds at most ``per_client`` of them (issue 67: one pod holding all 64 failed the kubelet's
liveness probes, so the agent was restarted over and over, and the extender's bind-time
readiness check got no verdict): one more from it is closed unanswered, and a connection over
the total cuts the oldest connection of the client holding the most, so the kubelet's probes,
Prometheus and the controller's bind check keep their way in. With ``authorize`` the routes in
``protected`` answer only callers it admits (the agent's are /metrics and /profile: they name
every pod on the node; gpushare.kube.access), told the caller's address (its budget of unknown
tokens).
"""

import contextlib
import logging
import socket
import threading
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpushare.api.build import (
    BUILD_INFO_HELP,
    BUILD_INFO_LABELS,
    BUILD_INFO_METRIC,
    build_info_values,
)
from gpushare.kube.access import Access

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reply:
    """What a route answers."""

    status: int
    content_type: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


RouteHandler = Callable[[str], Reply]
"""(raw query string) -> the reply."""


class Authorize(Protocol):
    """(the Authorization header, the path, the caller's address) -> may the caller read it
    (gpushare.kube.access)."""

    def __call__(self, authorization: str | None, path: str, *, client: str = "") -> Access: ...


MAX_CONNECTIONS = 64
"""Open connections at once (Prometheus and the operator keep one or two each)."""
PER_CLIENT = 8
"""Open connections of one client address (the kubelet's probes, Prometheus, the operator
and the controller's bind check each use one or two)."""
SLOT_WAIT_S = 1.0
"""How long a connection over the total waits for the slot its eviction frees."""
IDLE_TIMEOUT_S = 10.0
"""A connection whose next bytes take longer than this is closed."""
DEADLINE_S = 30.0
"""Every connection is cut this long after it opened (a request sent a byte at a time)."""
PROTECTED = ("/metrics", "/profile")


def registry_for(component: str, *, simulated: bool) -> CollectorRegistry:
    """A registry for ``component``'s /metrics (node-agent, exporter) that already holds its
    ``gpushare_build_info`` series (gpushare.api.build), with ``simulated`` as every series of
    a node on the simulated backend says it."""
    registry = CollectorRegistry()
    labels = (*BUILD_INFO_LABELS, "simulated")
    Gauge(BUILD_INFO_METRIC, BUILD_INFO_HELP, labels, registry=registry).labels(
        *build_info_values(component), "true" if simulated else "false"
    ).set(1)
    return registry


def _cut(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed
        conn.shutdown(socket.SHUT_RDWR)


class _BoundedHTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer with a bound on connections and a deadline per connection."""

    daemon_threads = True
    request_queue_size = 1024
    """The listen backlog (socketserver's default is 5; the kernel caps it at somaxconn): a
    burst beyond it had its SYNs dropped and retried a second later, so 300 connections
    opened at once took 42 s to connect, and a kubelet probe or the extender's bind check
    queued behind them. The server sheds load itself (``max_connections``); the kernel's
    queue only holds a burst until it is accepted, with room for the accept thread to be
    late (128 still dropped some on a loaded 2-core VM; tests/unit/node/
    test_metrics_server_bounds.py)."""

    def __init__(
        self,
        address: tuple[str, int],
        handler: Any,
        *,
        max_connections: int,
        deadline_s: float,
        per_client: int = PER_CLIENT,
    ) -> None:
        super().__init__(address, handler)
        self._slots = threading.BoundedSemaphore(max_connections)
        self._deadline_s = deadline_s
        self._per_client = per_client
        self._clients: dict[str, list[Any]] = {}
        """Per client address, its open connections, oldest first."""
        self._lock = threading.Lock()
        self.refused = 0
        """Connections closed unanswered because a bound was reached."""
        self.evicted = 0
        """Connections cut to make room for another client's."""

    def process_request(self, request: Any, client_address: Any) -> None:
        client = str(client_address[0]) if client_address else ""
        with self._lock:
            mine = self._clients.setdefault(client, [])
            over_own = len(mine) >= self._per_client
            if not over_own:
                mine.append(request)
        if over_own or not self._take_slot(client):
            self._refuse(client, request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            self._forget(client, request)
            raise

    def _take_slot(self, client: str) -> bool:
        """A slot for a connection of ``client``; at the total, the oldest connection of the
        client holding the most (another one than ``client``) is cut for it."""
        if self._slots.acquire(blocking=False):
            return True
        with self._lock:
            others = [(len(c), k) for k, c in self._clients.items() if k != client and c]
            victim = None
            if others:
                _, biggest = max(others)
                if len(self._clients[biggest]) > 1:
                    victim = self._clients[biggest][0]
        if victim is None:
            return False
        self.evicted += 1
        _cut(victim)
        return self._slots.acquire(timeout=SLOT_WAIT_S)

    def _refuse(self, client: str, request: Any) -> None:
        self._forget(client, request)
        self.refused += 1
        if self.refused in (1, 10, 100) or self.refused % 1000 == 0:
            log.warning("connection refused: too many open", extra={"refused": self.refused})
        self.shutdown_request(request)

    def _forget(self, client: str, request: Any) -> None:
        with self._lock:
            mine = self._clients.get(client)
            if mine is not None and request in mine:
                mine.remove(request)
                if not mine:
                    del self._clients[client]

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        timer = threading.Timer(self._deadline_s, _cut, args=(request,))
        timer.daemon = True
        timer.start()
        try:
            super().process_request_thread(request, client_address)
        finally:
            timer.cancel()
            self._slots.release()
            self._forget(str(client_address[0]) if client_address else "", request)


def _handler(
    routes: Mapping[str, RouteHandler],
    authorize: Authorize | None,
    guarded: frozenset[str],
    idle_timeout_s: float,
) -> type[BaseHTTPRequestHandler]:
    """The request handler: each GET routed, ``guarded`` paths only for callers ``authorize``
    admits (told the caller's address)."""

    class Handler(BaseHTTPRequestHandler):
        timeout = idle_timeout_s

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            handler = routes.get(url.path)
            access = (
                authorize(
                    self.headers.get("Authorization"),
                    url.path,
                    client=str(self.client_address[0]),
                )
                if authorize is not None and url.path in guarded
                else None
            )
            if access is not None and not access.allowed:
                reply = refusal(access)
            elif handler is None:
                reply = Reply(404, "text/plain", f"no route {url.path}\n".encode())
            else:
                try:
                    reply = handler(url.query)
                except Exception as exc:
                    log.exception("route %s failed", url.path)
                    reply = Reply(500, "text/plain", f"{exc}\n".encode())
            self.send_response(reply.status)
            self.send_header("Content-Type", reply.content_type)
            self.send_header("Content-Length", str(len(reply.body)))
            for name, value in reply.headers:
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(reply.body)

        def log_message(self, format: str, *args: object) -> None:
            return None

    return Handler


class MetricsServer:
    """A small threaded HTTP server on ``host:port`` (port 0 picks a free one), bounded (see
    the module's docstring); with ``authorize``, ``protected`` routes answer only the callers
    it admits (the kubelet's probes, /healthz and /readyz, stay open)."""

    def __init__(
        self,
        *,
        registry: CollectorRegistry,
        host: str,
        port: int,
        authorize: Authorize | None = None,
        protected: Collection[str] = PROTECTED,
        max_connections: int = MAX_CONNECTIONS,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        deadline_s: float = DEADLINE_S,
        per_client: int = PER_CLIENT,
    ) -> None:
        self.registry = registry
        self._routes: dict[str, RouteHandler] = {
            "/metrics": self._metrics,
            "/healthz": lambda _q: Reply(200, "text/plain", b"ok\n"),
        }
        guarded = frozenset(protected) if authorize is not None else frozenset()
        handler = _handler(self._routes, authorize, guarded, idle_timeout_s)
        self._httpd = _BoundedHTTPServer(
            (host, port),
            handler,
            max_connections=max_connections,
            deadline_s=deadline_s,
            per_client=per_client,
        )
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def refused_connections(self) -> int:
        return self._httpd.refused

    def add_route(self, path: str, handler: RouteHandler) -> None:
        if path in self._routes:
            raise ValueError(f"route {path} is already served")
        self._routes[path] = handler

    def _metrics(self, _query: str) -> Reply:
        return Reply(200, CONTENT_TYPE_LATEST, generate_latest(self.registry))

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="metrics-http", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def refusal(access: Access) -> Reply:
    """The answer to a caller ``authorize`` turned away: its status and the reason."""
    headers = (("WWW-Authenticate", 'Bearer realm="gpushare"'),) if access.status == 401 else ()
    return Reply(access.status, "text/plain", f"gpushare: {access.reason}\n".encode(), headers)


class AgentCollector(Collector):
    """The agent's own series: what it runs and what the device plugin did."""

    def __init__(
        self, *, node_name: str, backend_name: str, stats: Callable[[], Mapping[str, float]]
    ) -> None:
        self.node_name = node_name
        self.backend_name = backend_name
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        values = self.stats()
        simulated = "true" if values.get("simulated") else "false"
        info = GaugeMetricFamily(
            "gpushare_node_agent_info",
            "The node agent and its GPU backend (1 = running).",
            labels=["node", "backend", "simulated"],
        )
        info.add_metric([self.node_name, self.backend_name, simulated], 1)
        yield info
        for name, key, help_text in (
            (
                "gpushare_deviceplugin_registrations",
                "registrations",
                "Times the device plugin registered with the kubelet.",
            ),
            ("gpushare_deviceplugin_allocations", "allocations", "Allocate calls answered."),
            (
                "gpushare_deviceplugin_allocation_failures",
                "allocation_failures",
                "Allocate calls refused or failed.",
            ),
            (
                "gpushare_deviceplugin_reallocations",
                "reallocations",
                "Allocate calls answered again for a pod a restarted kubelet had not recorded.",
            ),
            (
                "gpushare_deviceplugin_placement_exchanges",
                "placement_exchanges",
                "Pods whose placement annotations were rewritten to the Allocate answer the "
                "kubelet gave them (meant for another pod of the same size).",
            ),
        ):
            counter = CounterMetricFamily(name, help_text, labels=["node", "simulated"])
            counter.add_metric([self.node_name, simulated], float(values.get(key, 0)))
            yield counter
        healthy = GaugeMetricFamily(
            "gpushare_deviceplugin_healthy_gpus",
            "GPUs whose slices the device plugin advertises Healthy.",
            labels=["node", "simulated"],
        )
        healthy.add_metric([self.node_name, simulated], float(values.get("healthy_gpus", 0)))
        yield healthy
