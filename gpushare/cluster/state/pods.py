"""Reading what gpushare needs out of plain pod dicts (the API server's JSON).

The extender receives pods as JSON, the watch delivers them as JSON, the webhook too: one set of
pure functions reads them all, so the view, the extender and the webhook agree on every pod.
:class:`PodFacts` is the one typed projection of a watched pod, read once per event: what the
extender places by and what the operator governs by (labels, GPU container, class).
"""

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from gpushare.api.bounds import MAX_INT_DIGITS
from gpushare.api.dra import ANN_DRA_GPU, POD_CLAIM
from gpushare.api.errors import InvalidInputError
from gpushare.api.exclusive import parse_avoid_gpus
from gpushare.api.limit import check_limit
from gpushare.api.names import (
    ANN_AVOID_GPUS,
    ANN_CLASS,
    ANN_CONTAINER,
    ANN_EVICT,
    ANN_FRACTION,
    ANN_MEMORY,
    ANN_SHARE,
    CLASS_BATCH,
    GPU_RESOURCES,
    GROUP,
    RESOURCE_GPU_OPPORTUNISTIC,
    RESOURCE_GPU_PERCENT,
    SCHEDULER_NAME,
    SLICES_PER_GPU,
    STATE_ASSUMED,
)
from gpushare.api.placement import Placement, parse_placement
from gpushare.api.quantities import MAX_WHOLE_GPUS, parse_memory
from gpushare.api.request import GpuRequest, parse_class, parse_request
from gpushare.cluster.state.host_resources import pod_requests
from gpushare.packing.model import Demand

log = logging.getLogger(__name__)

Pod = Mapping[str, Any]

FINISHED_PHASES = ("Succeeded", "Failed")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MAX_PERCENT = MAX_WHOLE_GPUS * SLICES_PER_GPU


def _mapping(value: object) -> Mapping[str, Any]:
    if type(value) is dict:  # decoded JSON; the ABC check below costs several times more
        return value
    return value if isinstance(value, Mapping) else {}


def metadata(pod: Pod) -> Mapping[str, Any]:
    return _mapping(pod.get("metadata"))


def spec(pod: Pod) -> Mapping[str, Any]:
    return _mapping(pod.get("spec"))


def annotations(pod: Pod) -> dict[str, str]:
    """The pod's annotations; non-string values (invalid in Kubernetes) are dropped."""
    raw = _mapping(metadata(pod).get("annotations"))
    return {k: v for k, v in raw.items() if isinstance(k, str) and isinstance(v, str)}


def pod_key(pod: Pod, *, namespace: str | None = None) -> str:
    """``namespace/name`` (the webhook passes the namespace of the request: a pod being created
    may not carry one yet)."""
    meta = metadata(pod)
    ns = meta.get("namespace") or namespace or "default"
    name = meta.get("name") or meta.get("generateName") or ""
    return f"{ns}/{name}"


def pod_uid(pod: Pod) -> str:
    uid = metadata(pod).get("uid")
    return uid if isinstance(uid, str) else ""


def node_name(pod: Pod) -> str | None:
    name = spec(pod).get("nodeName")
    return name if isinstance(name, str) and name else None


def scheduler_name(pod: Pod) -> str:
    name = spec(pod).get("schedulerName")
    return name if isinstance(name, str) else ""


def finished(pod: Pod) -> bool:
    """Succeeded/Failed pods no longer hold a GPU share, once none of their containers runs.

    Whoever may write pods/status can store a terminal phase for a running pod; the API server
    then refuses the kubelet's updates of it (a terminal phase never goes back), and on the
    local cluster the kubelet kept the container running for as long as it was watched (150 s,
    tests/faults/test_security_cluster.py). Until a status shows no container running, the
    share counts (#45: it was freed at once, and the next pod could take the GPU)."""
    status = _mapping(pod.get("status"))
    if status.get("phase") not in FINISHED_PHASES:
        return False
    for key in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
        items = status.get(key)
        for item in items if isinstance(items, list) else ():
            state = item.get("state") if isinstance(item, Mapping) else None
            if isinstance(state, Mapping) and "running" in state:
                return False
    return True


