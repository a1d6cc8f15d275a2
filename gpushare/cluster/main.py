"""Entry point of ``gpushare-controller``: one asyncio loop running the extender, the webhook, the
watches that feed the view and the Kopf operator (:func:`run_operator`, unless
``--no-operator``).

The operator reads the same :class:`ClusterView` the extender and webhook use, fed by this
process's watches (one list/watch per kind; the GpuShare watch is handed to the operator's
Kopf handlers, :class:`watches.ShareHandoff`), and gets the metrics registry and
``context.stopping``, an event set when the process shuts down. If any duty returns or raises,
the process stops, so Kubernetes restarts it whole.
"""

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from gpushare.api.errors import InvalidInputError
from gpushare.api.logs import setup_json_logging
from gpushare.api.tolerations import parse_toleration
from gpushare.cluster import quarantine_reports, watches
from gpushare.cluster.dra.allocator import ClaimAllocator
from gpushare.cluster.dra.devices import DraDevices
from gpushare.cluster.dra.templates import ClaimTemplates, TemplateKeeper
from gpushare.cluster.extender.requeue import requeue
from gpushare.cluster.extender.verbs import Extender
from gpushare.cluster.leader import LeaderElector
from gpushare.cluster.metrics import Metrics
from gpushare.cluster.operator import runner as operator_runner
from gpushare.cluster.operator.settings import OperatorConfig
from gpushare.cluster.opportunistic import OpportunisticDuties
from gpushare.cluster.server import BoundedRunner, extender_app, webhook_app
from gpushare.cluster.settings import MODE_DRA, PROG, Settings, parse_args
from gpushare.cluster.state.view import ClusterView
from gpushare.cluster.tls import (
    CertFiles,
    ReloadingServerTls,
    ensure_certs,
    issued_by_one_of,
)
from gpushare.cluster.webhook.facts import ClusterFacts, PriorityRef
from gpushare.cluster.webhook.registration import webhook_configurations
from gpushare.kube.access import Access, AsyncAccessReviewer
from gpushare.kube.controller import Kube
from gpushare.packing.admission import Admission
from gpushare.packing.interference import MODEL_ENV, load_default
from gpushare.packing.opportunistic import Opportunism

log = logging.getLogger("gpushare.cluster")


