"""What every part of the controller process shares: its settings, the one view of the cluster,
the metrics, the API client and the state the background duties keep (certificates, the
elected role, the PriorityClass of opted-in pods)."""

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from gpushare.api.errors import InvalidInputError
from gpushare.api.tolerations import parse_toleration
from gpushare.cluster import watches
from gpushare.cluster.dra.allocator import ClaimAllocator
from gpushare.cluster.dra.templates import ClaimTemplates, TemplateKeeper
from gpushare.cluster.metrics import Metrics
from gpushare.cluster.settings import Settings
from gpushare.cluster.state.view import ClusterView
from gpushare.cluster.tls import CertFiles, ReloadingServerTls
from gpushare.cluster.webhook.facts import ClusterFacts, PriorityRef
from gpushare.kube.access import Access, AsyncAccessReviewer
from gpushare.kube.controller import Kube
from gpushare.packing.opportunistic import Opportunism


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
    """``--opportunistic-priority-class`` as the API server has it (kept by
    :class:`~gpushare.cluster.duties.PriorityClassWatch`)."""
    _reviewer: AsyncAccessReviewer | None = None

    def __post_init__(self) -> None:
        # The cluster's state on /metrics from the leader only (each pod counted once when
        # replicas are summed); a standby exports its own requests and build_info.
        self.metrics.leading = lambda: self.leading

    async def authorize(self, authorization: str | None, path: str, *, client: str = "") -> Access:
        """May the caller (its address: ``client``) read ``path`` (/metrics):
        ``--metrics-auth`` (gpushare.kube.access)."""
        if self.settings.process.metrics_auth == "none":
            return Access(200, "allowed (--metrics-auth none)")
        if self.kube is None:
            return Access(
                503,
                f"{path}: tokens cannot be checked without an API server; fix: run the "
                "controller with --metrics-auth none",
            )
        if self._reviewer is None:
            self._reviewer = self.kube.access_reviewer()
        return await self._reviewer.review(authorization, path, client=client)

    def ready(self) -> tuple[bool, str]:
        if not self.view.synced:
            return False, "waiting for the first list of nodes and pods"
        if self.settings.webhook.register and not self.webhook_registered:
            return False, "waiting to register the admission webhooks"
        return True, "ready (leader)" if self.leading else "ready (standby: serves the webhook)"

    def cluster_facts(self) -> ClusterFacts:
        """What the webhook checks a pod against, now."""
        dra = self.settings.dra
        return ClusterFacts(
            max_gpu_memory=self.view.max_gpu_memory,
            max_gpus_per_node=self.view.max_gpus_per_node,
            # From the GpuShares in the view: the controller's GpuShare watch, or on the
            # leader once it handed that watch over, the operator's Kopf handlers.
            share_lookup=self.view.share_request,
            protected_host_paths=self.settings.pods.protected_host_paths,
            exclusive_lookup=self.view.exclusive_reason,
            separation_lookup=self.view.separation,
            dra_device_class=dra.device_class if dra.annotates_claims else None,
            dra_gate=dra.places_claims and dra.annotates_claims,
            opportunistic_placement=self.settings.opportunistic.placement,
            opportunistic_default=self.settings.opportunistic.default,
            pod_tolerations=tuple(parse_toleration(t) for t in self.settings.pods.pod_tolerations),
            pod_runtime_class=self.settings.pods.pod_runtime_class,
            opportunistic_priority=self.opportunistic_priority,
            template_check=self._template_check if self.claim_templates is not None else None,
            selector_lookup=self.view.share_selectors,
            selectors_enabled=self.view.share_selectors_enabled,
        )

    def _template_check(self, namespace: str, name: str) -> InvalidInputError | None:
        """The webhook's read of the template watch (gpushare.cluster.dra.templates); nothing
        is refused before its first list."""
        templates = self.claim_templates
        if templates is None or not templates.synced:
            return None
        return templates.admission_error(
            namespace, name, bound=self.settings.dra.templates_per_namespace
        )


Hook = Callable[[ControllerContext], Coroutine[Any, Any, None]]
"""A duty run on the leader beside the others (the operator, or a test's)."""
