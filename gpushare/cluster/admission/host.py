"""The controller's side of the admission process: starts it, answers its lookups from the
view, sends it the facts' values and readiness every FACTS_PERIOD_S, counts its reviews in the
controller's metrics, and starts it again should it end (:mod:`gpushare.cluster.admission`).

What the controller does per review is one lookup message or a few (a GpuShare by name, a
workload's marks), each a dictionary read on its loop; no byte a client sent reaches it but
those lookups' arguments (short strings, checked by :func:`link.plain_args`)."""

import asyncio
import contextlib
import dataclasses
import json
import logging
import socket
import sys
import time
from pathlib import Path
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gpushare.api.errors import InvalidInputError
from gpushare.cluster.admission import link
from gpushare.cluster.admission.child import FACTS_PERIOD_S, FORGET_CHECK_S, LIMITS, MAX_REPORTED
from gpushare.cluster.context import ControllerContext
from gpushare.cluster.lean_http import Limits
from gpushare.cluster.tls import ReloadingServerTls
from gpushare.cluster.webhook.facts import ClusterFacts

log = logging.getLogger("gpushare.cluster.admission")

START_TIMEOUT_S = 60.0
"""How long the admission process may take to import and listen."""
RESTART_DELAY_S = 1.0
YIELD_AFTER_S = 0.0005
"""Longest the controller's loop answers the admission process's messages in one go."""


class ForwardingTls(ReloadingServerTls):
    """The webhook's certificate files as the controller tracks them (the certificate reload
    duty decides when a rotated certificate may be served); each reload is passed on to the
    admission process, which serves them."""

    process: "AdmissionProcess | None" = None

    def reload(self) -> bool:
        ok = super().reload()
        if ok and self.process is not None:
            self.process.send("reload_tls")
        return ok