@dataclass
class ControllerContext:
    """What every component of the process shares."""

    settings: Settings
    view: ClusterView
    metrics: Metrics
    kube: Kube | None
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    webhook_registered: bool = False
    certs: CertFiles | None = None
    webhook_tls: ReloadingServerTls | None = None
    extender_tls: ReloadingServerTls | None = None
    ca_bundle: bytes = b""
    """The CA bundle registered in the webhook configurations (during a rotation: the new CA
    and the one before it)."""
    leading: bool = False
    """This replica binds pods and runs the operator (always, without --leader-elect)."""
    share_handoff: watches.ShareHandoff | None = None
    """When the GpuShare informer stops because the operator's Kopf watch feeds the view."""
    claim_allocator: ClaimAllocator | None = None
    """DRA mode with gpushare placement: places the claims of gated pods (on the leader)."""
    opportunism: Opportunism = field(default_factory=Opportunism)
    """The opportunistic rules and the interference corrections the governor learns."""
    claim_templates: ClaimTemplates | None = None
    """``--annotation-mode=dra``: the claim templates of gpushare's name form (their watch)."""
    template_keeper: TemplateKeeper | None = None
    """``--annotation-mode=dra``: makes the templates stored pods wait for (on the leader)."""
    opportunistic_priority: PriorityRef | None = None
    """``--opportunistic-priority-class`` as the API server has it (:func:`_priority_loop`)."""
    _reviewer: AsyncAccessReviewer | None = None

    def __post_init__(self) -> None:
        # The cluster's state on /metrics from the leader only (each pod counted once when
        # replicas are summed); a standby exports its own requests and build_info.
        self.metrics.leading = lambda: self.leading

    async def authorize(self, authorization: str | None, path: str) -> Access:
        """May the caller read ``path`` (/metrics): ``--metrics-auth`` (gpushare.kube.access)."""
        if self.settings.metrics_auth == "none":
            return Access(200, "allowed (--metrics-auth none)")
        if self.kube is None:
            return Access(
                503,
                f"{path}: tokens cannot be checked without an API server; fix: run the "
                "controller with --metrics-auth none",
            )
        if self._reviewer is None:
            self._reviewer = self.kube.access_reviewer()
        return await self._reviewer.review(authorization, path)

    def ready(self) -> tuple[bool, str]:
        if not self.view.synced:
            return False, "waiting for the first list of nodes and pods"
        if self.settings.register_webhooks and not self.webhook_registered:
            return False, "waiting to register the admission webhooks"
        return True, "ready (leader)" if self.leading else "ready (standby: serves the webhook)"

    def cluster_facts(self) -> ClusterFacts:
        return ClusterFacts(
            max_gpu_memory=self.view.max_gpu_memory,
            max_gpus_per_node=self.view.max_gpus_per_node,
            # From the GpuShares in the view: the controller's GpuShare watch, or on the
            # leader once it handed that watch over, the operator's Kopf handlers.
            share_lookup=self.view.share_request,
            protected_host_paths=self.settings.protected_host_paths,
            exclusive_lookup=self.view.exclusive_reason,
            separation_lookup=self.view.separation,
            dra_device_class=(
                self.settings.dra_device_class
                if self.settings.annotation_mode == MODE_DRA
                else None
            ),
            dra_gate=self.settings.places_claims and self.settings.annotation_mode == MODE_DRA,
            opportunistic_placement=self.settings.opportunistic_placement,
            opportunistic_default=self.settings.opportunistic_default,
            pod_tolerations=tuple(parse_toleration(t) for t in self.settings.pod_tolerations),
            pod_runtime_class=self.settings.pod_runtime_class,
            opportunistic_priority=self.opportunistic_priority,
            template_check=self._template_check if self.claim_templates is not None else None,
        )

    def _template_check(self, namespace: str, name: str) -> InvalidInputError | None:
        """The webhook's read of the template watch (gpushare.cluster.dra.templates); nothing
        is refused before its first list."""
        templates = self.claim_templates
        if templates is None or not templates.synced:
            return None
        return templates.admission_error(
            namespace, name, bound=self.settings.dra_templates_per_namespace
        )


Hook = Callable[[ControllerContext], Coroutine[Any, Any, None]]

SHARE_WATCH = "GpuShare watch"


async def run_operator(ctx: ControllerContext) -> None:
    """The GpuShare operator (:mod:`gpushare.cluster.operator`) in this process's event loop,
    on this process's view, metrics registry and stop event."""
    if ctx.settings.kubeconfig is not None:
        # The operator's own client reads $KUBECONFIG; point it at ours.
        os.environ.setdefault("KUBECONFIG", str(ctx.settings.kubeconfig))
    config = OperatorConfig(
        agent_url=ctx.settings.agent_url, cache_configmap=ctx.settings.profile_cache_name
    )
    ready = asyncio.Event()
    handoff = ctx.share_handoff
    on_share_event = handoff.kopf_event if handoff is not None else None

    async def announce_ready() -> None:
        await ready.wait()
        if handoff is not None:
            handoff.operator_ready()

    announcing = asyncio.create_task(announce_ready())
    try:
        await operator_runner.run_operator(
            view=ctx.view,
            host_watches=ctx.kube is not None,
            settings=config,
            registry=ctx.metrics.registry,
            stop_flag=ctx.stopping,
            ready_flag=ready,
            on_share_event=on_share_event,
        )
    finally:
        announcing.cancel()


