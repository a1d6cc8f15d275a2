"""The admission process: the webhook's port (/mutate, /validate, the probes, /metrics).

What any pod sends here is read under bounds (:data:`LIMITS`, :mod:`gpushare.cluster.lean_http`):
connections and bodies per client address, a body's size before any of it is read, how long
a body and a connection may take, and how many JSON values a review may hold before it is
parsed. Reviews are worked one at a time on one thread, taken from each client in turn
(:class:`FairQueue`), so a client sending many waits behind its own. The process runs at a
lower CPU priority than the controller (:data:`NICENESS`): a flood costs the flooder and this
process, not the extender. It asks the controller only for facts
(:class:`~gpushare.cluster.webhook.facts.ClusterFacts`): their values come every
:data:`FACTS_PERIOD_S`, and each lookup is one small message answered on the controller's loop.
"""

import asyncio
import concurrent.futures
import contextlib
import ctypes
import itertools
import json
import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpushare.api.errors import InvalidInputError
from gpushare.api.logs import setup_json_logging
from gpushare.cluster.admission import link
from gpushare.cluster.admission.fair import FairQueue, LogBudget, LookupBudgetError
from gpushare.cluster.lean_http import LeanServer, Limits, Request, Response
from gpushare.cluster.tls import ReloadingServerTls
from gpushare.cluster.webhook import review as webhook
from gpushare.cluster.webhook.facts import ClusterFacts

log = logging.getLogger("gpushare.cluster.admission")

MAX_REVIEW_BYTES = 4 * 2**20
"""Largest AdmissionReview read: the API server takes request bodies of at most 3 MiB and
stores objects of at most 1.5 MiB (etcd's default), and a review of a CREATE carries the pod
once. A larger Content-Length gets 413 before any of the body is read."""
MAX_REVIEW_VALUES = 200_000
"""Most JSON values a review may hold (counted as its commas and colons, before parsing): a
real pod holds a few thousand; one of 4 million integers took the controller's loop for over
a second to parse."""
LIMITS = Limits(
    max_connections=512,
    idle_timeout_s=30.0,
    deadline_s=30.0,
    max_body_bytes=MAX_REVIEW_BYTES,
    per_client_connections=64,
    body_budget_bytes=64 * 2**20,
    per_client_body_bytes=16 * 2**20,
    body_deadline_s=10.0,
)
"""The webhook port's bounds. The API server opens a connection per admission in flight (64
is far above its concurrency here); the bodies in flight stay within 64 MiB whatever the
clients, 16 MiB per client; a body must be complete 10 s after its head (the API server sends
it at once); the API server gives up on a webhook after at most 30 s."""
FACTS_PERIOD_S = 0.5
"""How often the controller sends the facts' values and its readiness."""
STALE_READY_S = 5.0
"""/readyz fails when the controller has sent nothing for this long."""
STALE_ALIVE_S = 30.0
"""/healthz fails when the controller has sent nothing for this long (the kubelet restarts
the controller's container: its loop is stuck)."""
LOOKUP_TIMEOUT_S = 5.0
NICENESS = 19
"""Added to the process's nice value: under a flood the kernel gives the controller (and the
API server, kube-scheduler) the CPU first."""
MAX_DUTY = 0.25
"""Share of the time the review thread works (the rest it waits): a quarter of a core at most
for reviews, whatever a flood sends (issue 67: a third of a core, and the extender's filter
p99 grew with it). About 300 real reviews a second still fit."""
FORGET_CHECK_S = 0.05
"""How often the controller looks for a changed GpuShare or namespace and then tells the
process to forget the lookup answers it keeps (``forget``)."""
LOOKUP_TTL_S = 0.5
"""How long a lookup's answer is kept (the facts' values are as old: FACTS_PERIOD_S)."""
LOOKUPS_PER_CLIENT_S = 100.0
"""Lookups the cache could not answer, per client address and second (a bucket of as many):
a flooder naming a new share in every review asks the controller at most this often; the API
server asks once per distinct share or workload per LOOKUP_TTL_S."""
MAX_ANSWERS_KEPT = 4096
MAX_CLIENTS_KEPT = 4096
REPORT_PERIOD_S = 0.25
"""How often reviews done are reported to the controller (its metrics)."""
MAX_REPORTED = 4096
"""Reviews a report carries one by one (the rest only counted by their number)."""
METRICS_IN_FLIGHT = 2
REFUSALS_LOGGED = LogBudget(per_second=5.0, tokens=5.0)
"""Refused pods logged: at most 5 a second (a flood of forged reviews wrote a line each, 12,662
in a minute; the controller's metrics count them all)."""
"""/metrics requests forwarded to the controller at once (each may render every series)."""


