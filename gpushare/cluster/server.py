"""HTTP layer: the extender's port (verbs, health, metrics) on :mod:`gpushare.cluster.lean_http`.
The webhook's port is served by the admission process (:mod:`gpushare.cluster.admission`).

Handlers only parse, time and answer; the decisions live in the extender. Any malformed body
gets a 4xx with the reason, and no request can stop the server.
"""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import msgspec
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gpushare.api.errors import InvalidInputError
from gpushare.cluster.extender.args import (
    BadRequestError,
    parse_binding_args,
    parse_extender_args,
    parse_preemption_args,
)
from gpushare.cluster.extender.verbs import Extender
from gpushare.cluster.lean_http import Handler, LeanServer, Limits, Request, Response, Routes
from gpushare.cluster.metrics import Metrics
from gpushare.kube.access import Access

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 2**20
"""Enough for a NodeList of thousands of nodes (schedulers that are not nodeCacheCapable)."""

Readiness = Callable[[], tuple[bool, str]]


class Authorize(Protocol):
    """(the Authorization header, the path, the caller's address) -> may the caller read it
    (gpushare.kube.access)."""

    def __call__(
        self, authorization: str | None, path: str, *, client: str = ""
    ) -> Awaitable[Access]: ...


MAX_CONNECTIONS = 256
"""Open connections per server; one more is closed at once (the API server and kube-scheduler
keep a few each)."""
IDLE_TIMEOUT_S = 30.0
"""A connection that sends no complete request for this long is closed (also one that sends
its headers a byte at a time)."""
EXTENDER_DEADLINE_S = 60.0
"""Longest extender request (a bind waits at most the allocation gate, 5 s by default)."""
PER_CLIENT_CONNECTIONS = 64
"""Connections of one client address (kube-scheduler keeps a few, more while binds run in
parallel): a client holding every connection no longer shuts kube-scheduler out (issue 67)."""
EXTENDER_LIMITS = Limits(
    max_connections=MAX_CONNECTIONS,
    idle_timeout_s=IDLE_TIMEOUT_S,
    deadline_s=EXTENDER_DEADLINE_S,
    max_body_bytes=MAX_BODY_BYTES,
    per_client_connections=PER_CLIENT_CONNECTIONS,
)


_encode = msgspec.json.Encoder()
_decode = msgspec.json.Decoder()


def _json(data: object, *, status: int = 200) -> Response:
    # msgspec: a filter call carries hundreds of node names each way; the stdlib json module
    # was a visible share of the controller's CPU per pod at 1000 nodes.
    return Response(status, _encode.encode(data), content_type="application/json")


def decode_body(raw: bytes) -> Any:
    """An extender request body as plain JSON values; BadRequestError for anything else."""
    try:
        return _decode.decode(raw)
    except msgspec.DecodeError as exc:  # also integers and floats out of range
        raise BadRequestError(f"body is not JSON: {exc}") from None
    except UnicodeDecodeError:  # a string holding bytes that are not UTF-8 (found by fuzzing)
        raise BadRequestError("body is not JSON: a string is not valid UTF-8") from None
    except RecursionError:  # msgspec checks the interpreter's limit, and fails cleanly
        raise BadRequestError("body is nested too deeply") from None


def _refusal(access: Access) -> Response:
    """The answer to a caller ``authorize`` turned away."""
    headers = (("WWW-Authenticate", 'Bearer realm="gpushare"'),) if access.status == 401 else ()
    return Response.text(access.status, f"gpushare: {access.reason}\n", headers=headers)


def health_handlers(
    *, ready: Readiness, metrics: Metrics | None, authorize: Authorize | None = None
) -> dict[tuple[str, str], Handler]:
    """GET /healthz and /readyz (open: the kubelet probes them), /metrics (with ``authorize``,
    only for callers allowed to get it)."""

    def healthz(_: Request) -> Response:
        return Response.text(200, "ok\n")

    def readyz(_: Request) -> Response:
        ok, why = ready()
        return Response.text(200 if ok else 503, f"{why}\n")

    handlers: dict[tuple[str, str], Handler] = {
        ("GET", "/healthz"): healthz,
        ("GET", "/readyz"): readyz,
    }
    if metrics is not None:
        registry = metrics.registry

        async def prometheus(request: Request) -> Response:
            if authorize is not None:
                access = await authorize(
                    request.headers.get("authorization"), "/metrics", client=request.client
                )
                if not access.allowed:
                    return _refusal(access)
            return Response(200, generate_latest(registry), content_type=CONTENT_TYPE_LATEST)

        handlers[("GET", "/metrics")] = prometheus
    return handlers