async def _start_site(
    app: web.Application,
    *,
    host: str,
    port: int,
    ssl_context: object | None,
    reuse_port: bool = False,
    wait_s: float = 0.0,
) -> web.AppRunner:
    """Listen; with ``wait_s`` keep trying that long while the port is taken (a takeover on
    one host: the old leader's socket may linger a moment)."""
    runner = BoundedRunner(app)
    await runner.setup()
    deadline = time.monotonic() + wait_s
    while True:
        site = web.TCPSite(
            runner,
            host,
            port,
            ssl_context=ssl_context,  # type: ignore[arg-type]
            reuse_address=True,
            reuse_port=reuse_port or None,
        )
        try:
            await site.start()
            return runner
        except OSError as exc:
            if time.monotonic() < deadline:
                await asyncio.sleep(0.2)
                continue
            await runner.cleanup()
            raise InvalidInputError(
                f"{host}:{port}", f"cannot listen ({exc.strerror})", "free the port or pick another"
            ) from None


async def _priority_loop(ctx: ControllerContext, *, period_s: float = 15.0) -> None:
    """Keep ``ctx.opportunistic_priority`` to the PriorityClass ``--opportunistic-priority-
    class`` names, as the API server has it (its value may be edited; it may not exist yet)."""
    name, kube = ctx.settings.opportunistic_priority_class, ctx.kube
    assert kube is not None
    said = ""
    while True:
        try:
            found = await kube.get_priority_class(name)
        except Exception as exc:  # keep what we had: the API server may be briefly away
            log.warning("cannot read PriorityClass %s: %s", name, exc)
        else:
            ref = None
            if found is not None and isinstance(found.get("value"), int):
                policy = str(found.get("preemptionPolicy") or "PreemptLowerPriority")
                ref = PriorityRef(name=name, value=int(found["value"]), preemption_policy=policy)
            ctx.opportunistic_priority = ref
            state = repr(ref)
            if state != said:
                said = state
                if ref is None:
                    log.warning(
                        "PriorityClass %s does not exist: opted-in pods get no lower priority "
                        "(the chart creates it; or set --opportunistic-priority-class '')",
                        name,
                    )
                else:
                    log.info("opted-in pods get PriorityClass %s (%d)", name, ref.value)
        await asyncio.sleep(period_s)


async def _expire_loop(ctx: ControllerContext, extender: Extender) -> None:
    period = max(1.0, min(5.0, ctx.settings.stale_assume_seconds / 4))
    agents_back = ctx.view.agents_back
    while True:
        await asyncio.sleep(period)
        back, agents_back = ctx.view.agents_back != agents_back, ctx.view.agents_back
        released = ctx.view.expire_stale()
        for key in released:
            log.info("stale placement released (pod never bound)", extra={"pod": key})
        lapsed = ctx.view.expire_holds()
        for key in lapsed:
            log.info("filter-time hold lapsed (no bind came)", extra={"pod": key})
        freed = released or lapsed or back
        if freed and ctx.leading and ctx.kube is not None and len(extender.refused):
            touched = await requeue(extender.refused, ctx.view.pods(), ctx.kube)
            if touched:
                log.info(
                    "asked the scheduler to retry pods refused before capacity was let go",
                    extra={"pods": len(touched), "example": touched[0]},
                )


async def _evict_loop(ctx: ControllerContext, *, period_s: float = 2.0) -> None:
    """Evict pods the node agent marked ``gpushare.io/evict``: a workload whose CUDA clients
    keep breaking their GPU's other tenants (repeated fatal faults, or a broken context kept
    open). The node agent may only mark; eviction (through PodDisruptionBudgets) is ours."""
    assert ctx.kube is not None
    tried: dict[str, float] = {}
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(period_s)
        marked = [f for f in ctx.view.pods().values() if f.evict and f.node and not f.finished]
        for f in marked:
            if loop.time() - tried.get(f.uid, -1e9) < 30.0:
                continue
            tried[f.uid] = loop.time()
            namespace, _, name = f.key.partition("/")
            try:
                done = await ctx.kube.evict_pod(namespace=namespace, name=name)
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