@dataclass
class Link:
    """The child's end of the socket pair: facts and lookups from the controller."""

    writer: asyncio.StreamWriter
    loop: asyncio.AbstractEventLoop
    values: dict[str, Any] = field(default_factory=dict)
    lookups: tuple[str, ...] = ()
    ready: tuple[bool, str] = (False, "waiting for the controller")
    heard: float = field(default_factory=time.monotonic)
    asked: dict[int, "concurrent.futures.Future[Any]"] = field(default_factory=dict)
    metrics: dict[int, asyncio.Future[Response]] = field(default_factory=dict)
    ids: "itertools.count[int]" = field(default_factory=itertools.count)
    """Message ids (taken from both threads: ``next`` of a count is atomic)."""
    tls: ReloadingServerTls | None = None
    answers: dict[tuple[str, tuple[object, ...]], tuple[float, Any]] = field(default_factory=dict)
    """Lookup answers by (lookup, arguments), kept LOOKUP_TTL_S: a flood of reviews naming the
    same share asks the controller once per period."""
    budgets: dict[str, "LogBudget"] = field(default_factory=dict)
    """Per client address, its budget of lookups the cache could not answer."""
    counted: list[tuple[str, str, float]] = field(default_factory=list)
    """Reviews done since the last report to the controller (webhook, outcome, seconds)."""
    client: str = ""
    """The client address of the review being worked (one at a time, on the review thread)."""
    clients_certified: bool = False
    """Reviews are answered only to callers presenting a client certificate of the webhook's
    client CA (the API server's, ``--webhook-client-ca``)."""

    def send(self, *values: object) -> None:
        self.writer.write(link.child_frame(*values))

    def count(self, hook: str, outcome: str, seconds: float) -> None:
        """Remember one review done; the controller gets them in one message a period
        (``report``), not one each (a flood of reviews was a flood of messages on its loop)."""
        self.counted.append((hook, outcome, seconds))

    async def report(self) -> None:
        while True:
            await asyncio.sleep(REPORT_PERIOD_S)
            if self.counted:
                done, self.counted = self.counted, []
                self.send("done", [list(d) for d in done[:MAX_REPORTED]], len(done))

    def facts(self) -> ClusterFacts:
        """The facts as the controller last sent them, each lookup a question to it."""
        stubs: dict[str, Any] = {name: self._stub(name) for name in self.lookups}
        return ClusterFacts(**{**self.values, **stubs})

    def _stub(self, name: str) -> Callable[..., Any]:
        def ask(*args: object) -> Any:
            return self.ask(name, args)

        return ask

    def ask(self, name: str, args: tuple[object, ...]) -> Any:
        """Ask the controller (from the review thread), unless a recent answer is kept;
        raises when it cannot answer, or when the client of the review at work has asked
        more than its budget of lookups that were not kept (LOOKUPS_PER_CLIENT_S)."""
        key = (name, args)
        now = time.monotonic()
        kept = self.answers.get(key)
        if kept is not None and now - kept[0] < LOOKUP_TTL_S:
            return kept[1]
        budget = self.budgets.get(self.client)
        if budget is None:
            if len(self.budgets) >= MAX_CLIENTS_KEPT:
                self.budgets.clear()
            budget = self.budgets[self.client] = LogBudget(
                per_second=LOOKUPS_PER_CLIENT_S, tokens=LOOKUPS_PER_CLIENT_S
            )
        if not budget.take():
            raise LookupBudgetError(
                f"client {self.client} asked for more than {LOOKUPS_PER_CLIENT_S:g} lookups a "
                "second; retry"
            )
        value = self._ask(name, args)
        if len(self.answers) >= MAX_ANSWERS_KEPT:
            self.answers.clear()
        self.answers[key] = (now, value)
        return value

    def _ask(self, name: str, args: tuple[object, ...]) -> Any:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        ask_id = next(self.ids)
        self.asked[ask_id] = future
        self.loop.call_soon_threadsafe(self.send, "ask", ask_id, name, list(args))
        try:
            return future.result(timeout=LOOKUP_TIMEOUT_S)
        finally:
            self.asked.pop(ask_id, None)

    async def fetch_metrics(self, authorization: str | None, client: str) -> Response:
        metrics_id = next(self.ids)
        future: asyncio.Future[Response] = self.loop.create_future()
        self.metrics[metrics_id] = future
        self.send("metrics", metrics_id, authorization, client)
        try:
            async with asyncio.timeout(LOOKUP_TIMEOUT_S * 2):
                return await future
        finally:
            self.metrics.pop(metrics_id, None)

    def take(self, message: tuple[Any, ...]) -> None:
        """One message from the controller."""
        self.heard = time.monotonic()
        kind = message[0]
        if kind == "facts":
            _, self.values, self.lookups, self.ready = message
        elif kind == "forget":
            self.answers.clear()  # a share or namespace changed: ask again
        elif kind == "answer":
            _, ask_id, ok, value = message
            future = self.asked.get(ask_id)
            if future is not None and not future.done():
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(RuntimeError(f"the controller could not answer: {value}"))
        elif kind == "metrics":
            _, metrics_id, status, body, content_type, headers = message
            waiting = self.metrics.get(metrics_id)
            if waiting is not None and not waiting.done():
                waiting.set_result(Response(status, body, content_type, tuple(headers)))
        elif kind == "reload_tls" and self.tls is not None and self.tls.reload():
            log.info("webhook certificate reloaded", extra={"reloads": self.tls.reloads})