class AdmissionProcess:
    """The webhook's port as a component of the controller: :meth:`start` starts the process
    and returns once it listens (raising InvalidInputError when it cannot, like
    :class:`gpushare.cluster.server.Listener`), :meth:`stop` ends it. Without ``cert`` it
    serves plain HTTP (tests)."""

    def __init__(
        self,
        ctx: ControllerContext,
        *,
        host: str,
        port: int,
        cert: Path | None,
        key: Path | None,
        reuse_port: bool = False,
        wait_s: float = 0.0,
        limits: Limits = LIMITS,
        client_ca: Path | None = None,
    ) -> None:
        self.ctx = ctx
        self.config: dict[str, Any] = {
            "host": host,
            "port": port,
            "cert": str(cert) if cert is not None else "",
            "key": str(key) if key is not None else "",
            "reuse_port": reuse_port,
            "log_level": ctx.settings.process.log_level,
            "limits": dataclasses.asdict(limits),
            "client_ca": str(client_ca) if client_ca is not None else "",
        }
        self.wait_s = wait_s
        self.port = port
        self.starts = 0
        self._proc: asyncio.subprocess.Process | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._facts: ClusterFacts | None = None
        self.lookups_answered = 0
        """Lookups the admission process asked the controller for (tests, diagnostics)."""
        self._lookups: tuple[str, ...] = ()
        if isinstance(ctx.webhook_tls, ForwardingTls):
            ctx.webhook_tls.process = self

    @property
    def bound_port(self) -> int:
        return self.port

    @property
    def pid(self) -> int | None:
        """The admission process's id while it runs."""
        return self._proc.pid if self._proc is not None else None

    async def start(self) -> None:
        deadline = time.monotonic() + self.wait_s
        while True:
            reader, failure = await self._spawn()
            if reader is not None:
                break
            if time.monotonic() < deadline:
                await asyncio.sleep(0.2)
                continue
            raise InvalidInputError(
                f"{self.config['host']}:{self.config['port']}",
                f"cannot serve the webhook ({failure})",
                "free the port or pick another",
            )
        self._tasks = [
            asyncio.create_task(self._supervise(reader), name="admission process"),
            asyncio.create_task(self._push_facts(), name="admission facts"),
        ]

    async def _spawn(self) -> tuple[asyncio.StreamReader | None, str]:
        """Start the process; (its reader, "") once it listens, else (None, why)."""
        mine, theirs = socket.socketpair()
        self.starts += 1
        try:
            self._proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "gpushare.cluster.admission",
                json.dumps({**self.config, "fd": theirs.fileno()}),
                pass_fds=(theirs.fileno(),),
            )
        finally:
            theirs.close()
        reader, self._writer = await asyncio.open_connection(sock=mine, limit=2**16)
        self._send_facts()
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                first = await link.read_from_child(reader)
        except (TimeoutError, link.LinkError) as exc:
            first = ["failed", f"no answer: {exc}"]
        if first is not None and first[0] == "listening" and isinstance(first[1], int):
            self.port = first[1]
            log.info("admission process listening", extra={"port": self.port})
            return reader, ""
        why = str(first[1])[:300] if first is not None and len(first) > 1 else "it ended"
        await self._end_process()
        return None, why

    async def _supervise(self, reader: asyncio.StreamReader) -> None:
        """Answer the process; start it again when it ends (after RESTART_DELAY_S)."""
        while not self._stopping:
            try:
                await self._serve(reader)
            except link.LinkError as exc:
                log.error("admission process sent a malformed message", extra={"error": str(exc)})
            await self._end_process()
            if self._stopping:
                return
            log.error("admission process ended; starting it again")
            while not self._stopping:
                await asyncio.sleep(RESTART_DELAY_S)
                started, why = await self._spawn()
                if started is not None:
                    reader = started
                    break
                log.error("admission process could not start", extra={"error": why})

    async def _serve(self, reader: asyncio.StreamReader) -> None:
        turn = time.perf_counter()
        while (message := await link.read_from_child(reader)) is not None:
            if time.perf_counter() - turn > YIELD_AFTER_S:
                # Messages already buffered are read without a pause: let the extender in.
                await asyncio.sleep(0)
                turn = time.perf_counter()
            kind = message[0]
            if kind == "ask" and len(message) == 4:
                self._answer(message[1], message[2], message[3])
            elif kind == "done" and len(message) == 3 and isinstance(message[1], list):
                for entry in message[1][:MAX_REPORTED]:
                    if isinstance(entry, list) and len(entry) == 3:
                        self._count(*entry)
            elif kind == "metrics" and len(message) == 4:
                task = asyncio.create_task(self._metrics(message[1], message[2], message[3]))
                self._tasks.append(task)
                task.add_done_callback(self._tasks.remove)
            else:
                raise link.LinkError(f"unknown message {kind!r}")

    def _answer(self, ask_id: object, name: object, args: object) -> None:
        self.lookups_answered += 1
        try:
            if name not in self._lookups or not isinstance(ask_id, int):
                raise link.LinkError(f"no lookup {name!r}")
            assert self._facts is not None
            value = getattr(self._facts, str(name))(*link.plain_args(args))
            self.send("answer", ask_id, True, value)
        except Exception as exc:
            log.warning("admission lookup failed", extra={"lookup": str(name), "error": str(exc)})
            self.send("answer", ask_id, False, str(exc)[:300])

    def _count(self, hook: object, outcome: object, seconds: object) -> None:
        metrics = self.ctx.metrics
        if hook not in ("mutate", "validate") or outcome not in _OUTCOMES:
            return
        if isinstance(seconds, int | float) and 0 <= seconds < 3600:
            metrics.webhook_seconds.labels(hook).observe(seconds)
        metrics.webhook_requests.labels(hook, outcome).inc()

    async def _metrics(self, metrics_id: object, authorization: object, client: object) -> None:
        header = authorization if isinstance(authorization, str) else None
        address = client[:64] if isinstance(client, str) else ""
        access = await self.ctx.authorize(header, "/metrics", client=address)
        if not access.allowed:
            headers = (
                [("WWW-Authenticate", 'Bearer realm="gpushare"')] if access.status == 401 else []
            )
            body = f"gpushare: {access.reason}\n".encode()
            self.send(
                "metrics", metrics_id, access.status, body, "text/plain; charset=utf-8", headers
            )
            return
        body = generate_latest(self.ctx.metrics.registry)
        self.send("metrics", metrics_id, 200, body, CONTENT_TYPE_LATEST, [])

    async def _push_facts(self) -> None:
        """The facts every FACTS_PERIOD_S; ``forget`` within FORGET_CHECK_S of a GpuShare or
        namespace change, so that the answers the process keeps (LOOKUP_TTL_S) are never
        older than the view: a pod created right after a share is linked to it."""
        sent = time.monotonic()
        seen = self.ctx.view.lookups_version
        while True:
            await asyncio.sleep(FORGET_CHECK_S)
            version = self.ctx.view.lookups_version
            if version != seen:
                seen = version
                self.send("forget")
            if time.monotonic() - sent >= FACTS_PERIOD_S:
                sent = time.monotonic()
                self._send_facts()

    def _send_facts(self) -> None:
        """The facts' values and lookup names, and the controller's readiness."""
        facts = self._facts = self.ctx.cluster_facts()
        values: dict[str, Any] = {}
        lookups: list[str] = []
        for f in dataclasses.fields(facts):
            value = getattr(facts, f.name)
            if callable(value):
                lookups.append(f.name)
            elif value is not None:
                values[f.name] = value
        self._lookups = tuple(lookups)
        self.send("facts", values, self._lookups, self.ctx.ready())

    def send(self, *values: object) -> None:
        writer = self._writer
        if writer is not None and not writer.is_closing():
            writer.write(link.parent_frame(*values))

    async def _end_process(self) -> None:
        writer, proc = self._writer, self._proc
        self._writer = self._proc = None
        if writer is not None:
            writer.close()
        if proc is None:
            return
        try:
            async with asyncio.timeout(5):
                await proc.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()

    async def stop(self) -> None:
        self._stopping = True
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._end_process()


_TEXT = "text/plain; charset=utf-8"
_OUTCOMES = ("allowed", "denied", "bad_request", "error")