async def _register(ctx: ControllerContext) -> None:
    assert ctx.kube is not None and ctx.certs is not None
    # Wait for the inventory first, so the very first reviews can check memory sizes.
    for _ in range(300):
        if ctx.view.synced:
            break
        await asyncio.sleep(0.1)
    mutating, validating = webhook_configurations(ctx.settings, ctx.ca_bundle)
    delay = 0.5
    while True:
        try:
            await ctx.kube.register_webhooks(mutating=mutating, validating=validating)
            break
        except Exception as exc:
            log.warning("webhook registration failed; retrying", extra={"error": str(exc)})
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)
    ctx.webhook_registered = True
    log.info("admission webhooks registered", extra={"config": ctx.settings.webhook_config_name})


async def run(
    settings: Settings,
    *,
    hooks: Sequence[Hook] = (),
    kube: Kube | None = None,
    view: ClusterView | None = None,
    connect: bool = True,
) -> None:
    """Run until ``context.stopping`` is set (SIGTERM/SIGINT in ``main``) or a task dies.

    ``connect=False`` runs without any API server (extender and webhook only; for benchmarks and
    fuzzing), in which case the caller fills ``view``.
    """
    view = view or ClusterView(stale_assume_seconds=settings.stale_assume_seconds)
    metrics = Metrics(view)
    if kube is None and connect:
        kube = Kube.connect(kubeconfig=settings.kubeconfig, field_manager=settings.field_manager)
    ctx = ControllerContext(settings=settings, view=view, metrics=metrics, kube=kube)
    await serve(ctx, hooks=hooks)


