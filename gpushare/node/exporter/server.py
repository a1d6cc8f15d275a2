"""HTTP serving of /metrics and /profile, for a WSGI server thread or an aiohttp application.

Both variants serve the same handlers, so the node agent can mount them on whichever metrics
server it runs; ``start_http_server`` is what the standalone exporter uses.
"""

import asyncio
import json
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIServer, make_server

from prometheus_client import CollectorRegistry, generate_latest, make_wsgi_app
from prometheus_client.exposition import CONTENT_TYPE_LATEST, ThreadingWSGIServer, _SilentHandler

from gpushare.node.exporter.profiler import ProfileError, Profiler

if TYPE_CHECKING:
    from aiohttp import web

StartResponse = Callable[[str, list[tuple[str, str]]], Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 503: "Service Unavailable"}


def parse_single_query(raw: str) -> dict[str, str]:
    """``a=1&b=2`` -> dict; a repeated parameter is an error naming it."""
    parsed = parse_qs(raw, keep_blank_values=True)
    for key, values in parsed.items():
        if len(values) > 1:
            raise ProfileError(400, key, "is given more than once", f"pass {key} once")
    return {k: v[0] for k, v in parsed.items()}


def profile_response(profiler: Profiler, raw_query: str) -> tuple[int, dict[str, Any]]:
    try:
        query = parse_single_query(raw_query)
    except ProfileError as exc:
        return exc.status, exc.to_json()
    return profiler.handle_query(query)


def make_app(*, registry: CollectorRegistry, profiler: Profiler | None) -> WsgiApp:
    """WSGI app: /metrics (Prometheus text), /profile (JSON), /healthz."""
    metrics_app = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/profile" and profiler is not None:
            status, body = profile_response(profiler, environ.get("QUERY_STRING", ""))
            payload = json.dumps(body, sort_keys=True).encode()
            headers = [("Content-Type", "application/json")]
            if status == 503:
                headers.append(("Retry-After", "1"))
            start_response(f"{status} {_REASONS.get(status, '')}", headers)
            return [payload]
        if path == "/healthz":
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [b"ok\n"]
        result: Iterable[bytes] = metrics_app(environ, start_response)
        return result

    return app


def start_http_server(
    *,
    port: int,
    addr: str = "0.0.0.0",
    registry: CollectorRegistry,
    profiler: Profiler | None,
) -> tuple[WSGIServer, threading.Thread]:
    """Serve in a daemon thread (one thread per request); ``port=0`` picks a free port."""
    server = make_server(
        addr,
        port,
        make_app(registry=registry, profiler=profiler),
        ThreadingWSGIServer,
        handler_class=_SilentHandler,
    )
    thread = threading.Thread(target=server.serve_forever, name="gpushare-exporter-http")
    thread.daemon = True
    thread.start()
    return server, thread


def add_aiohttp_routes(
    app: "web.Application", *, registry: CollectorRegistry, profiler: Profiler | None
) -> None:
    """Mount GET /metrics and GET /profile on an aiohttp application (the agent's server)."""
    from aiohttp import web  # noqa: PLC0415  (only agents serving with aiohttp need it)

    async def metrics(_request: web.Request) -> web.Response:
        # Collecting reads in-memory state only, but keep the event loop free anyway.
        body = await asyncio.get_running_loop().run_in_executor(None, generate_latest, registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def profile(request: web.Request) -> web.Response:
        if profiler is None:
            raise web.HTTPNotFound()
        status, body = profile_response(profiler, request.query_string)
        headers = {"Retry-After": "1"} if status == 503 else {}
        return web.json_response(body, status=status, headers=headers)

    app.router.add_get("/metrics", metrics)
    app.router.add_get("/profile", profile)
