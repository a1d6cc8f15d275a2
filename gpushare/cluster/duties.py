"""The controller's background duties, each a component with ``start`` and ``stop`` that
``gpushare.cluster.main`` lists: what each does lives here, the wiring there.

A duty is a coroutine run as one task (:class:`Duty`); :func:`supervise` runs a list of them
until the process stops, and stops the process (exit status 1, so Kubernetes restarts it whole)
when one ends that was not allowed to.
"""

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from gpushare.cluster.context import ControllerContext
from gpushare.cluster.extender.requeue import requeue
from gpushare.cluster.extender.verbs import Extender
from gpushare.cluster.tls import issued_by_one_of
from gpushare.cluster.webhook.facts import PriorityRef
from gpushare.cluster.webhook.registration import webhook_configurations
from gpushare.kube.controller import Kube
from gpushare.kube.retry import Backoff, keep_trying

log = logging.getLogger("gpushare.cluster")

Work = Callable[[], Coroutine[Any, Any, None]]


class DutyEndedError(RuntimeError):
    """A duty that may not finish ended (:func:`supervise`): the process stops."""


class Duty:
    """One background duty: :meth:`start` runs :meth:`run` as a task, :meth:`stop` cancels it
    and waits. ``may_finish``: its ending is expected (a registration done, a watch handed
    over), not a reason to stop the process."""

    name = "duty"
    may_finish = False

    def __init__(self) -> None:
        self.task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        raise NotImplementedError

    def start(self) -> asyncio.Task[None]:
        self.task = asyncio.create_task(self.run(), name=self.name)
        return self.task

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(BaseException):
                await self.task


class Task(Duty):
    """A duty given as a coroutine (a watch feeding the view, a component's own loop)."""

    def __init__(self, name: str, work: Work, *, may_finish: bool = False) -> None:
        super().__init__()
        self.name = name
        self.may_finish = may_finish
        self._work = work

    async def run(self) -> None:
        await self._work()


async def supervise(duties: Sequence[Duty], stopping: asyncio.Event) -> None:
    """Start ``duties``; return when ``stopping`` is set, raise :class:`DutyEndedError` when a duty
    that may not finish ends (its error logged); every duty is stopped on the way out."""
    running = {duty.start(): duty for duty in duties}
    stop = asyncio.create_task(stopping.wait())
    try:
        while True:
            done, _ = await asyncio.wait([stop, *running], return_when=asyncio.FIRST_COMPLETED)
            if stop in done:
                log.info("stopping")
                return
            for task in [t for t in running if t in done]:
                duty = running.pop(task)
                exc = task.exception()
                if duty.may_finish and exc is None:
                    continue
                log.error("task ended; stopping", extra={"task": duty.name, "error": repr(exc)})
                raise DutyEndedError(duty.name)
    finally:
        stop.cancel()
        for duty in reversed(duties):
            await duty.stop()


class StaleExpiry(Duty):
    """Release placements whose pod never got bound, and filter-time holds no bind came for;
    on the leader, ask kube-scheduler to retry pods refused while that capacity was held."""

    name = "stale placement expiry"

    def __init__(self, ctx: ControllerContext, extender: Extender) -> None:
        super().__init__()
        self.ctx, self.extender = ctx, extender

    async def run(self) -> None:
        ctx = self.ctx
        period = max(1.0, min(5.0, ctx.settings.placement.stale_assume_seconds / 4))
        seen = self._changes()
        while True:
            await asyncio.sleep(period)
            now = self._changes()
            back, seen = now != seen, now
            released = ctx.view.expire_stale()
            for key in released:
                log.info("stale placement released (pod never bound)", extra={"pod": key})
            lapsed = ctx.view.expire_holds()
            for key in lapsed:
                log.info("filter-time hold lapsed (no bind came)", extra={"pod": key})
            refused = self.extender.refused
            # A node placeable again (its agent back, its devices registered again), or a
            # placed pod's rules changed (its profile known, its profiling ended), frees what
            # was refused there too.
            freed = released or lapsed or back
            if freed and ctx.leading and ctx.kube is not None and len(refused):
                touched = await requeue(refused, ctx.view.pods(), ctx.kube)
                if touched:
                    log.info(
                        "asked the scheduler to retry pods refused before capacity was let go",
                        extra={"pods": len(touched), "example": touched[0]},
                    )

    def _changes(self) -> tuple[int, int, int]:
        view = self.ctx.view
        return (view.agents_back, view.nodes_back, view.placed_rules_changed)


class Evictions(Duty):
    """Evict pods the node agent marked ``gpushare.io/evict``: a workload whose CUDA clients
    keep breaking their GPU's other tenants (repeated fatal faults, or a broken context kept
    open). The node agent may only mark; eviction (through PodDisruptionBudgets) is ours."""

    name = "evictions"
    RETRY_S = 30.0

    def __init__(self, ctx: ControllerContext, kube: Kube, *, period_s: float = 2.0) -> None:
        super().__init__()
        self.ctx, self.kube, self.period_s = ctx, kube, period_s

    async def run(self) -> None:
        tried: dict[str, float] = {}
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.period_s)
            marked = [
                f for f in self.ctx.view.pods().values() if f.evict and f.node and not f.finished
            ]
            for f in marked:
                if loop.time() - tried.get(f.uid, -1e9) < self.RETRY_S:
                    continue
                tried[f.uid] = loop.time()
                namespace, _, name = f.key.partition("/")
                try:
                    done = await self.kube.evict_pod(namespace=namespace, name=name)
                except Exception as exc:
                    log.warning("eviction failed", extra={"pod": f.key, "error": str(exc)})
                    continue
                log.info(
                    "evicted at the node agent's request" if done else "eviction blocked; retrying",
                    extra={"pod": f.key, "why": f.evict},
                )
            live = {f.uid for f in marked}
            for uid in [u for u in tried if u not in live]:
                del tried[uid]