async def serve(ctx: ControllerContext, *, hooks: Sequence[Hook] = ()) -> None:
    settings = ctx.settings
    ctx.view.tenancies.mode = settings.tenancy
    ctx.view.tenancies.rules = settings.neighbour_rules
    runners: list[web.AppRunner] = []
    tasks: dict[asyncio.Task[None], str] = {}
    tmpdir: tempfile.TemporaryDirectory[str] | None = None
    elector: LeaderElector | None = None
    try:
        extender = Extender(
            view=ctx.view,
            writer=ctx.kube,
            policy=settings.policy,
            admission=Admission() if settings.interference_admission else None,
            gate_seconds=settings.bind_gate_seconds,
            hold_in_filter=settings.hold_in_filter,
            opportunism=ctx.opportunism,
        )
        if settings.extender_tls_cert is not None and settings.extender_tls_key is not None:
            ctx.extender_tls = ReloadingServerTls(
                cert=settings.extender_tls_cert,
                key=settings.extender_tls_key,
                client_ca=settings.extender_client_ca,
            )
        if settings.webhook_enabled:
            cert_dir = settings.webhook_cert_dir
            if cert_dir is None:
                tmpdir = tempfile.TemporaryDirectory(prefix="gpushare-webhook-")
                cert_dir = Path(tmpdir.name)
            ctx.certs = ensure_certs(
                cert_dir,
                hosts=settings.webhook_hosts(),
                required=settings.webhook_required_hosts() or None,
            )
            ctx.ca_bundle = ctx.certs.ca_pem()
            ctx.webhook_tls = ReloadingServerTls(cert=ctx.certs.cert, key=ctx.certs.key)
            runners.append(
                await _start_site(
                    webhook_app(
                        facts=ctx.cluster_facts,
                        metrics=ctx.metrics,
                        ready=ctx.ready,
                        authorize=ctx.authorize,
                    ),
                    host=settings.webhook_host,
                    port=settings.webhook_port,
                    ssl_context=ctx.webhook_tls.context,
                    # Replicas on one host (tests) share the port; the kernel spreads the calls.
                    reuse_port=settings.leader_elect,
                )
            )
            log.info(
                "webhook listening",
                extra={"url": f"https://{settings.webhook_host}:{settings.webhook_port}"},
            )
        if ctx.kube is not None:
            if settings.operator_enabled:
                ctx.share_handoff = watches.ShareHandoff(ctx.view)
            resync = settings.resync_seconds
            lease_namespace = settings.agent_lease_namespace or settings.leader_elect_namespace
            ctx.view.agents.namespace = lease_namespace
            if settings.annotation_mode == MODE_DRA:
                ctx.claim_templates = ClaimTemplates(
                    device_class=settings.dra_device_class, quarantine=ctx.view.quarantine
                )
                ctx.template_keeper = TemplateKeeper(
                    templates=ctx.claim_templates,
                    api=ctx.kube,
                    per_namespace=settings.dra_templates_per_namespace,
                    idle_s=settings.dra_template_idle_seconds,
                )
                tasks[
                    asyncio.create_task(
                        watches.feed_claim_templates(
                            ctx.kube, ctx.claim_templates, resync_seconds=resync
                        )
                    )
                ] = "claim template watch"
            if settings.places_claims:
                devices = DraDevices(quarantine=ctx.view.quarantine)
                # The operator sees DRA-mode pods on GPUs by their claims (status.placements,
                # latency protection); the extender's ledger does not.
                ctx.view.claim_holders = devices.holders
                ctx.claim_allocator = ClaimAllocator(
                    view=ctx.view,
                    devices=devices,
                    placer=extender.placer,
                    writer=ctx.kube,
                    device_class=settings.dra_device_class,
                )
                ctx.metrics.watch_claims(ctx.claim_allocator)
                tasks[
                    asyncio.create_task(watches.feed_dra(ctx.kube, devices, resync_seconds=resync))
                ] = "DRA watches"
            for name, feeding in (
                (
                    "node watch",
                    watches.feed_nodes(ctx.kube, ctx.view, resync_seconds=resync),
                ),
                (
                    "pod watch",
                    watches.feed_pods(
                        ctx.kube,
                        ctx.view,
                        resync_seconds=resync,
                        allocator=ctx.claim_allocator,
                        keeper=ctx.template_keeper,
                    ),
                ),
                (
                    SHARE_WATCH,
                    watches.feed_shares(
                        ctx.kube, ctx.view, resync_seconds=resync, handoff=ctx.share_handoff
                    ),
                ),
                (
                    "namespace watch",
                    watches.feed_namespaces(ctx.kube, ctx.view, resync_seconds=resync),
                ),
                (
                    "node agent Lease watch",
                    watches.feed_agent_leases(
                        ctx.kube,
                        ctx.view,
                        namespace=lease_namespace,
                        resync_seconds=resync,
                    ),
                ),
                ("node agent Leases", watches.judge_agent_leases(ctx.view)),
            ):
                tasks[asyncio.create_task(feeding)] = name
            if settings.register_webhooks:
                tasks[asyncio.create_task(_register(ctx))] = "webhook registration"
        else:
            ctx.view.mark_synced()
        tasks[asyncio.create_task(_expire_loop(ctx, extender))] = "stale placement expiry"
        tasks[asyncio.create_task(_reload_certs(ctx))] = "certificate reload"
        if settings.opportunistic_priority_class and ctx.kube is not None:
            tasks[asyncio.create_task(_priority_loop(ctx))] = "priority class"
        all_hooks = list(hooks)
        if settings.operator_enabled:
            all_hooks.append(run_operator)
        if settings.leader_elect and ctx.kube is not None:
            elector = LeaderElector(
                ctx.kube,
                namespace=settings.leader_elect_namespace,
                name=settings.leader_elect_name,
                identity=settings.leader_identity
                or os.environ.get("POD_NAME")
                or f"{socket.gethostname()}-{os.getpid()}",
                lease_seconds=settings.leader_elect_lease_seconds,
                renew_seconds=settings.leader_elect_renew_seconds,
            )
        duties = _lead(ctx, extender, elector=elector, hooks=all_hooks, runners=runners)
        tasks[asyncio.create_task(duties)] = "leader duties"
        stop: asyncio.Task[Any] = asyncio.create_task(ctx.stopping.wait())
        while True:
            waiting: list[asyncio.Task[Any]] = [stop, *tasks]
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if stop in done:
                log.info("stopping")
                return
            finished = [t for t in tasks if t in done]
            # Registration finishing is expected, so is the GpuShare informer once the
            # operator's Kopf watch took over; anything else ending is fatal.
            for task in finished:
                name = tasks.pop(task)
                if name in ("webhook registration", SHARE_WATCH) and task.exception() is None:
                    continue
                exc = task.exception()
                log.error("task ended; stopping", extra={"task": name, "error": repr(exc)})
                raise SystemExit(1)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        for runner in runners:
            await runner.cleanup()
        if elector is not None:
            await elector.release()
        if ctx.kube is not None:
            with contextlib.suppress(Exception):
                await ctx.kube.close()
        if tmpdir is not None:
            tmpdir.cleanup()


