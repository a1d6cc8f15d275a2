"""What the view keeps of a watched pod: :class:`PodFacts`, the one typed projection of a pod,
read once per event by :func:`facts`: what the extender places by and what the operator
governs by (labels, GPU container, class), and the tests of which pods the view keeps.
"""

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from gpushare.api.dra import ANN_DRA_GPU
from gpushare.api.errors import InvalidInputError
from gpushare.api.names import (
    ANN_CLASS,
    ANN_CONTAINER,
    ANN_EVICT,
    ANN_SHARE,
    CLASS_BATCH,
    GPU_RESOURCES,
    SCHEDULER_NAME,
    STATE_ASSUMED,
)
from gpushare.api.placement import Placement, parse_placement
from gpushare.api.request import parse_class
from gpushare.cluster.state.gpu_requests import demand_of
from gpushare.cluster.state.pods import (
    FINISHED_PHASES,
    Pod,
    annotations,
    as_mapping,
    containers,
    dra_claimed,
    finished,
    metadata,
    node_name,
    pod_key,
    pod_uid,
    scheduler_name,
    scheduling_gated,
)
from gpushare.packing.model import Demand

log = logging.getLogger("gpushare.cluster.state.pods")  # the name its warning always had

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _unexpected(exc: Exception) -> str:
    return f"gpushare annotations unreadable ({type(exc).__name__}); fix or remove them"


@dataclass(frozen=True)
class Workload:
    """What a GpuShare governs a pod by, and what its profile is cached under: read only for
    the pods the view keeps (``kept``)."""

    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    created: datetime = EPOCH
    gpu_pod: bool = False
    """Asks for gpushare GPU slices (resource limit), uses gpushare-scheduler, or links a
    GpuShare by annotation. Only these pods are governed by a GpuShare: a selector alone never
    turns a pod the webhook did not see into a GPU pod."""
    image: str = ""
    """The GPU container's image (``gpushare.io/container``, else the first container)."""
    command: tuple[str, ...] = ()
    """The GPU container's command followed by its args."""
    gpu_class: str = CLASS_BATCH
    dra_gpu: str | None = None
    """DRA mode: the GPU the controller allocated the pod's claim on (``gpushare.io/dra-gpu``,
    written for GpuShare-governed pods only), which its share profiles if it elects the pod."""


NO_WORKLOAD = Workload()


@dataclass(frozen=True)
class PodFacts:
    """What the view keeps of one pod gpushare places or a GpuShare may govern: the one typed
    projection of a watched pod (placement reads the top fields, the operator ``workload``)."""

    key: str
    uid: str
    node: str | None
    finished: bool
    demand: Demand | None
    """None when the pod's annotations are unreadable (it then holds what its placement says)."""
    placement: Placement | None
    problem: str | None = None
    """Why demand or placement could not be read, for logs."""
    phase: str = ""
    evict: str | None = None
    """Why the node agent asks for the pod to be evicted (``gpushare.io/evict``), if it does."""
    scheduler: str = ""
    """``spec.schedulerName``: the extender binds only pods of gpushare-scheduler."""
    deleting: bool = False
    """``metadata.deletionTimestamp`` is set (scheduled or not)."""
    gated: bool = False
    """``spec.schedulingGates`` is not empty: kube-scheduler does not try the pod yet, whoever
    holds it (a queue such as Kueue until it admits the pod, docs/queues.md)."""
    dra: bool = False
    """Holds the claim the webhook gives annotated pods in DRA mode (:func:`dra_claimed`): the
    claim allocator places it, and the view counts no GPU share for it. Kept when it links a
    GpuShare, which governs it as any GPU pod (docs/dra.md, "GpuShares and profiles")."""
    workload: Workload = NO_WORKLOAD
    """Kept apart so that the copies placement makes of the facts stay cheap."""

    @property
    def labels(self) -> Mapping[str, str]:
        return self.workload.labels

    @property
    def annotations(self) -> Mapping[str, str]:
        return self.workload.annotations

    @property
    def created(self) -> datetime:
        return self.workload.created

    @property
    def gpu_pod(self) -> bool:
        return self.workload.gpu_pod

    @property
    def image(self) -> str:
        return self.workload.image

    @property
    def command(self) -> tuple[str, ...]:
        return self.workload.command

    @property
    def gpu_class(self) -> str:
        return self.workload.gpu_class

    @property
    def namespace(self) -> str:
        return self.key.partition("/")[0]

    @property
    def name(self) -> str:
        return self.key.partition("/")[2]

    @property
    def active(self) -> bool:
        """Holds (or will hold) its GPU share: neither finished nor being deleted."""
        return not self.deleting and self.phase not in FINISHED_PHASES

    @property
    def gpu_uuid(self) -> str | None:
        """The one GPU the pod is placed on (None: unplaced, or on several GPUs)."""
        if self.placement is None or len(self.placement.gpu_uuids) != 1:
            return None
        return self.placement.gpu_uuids[0]

    @property
    def profiled_gpu(self) -> str | None:
        """The one GPU whose counters are this pod's when it runs alone: its placement's, or
        in DRA mode its claim's (``Workload.dra_gpu``)."""
        return self.gpu_uuid or self.workload.dra_gpu

    @property
    def awaiting_allocation(self) -> bool:
        """Bound with state ``assumed`` and not yet admitted: the node agent's Allocate for it
        is still to come."""
        return (
            self.node is not None
            and not self.finished
            and self.phase == "Pending"
            and self.placement is not None
            and self.placement.state == STATE_ASSUMED
        )


def _created(text: object) -> datetime:
    if not isinstance(text, str) or not text:
        return EPOCH
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return EPOCH
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _str_map(raw: object) -> dict[str, str]:
    """Labels as the API server stores them (strings to strings); anything else is left out
    (str() of a deeply nested value raises RecursionError)."""
    if not isinstance(raw, Mapping):
        return {}
    return {k: v for k, v in raw.items() if isinstance(k, str) and isinstance(v, str)}