class PriorityClassWatch(Duty):
    """Keep ``ctx.opportunistic_priority`` to the PriorityClass ``--opportunistic-priority-
    class`` names, as the API server has it (its value may be edited; it may not exist yet)."""

    name = "priority class"

    def __init__(self, ctx: ControllerContext, kube: Kube, *, period_s: float = 15.0) -> None:
        super().__init__()
        self.ctx, self.kube, self.period_s = ctx, kube, period_s
        self._said = ""

    async def run(self) -> None:
        name = self.ctx.settings.opportunistic.priority_class
        while True:
            try:
                found = await self.kube.get_priority_class(name)
            except Exception as exc:  # keep what we had: the API server may be briefly away
                log.warning("cannot read PriorityClass %s: %s", name, exc)
            else:
                self._take(name, found)
            await asyncio.sleep(self.period_s)

    def _take(self, name: str, found: dict[str, Any] | None) -> None:
        ref = None
        if found is not None and isinstance(found.get("value"), int):
            policy = str(found.get("preemptionPolicy") or "PreemptLowerPriority")
            ref = PriorityRef(name=name, value=int(found["value"]), preemption_policy=policy)
        self.ctx.opportunistic_priority = ref
        if repr(ref) == self._said:
            return
        self._said = repr(ref)
        if ref is None:
            log.warning(
                "PriorityClass %s does not exist: opted-in pods get no lower priority "
                "(the chart creates it; or set --opportunistic-priority-class '')",
                name,
            )
        else:
            log.info("opted-in pods get PriorityClass %s (%d)", name, ref.value)


class WebhookRegistration(Duty):
    """Register the admission webhooks with our CA bundle, once the view has listed (so the
    first reviews can check memory sizes); retried until it works."""

    name = "webhook registration"
    may_finish = True

    def __init__(self, ctx: ControllerContext, kube: Kube) -> None:
        super().__init__()
        self.ctx, self.kube = ctx, kube

    async def run(self) -> None:
        ctx = self.ctx
        for _ in range(300):
            if ctx.view.synced:
                break
            await asyncio.sleep(0.1)
        mutating, validating = webhook_configurations(ctx.settings, ctx.ca_bundle)
        await keep_trying(
            lambda: self.kube.register_webhooks(mutating=mutating, validating=validating),
            what="webhook registration",
            backoff=Backoff(first_s=0.5, most_s=10.0),
        )
        ctx.webhook_registered = True
        log.info(
            "admission webhooks registered", extra={"config": ctx.settings.webhook.config_name}
        )


CA_PROPAGATION_SECONDS = 3.0
"""After registering a new CA bundle, how long to wait before serving with the new certificate
(the API server picks webhook configurations up from its own watch)."""


class CertReload(Duty):
    """Pick up rotated certificates without a restart. The webhook's new CA is registered
    (alongside the old one) before the new serving certificate is used, so no admission fails
    during a rotation; the extender's certificate and client CA are swapped in place (a new
    extender certificate must come from the CA kube-scheduler already trusts)."""

    name = "certificate reload"

    def __init__(self, ctx: ControllerContext) -> None:
        super().__init__()
        self.ctx = ctx

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.ctx.settings.process.cert_reload_seconds)
            tls = self.ctx.extender_tls
            if tls is not None and tls.changed():
                if tls.reload():
                    log.info("extender certificates reloaded", extra={"reloads": tls.reloads})
                else:
                    log.warning("extender certificate files changed but are not usable yet")
            await self._webhook()

    async def _webhook(self) -> None:
        ctx = self.ctx
        hook = ctx.webhook_tls
        if hook is None or ctx.certs is None or not hook.changed():
            return
        try:
            new_ca = ctx.certs.ca_pem()
        except OSError:
            return
        if ctx.settings.webhook.register and ctx.kube is not None and new_ca not in ctx.ca_bundle:
            bundle = new_ca.rstrip(b"\n") + b"\n" + _last_ca(ctx.ca_bundle)
            mutating, validating = webhook_configurations(ctx.settings, bundle)
            try:
                await ctx.kube.register_webhooks(mutating=mutating, validating=validating)
            except Exception as exc:
                log.warning("could not register the new CA bundle", extra={"error": str(exc)})
                return
            ctx.ca_bundle = bundle
            await asyncio.sleep(CA_PROPAGATION_SECONDS)
        if not issued_by_one_of(ctx.certs.cert.read_bytes(), ctx.ca_bundle):
            # A rotation written file by file: the new certificate is here before its CA.
            log.info("new webhook certificate waits for its CA to be registered")
            return
        if hook.reload():
            log.info("webhook certificate reloaded", extra={"reloads": hook.reloads})
        else:
            log.warning("webhook certificate files changed but are not usable yet")


def _last_ca(bundle: bytes) -> bytes:
    """The first certificate of a PEM bundle (the CA in use before a rotation)."""
    end = b"-----END CERTIFICATE-----"
    head, sep, _ = bundle.partition(end)
    return head + sep + b"\n" if sep else b""
