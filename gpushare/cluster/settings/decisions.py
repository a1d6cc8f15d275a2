"""Settings of the controller's decisions: the placement policy and tenancy, opportunistic
placement, DRA mode and the operator."""

from dataclasses import dataclass
from typing import ClassVar

from gpushare.api.agent_lease import AGENT_LEASE_DURATION_S
from gpushare.api.dra import DEVICE_CLASS
from gpushare.api.endpoints import (
    DEFAULT_AGENT_URL,
    DEFAULT_PROFILE_CACHE,
    check_agent_url,
    check_configmap_name,
)
from gpushare.api.errors import InvalidInputError
from gpushare.api.flags import option
from gpushare.cluster.settings.checks import (
    ANNOTATION_MODES,
    DRA_PLACEMENTS,
    MODE_DEVICEPLUGIN,
    MODE_DRA,
    PLACEMENT_GPUSHARE,
    PLACEMENT_KUBE_SCHEDULER,
    namespace_name,
    object_name,
    positive,
    within,
)
from gpushare.cluster.state.agents import MAX_DURATION_S
from gpushare.cluster.state.tenancy import RULES_GRANTED, RULES_MODES
from gpushare.packing.policy import DEFAULT_POLICY, Policy
from gpushare.packing.tenancy import TENANCY_MODES, TENANCY_NAMESPACE


@dataclass(frozen=True)
class PlacementSettings:
    """Where pods go: the policy of filter, prioritize and bind, and who may share a GPU."""

    policy: Policy = DEFAULT_POLICY
    """Placement policy of filter, prioritize and bind: ``gpushare`` (fragmentation-aware,
    measured against the pod mix the controller learns; what the openb benchmarks measured,
    docs/packing.md), ``binpack`` (fullest GPU and node) or ``spread`` (emptiest)."""
    tenancy: str = option(TENANCY_NAMESPACE, choices=TENANCY_MODES)
    """``namespace``: a GPU is shared only by pods of one namespace (or of one sharing group an
    admin set with the namespace label gpushare.io/sharing-group). ``cluster``: pods of every
    namespace may share a GPU (cross-namespace sharing, an explicit opt-in)."""
    neighbour_rules: str = option(RULES_GRANTED, choices=RULES_MODES)
    """``granted-namespaces``: packing-policy exclusive and profiling alone on a GPU take effect
    only in namespaces an admin labelled gpushare.io/neighbour-rules=granted. ``everyone``:
    in every namespace."""
    interference_admission: bool = True
    """Leave out GPUs where a pod, or a tenant already there, is predicted slower than its
    class accepts (latency 1.15x, batch 2.0x) by the shipped interference model. Applies only
    where a GpuShare profile was measured (docs/packing.md, "Admission")."""
    stale_assume_seconds: float = 120.0
    """A pod whose placement annotations were written but which never got bound (the
    controller died between the two writes) stops holding its share after this long."""
    bind_gate_seconds: float = 5.0
    """Longest a bind waits for the pods bound just before it on the same node to get their
    Allocate (kept below kube-scheduler's extender httpTimeout); a bind that cannot even start
    in that time is answered "busy" and retried by the scheduler."""
    hold_in_filter: bool = True
    """Filter picks the best node itself and holds the GPU there until the bind, offering the
    scheduler that node only: no bind collisions between pods scheduled back to back, at the
    cost of the scheduler's own scores among GPU-feasible nodes (see docs/scheduling.md).
    --no-hold-in-filter lets the scheduler choose among all GPU-feasible nodes."""
    resync_seconds: float = 300.0
    """Re-list pods and nodes this often, as a guard against a missed watch event."""
    agent_lease_namespace: str = ""
    """Where the node agents renew their Leases (gpushare.api.agent_lease; the chart: the
    release namespace); a node whose agent's Lease expired gets no new pod. Empty: the
    leader-election Lease's namespace (``--leader-elect-namespace``)."""
    agent_lease_max_seconds: float = MAX_DURATION_S
    """The longest an agent's Lease counts as renewed without a renewal seen, whatever its
    ``leaseDurationSeconds`` says: a Lease is written with the agent's token, and one written
    once with a huge duration right after its agent died keeps the node for this long at most
    (docs/security.md). At least the agents' own duration (6 s)."""

    def validate(self) -> None:
        positive(
            ("--stale-assume-seconds", self.stale_assume_seconds),
            ("--resync-seconds", self.resync_seconds),
            ("--bind-gate-seconds", self.bind_gate_seconds),
        )
        if not AGENT_LEASE_DURATION_S <= self.agent_lease_max_seconds <= 3600.0:
            raise InvalidInputError(
                "--agent-lease-max-seconds",
                f"{self.agent_lease_max_seconds} is out of range",
                f"use {AGENT_LEASE_DURATION_S}..3600 seconds (below the agents' own Lease "
                "duration a live agent would be judged gone between its renewals)",
            )
        if self.agent_lease_namespace:
            # Only the agents' namespace: a tenant's Lease named like an agent's elsewhere
            # must not count (gpushare.cluster.state.agents).
            namespace_name(
                "--agent-lease-namespace", self.agent_lease_namespace, "the node agents' Leases"
            )


