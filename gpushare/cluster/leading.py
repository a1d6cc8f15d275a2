"""What only one replica may do, as one component: wait for the Lease (serving the webhook
meanwhile), then serve the extender (bind pods) and run the leader's duties (evictions,
quarantine reports, the opportunistic governor, the claim allocator and template keeper, the
operator). Losing the Lease raises, which stops the process (Kubernetes restarts it as a
standby)."""

import asyncio
import logging
import os
from collections.abc import Sequence

from gpushare.cluster import quarantine_reports
from gpushare.cluster.context import ControllerContext, Hook
from gpushare.cluster.duties import Duty, Evictions, Task, Work, supervise
from gpushare.cluster.extender.verbs import Extender
from gpushare.cluster.leader import LeaderElector
from gpushare.cluster.operator import runner as operator_runner
from gpushare.cluster.operator.settings import OperatorConfig
from gpushare.cluster.opportunistic import OpportunisticDuties
from gpushare.cluster.server import Listener, extender_routes
from gpushare.kube.retry import Backoff, keep_trying

log = logging.getLogger("gpushare.cluster")

ROLE_LABEL = "gpushare.io/controller-role"
"""Label on a controller replica's pod: the extender Service selects ``leader``."""
ROLE_LEADER = "leader"
ROLE_STANDBY = "standby"


class Leadership(Duty):
    """The leader's part of the process (module docstring); without an elector this replica
    leads at once."""

    name = "leader duties"

    def __init__(
        self,
        ctx: ControllerContext,
        extender: Extender,
        *,
        elector: LeaderElector | None,
        hooks: Sequence[Hook],
    ) -> None:
        super().__init__()
        self.ctx, self.extender, self.elector, self.hooks = ctx, extender, elector, hooks
        settings = ctx.settings
        self.listener = Listener(
            extender_routes(
                extender, metrics=ctx.metrics, ready=ctx.ready, authorize=ctx.authorize
            ),
            host=settings.extender.host,
            port=settings.extender.port,
            ssl_context=ctx.extender_tls.context if ctx.extender_tls else None,
            wait_s=settings.leader.lease_seconds if elector is not None else 0.0,
        )

    async def run(self) -> None:
        ctx, elector = self.ctx, self.elector
        if elector is not None:
            await self._label_role(ROLE_STANDBY)
            if not await elector.acquire(ctx.stopping):
                return
        ctx.leading = True
        await self.listener.start()
        scheme = "https" if ctx.extender_tls else "http"
        log.info(
            "extender listening",
            extra={
                "url": f"{scheme}://{ctx.settings.extender.host}:{ctx.settings.extender.port}"
                "/scheduler",
                "client_certificates": ctx.settings.extender.client_ca is not None,
            },
        )
        if elector is not None:
            await self._label_role(ROLE_LEADER)
        await supervise(self.duties(), ctx.stopping)

    def duties(self) -> list[Duty]:
        """The leader's duties, each stopping the process should it end."""
        ctx, settings = self.ctx, self.ctx.settings
        duties: list[Duty] = []
        if self.elector is not None:
            duties.append(Task("lease renewal", self._keep_lease))
        if ctx.kube is not None:
            kube = ctx.kube
            governor = OpportunisticDuties(
                view=ctx.view,
                kube=kube,
                opportunism=ctx.opportunism,
                metrics=ctx.metrics,
                period_s=settings.opportunistic.governor_period_seconds,
                settle_s=settings.opportunistic.governor_settle_seconds,
                agent_url=settings.operator.agent_url,
                waiting=lambda: self.extender.refused.waiting(ctx.view.pods()),
            )
            self.extender.bound_listeners.append(governor.bound)
            self.extender.pauser = governor.pause_for
            duties += [
                Evictions(ctx, kube),
                Task(
                    "quarantine reports",
                    lambda: quarantine_reports.report_loop(kube, [ctx.view.quarantine]),
                ),
                Task("opportunistic governor", governor.run),
            ]
        if ctx.claim_allocator is not None:
            duties.append(Task("claim allocator", ctx.claim_allocator.run))
        if ctx.template_keeper is not None:
            duties.append(Task("claim template keeper", ctx.template_keeper.run))
        for hook in self.hooks:
            duties.append(Task(getattr(hook, "__qualname__", "hook"), _bound(hook, ctx)))
        return duties

    async def _keep_lease(self) -> None:
        assert self.elector is not None
        await self.elector.keep(self.ctx.stopping)

    async def stop(self) -> None:
        await super().stop()
        await self.listener.stop()

    async def _label_role(self, role: str) -> None:
        """Mark this replica's pod, so the extender Service routes only to the leader."""
        ctx = self.ctx
        pod = ctx.settings.leader.pod or (
            f"{os.environ['POD_NAMESPACE']}/{os.environ['POD_NAME']}"
            if os.environ.get("POD_NAMESPACE") and os.environ.get("POD_NAME")
            else ""
        )
        if not pod or ctx.kube is None:
            return
        namespace, _, name = pod.partition("/")
        kube = ctx.kube
        try:
            await keep_trying(
                lambda: kube.label_pod(namespace=namespace, name=name, labels={ROLE_LABEL: role}),
                what="labelling this replica's pod",
                backoff=Backoff(first_s=0.5, most_s=5.0),
                attempts=20,
            )
        except Exception as exc:
            raise RuntimeError(f"could not label pod {pod} {ROLE_LABEL}={role}") from exc


def _bound(hook: Hook, ctx: ControllerContext) -> Work:
    async def work() -> None:
        await hook(ctx)

    return work


async def run_operator(ctx: ControllerContext) -> None:
    """The GpuShare operator (:mod:`gpushare.cluster.operator`) in this process's event loop,
    on this process's view, API client, metrics registry and stop event."""
    settings = ctx.settings
    if settings.process.kubeconfig is not None:
        # Kopf reads $KUBECONFIG; point it at ours.
        os.environ.setdefault("KUBECONFIG", str(settings.process.kubeconfig))
    config = OperatorConfig(
        agent_url=settings.operator.agent_url,
        cache_configmap=settings.operator.profile_cache_name,
    )
    ready = asyncio.Event()
    handoff = ctx.share_handoff

    async def announce_ready() -> None:
        await ready.wait()
        if handoff is not None:
            handoff.operator_ready()

    announcing = asyncio.create_task(announce_ready())
    try:
        await operator_runner.run_operator(
            view=ctx.view,
            kube=ctx.kube,
            host_watches=ctx.kube is not None,
            settings=config,
            registry=ctx.metrics.registry,
            stop_flag=ctx.stopping,
            ready_flag=ready,
            on_share_event=handoff.kopf_event if handoff is not None else None,
        )
    finally:
        announcing.cancel()
