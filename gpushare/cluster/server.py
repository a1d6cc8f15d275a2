"""HTTP layer: the extender's port (verbs, health, metrics) on :mod:`gpushare.cluster.lean_http`,
the webhook's on aiohttp.

Handlers only parse, time and answer; the decisions live in extender.py and webhook.py. Any
malformed body gets a 4xx with the reason, and no request can stop the server.
"""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gpushare.api.errors import InvalidInputError
from gpushare.cluster.extender.args import BadRequestError, parse_binding_args, parse_extender_args
from gpushare.cluster.extender.verbs import Extender
from gpushare.cluster.lean_http import Handler, LeanServer, Limits, Request, Response, Routes
from gpushare.cluster.metrics import Metrics
from gpushare.cluster.webhook import review as webhook
from gpushare.cluster.webhook.facts import ClusterFacts
from gpushare.kube.access import Access

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 2**20
"""Enough for a NodeList of thousands of nodes (schedulers that are not nodeCacheCapable)."""

Readiness = Callable[[], tuple[bool, str]]
FactsSource = Callable[[], ClusterFacts]
Authorize = Callable[[str | None, str], Awaitable[Access]]
"""(the Authorization header, the path) -> may the caller read it (gpushare.kube.access)."""

MAX_CONNECTIONS = 256
"""Open connections per server; one more is closed at once (the API server and kube-scheduler
keep a few each)."""
IDLE_TIMEOUT_S = 30.0
"""A connection that sends no complete request for this long is closed (also one that sends
its headers a byte at a time)."""
WEBHOOK_DEADLINE_S = 30.0
"""The API server gives up on a webhook after at most 30 s: no review is worked on longer."""
EXTENDER_DEADLINE_S = 60.0
"""Longest extender request (a bind waits at most the allocation gate, 5 s by default)."""
EXTENDER_LIMITS = Limits(
    max_connections=MAX_CONNECTIONS,
    idle_timeout_s=IDLE_TIMEOUT_S,
    deadline_s=EXTENDER_DEADLINE_S,
    max_body_bytes=MAX_BODY_BYTES,
)