@dataclass(frozen=True)
class OpportunisticSettings:
    """Opportunistic placement beyond guaranteed capacity, and its governor."""

    PREFIX: ClassVar[str] = "opportunistic"
    placement: bool = True
    """Honour opt-ins to opportunistic placement (pods asking for
    ``gpushare.io/opportunistic-gpu-percent``, which node agents advertise). Off: the webhook
    refuses an opt-in, naming this flag (docs/packing.md, "The sharing contract")."""
    priority_class: str = "gpushare-opportunistic"
    """PriorityClass the webhook gives opted-in pods that name none (the chart creates it,
    value -10, preemptionPolicy Never): kube-scheduler tries higher priorities first, so a
    guaranteed pod waiting beside an opportunistic one is placed first instead of preempting
    it right after. Read from the API server every 15 s; while it does not exist no priority is
    given. Empty gives none."""
    default: bool = False
    """Opportunistic by default where the user left the choice to gpushare: batch pods of one
    GPU or less whose request gpushare sizes (a GpuShare's fraction: auto) opt in unless they
    or their GpuShare say otherwise (gpushare.io/opportunistic: "false"); a pod or GpuShare
    that writes its fraction keeps a guarantee. Where no GPU has their request free, they may
    run beyond a GPU's guaranteed capacity when gpushare predicts it pays, paused when a
    guaranteed pod needs the compute (docs/packing.md, "The sharing contract"). Off until the
    GPU benchmark shows its targets hold: only pods that opt in do."""
    governor_period_seconds: float = option(30.0, flat="governor_period_seconds")
    """How often the leader judges GPUs with opportunistic tenants by their measured counters
    (the node agent's /profile), and learns its interference corrections from every shared
    GPU."""
    governor_settle_seconds: float = option(60.0, flat="governor_settle_seconds")
    """How long an opportunistic pod runs before the governor judges it (its start-up, then a
    window of counters taken with it)."""

    def validate(self) -> None:
        for name, seconds in (
            ("--governor-period-seconds", self.governor_period_seconds),
            ("--governor-settle-seconds", self.governor_settle_seconds),
        ):
            if not 1.0 <= seconds <= 86400.0:
                raise InvalidInputError(name, f"{seconds} is out of range", "use 1..86400 seconds")
        if self.priority_class:
            object_name(
                "--opportunistic-priority-class",
                self.priority_class,
                "a PriorityClass name",
                ", or '' for none",
            )


