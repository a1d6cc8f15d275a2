"""Entry point of ``gpushare-controller``: wiring only. One asyncio loop runs the extender, the
webhook, the watches that feed the view, the leader's duties and the Kopf operator (unless
``--no-operator``); each is a component with start and stop (:mod:`gpushare.cluster.duties`,
:mod:`gpushare.cluster.leading`, :class:`gpushare.cluster.server.Listener`) that
:func:`serve` lists.

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
from collections.abc import Sequence
from pathlib import Path

from gpushare.api.errors import InvalidInputError
from gpushare.api.logs import setup_json_logging
from gpushare.cluster import watches
from gpushare.cluster.admission.host import AdmissionProcess, ForwardingTls
from gpushare.cluster.agent_readiness import AgentReadiness
from gpushare.cluster.certificates import CertificateKeeper, leaves_for
from gpushare.cluster.context import ControllerContext, Hook
from gpushare.cluster.dra.allocator import ClaimAllocator
from gpushare.cluster.dra.devices import DraDevices
from gpushare.cluster.dra.templates import ClaimTemplates, TemplateKeeper
from gpushare.cluster.duties import (
    CertReload,
    Duty,
    DutyEndedError,
    PriorityClassWatch,
    StaleExpiry,
    Task,
    WebhookRegistration,
    supervise,
)
from gpushare.cluster.event_loop import ControllerLoop
from gpushare.cluster.extender.verbs import Extender
from gpushare.cluster.leader import LeaderElector
from gpushare.cluster.leading import Leadership, run_operator
from gpushare.cluster.metrics import Metrics
from gpushare.cluster.settings import PROG, Settings, parse_args
from gpushare.cluster.state.view import ClusterView
from gpushare.cluster.tls import (
    CA_FILE,
    CERT_FILE,
    KEY_FILE,
    CertFiles,
    ReloadingServerTls,
    ensure_certs,
)
from gpushare.kube.controller import Kube
from gpushare.packing.admission import Admission
from gpushare.packing.interference import MODEL_ENV, load_default

__all__ = ["ControllerContext", "Hook", "main", "run", "run_operator", "serve"]

log = logging.getLogger("gpushare.cluster")


async def run(
    settings: Settings,
    *,
    hooks: Sequence[Hook] = (),
    kube: Kube | None = None,
    view: ClusterView | None = None,
    connect: bool = True,
) -> None:
    """Run until ``context.stopping`` is set (SIGTERM/SIGINT in ``main``) or a duty dies.

    ``connect=False`` runs without any API server (extender and webhook only; for benchmarks and
    fuzzing), in which case the caller fills ``view``.
    """
    view = view or ClusterView(stale_assume_seconds=settings.placement.stale_assume_seconds)
    if kube is None and connect:
        process = settings.process
        kube = Kube.connect(kubeconfig=process.kubeconfig, field_manager=process.field_manager)
    ctx = ControllerContext(settings=settings, view=view, metrics=Metrics(view), kube=kube)
    await serve(ctx, hooks=hooks)


async def serve(ctx: ControllerContext, *, hooks: Sequence[Hook] = ()) -> None:
    """Serve with every component :func:`components` lists until the process stops; a duty
    that dies stops it with exit status 1."""
    ctx.view.tenancies.mode = ctx.settings.placement.tenancy
    ctx.view.tenancies.rules = ctx.settings.placement.neighbour_rules
    listeners: list[AdmissionProcess] = []
    elector: LeaderElector | None = None
    with tempfile.TemporaryDirectory(prefix="gpushare-webhook-") as scratch:
        try:
            web = ctx.settings.webhook
            cert_dir = (web.cert_dir or Path(scratch)) if web.enabled else None
            keeper = await _certificate_keeper(ctx, cert_dir)
            extender = _extender(ctx)
            if web.enabled:
                assert cert_dir is not None
                listeners.append(_webhook(ctx, cert_dir=cert_dir, keeper=keeper))
                await listeners[-1].start()
                log.info(
                    "webhook listening",
                    extra={
                        "url": f"https://{ctx.settings.webhook.host}:{ctx.settings.webhook.port}"
                    },
                )
            elector = _elector(ctx)
            duties = components(ctx, extender, elector=elector, hooks=hooks)
            if keeper is not None:
                duties.append(
                    Task(
                        "certificate upkeep",
                        lambda: keeper.run(
                            leading=lambda: ctx.leading,
                            period_s=ctx.settings.process.cert_reload_seconds,
                        ),
                    )
                )
            await supervise(duties, ctx.stopping)
        except DutyEndedError:
            raise SystemExit(1) from None
        finally:
            for listener in listeners:
                await listener.stop()
            if elector is not None:
                await elector.release()
            if ctx.kube is not None:
                with contextlib.suppress(Exception):
                    await ctx.kube.close()


def components(
    ctx: ControllerContext,
    extender: Extender,
    *,
    elector: LeaderElector | None,
    hooks: Sequence[Hook],
) -> list[Duty]:
    """Every background duty of the process, in the order they start."""
    settings, kube = ctx.settings, ctx.kube
    duties: list[Duty] = []
    if kube is not None:
        duties += _watches(ctx, kube, extender)
        if settings.webhook.register:
            duties.append(WebhookRegistration(ctx, kube))
    else:
        ctx.view.mark_synced()
    duties += [StaleExpiry(ctx, extender), CertReload(ctx)]
    if settings.opportunistic.priority_class and kube is not None:
        duties.append(PriorityClassWatch(ctx, kube))
    leader_hooks = [*hooks, run_operator] if settings.operator.enabled else list(hooks)
    duties.append(Leadership(ctx, extender, elector=elector, hooks=leader_hooks))
    return duties


def _extender(ctx: ControllerContext) -> Extender:
    """The scheduler extender, and its TLS when configured."""
    settings = ctx.settings
    placement, ext = settings.placement, settings.extender
    if ext.tls_cert is not None and ext.tls_key is not None:
        ctx.extender_tls = ReloadingServerTls(
            cert=ext.tls_cert, key=ext.tls_key, client_ca=ext.client_ca
        )
    return Extender(
        view=ctx.view,
        writer=ctx.kube,
        policy=placement.policy,
        admission=Admission() if placement.interference_admission else None,
        gate_seconds=placement.bind_gate_seconds,
        hold_in_filter=placement.hold_in_filter,
        opportunism=ctx.opportunism,
        agent_check=AgentReadiness(url_template=settings.operator.agent_url),
    )


def _webhook(
    ctx: ControllerContext, *, cert_dir: Path, keeper: CertificateKeeper | None
) -> AdmissionProcess:
    """The webhook's port, served by the admission process (gpushare.cluster.admission) with
    what the certificate keeper wrote from the Secret every replica serves, else certificates
    made in ``cert_dir`` where missing."""
    web = ctx.settings.webhook
    if keeper is not None and keeper.settings.issue:
        ctx.certs = CertFiles(cert_dir / CERT_FILE, cert_dir / KEY_FILE, cert_dir / CA_FILE)
    else:
        ctx.certs = ensure_certs(cert_dir, hosts=web.hosts(), required=web.required_hosts() or None)
    ctx.ca_bundle = ctx.certs.ca_pem()
    ctx.webhook_tls = ForwardingTls(cert=ctx.certs.cert, key=ctx.certs.key)
    return AdmissionProcess(
        ctx,
        host=web.host,
        port=web.port,
        cert=ctx.certs.cert,
        key=ctx.certs.key,
        # Replicas on one host (tests) share the port; the kernel spreads the calls.
        reuse_port=ctx.settings.leader.enabled,
        # A restarted controller's port may be held a moment by the last admission process.
        wait_s=ADMISSION_PORT_WAIT_S,
        client_ca=web.client_ca,
    )


async def _certificate_keeper(
    ctx: ControllerContext, cert_dir: Path | None
) -> CertificateKeeper | None:
    """With --certificate-secrets: the keeper of the Secrets, its files written before
    anything serves them (gpushare.cluster.certificates)."""
    settings = ctx.settings
    if not settings.certificates.secrets or ctx.kube is None:
        return None
    keeper = CertificateKeeper(
        ctx.kube.secret_store(settings.certificates.namespace),
        settings.certificates,
        leaves_for(
            settings.certificates,
            webhook_hosts=settings.webhook.hosts(),
            webhook_dir=cert_dir,
            extender_cert=settings.extender.tls_cert,
            extender_key=settings.extender.tls_key,
            extender_client_ca=settings.extender.client_ca,
        ),
    )
    await keeper.start()
    return keeper


def _elector(ctx: ControllerContext) -> LeaderElector | None:
    """The Lease election with ``--leader-elect`` (and an API server), else None: lead."""
    leader = ctx.settings.leader
    if not leader.enabled or ctx.kube is None:
        return None
    return LeaderElector(
        ctx.kube,
        namespace=leader.namespace,
        name=leader.name,
        identity=leader.identity
        or os.environ.get("POD_NAME")
        or f"{socket.gethostname()}-{os.getpid()}",
        lease_seconds=leader.lease_seconds,
        renew_seconds=leader.renew_seconds,
    )


def _watches(ctx: ControllerContext, kube: Kube, extender: Extender) -> list[Duty]:
    """The watches that feed the view (and, in DRA mode, the claim templates and devices)."""
    settings, view = ctx.settings, ctx.view
    resync = settings.placement.resync_seconds
    lease_namespace = settings.placement.agent_lease_namespace or settings.leader.namespace
    view.agents.namespace = lease_namespace
    view.agents.max_duration_s = settings.placement.agent_lease_max_seconds
    if settings.operator.enabled:
        ctx.share_handoff = watches.ShareHandoff(view)
    duties = _dra_watches(ctx, kube, extender)
    allocator, keeper, handoff = ctx.claim_allocator, ctx.template_keeper, ctx.share_handoff
    return [
        *duties,
        Task("node watch", lambda: watches.feed_nodes(kube, view, resync_seconds=resync)),
        Task(
            "pod watch",
            lambda: watches.feed_pods(
                kube, view, resync_seconds=resync, allocator=allocator, keeper=keeper
            ),
        ),
        # Ends, as expected, once the operator's Kopf watch feeds the view (ShareHandoff).
        Task(
            "GpuShare watch",
            lambda: watches.feed_shares(kube, view, resync_seconds=resync, handoff=handoff),
            may_finish=True,
        ),
        Task("namespace watch", lambda: watches.feed_namespaces(kube, view, resync_seconds=resync)),
        Task("ResourceQuota watch", lambda: watches.feed_quotas(kube, view, resync_seconds=resync)),
        Task(
            "node agent Lease watch",
            lambda: watches.feed_agent_leases(
                kube, view, namespace=lease_namespace, resync_seconds=resync
            ),
        ),
        Task("node agent Leases", lambda: watches.judge_agent_leases(view)),
    ]


def _dra_watches(ctx: ControllerContext, kube: Kube, extender: Extender) -> list[Duty]:
    """DRA mode's parts and their watches: the claim templates of annotated pods, and the
    devices and claims the claim allocator places from (none in device-plugin mode)."""
    settings, view = ctx.settings, ctx.view
    resync = settings.placement.resync_seconds
    duties: list[Duty] = []
    if settings.dra.annotates_claims:
        templates = ctx.claim_templates = ClaimTemplates(
            device_class=settings.dra.device_class, quarantine=view.quarantine
        )
        ctx.template_keeper = TemplateKeeper(
            templates=templates,
            api=kube,
            per_namespace=settings.dra.templates_per_namespace,
            idle_s=settings.dra.template_idle_seconds,
        )
        duties.append(
            Task(
                "claim template watch",
                lambda: watches.feed_claim_templates(kube, templates, resync_seconds=resync),
            )
        )
    if settings.dra.places_claims:
        devices = DraDevices(quarantine=view.quarantine)
        # The operator sees DRA-mode pods on GPUs by their claims (status.placements, latency
        # protection); the extender's ledger does not.
        view.claim_holders = devices.holders
        ctx.claim_allocator = ClaimAllocator(
            view=view,
            devices=devices,
            placer=extender.placer,
            writer=kube,
            device_class=settings.dra.device_class,
        )
        ctx.metrics.watch_claims(ctx.claim_allocator)
        duties.append(
            Task("DRA watches", lambda: watches.feed_dra(kube, devices, resync_seconds=resync))
        )
    return duties


ADMISSION_PORT_WAIT_S = 10.0
"""How long a starting controller tries the webhook's port while it is taken."""

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
    setup_json_logging(component=PROG, level=settings.process.log_level)
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
        view = ClusterView(stale_assume_seconds=settings.placement.stale_assume_seconds)
        try:
            kube = Kube.connect(
                kubeconfig=settings.process.kubeconfig, field_manager=settings.process.field_manager
            )
        except Exception as exc:
            raise InvalidInputError(
                "--kubeconfig", f"cannot load Kubernetes config ({exc})", "give a valid kubeconfig"
            ) from None
        ctx = ControllerContext(settings=settings, view=view, metrics=Metrics(view), kube=kube)
        loop = asyncio.get_running_loop()
        if isinstance(loop, ControllerLoop):
            ctx.metrics.watch_loop(loop.turns)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, ctx.stopping.set)
        await serve(ctx)

    gc.set_threshold(*GC_THRESHOLDS)
    try:
        # The loop's turns are timed (gpushare.cluster.event_loop; /metrics).
        with asyncio.Runner(loop_factory=ControllerLoop) as runner:
            runner.run(_main())
    except InvalidInputError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