def review_work(body: bytes, hook: str, channel: Link, client: str = "") -> Response:
    """One review, on the review thread: parsed, answered; counted by the controller."""
    start = time.perf_counter()
    outcome = "error"
    channel.client = client
    try:
        response, outcome = _answer(body, hook, channel)
        return response
    finally:
        channel.count(hook, outcome, time.perf_counter() - start)


def _answer(body: bytes, hook: str, channel: Link) -> tuple[Response, str]:
    try:
        parsed = webhook.parse_review(body)
    except webhook.BadReviewError as exc:
        return Response.text(400, f"gpushare: bad AdmissionReview: {exc}\n"), "bad_request"
    try:
        doc, verdict = webhook.answer(parsed, facts=channel.facts(), mutate=hook == "mutate")
    except LookupBudgetError as exc:
        return Response.text(429, f"gpushare: {exc}\n"), "bad_request"
    except Exception as exc:
        # Never leave the API server without an answer for a pod we were asked about.
        log.exception("admission review failed", extra={"webhook": hook})
        doc = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": {
                "uid": parsed.uid,
                "allowed": False,
                "status": {"code": 500, "message": f"gpushare: internal error: {exc}"},
            },
        }
        return _json(doc), "error"
    if not verdict.allowed and REFUSALS_LOGGED.take():
        log.info(
            "pod refused",
            extra={"webhook": hook, "namespace": parsed.namespace, "why": verdict.message},
        )
    return _json(doc), "allowed" if verdict.allowed else "denied"


def _json(doc: object) -> Response:
    return Response(200, json.dumps(doc).encode(), content_type="application/json")


NOT_THE_API_SERVER = Response.text(
    403,
    "gpushare: this webhook answers only the API server, which presents a client certificate "
    "of the webhook's client CA (--webhook-client-ca); fix: configure the API server's "
    "AdmissionConfiguration with that certificate for this webhook\n",
)


def too_many_values(body: bytes) -> Response | None:
    """413 for a review holding more than MAX_REVIEW_VALUES values (counted, not parsed)."""
    values = body.count(b",") + body.count(b":")
    if values <= MAX_REVIEW_VALUES:
        return None
    return Response.text(
        413,
        f"gpushare: bad AdmissionReview: holds about {values} JSON values (at most "
        f"{MAX_REVIEW_VALUES}); the API server sends one pod\n",
    )