def extender_routes(
    extender: Extender,
    *,
    metrics: Metrics,
    prefix: str = "/scheduler",
    ready: Readiness,
    authorize: Authorize | None = None,
) -> Routes:
    """POST {prefix}/filter, {prefix}/prioritize, {prefix}/preempt, {prefix}/bind; GET /healthz
    /readyz /metrics.
    Filter and prioritize answer inside the call that read the request (lean_http)."""
    stages = metrics.bind_stage_seconds
    extender.bind_stage_observer = lambda stage, seconds: stages.labels(stage).observe(seconds)

    def filter_work(doc: Any) -> tuple[object, bool]:
        return extender.filter(parse_extender_args(doc)), True

    def prioritize_work(doc: Any) -> tuple[object, bool]:
        return extender.prioritize(parse_extender_args(doc)), True

    def preempt_work(doc: Any) -> tuple[object, bool]:
        return extender.preempt(parse_preemption_args(doc)), True

    async def bind_work(doc: Any) -> tuple[object, bool]:
        result = await extender.bind(parse_binding_args(doc))
        ok = not result.get("Error")
        metrics.binds.labels("bound" if ok else "failed").inc()
        return result, ok

    routes: dict[tuple[str, str], Handler] = {
        ("POST", f"{prefix}/filter"): _Verb("filter", metrics).answer(filter_work),
        ("POST", f"{prefix}/prioritize"): _Verb("prioritize", metrics).answer(prioritize_work),
        ("POST", f"{prefix}/preempt"): _Verb("preempt", metrics).answer(preempt_work),
        ("POST", f"{prefix}/bind"): _Verb("bind", metrics).answer_later(bind_work),
    }
    routes.update(health_handlers(ready=ready, metrics=metrics, authorize=authorize))
    return routes


class _Verb:
    """One extender verb's timing, outcome counting and error answers."""

    def __init__(self, name: str, metrics: Metrics) -> None:
        self.name = name
        self.latency = metrics.extender_seconds.labels(name)
        self.outcomes = {o: metrics.extender_requests.labels(name, o) for o in OUTCOMES}

    def answer(self, work: Callable[[Any], tuple[object, bool]]) -> Handler:
        def handle(request: Request) -> Response:
            start = time.perf_counter()
            try:
                return self._done(*work(decode_body(request.body)), start=start)
            except Exception as exc:
                return self._failed(exc, start=start)

        return handle

    def answer_later(self, work: Callable[[Any], Awaitable[tuple[object, bool]]]) -> Handler:
        async def handle(request: Request) -> Response:
            start = time.perf_counter()
            try:
                return self._done(*await work(decode_body(request.body)), start=start)
            except Exception as exc:
                return self._failed(exc, start=start)

        return handle

    def _done(self, result: object, ok: bool, *, start: float) -> Response:
        answer = _json(result)
        self._count("ok" if ok else "error", start)
        return answer

    def _failed(self, exc: Exception, *, start: float) -> Response:
        if isinstance(exc, BadRequestError):
            self._count("bad_request", start)
            return _json({"Error": f"gpushare: bad {self.name} request: {exc}"}, status=400)
        log.exception("extender call failed", extra={"verb": self.name})
        self._count("error", start)
        return _json({"Error": f"gpushare: internal error: {exc}"}, status=500)

    def _count(self, outcome: str, start: float) -> None:
        self.latency.observe(time.perf_counter() - start)
        self.outcomes[outcome].inc()


OUTCOMES = ("ok", "error", "bad_request")


class Listener:
    """One of the process's HTTP servers as a component: :meth:`start` listens (with
    ``wait_s``, trying that long while the port is taken: on a takeover on one host the old
    leader's socket may linger a moment), :meth:`stop` closes it. Lean routes (the
    extender's, with ``limits``)."""

    def __init__(
        self,
        app: Routes,
        *,
        host: str,
        port: int,
        ssl_context: object | None,
        reuse_port: bool = False,
        wait_s: float = 0.0,
        limits: Limits | None = None,
    ) -> None:
        self.app, self.host, self.port = app, host, port
        self.ssl_context, self.reuse_port, self.wait_s = ssl_context, reuse_port, wait_s
        self.limits = limits or EXTENDER_LIMITS
        self._lean: LeanServer | None = None

    async def start(self) -> None:
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                await self._open()
                return
            except OSError as exc:
                if time.monotonic() < deadline:
                    await asyncio.sleep(0.2)
                    continue
                raise InvalidInputError(
                    f"{self.host}:{self.port}",
                    f"cannot listen ({exc.strerror})",
                    "free the port or pick another",
                ) from None

    async def _open(self) -> None:
        lean = LeanServer(self.app, self.limits)
        await lean.start(
            self.host, self.port, ssl_context=self.ssl_context, reuse_port=self.reuse_port
        )
        self._lean = lean

    @property
    def bound_port(self) -> int:
        """The port listened on (the one picked for port 0)."""
        assert self._lean is not None
        return self._lean.port

    async def stop(self) -> None:
        if self._lean is not None:
            await self._lean.stop()
            self._lean = None
