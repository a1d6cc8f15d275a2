"""The exporter's HTTP routes: ``/profile`` (JSON), served beside /metrics by the node side's
one server (:class:`~gpushare.node.metrics.MetricsServer`), in the agent or on its own."""

import json
from typing import Any
from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry

from gpushare.node.exporter.profiler import ProfileError, Profiler
from gpushare.node.metrics import MetricsServer, Reply


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


def profile_reply(profiler: Profiler, raw_query: str) -> Reply:
    """GET /profile: the profiler's answer as JSON; 503 (not ready yet) says when to ask again."""
    status, body = profile_response(profiler, raw_query)
    headers = (("Retry-After", "1"),) if status == 503 else ()
    return Reply(status, "application/json", json.dumps(body, sort_keys=True).encode(), headers)


def serve(
    *,
    registry: CollectorRegistry,
    profiler: Profiler | None,
    host: str = "0.0.0.0",
    port: int = 0,
) -> MetricsServer:
    """/metrics, /healthz and (with a profiler) /profile, started; ``port=0`` picks a free port
    (:attr:`MetricsServer.port`); ``stop()`` ends it."""
    server = MetricsServer(registry=registry, host=host, port=port)
    if profiler is not None:
        server.add_route("/profile", lambda query: profile_reply(profiler, query))
    server.start()
    return server