@dataclass(frozen=True)
class DraSettings:
    """DRA mode: the claims annotated pods get and who allocates them (docs/dra.md)."""

    PREFIX: ClassVar[str] = "dra"
    annotation_mode: str = option(
        MODE_DEVICEPLUGIN, flat="annotation_mode", choices=ANNOTATION_MODES
    )
    """What the webhook makes of a pod's gpushare.io/gpu-fraction (or share) annotations:
    ``deviceplugin``, the gpushare.io/gpu-percent resource placed by gpushare-scheduler; ``dra``,
    a ResourceClaim of ``dra_device_class`` (docs/dra.md, "Keeping
    annotations"; placed as ``dra_placement`` says). The chart sets it from its ``mode``."""
    device_class: str = DEVICE_CLASS
    """DeviceClass of the claims made in ``--annotation-mode=dra`` (the chart's
    dra.deviceClass.name)."""
    placement: str | None = option(None, choices=DRA_PLACEMENTS)
    """Who allocates DRA claims of pods gated by ``gpushare.io/placement``: ``gpushare``, the
    controller with the placement policy (in ``--annotation-mode=dra`` the webhook gates
    annotated pods; docs/dra.md "Who places a claim"); ``kube-scheduler``, its DRA allocator
    (first fit; nothing is gated). Unset: ``gpushare`` in ``--annotation-mode=dra``, else
    ``kube-scheduler``. The chart sets it from dra.placement wherever a node pool runs in dra
    mode."""
    templates_per_namespace: int = 32
    """In ``--annotation-mode=dra``: most ResourceClaimTemplates gpushare makes in one namespace
    (one per distinct request its annotated pods make); a pod asking for one more is refused
    at admission, naming this bound (gpushare.cluster.dra.templates)."""
    template_idle_seconds: float = 600.0
    """A ResourceClaimTemplate gpushare made that no pod has referred to for this long is
    deleted (it is made again for the next pod that asks)."""

    @property
    def annotates_claims(self) -> bool:
        """The webhook turns annotations into ResourceClaims (``--annotation-mode=dra``)."""
        return self.annotation_mode == MODE_DRA

    @property
    def places_claims(self) -> bool:
        """The controller allocates the claims of gated pods (see ``dra_placement``)."""
        default = PLACEMENT_GPUSHARE if self.annotates_claims else PLACEMENT_KUBE_SCHEDULER
        return (self.placement or default) == PLACEMENT_GPUSHARE

    def validate(self) -> None:
        if self.annotation_mode not in ANNOTATION_MODES:
            raise InvalidInputError(
                "--annotation-mode",
                f"{self.annotation_mode!r} is not a mode",
                f"use one of {', '.join(ANNOTATION_MODES)}",
            )
        object_name(
            "--dra-device-class",
            self.device_class,
            "a valid DeviceClass name",
            ", e.g. mps.gpushare.io",
        )
        within(
            "--dra-templates-per-namespace",
            self.templates_per_namespace,
            (1, 10_000),
            "give how many distinct requests a namespace's pods may make, e.g. 32",
        )
        positive(("--dra-template-idle-seconds", self.template_idle_seconds))


@dataclass(frozen=True)
class OperatorSettings:
    """The GpuShare operator run in this process."""

    enabled: bool = option(
        True,
        flat="operator_enabled",
        flags=("--no-operator",),
        action="store_false",
        help="do not run the operator",
    )
    """Run the Kopf operator (``gpushare.cluster.operator``) in the same event loop."""
    agent_url: str = DEFAULT_AGENT_URL
    """The operator's way to a node agent's metrics server (its profiler is ``/profile``
    below it): an http(s) URL template where {node} and {node_ip} (the node's InternalIP) are
    substituted. The chart derives it from node.metrics.port."""
    profile_cache_name: str = DEFAULT_PROFILE_CACHE
    """Name of the operator's profile cache ConfigMap in the controller's namespace (the chart:
    <release>-profile-cache, the one its RBAC grants)."""

    def validate(self) -> None:
        check_agent_url(self.agent_url)
        check_configmap_name(self.profile_cache_name)
