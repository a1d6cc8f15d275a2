"""The agent's HTTP endpoint: /metrics from one CollectorRegistry, /healthz, and extra routes.

The exporter (``gpushare.node.exporter``) adds its collectors to the same registry and may add
routes (e.g. ``/profile``) through ``add_route``; see ``gpushare.node.extension``.
"""

import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

# (raw query string) -> (HTTP status, content type, body)
RouteHandler = Callable[[str], tuple[int, str, bytes]]


class MetricsServer:
    """A small threaded HTTP server on ``host:port`` (port 0 picks a free one)."""

    def __init__(self, *, registry: CollectorRegistry, host: str, port: int) -> None:
        self.registry = registry
        self._routes: dict[str, RouteHandler] = {
            "/metrics": self._metrics,
            "/healthz": lambda _q: (200, "text/plain", b"ok\n"),
        }
        routes = self._routes

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlsplit(self.path)
                handler = routes.get(url.path)
                if handler is None:
                    status, ctype, body = 404, "text/plain", f"no route {url.path}\n".encode()
                else:
                    try:
                        status, ctype, body = handler(url.query)
                    except Exception as exc:
                        log.exception("route %s failed", url.path)
                        status, ctype, body = 500, "text/plain", f"{exc}\n".encode()
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

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

    def _metrics(self, _query: str) -> tuple[int, str, bytes]:
        return 200, CONTENT_TYPE_LATEST, generate_latest(self.registry)

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
