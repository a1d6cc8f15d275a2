"""The node side's one HTTP server: /metrics from one CollectorRegistry, /healthz, and extra
routes (the exporter's ``/profile``, see ``gpushare.node.extension``), in a thread of its own.

The agent and the standalone exporter (``python -m gpushare.node.exporter``) both serve with it.
"""

import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

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


class MetricsServer:
    """A small threaded HTTP server on ``host:port`` (port 0 picks a free one)."""

    def __init__(self, *, registry: CollectorRegistry, host: str, port: int) -> None:
        self.registry = registry
        self._routes: dict[str, RouteHandler] = {
            "/metrics": self._metrics,
            "/healthz": lambda _q: Reply(200, "text/plain", b"ok\n"),
        }
        routes = self._routes

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlsplit(self.path)
                handler = routes.get(url.path)
                if handler is None:
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

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

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
