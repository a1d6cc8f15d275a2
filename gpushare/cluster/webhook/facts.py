"""What the webhook knows of the cluster: a few facts from the view, read per request."""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gpushare.api.errors import InvalidInputError
from gpushare.api.label_selector import LabelSelector
from gpushare.api.request import GpuRequest

ShareLookup = Callable[[str, str], GpuRequest | None]
ExclusiveLookup = Callable[[str, str], str | None]
"""(workload UID, namespace) -> why it must get a GPU of its own."""
SeparationLookup = Callable[[str, str], tuple[frozenset[str], str] | None]
"""(workload UID, namespace) -> (GPUs its new pods keep off, why), for workloads separated
after faults."""
SelectorLookup = Callable[[str], Sequence[tuple[str, LabelSelector]]]
"""namespace -> (name, spec.selector) of its GpuShares that have a selector, by name."""
TemplateCheck = Callable[[str, str], InvalidInputError | None]
"""(namespace, template name) -> why a DRA-mode pod asking for it is refused, or None."""


@dataclass(frozen=True)
class PriorityRef:
    """A PriorityClass as the API server has it: what the webhook writes beside its name (the
    API server resolved the pod's priority before the webhook ran)."""

    name: str
    value: int
    preemption_policy: str = "Never"


@dataclass(frozen=True)
class ClusterFacts:
    """What the webhook needs to know of the cluster, read from the view per request."""

    max_gpu_memory: int = 0
    """Memory of the largest GPU; 0 = no inventory seen yet (the check is skipped)."""
    max_gpus_per_node: int = 0
    """Most GPUs on one node; 0 = unknown."""
    share_lookup: ShareLookup | None = None
    protected_host_paths: tuple[str, ...] = ()
    exclusive_lookup: ExclusiveLookup | None = None
    """Workload (controller) UID -> why it must get a GPU of its own (repeated GPU faults)."""
    separation_lookup: SeparationLookup | None = None
    """Workload (controller) UID -> GPUs to keep its pods off (it kept faulting with others)."""
    dra_device_class: str | None = None
    """DRA mode (``--annotation-mode=dra``): annotated pods get a ResourceClaim of this
    DeviceClass (gpushare.cluster.webhook.claims); None: the gpu-percent resource."""
    dra_gate: bool = False
    """DRA mode with gpushare placement (``--dra-placement=gpushare``): annotated pods also get
    the ``gpushare.io/placement`` scheduling gate, so the controller allocates their claim."""
    opportunistic_placement: bool = True
    """Opt-ins to opportunistic placement are honoured (``--opportunistic-placement``); off,
    an explicit opt-in is refused and the default applies to no pod."""
    opportunistic_default: bool = False
    """Batch pods of one GPU or less that state no opt-in (nor their GpuShare) opt in to
    opportunistic placement (``--opportunistic-default``, chart
    ``controller.opportunistic.default``)."""
    pod_tolerations: tuple[Mapping[str, str], ...] = ()
    """Tolerations added to gpushare pods that lack them (``--pod-toleration``)."""
    pod_runtime_class: str = ""
    """RuntimeClass set on gpushare pods that name none (``--pod-runtime-class``)."""
    opportunistic_priority: PriorityRef | None = None
    """The PriorityClass opted-in pods that name none are given (``--opportunistic-priority-
    class``, read from the API server); None: none exists, no priority is given."""
    template_check: TemplateCheck | None = None
    """DRA mode: a template of that name with another spec, or one template more than the
    namespace's bound, refuses the pod (gpushare.cluster.dra.templates, from its watch)."""
    selector_lookup: SelectorLookup | None = None
    """The GpuShares whose ``spec.selector`` may link a new pod (gpushare.cluster.webhook.
    share_match); None: selectors link nothing."""
    selectors_enabled: Callable[[str], bool] | None = None
    """namespace -> an admin labelled it ``gpushare.io/share-selectors=enabled``, so selectors
    link its new pods (a pod's label alone is not its owner's consent)."""