def containers(pod: Pod) -> list[Mapping[str, Any]]:
    items = spec(pod).get("containers")
    return [c for c in items if isinstance(c, Mapping)] if isinstance(items, list) else []


def all_containers(pod: Pod) -> list[tuple[str, int, Mapping[str, Any]]]:
    """(list name, index, container) for containers, initContainers and ephemeralContainers."""
    out: list[tuple[str, int, Mapping[str, Any]]] = []
    for kind in ("initContainers", "containers", "ephemeralContainers"):
        items = spec(pod).get(kind)
        if isinstance(items, list):
            out += [(kind, i, c) for i, c in enumerate(items) if isinstance(c, Mapping)]
    return out


def resource_value(container: Mapping[str, Any], resource: str) -> tuple[str | None, str | None]:
    """(limit, request) of a resource as written in the container, None where absent."""
    res = _mapping(container.get("resources"))
    limit = _mapping(res.get("limits")).get(resource)
    request = _mapping(res.get("requests")).get(resource)
    return (
        str(limit) if limit is not None else None,
        str(request) if request is not None else None,
    )


def gpu_percent_resource(pod: Pod, resource: str = RESOURCE_GPU_PERCENT) -> int | None:
    """Sum of ``resource`` (``gpushare.io/gpu-percent`` by default) over the pod's containers
    (limit, else request); None when no container asks for it. Raises InvalidInputError on a
    non-integer value."""
    total: int | None = None
    for i, c in enumerate(containers(pod)):
        limit, request = resource_value(c, resource)
        value = limit if limit is not None else request
        if value is None:
            continue
        try:
            number = int(value) if len(value) <= MAX_INT_DIGITS else None
        except ValueError:
            number = None
        if number is None or number > MAX_PERCENT:
            shown = value if len(value) <= 24 else value[:20] + "..."
            raise InvalidInputError(
                f"spec.containers[{i}].resources.limits[{resource}]",
                f"{shown!r} is not a whole number of GPU percent up to {MAX_PERCENT}",
                "write an integer such as 25 (a quarter GPU), or use the gpushare.io/gpu-fraction "
                "annotation",
            )
        if number <= 0:
            raise InvalidInputError(
                f"spec.containers[{i}].resources.limits[{resource}]",
                f"{number} must be positive",
                "ask for 1..100 (or multiples of 100 for whole GPUs)",
            )
        total = (total or 0) + number
    return total


def gpu_resource(pod: Pod) -> tuple[int, bool] | None:
    """(GPU-percent, opted in) the pod asks the kubelet for: ``gpushare.io/gpu-percent``, or
    ``gpushare.io/opportunistic-gpu-percent`` for a pod opted in to opportunistic placement
    (docs/packing.md, "The sharing contract"); None when neither. Raises InvalidInputError on a
    bad value or on both."""
    plain = gpu_percent_resource(pod)
    opted = gpu_percent_resource(pod, RESOURCE_GPU_OPPORTUNISTIC)
    if plain is not None and opted is not None:
        raise InvalidInputError(
            RESOURCE_GPU_OPPORTUNISTIC,
            f"is asked for beside {RESOURCE_GPU_PERCENT}",
            f"ask for one of them (the webhook sets {RESOURCE_GPU_OPPORTUNISTIC} for pods with "
            "gpushare.io/opportunistic: true)",
        )
    if opted is not None:
        return opted, True
    return (plain, False) if plain is not None else None


def wants_gpushare(pod: Pod) -> bool:
    """True for pods gpushare places: annotated, or requesting a gpushare GPU resource (in
    any container, init containers included: the webhook refuses those)."""
    ann = metadata(pod).get("annotations")
    if isinstance(ann, Mapping) and (ANN_FRACTION in ann or ANN_SHARE in ann):
        return True
    for _, _, c in all_containers(pod):
        for resource in GPU_RESOURCES:
            limit, request = resource_value(c, resource)
            if limit is not None or request is not None:
                return True
    return False


