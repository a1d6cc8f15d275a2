"""What a pod asks of the GPUs, read from its gpushare resources and annotations: its
:class:`GpuRequest` (``request_of``) and the :class:`Demand` gpushare.packing places by
(``demand_of``). Pure functions of the plain pod dict, shared by the view, the extender and the
webhook; they raise InvalidInputError on bad input (the webhook's answer, the view's
``problem``).
"""

from collections.abc import Mapping
from dataclasses import replace
from typing import cast

import msgspec

from gpushare.api.bounds import MAX_INT_DIGITS
from gpushare.api.errors import InvalidInputError
from gpushare.api.exclusive import parse_avoid_gpus
from gpushare.api.limit import check_limit
from gpushare.api.names import (
    ANN_AVOID_GPUS,
    ANN_CLASS,
    ANN_FRACTION,
    ANN_LIMIT,
    ANN_MEMORY,
    ANN_OPPORTUNISTIC,
    ANN_SHARE,
    RESOURCE_GPU_OPPORTUNISTIC,
    RESOURCE_GPU_PERCENT,
    SLICES_PER_GPU,
)
from gpushare.api.quantities import MAX_WHOLE_GPUS, parse_memory
from gpushare.api.request import GpuRequest, parse_class, parse_request
from gpushare.cluster.state.host_resources import pod_requests
from gpushare.cluster.state.pods import (
    Pod,
    annotations,
    as_mapping,
    containers,
    metadata,
    resource_value,
)
from gpushare.packing.model import Demand

MAX_PERCENT = MAX_WHOLE_GPUS * SLICES_PER_GPU
_encode = msgspec.json.Encoder().encode
_UNKNOWN = object()


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


DEMANDS_KEPT = 4096
"""Pod inputs :func:`demand_of` keeps its answer for before all are dropped."""
INPUTS_KEPT_BYTES = 4096
"""Longest inputs (encoded) an answer is kept for: at most 16 MiB kept, whatever pods carry
(an annotation may hold 256 KiB)."""
_demands: dict[bytes, Demand | None] = {}


def demand_of(pod: Pod, *, ann: Mapping[str, str] | None = None) -> Demand | None:
    """What the pod asks of the GPUs (and of its node's CPU and memory, which the gpushare
    policy's stranding term reads), as gpushare.packing sees it; None for other pods.

    Every pod comes through here for each of its watch events and again in filter (four
    times a pod on the scale bench's path), mostly with inputs already seen: the answer is
    kept by everything it reads, encoded (:func:`_inputs`), and the same object returned
    (docs/scale.md). Bad input raises each time."""
    if ann is None:
        ann = annotations(pod)
    key = _inputs(pod, ann)
    if key is not None and len(key) > INPUTS_KEPT_BYTES:
        key = None
    if key is not None:
        known = _demands.get(key, _UNKNOWN)
        if known is not _UNKNOWN:
            return cast(Demand | None, known)
    demand = read_demand(pod, ann=ann)
    if key is not None:
        if len(_demands) >= DEMANDS_KEPT:
            _demands.clear()
        _demands[key] = demand
    return demand


DEMAND_ANNOTATIONS = (
    ANN_FRACTION,
    ANN_SHARE,
    ANN_LIMIT,
    ANN_MEMORY,
    ANN_CLASS,
    ANN_OPPORTUNISTIC,
    ANN_AVOID_GPUS,
)
"""The annotations :func:`read_demand` reads (a test holds it to this list): not the
placement a bind writes, so a pod's events before and after its bind share one answer."""


def _inputs(pod: Pod, ann: Mapping[str, str]) -> bytes | None:
    """All :func:`read_demand` reads of the pod, as JSON: its :data:`DEMAND_ANNOTATIONS`, each
    container's and init container's resources, the overhead and the namespace. None when
    they are not plain JSON (nothing is kept then)."""
    spec = as_mapping(pod.get("spec"))
    try:
        return _encode(
            (
                [ann.get(k) for k in DEMAND_ANNOTATIONS],
                _resources(spec.get("containers")),
                _resources(spec.get("initContainers")),
                spec.get("overhead"),
                metadata(pod).get("namespace"),
            )
        )
    except (TypeError, ValueError, OverflowError, RecursionError):
        return None


def _resources(items: object) -> object:
    if not isinstance(items, list):
        return items
    return [c.get("resources") if type(c) is dict else c for c in items]


def read_demand(pod: Pod, *, ann: Mapping[str, str] | None = None) -> Demand | None:
    """:func:`demand_of` worked out afresh (the reference its kept answers are held to)."""
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