def routes(channel: Link, queue: FairQueue) -> dict[tuple[str, str], Any]:
    """The webhook port's routes."""

    def reviewer(hook: str) -> Callable[[Request], Any]:
        async def handle(request: Request) -> Response:
            if channel.clients_certified and not request.certified:
                channel.count(hook, "bad_request", 0.0)
                return NOT_THE_API_SERVER
            refusal = too_many_values(request.body)
            if refusal is not None:
                channel.count(hook, "bad_request", 0.0)
                return refusal
            body = request.body
            client = request.client
            return await queue.submit(client, lambda: review_work(body, hook, channel, client))

        return handle

    def healthz(_: Request) -> Response:
        if time.monotonic() - channel.heard > STALE_ALIVE_S:
            return Response.text(503, "the controller has not answered for 30 s\n")
        return Response.text(200, "ok\n")

    def readyz(_: Request) -> Response:
        if time.monotonic() - channel.heard > STALE_READY_S:
            return Response.text(503, "the controller is not answering\n")
        ok, why = channel.ready
        return Response.text(200 if ok else 503, f"{why}\n")

    in_flight: dict[str, int] = {}

    async def metrics(request: Request) -> Response:
        if sum(in_flight.values()) >= METRICS_IN_FLIGHT or in_flight.get(request.client):
            return Response.text(503, "gpushare: /metrics is busy; retry\n")
        in_flight[request.client] = 1
        try:
            return await channel.fetch_metrics(request.headers.get("authorization"), request.client)
        finally:
            in_flight.pop(request.client, None)

    return {
        ("POST", "/mutate"): reviewer("mutate"),
        ("POST", "/validate"): reviewer("validate"),
        ("GET", "/healthz"): healthz,
        ("GET", "/readyz"): readyz,
        ("GET", "/metrics"): metrics,
    }


async def serve(config: dict[str, Any]) -> None:
    """Listen on the webhook's port until the controller closes the socket pair."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(fileno=int(config["fd"]))
    reader, writer = await asyncio.open_connection(sock=sock, limit=2**16)
    channel = Link(writer=writer, loop=loop)
    client_ca = Path(config["client_ca"]) if config.get("client_ca") else None
    channel.clients_certified = client_ca is not None
    if config["cert"]:
        try:
            channel.tls = ReloadingServerTls(
                cert=Path(config["cert"]),
                key=Path(config["key"]),
                client_ca=client_ca,
                client_optional=True,
            )
        except Exception as exc:
            channel.send("failed", f"cannot load the webhook certificate ({exc})")
            await writer.drain()
            return
    limits = Limits(**config["limits"]) if "limits" in config else LIMITS
    server = LeanServer(routes(channel, FairQueue(duty=MAX_DUTY)), limits)
    try:
        await server.start(
            config["host"],
            int(config["port"]),
            ssl_context=channel.tls.context if channel.tls is not None else None,
            reuse_port=bool(config.get("reuse_port")),
            tls_after_accept=True,
        )
    except OSError as exc:
        channel.send("failed", exc.strerror or str(exc))
        await writer.drain()
        return
    channel.send("listening", server.port)
    reporting = asyncio.create_task(channel.report())
    try:
        while (message := await link.read_from_parent(reader)) is not None:
            channel.take(message)
    except ConnectionError:
        pass  # the controller ended
    finally:
        reporting.cancel()
        await server.stop()


PR_SET_PDEATHSIG = 1


def _end_with_parent() -> None:
    """Have the kernel end this process when the controller does (Linux), so a killed
    controller's port is free at once for the next one; elsewhere the closed socket pair
    ends it."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def main(argv: list[str]) -> int:
    """The process: its configuration (JSON, from the controller) in ``argv[0]``."""
    config = json.loads(argv[0])
    setup_json_logging(
        component="gpushare-controller-webhook", level=config.get("log_level", "INFO")
    )
    with contextlib.suppress(OSError):
        os.nice(NICENESS)
    _end_with_parent()
    try:
        asyncio.run(serve(config))
    except InvalidInputError as exc:
        log.error("cannot serve the webhook", extra={"error": str(exc)})
        return 2
    return 0