def has_gpushare_annotations(pod: Pod) -> bool:
    return any(k.startswith(f"{GROUP}/") for k in annotations(pod))


def target_container(pod: Pod) -> int:
    """Index of the container that gets the GPU: ``gpushare.io/container`` or the first."""
    items = containers(pod)
    if not items:
        raise InvalidInputError("spec.containers", "is empty", "give the pod a container")
    wanted = annotations(pod).get(ANN_CONTAINER)
    if wanted is None:
        return 0
    for i, c in enumerate(items):
        if c.get("name") == wanted:
            return i
    names = ", ".join(str(c.get("name")) for c in items)
    raise InvalidInputError(
        ANN_CONTAINER,
        f"no container named {wanted!r}",
        f"name one of the pod's containers: {names}",
    )


def request_of(pod: Pod, *, ann: Mapping[str, str] | None = None) -> GpuRequest | None:
    """The pod's request: from the annotations (``ann``: already read, else read here), else
    from its gpu-percent resource.

    A pod linked to a GpuShare reads its compute share from the gpu-percent limit the webhook
    set. None for pods gpushare does not place. Raises InvalidInputError on bad input.
    """
    if ann is None:
        ann = annotations(pod)
    request = parse_request(ann)
    asked = gpu_resource(pod)
    if asked is not None and asked[1]:
        # The webhook resolved the opt-in into the resource: it, not the annotation, decides.
        if request is not None and request.percent > 0:
            return replace(request, opportunistic=True)
    elif request is not None and request.percent > 0:
        return replace(request, opportunistic=False) if request.opportunistic else request
    resource = asked[0] if asked is not None else None
    if resource is None:
        if request is not None and request.share is not None:
            # Linked to a GpuShare the webhook has not resolved (webhook bypassed or down).
            raise InvalidInputError(
                ANN_SHARE,
                f"GpuShare {request.share!r} was not resolved into a gpu-percent request",
                "make sure the gpushare webhook is registered, then recreate the pod",
            )
        return request
    memory_text = ann.get(ANN_MEMORY)
    memory = parse_memory(memory_text, field=ANN_MEMORY) if memory_text is not None else None
    limit = request.limit_percent if request is not None else None
    check_limit(limit, resource)
    return GpuRequest(
        percent=resource,
        memory_bytes=memory if resource <= SLICES_PER_GPU else None,
        gpu_class=parse_class(ann.get(ANN_CLASS)),
        share=request.share if request is not None else None,
        limit_percent=limit,
        opportunistic=asked is not None and asked[1],
    )


def demand_of_request(request: GpuRequest) -> Demand:
    if request.percent > SLICES_PER_GPU or request.percent == SLICES_PER_GPU:
        return Demand(
            percent=SLICES_PER_GPU,
            memory_bytes=request.memory_bytes,
            gpu_class=request.gpu_class,
            gpus=max(1, request.whole_gpus),
            opportunistic=bool(request.opportunistic) and request.percent == SLICES_PER_GPU,
        )
    return Demand(
        percent=request.percent,
        memory_bytes=request.memory_bytes,
        gpu_class=request.gpu_class,
        limit_percent=request.limit_percent,
        opportunistic=bool(request.opportunistic),
    )


def demand_of(pod: Pod, *, ann: Mapping[str, str] | None = None) -> Demand | None:
    """What the pod asks of the GPUs (and of its node's CPU and memory, which the gpushare
    policy's stranding term reads), as gpushare.packing sees it; None for other pods."""
    if ann is None:
        ann = annotations(pod)
    request = request_of(pod, ann=ann)
    if request is None or request.percent <= 0:
        return None
    cpu, memory = pod_requests(pod)
    demand = replace(demand_of_request(request), cpu_milli=cpu, host_memory_bytes=memory)
    if request.share:
        # What the governor's corrections are kept by: the pods of one GpuShare run one job.
        namespace = str(metadata(pod).get("namespace") or "default")
        demand = replace(demand, workload=f"{namespace}/{request.share}")
    avoid = ann.get(ANN_AVOID_GPUS)
    if avoid is None:
        return demand
    return replace(demand, avoid_gpus=parse_avoid_gpus(avoid))


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