async def _lead(
    ctx: ControllerContext,
    extender: Extender,
    *,
    elector: LeaderElector | None,
    hooks: Sequence[Hook],
    runners: list[web.AppRunner],
) -> None:
    """What only one replica may do: serve the extender (bind pods), evict, run the operator.
    With an elector, first wait for the Lease (serving the webhook meanwhile), then renew it;
    losing it raises, which stops the process (Kubernetes restarts it as a standby)."""
    settings = ctx.settings
    if elector is not None:
        await _label_role(ctx, ROLE_STANDBY)
        if not await elector.acquire(ctx.stopping):
            return
    ctx.leading = True
    runners.append(
        await _start_site(
            extender_app(extender, metrics=ctx.metrics, ready=ctx.ready, authorize=ctx.authorize),
            host=settings.extender_host,
            port=settings.extender_port,
            ssl_context=ctx.extender_tls.context if ctx.extender_tls else None,
            wait_s=settings.leader_elect_lease_seconds if elector is not None else 0.0,
        )
    )
    log.info(
        "extender listening",
        extra={
            "url": f"{'https' if ctx.extender_tls else 'http'}://{settings.extender_host}:"
            f"{settings.extender_port}/scheduler",
            "client_certificates": settings.extender_client_ca is not None,
        },
    )
    if elector is not None:
        await _label_role(ctx, ROLE_LEADER)

    async def fatal_on_return(hook: Hook) -> None:
        await hook(ctx)
        raise RuntimeError(f"{getattr(hook, '__qualname__', 'hook')} returned")

    async with asyncio.TaskGroup() as group:
        if elector is not None:
            group.create_task(elector.keep(ctx.stopping))
        if ctx.kube is not None:
            group.create_task(_evict_loop(ctx))
            group.create_task(quarantine_reports.report_loop(ctx.kube, [ctx.view.quarantine]))
            duties = OpportunisticDuties(
                view=ctx.view,
                kube=ctx.kube,
                opportunism=ctx.opportunism,
                metrics=ctx.metrics,
                period_s=settings.governor_period_seconds,
                settle_s=settings.governor_settle_seconds,
                agent_url=settings.agent_url,
            )
            extender.bound_listeners.append(duties.bound)
            group.create_task(duties.run())
        if ctx.claim_allocator is not None:
            group.create_task(ctx.claim_allocator.run())
        if ctx.template_keeper is not None:
            group.create_task(ctx.template_keeper.run())
        for hook in hooks:
            group.create_task(fatal_on_return(hook))
    await ctx.stopping.wait()  # nothing else to run (no API server): serve until stopped


ROLE_LABEL = "gpushare.io/controller-role"
"""Label on a controller replica's pod: the extender Service selects ``leader``."""
ROLE_LEADER = "leader"
ROLE_STANDBY = "standby"


async def _label_role(ctx: ControllerContext, role: str) -> None:
    """Mark this replica's pod, so the extender Service routes only to the leader."""
    pod = ctx.settings.leader_pod or (
        f"{os.environ['POD_NAMESPACE']}/{os.environ['POD_NAME']}"
        if os.environ.get("POD_NAMESPACE") and os.environ.get("POD_NAME")
        else ""
    )
    if not pod or ctx.kube is None:
        return
    namespace, _, name = pod.partition("/")
    for attempt in range(20):
        try:
            await ctx.kube.label_pod(namespace=namespace, name=name, labels={ROLE_LABEL: role})
            return
        except Exception as exc:
            log.warning("could not label this replica's pod", extra={"error": str(exc)})
            await asyncio.sleep(min(0.5 * 2**attempt, 5.0))
    raise RuntimeError(f"could not label pod {pod} {ROLE_LABEL}={role}")