def facts(pod: Pod) -> PodFacts:
    """Read a watched pod; never raises (a broken pod must not stop the watch): what cannot be
    read becomes ``problem``, reported on the pod, and the pod holds what its placement says.

    Labels, annotations, GPU container and class are read only for pods gpushare places or a
    GpuShare may govern (``kept``): the view drops every other pod after counting its host
    resources, and every pod event of the cluster comes through here."""
    problem: str | None = None
    ann = annotations(pod)  # read once: every pod event of the cluster comes through here
    try:
        demand = demand_of(pod, ann=ann)
    except InvalidInputError as exc:
        demand, problem = None, str(exc)
    except Exception as exc:  # a bound missed somewhere: still never the watch's problem
        demand, problem = None, _unexpected(exc)
    dra = (demand is not None or ANN_SHARE in ann) and dra_claimed(pod)
    if dra:
        demand = None  # the DRA allocator places it (gpushare.cluster.webhook.claims)
    try:
        placement = parse_placement(ann)
    except InvalidInputError as exc:
        placement, problem = None, str(exc)
    except Exception as exc:
        placement, problem = None, _unexpected(exc)
    node = node_name(pod)
    meta = metadata(pod)
    deleting = meta.get("deletionTimestamp") is not None
    scheduler = scheduler_name(pod)
    placed = demand is not None or placement is not None or problem is not None
    governed_dra = dra and bool(ann.get(ANN_SHARE))
    is_kept = placed or scheduler == SCHEDULER_NAME or governed_dra  # ``kept``
    return PodFacts(
        key=pod_key(pod),
        uid=pod_uid(pod),
        node=node,
        finished=finished(pod) or (deleting and node is None),
        demand=demand,
        placement=placement,
        problem=problem,
        phase=str(as_mapping(pod.get("status")).get("phase") or ""),
        evict=ann.get(ANN_EVICT),
        scheduler=scheduler,
        deleting=deleting,
        gated=node is None and scheduling_gated(pod),
        dra=dra,
        workload=_workload(pod, meta, ann, scheduler, dra=dra) if is_kept else NO_WORKLOAD,
    )


def _workload(
    pod: Pod, meta: Mapping[str, Any], ann: dict[str, str], scheduler: str, *, dra: bool
) -> Workload:
    """What a GpuShare governs a kept pod by (:func:`facts`): its labels, annotations and age,
    its GPU container's image and command, its class."""
    items = containers(pod)
    wanted = ann.get(ANN_CONTAINER)
    gpu_container = next((c for c in items if c.get("name") == wanted), None) or (
        items[0] if items else {}
    )
    limits_have_gpu = any(
        r in as_mapping(as_mapping(c.get("resources")).get("limits"))
        for c in items
        for r in GPU_RESOURCES
    )
    command = [str(x) for x in gpu_container.get("command") or []] + [
        str(x) for x in gpu_container.get("args") or []
    ]
    try:
        gpu_class = parse_class(ann.get(ANN_CLASS))
    except InvalidInputError:
        gpu_class = CLASS_BATCH
    return Workload(
        labels=_str_map(meta.get("labels")),
        annotations=ann,
        created=_created(meta.get("creationTimestamp")),
        gpu_pod=limits_have_gpu or scheduler == SCHEDULER_NAME or bool(ann.get(ANN_SHARE)),
        image=str(gpu_container.get("image", "")),
        command=tuple(command),
        gpu_class=gpu_class,
        dra_gpu=(ann.get(ANN_DRA_GPU) or None) if dra else None,
    )


def ours(f: PodFacts) -> bool:
    """A pod gpushare places on GPUs: it asks for a share, holds one, or its gpushare
    annotations are unreadable (it is refused with the reason)."""
    return f.demand is not None or f.placement is not None or f.problem is not None


def kept(f: PodFacts) -> bool:
    """A pod the view keeps: one gpushare places, one naming gpushare-scheduler without a
    request (linked to a GpuShare, it is governed and reported by the operator), or a DRA-mode
    pod linking a GpuShare (``PodFacts.dra``)."""
    return ours(f) or f.scheduler == SCHEDULER_NAME or (f.dra and f.gpu_pod)


def frozen_demand(old: PodFacts | None, f: PodFacts) -> PodFacts:
    """``f``, the pod as the watch says it now, with the request it was placed with (``old``:
    as the view kept it). Once bound, a pod holds what it was placed with: a later change of
    its request annotations (refused by the chart's admission policy; here if that is missing)
    does not change what it counts for on its GPU (docs/security.md). Its GpuShare's measured
    profile follows the pod: the operator writes it on running pods once it is known, and
    what fits beside the pod depends on it, not what the pod counts for."""
    if (
        old is None
        or old.uid != f.uid
        or old.node is None
        or old.placement is None
        or old.demand is None
        or f.demand == old.demand
    ):
        return f
    if f.demand is None or _request(f.demand) != _request(old.demand):
        log.warning(
            "request annotations changed after bind; the pod keeps the share it was placed with",
            extra={"pod": f.key},
        )
    if f.demand is None:
        return replace(f, demand=replace(old.demand, tenancy=None))
    new = f.demand
    kept = replace(
        old.demand,
        tenancy=new.tenancy,
        profile=new.profile,
        peak_memory_bytes=new.peak_memory_bytes,
    )
    return replace(f, demand=kept)


def _request(demand: Demand) -> Demand:
    """What of a demand is the pod's request (not its tenancy, nor its share's profile)."""
    return replace(demand, tenancy=None, profile=None, peak_memory_bytes=None)