class _Refused(asyncio.Protocol):
    """The protocol of a connection over the bound: closed at once."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class _BoundedServer(web.Server):
    max_connections = MAX_CONNECTIONS

    def __call__(self) -> Any:
        if len(self.connections) >= self.max_connections:
            log.warning("connection refused: too many open", extra={"open": self.max_connections})
            return _Refused()
        return super().__call__()


class BoundedRunner(web.AppRunner):
    """An AppRunner whose server keeps at most ``max_connections`` connections (TLS handshakes
    in flight are bounded by asyncio's 60 s handshake timeout) and closes idle ones after
    ``idle_timeout_s``."""

    def __init__(
        self,
        app: web.Application,
        *,
        max_connections: int = MAX_CONNECTIONS,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
    ) -> None:
        super().__init__(
            app, access_log=None, handle_signals=False, keepalive_timeout=idle_timeout_s
        )
        self._max_connections = max_connections

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _BoundedServer
        server.max_connections = self._max_connections  # type: ignore[attr-defined]
        return server


def deadline(seconds: float) -> Any:
    """Middleware: a request not answered within ``seconds`` (a body sent slowly, a stuck
    call) gets 503 and its work is cancelled."""

    @web.middleware
    async def within(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        try:
            async with asyncio.timeout(seconds):
                return await handler(request)
        except TimeoutError:
            return web.Response(
                status=503, text=f"gpushare: no answer within {seconds:g}s; retry\n"
            )

    return within


_encode = msgspec.json.Encoder()
_decode = msgspec.json.Decoder()


def _json(data: object, *, status: int = 200) -> Response:
    # msgspec: a filter call carries hundreds of node names each way; the stdlib json module
    # was a visible share of the controller's CPU per pod at 1000 nodes.
    return Response(status, _encode.encode(data), content_type="application/json")


def _web_json(data: object) -> web.Response:
    return web.Response(body=_encode.encode(data), content_type="application/json")


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
                access = await authorize(request.headers.get("authorization"), "/metrics")
                if not access.allowed:
                    return _refusal(access)
            return Response(200, generate_latest(registry), content_type=CONTENT_TYPE_LATEST)

        handlers[("GET", "/metrics")] = prometheus
    return handlers


def _on_aiohttp(handler: Handler) -> Callable[[web.Request], Awaitable[web.Response]]:
    """A lean handler served by an aiohttp application (the webhook port's health routes)."""

    async def handle(request: web.Request) -> web.Response:
        headers = {k.lower(): v for k, v in request.headers.items()}
        result = handler(Request(request.method, request.path, headers, await request.read()))
        answer = result if isinstance(result, Response) else await result
        return web.Response(
            status=answer.status,
            body=answer.body,
            headers={"Content-Type": answer.content_type, **dict(answer.headers)},
        )

    return handle


def extender_routes(
    extender: Extender,
    *,
    metrics: Metrics,
    prefix: str = "/scheduler",
    ready: Readiness,
    authorize: Authorize | None = None,
) -> Routes:
    """POST {prefix}/filter, {prefix}/prioritize, {prefix}/bind; GET /healthz /readyz /metrics.
    Filter and prioritize answer inside the call that read the request (lean_http)."""
    stages = metrics.bind_stage_seconds
    extender.bind_stage_observer = lambda stage, seconds: stages.labels(stage).observe(seconds)

    def filter_work(doc: Any) -> tuple[object, bool]:
        return extender.filter(parse_extender_args(doc)), True

    def prioritize_work(doc: Any) -> tuple[object, bool]:
        return extender.prioritize(parse_extender_args(doc)), True

    async def bind_work(doc: Any) -> tuple[object, bool]:
        result = await extender.bind(parse_binding_args(doc))
        ok = not result.get("Error")
        metrics.binds.labels("bound" if ok else "failed").inc()
        return result, ok

    routes: dict[tuple[str, str], Handler] = {
        ("POST", f"{prefix}/filter"): _Verb("filter", metrics).answer(filter_work),
        ("POST", f"{prefix}/prioritize"): _Verb("prioritize", metrics).answer(prioritize_work),
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


def webhook_app(
    *,
    facts: FactsSource,
    metrics: Metrics,
    ready: Readiness,
    authorize: Authorize | None = None,
) -> web.Application:
    """POST /mutate and /validate (AdmissionReview v1); GET /healthz /readyz /metrics.

    An answer has no side effect: anyone who reaches this port can post a review (the API
    server proves nothing to a webhook), so a review only reads the view (docs/security.md,
    "Nothing with side effects on an unauthenticated request")."""
    app = web.Application(client_max_size=8 * 2**20, middlewares=[deadline(WEBHOOK_DEADLINE_S)])
    app.router.add_post("/mutate", _review_handler("mutate", facts, metrics, mutate=True))
    app.router.add_post("/validate", _review_handler("validate", facts, metrics, mutate=False))
    # /metrics here too: every replica serves this port, and it asks for no client certificate
    # (so a bearer token, checked by ``authorize``).
    for (method, path), handler in health_handlers(
        ready=ready, metrics=metrics, authorize=authorize
    ).items():
        app.router.add_route(method, path, _on_aiohttp(handler))
    return app


def _review_handler(
    name: str, facts: FactsSource, metrics: Metrics, *, mutate: bool
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """The handler of one webhook (``mutate`` or ``validate``), timed and counted by outcome."""
    latency = metrics.webhook_seconds.labels(name)

    async def handle(request: web.Request) -> web.Response:
        start = time.perf_counter()
        try:
            return await _answer_review(request, name, facts, metrics, mutate=mutate)
        finally:
            latency.observe(time.perf_counter() - start)

    return handle


async def _answer_review(
    request: web.Request, name: str, facts: FactsSource, metrics: Metrics, *, mutate: bool
) -> web.Response:
    """One AdmissionReview answered: 400 for one that is not, a refusal (never no answer) when
    reviewing fails, else the verdict."""
    try:
        parsed = webhook.parse_review(await request.read())
    except webhook.BadReviewError as exc:
        metrics.webhook_requests.labels(name, "bad_request").inc()
        return web.Response(text=f"gpushare: bad AdmissionReview: {exc}\n", status=400)
    try:
        doc, verdict = webhook.answer(parsed, facts=facts(), mutate=mutate)
    except Exception as exc:
        # Never leave the API server without an answer for a pod we were asked about.
        log.exception("admission review failed", extra={"webhook": name})
        metrics.webhook_requests.labels(name, "error").inc()
        doc = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": {
                "uid": parsed.uid,
                "allowed": False,
                "status": {"code": 500, "message": f"gpushare: internal error: {exc}"},
            },
        }
        return _web_json(doc)
    outcome = "allowed" if verdict.allowed else "denied"
    metrics.webhook_requests.labels(name, outcome).inc()
    if not verdict.allowed:
        log.info(
            "pod refused",
            extra={"webhook": name, "namespace": parsed.namespace, "why": verdict.message},
        )
    return _web_json(doc)


class Listener:
    """One of the process's HTTP servers as a component: :meth:`start` listens (with
    ``wait_s``, trying that long while the port is taken: on a takeover on one host the old
    leader's socket may linger a moment), :meth:`stop` closes it. An aiohttp application (the
    webhook's) or lean routes (the extender's, with ``limits``)."""

    def __init__(
        self,
        app: web.Application | Routes,
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
        self._runner: BoundedRunner | None = None
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
        if not isinstance(self.app, web.Application):
            lean = LeanServer(self.app, self.limits)
            await lean.start(
                self.host, self.port, ssl_context=self.ssl_context, reuse_port=self.reuse_port
            )
            self._lean = lean
            return
        runner = BoundedRunner(self.app)
        await runner.setup()
        site = web.TCPSite(
            runner,
            self.host,
            self.port,
            ssl_context=self.ssl_context,  # type: ignore[arg-type]
            reuse_address=True,
            reuse_port=self.reuse_port or None,
        )
        try:
            await site.start()
        except OSError:
            await runner.cleanup()
            raise
        self._runner = runner

    @property
    def bound_port(self) -> int:
        """The port listened on (the one picked for port 0)."""
        if self._lean is not None:
            return self._lean.port
        assert self._runner is not None
        return int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        if self._lean is not None:
            await self._lean.stop()
            self._lean = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