CA_PROPAGATION_SECONDS = 3.0
"""After registering a new CA bundle, how long to wait before serving with the new certificate
(the API server picks webhook configurations up from its own watch)."""


async def _reload_certs(ctx: ControllerContext) -> None:
    """Pick up rotated certificates without a restart. The webhook's new CA is registered
    (alongside the old one) before the new serving certificate is used, so no admission fails
    during a rotation; the extender's certificate and client CA are swapped in place (a new
    extender certificate must come from the CA kube-scheduler already trusts)."""
    settings = ctx.settings
    while True:
        await asyncio.sleep(settings.cert_reload_seconds)
        tls = ctx.extender_tls
        if tls is not None and tls.changed():
            if tls.reload():
                log.info("extender certificates reloaded", extra={"reloads": tls.reloads})
            else:
                log.warning("extender certificate files changed but are not usable yet")
        hook = ctx.webhook_tls
        if hook is None or ctx.certs is None or not hook.changed():
            continue
        try:
            new_ca = ctx.certs.ca_pem()
        except OSError:
            continue
        if settings.register_webhooks and ctx.kube is not None and new_ca not in ctx.ca_bundle:
            bundle = new_ca.rstrip(b"\n") + b"\n" + _last_ca(ctx.ca_bundle)
            mutating, validating = webhook_configurations(settings, bundle)
            try:
                await ctx.kube.register_webhooks(mutating=mutating, validating=validating)
            except Exception as exc:
                log.warning("could not register the new CA bundle", extra={"error": str(exc)})
                continue
            ctx.ca_bundle = bundle
            await asyncio.sleep(CA_PROPAGATION_SECONDS)
        if not issued_by_one_of(ctx.certs.cert.read_bytes(), ctx.ca_bundle):
            # A rotation written file by file: the new certificate is here before its CA.
            log.info("new webhook certificate waits for its CA to be registered")
            continue
        if hook.reload():
            log.info("webhook certificate reloaded", extra={"reloads": hook.reloads})
        else:
            log.warning("webhook certificate files changed but are not usable yet")


def _last_ca(bundle: bytes) -> bytes:
    """The first certificate of a PEM bundle (the CA in use before a rotation)."""
    end = b"-----END CERTIFICATE-----"
    head, sep, _ = bundle.partition(end)
    return head + sep + b"\n" if sep else b""


GC_THRESHOLDS = (20_000, 10, 100)
"""The cyclic GC's thresholds in this process (Python's defaults: 700, 10, 10). The controller
holds every pod, node and claim as dicts, and a watch event replaces one: at the defaults a
full collection (0.2-0.3 s over that heap, stalling every extender call meanwhile) ran every few
seconds, and the GC took 9 % of the process in the scale bench's DRA phase (2.5 % in its
extender phase; 2-core VM, 1,000 nodes, 2,000 pods). Decoded objects hold no cycles and go by
reference counting, so collecting less often only keeps rare cyclic garbage a little longer
(docs/dra.md, "Known limits")."""


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = parse_args(argv)
    except InvalidInputError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    setup_json_logging(component=PROG, level=settings.log_level)
    try:
        model = load_default()  # a calibrated file that cannot be read stops here, not mid-bind
    except InvalidInputError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    log.info(
        "interference model loaded",
        extra={"file": os.environ.get(MODEL_ENV) or "shipped", "source": model.source},
    )

    async def _main() -> None:
        view = ClusterView(stale_assume_seconds=settings.stale_assume_seconds)
        try:
            kube = Kube.connect(
                kubeconfig=settings.kubeconfig, field_manager=settings.field_manager
            )
        except Exception as exc:
            raise InvalidInputError(
                "--kubeconfig", f"cannot load Kubernetes config ({exc})", "give a valid kubeconfig"
            ) from None
        ctx = ControllerContext(settings=settings, view=view, metrics=Metrics(view), kube=kube)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, ctx.stopping.set)
        await serve(ctx)

    gc.set_threshold(*GC_THRESHOLDS)
    try:
        asyncio.run(_main())
    except InvalidInputError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
