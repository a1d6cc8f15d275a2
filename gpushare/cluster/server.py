"""HTTP layer: aiohttp applications for the extender (plus health and metrics) and the webhook.

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


def _json(data: object, *, status: int = 200) -> web.Response:
    # msgspec: a filter call carries hundreds of node names each way; the stdlib json module
    # was a visible share of the controller's CPU per pod at 1000 nodes.
    return web.Response(body=_encode.encode(data), status=status, content_type="application/json")


async def _body_json(request: web.Request) -> Any:
    return decode_body(await request.read())


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


def refusal(access: Access) -> web.Response:
    """The answer to a caller ``authorize`` turned away."""
    headers = {"WWW-Authenticate": 'Bearer realm="gpushare"'} if access.status == 401 else None
    return web.Response(status=access.status, text=f"gpushare: {access.reason}\n", headers=headers)


def health_routes(
    app: web.Application,
    *,
    ready: Readiness,
    metrics: Metrics | None,
    authorize: Authorize | None = None,
) -> None:
    """/healthz and /readyz (open: the kubelet probes them), /metrics (with ``authorize``,
    only for callers allowed to get it)."""

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        ok, why = ready()
        return web.Response(text=f"{why}\n", status=200 if ok else 503)

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    if metrics is not None:
        registry = metrics.registry

        async def prometheus(request: web.Request) -> web.Response:
            if authorize is not None:
                access = await authorize(request.headers.get("Authorization"), "/metrics")
                if not access.allowed:
                    return refusal(access)
            body = generate_latest(registry)
            resp = web.Response(body=body)
            resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
            return resp

        app.router.add_get("/metrics", prometheus)


def extender_app(
    extender: Extender,
    *,
    metrics: Metrics,
    ready: Readiness,
    prefix: str = "/scheduler",
    authorize: Authorize | None = None,
) -> web.Application:
    """POST {prefix}/filter, {prefix}/prioritize, {prefix}/bind; GET /healthz /readyz /metrics."""
    app = web.Application(
        client_max_size=MAX_BODY_BYTES, middlewares=[deadline(EXTENDER_DEADLINE_S)]
    )
    stages = metrics.bind_stage_seconds
    extender.bind_stage_observer = lambda stage, seconds: stages.labels(stage).observe(seconds)

    def verb(
        name: str, work: Callable[[Any], Awaitable[tuple[object, bool]]]
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        latency = metrics.extender_seconds.labels(name)

        async def handle(request: web.Request) -> web.Response:
            start = time.perf_counter()
            outcome = "ok"
            try:
                result, ok = await work(await _body_json(request))
                if not ok:
                    outcome = "error"
                return _json(result)
            except BadRequestError as exc:
                outcome = "bad_request"
                return _json({"Error": f"gpushare: bad {name} request: {exc}"}, status=400)
            except Exception as exc:
                outcome = "error"
                log.exception("extender call failed", extra={"verb": name})
                return _json({"Error": f"gpushare: internal error: {exc}"}, status=500)
            finally:
                latency.observe(time.perf_counter() - start)
                metrics.extender_requests.labels(name, outcome).inc()

        return handle

    async def do_filter(doc: Any) -> tuple[object, bool]:
        return extender.filter(parse_extender_args(doc)), True

    async def do_prioritize(doc: Any) -> tuple[object, bool]:
        return extender.prioritize(parse_extender_args(doc)), True

    async def do_bind(doc: Any) -> tuple[object, bool]:
        result = await extender.bind(parse_binding_args(doc))
        ok = not result.get("Error")
        metrics.binds.labels("bound" if ok else "failed").inc()
        return result, ok

    app.router.add_post(f"{prefix}/filter", verb("filter", do_filter))
    app.router.add_post(f"{prefix}/prioritize", verb("prioritize", do_prioritize))
    app.router.add_post(f"{prefix}/bind", verb("bind", do_bind))
    health_routes(app, ready=ready, metrics=metrics, authorize=authorize)
    return app


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
    health_routes(app, ready=ready, metrics=metrics, authorize=authorize)
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
        return _json(doc)
    outcome = "allowed" if verdict.allowed else "denied"
    metrics.webhook_requests.labels(name, outcome).inc()
    if not verdict.allowed:
        log.info(
            "pod refused",
            extra={"webhook": name, "namespace": parsed.namespace, "why": verdict.message},
        )
    return _json(doc)


class Listener:
    """One of the process's HTTP servers as a component: :meth:`start` listens (with
    ``wait_s``, trying that long while the port is taken: on a takeover on one host the old
    leader's socket may linger a moment), :meth:`stop` closes it."""

    def __init__(
        self,
        app: web.Application,
        *,
        host: str,
        port: int,
        ssl_context: object | None,
        reuse_port: bool = False,
        wait_s: float = 0.0,
    ) -> None:
        self.app, self.host, self.port = app, host, port
        self.ssl_context, self.reuse_port, self.wait_s = ssl_context, reuse_port, wait_s
        self._runner: BoundedRunner | None = None

    async def start(self) -> None:
        runner = BoundedRunner(self.app)
        await runner.setup()
        deadline = time.monotonic() + self.wait_s
        while True:
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
                self._runner = runner
                return
            except OSError as exc:
                if time.monotonic() < deadline:
                    await asyncio.sleep(0.2)
                    continue
                await runner.cleanup()
                raise InvalidInputError(
                    f"{self.host}:{self.port}",
                    f"cannot listen ({exc.strerror})",
                    "free the port or pick another",
                ) from None

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