def scheduling_gated(pod: Pod) -> bool:
    """The pod has scheduling gates left: no scheduler considers it until they are removed."""
    gates = spec(pod).get("schedulingGates")
    return isinstance(gates, list) and len(gates) > 0


def dra_claimed(pod: Pod) -> bool:
    """The pod holds the claim the webhook gives annotated pods in DRA mode: kube-scheduler's
    DRA allocator places it, not the extender, and the view does not count it."""
    claims = spec(pod).get("resourceClaims")
    return isinstance(claims, list) and any(
        isinstance(c, Mapping) and c.get("name") == POD_CLAIM for c in claims
    )


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
    phase = str(_mapping(pod.get("status")).get("phase") or "")
    key, uid = pod_key(pod), pod_uid(pod)
    done = finished(pod) or (deleting and node is None)
    evict = ann.get(ANN_EVICT)
    placed = demand is not None or placement is not None or problem is not None
    facts = PodFacts(
        key=key,
        uid=uid,
        node=node,
        finished=done,
        demand=demand,
        placement=placement,
        problem=problem,
        phase=phase,
        evict=evict,
        scheduler=scheduler,
        deleting=deleting,
        gated=node is None and scheduling_gated(pod),
        dra=dra,
    )
    governed_dra = dra and bool(ann.get(ANN_SHARE))
    if not placed and scheduler != SCHEDULER_NAME and not governed_dra:  # not ``kept``
        return facts
    items = containers(pod)
    wanted = ann.get(ANN_CONTAINER)
    gpu_container = next((c for c in items if c.get("name") == wanted), None) or (
        items[0] if items else {}
    )
    limits_have_gpu = any(
        r in _mapping(_mapping(c.get("resources")).get("limits"))
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
    return replace(
        facts,
        workload=Workload(
            labels=_str_map(meta.get("labels")),
            annotations=ann,
            created=_created(meta.get("creationTimestamp")),
            gpu_pod=limits_have_gpu or scheduler == SCHEDULER_NAME or bool(ann.get(ANN_SHARE)),
            image=str(gpu_container.get("image", "")),
            command=tuple(command),
            gpu_class=gpu_class,
            dra_gpu=(ann.get(ANN_DRA_GPU) or None) if dra else None,
        ),
    )


def ours(f: PodFacts) -> bool:
    """A pod gpushare places on GPUs: it asks for a share, holds one, or its gpushare
    annotations are unreadable (it is refused with the reason)."""
    return f.demand is not None or f.placement is not None or f.problem is not None


def kept(f: PodFacts) -> bool:
    """A pod the view keeps: one gpushare places, one naming gpushare-scheduler without a
    request, which a GpuShare's selector may govern (the operator gives it the request), or a
    DRA-mode pod linking a GpuShare (``PodFacts.dra``)."""
    return ours(f) or f.scheduler == SCHEDULER_NAME or (f.dra and f.gpu_pod)


def frozen_demand(old: PodFacts | None, f: PodFacts) -> PodFacts:
    """``f``, the pod as the watch says it now, with the demand it was placed with (``old``:
    as the view kept it). Once bound, a pod holds what it was placed with: a later change of
    its request annotations (refused by the chart's admission policy; here if that is missing)
    does not change what it counts for on its GPU (docs/security.md)."""
    if (
        old is None
        or old.uid != f.uid
        or old.node is None
        or old.placement is None
        or old.demand is None
        or f.demand == old.demand
    ):
        return f
    if f.demand is None or replace(f.demand, tenancy=None) != replace(old.demand, tenancy=None):
        log.warning(
            "request annotations changed after bind; the pod keeps the share it was placed with",
            extra={"pod": f.key},
        )
    return replace(f, demand=replace(old.demand, tenancy=f.demand.tenancy if f.demand else None))
