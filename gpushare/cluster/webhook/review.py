"""Admission webhook for gpushare pods: mutate (add the gpu-percent resource, pick the scheduler)
and validate (refuse what gpushare cannot honour, naming the field and the fix).

The checks are pure functions of the pod and a few facts from the view, so the same code answers
the API server, the unit tests and the fuzzer.
"""

import base64
import json
import posixpath
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpushare.api.bounds import load_body
from gpushare.api.errors import InvalidInputError
from gpushare.api.exclusive import parse_avoid_gpus
from gpushare.api.gpushare_crd import ANN_PROFILE, ANN_PROFILING
from gpushare.api.limit import check_limit
from gpushare.api.names import (
    ANN_AVOID_GPUS,
    ANN_BIND_TIME,
    ANN_CLASS,
    ANN_EXCLUSIVE,
    ANN_FRACTION,
    ANN_GPU_UUID,
    ANN_LIMIT,
    ANN_MEMORY,
    ANN_MEMORY_LIMIT,
    ANN_REQUEST_PERCENT,
    ANN_SHARE,
    ANN_STATE,
    ANN_THREAD_PERCENT,
    NVIDIA_GPU_RESOURCE,
    RESERVED_ENV_NAMES,
    RESERVED_ENV_PREFIXES,
    RESOURCE_GPU_PERCENT,
    SCHEDULER_NAME,
    SLICES_PER_GPU,
)
from gpushare.api.quantities import format_memory
from gpushare.api.request import GpuRequest, parse_request
from gpushare.cluster.state import pods

PLACEMENT_ANNOTATIONS = (
    ANN_GPU_UUID,
    ANN_THREAD_PERCENT,
    ANN_REQUEST_PERCENT,
    ANN_MEMORY_LIMIT,
    ANN_BIND_TIME,
    ANN_STATE,
)
OPERATOR_ANNOTATIONS = (ANN_PROFILING, ANN_PROFILE)
"""Written by the operator only: a pod claiming them at creation would keep neighbours off its
GPU (profiling alone) or misstate its interference profile."""
DEFAULT_SCHEDULERS = ("", "default-scheduler", SCHEDULER_NAME)

ShareLookup = Callable[[str, str], GpuRequest | None]
ExclusiveLookup = Callable[[str], str | None]
SeparationLookup = Callable[[str], tuple[frozenset[str], str] | None]
"""Workload UID -> (GPUs its new pods keep off, why), for workloads separated after faults."""


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


@dataclass(frozen=True)
class Verdict:
    """The webhook's answer for one pod."""

    allowed: bool
    errors: tuple[InvalidInputError, ...] = ()
    patch: list[dict[str, Any]] = field(default_factory=list)
    warnings: tuple[str, ...] = ()

    @property
    def message(self) -> str:
        return "; ".join(str(e) for e in self.errors)


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def resolve_request(
    pod: pods.Pod, *, facts: ClusterFacts, namespace: str
) -> tuple[GpuRequest | None, list[InvalidInputError]]:
    """The pod's request with a GpuShare link resolved; (None, []) for pods that ask nothing."""
    errors: list[InvalidInputError] = []
    ann = pods.annotations(pod)
    try:
        request = parse_request(ann)
    except InvalidInputError as exc:
        return None, [exc]
    if request is not None and request.percent == 0 and request.share is not None:
        shared = facts.share_lookup(namespace, request.share) if facts.share_lookup else None
        if shared is None:
            return None, [
                InvalidInputError(
                    ANN_SHARE,
                    f"no GpuShare {request.share!r} in namespace {namespace!r}",
                    "create the GpuShare first, or set gpushare.io/gpu-fraction on the pod",
                )
            ]
        try:
            check_limit(request.limit_percent, shared.percent)
        except InvalidInputError as exc:
            return None, [exc]
        request = GpuRequest(
            percent=shared.percent,
            memory_bytes=request.memory_bytes if ANN_MEMORY in ann else shared.memory_bytes,
            gpu_class=request.gpu_class if ANN_CLASS in ann else shared.gpu_class,
            share=request.share,
            limit_percent=request.limit_percent,
        )
    if request is None:
        # No annotation: a pod asking for the gpu-percent resource directly.
        try:
            request = pods.request_of(pod)
        except InvalidInputError as exc:
            return None, [exc]
    if request is None:
        return None, errors
    if (
        facts.max_gpu_memory > 0
        and request.memory_bytes is not None
        and (request.memory_bytes > facts.max_gpu_memory)
    ):
        errors.append(
            InvalidInputError(
                ANN_MEMORY,
                f"asks for {format_memory(request.memory_bytes)} but the largest GPU in the "
                f"cluster has {format_memory(facts.max_gpu_memory)}",
                f"ask for at most {format_memory(facts.max_gpu_memory)}",
            )
        )
    whole = request.percent // SLICES_PER_GPU if request.percent >= SLICES_PER_GPU else 0
    if facts.max_gpus_per_node > 0 and whole > facts.max_gpus_per_node:
        errors.append(
            InvalidInputError(
                ANN_FRACTION,
                f"asks for {whole} GPUs but no node has more than {facts.max_gpus_per_node}",
                f"ask for at most {facts.max_gpus_per_node} GPUs, or split the job",
            )
        )
    if request.percent > SLICES_PER_GPU and request.percent % SLICES_PER_GPU:
        errors.append(
            InvalidInputError(
                RESOURCE_GPU_PERCENT,
                f"{request.percent} is above one GPU but not a whole number of GPUs",
                "ask for 1..100, or a multiple of 100 for whole GPUs",
            )
        )
    return request, errors


def _check_containers(pod: pods.Pod, *, facts: ClusterFacts) -> list[InvalidInputError]:
    errors: list[InvalidInputError] = []
    for kind, i, c in pods.all_containers(pod):
        where = f"spec.{kind}[{i}]"
        if kind != "containers" and any(pods.resource_value(c, RESOURCE_GPU_PERCENT)):
            # The kubelet would Allocate slices to it that no placement accounts for.
            errors.append(
                InvalidInputError(
                    f"{where}.resources[{RESOURCE_GPU_PERCENT}]",
                    "asks for a GPU share in an init or ephemeral container, which gpushare "
                    "does not count",
                    "give the GPU share to one of spec.containers (gpushare.io/container names "
                    "which)",
                )
            )
        limit, request = pods.resource_value(c, NVIDIA_GPU_RESOURCE)
        if limit is not None or request is not None:
            errors.append(
                InvalidInputError(
                    f"{where}.resources[{NVIDIA_GPU_RESOURCE}]",
                    "asks for whole GPUs from the NVIDIA device plugin as well as a gpushare share",
                    f"remove {NVIDIA_GPU_RESOURCE} and use gpushare.io/gpu-fraction "
                    '(e.g. "1" for a whole GPU)',
                )
            )
        env = c.get("env")
        for j, var in enumerate(env if isinstance(env, list) else []):
            name = var.get("name") if isinstance(var, Mapping) else None
            if not isinstance(name, str):
                continue
            if name in RESERVED_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIXES):
                errors.append(
                    InvalidInputError(
                        f"{where}.env[{j}] ({name})",
                        "is set by gpushare's device plugin for the GPU share",
                        f"remove {name} from the container",
                    )
                )
        env_from = c.get("envFrom")
        for j, source in enumerate(env_from if isinstance(env_from, list) else []):
            prefix = source.get("prefix") if isinstance(source, Mapping) else None
            if not _safe_env_prefix(prefix if isinstance(prefix, str) else ""):
                errors.append(
                    InvalidInputError(
                        f"{where}.envFrom[{j}]",
                        "could set CUDA_MPS_* or CUDA_VISIBLE_DEVICES from a ConfigMap or Secret, "
                        "overriding the GPU share gpushare's device plugin sets",
                        'give it a prefix that no reserved name starts with (e.g. prefix: "APP_"), '
                        "or list the variables under env",
                    )
                )
    return errors


def _safe_env_prefix(prefix: str) -> bool:
    """True when no name ``prefix + key`` can be one gpushare reserves."""
    if not prefix:
        return False
    reserved = (*RESERVED_ENV_PREFIXES, *RESERVED_ENV_NAMES)
    return not any(r.startswith(prefix) or prefix.startswith(r) for r in reserved)


def _check_node_name(pod: pods.Pod) -> list[InvalidInputError]:
    """A gpushare pod created with spec.nodeName would skip gpushare-scheduler: its share would
    be invisible to every placement decision."""
    if pods.node_name(pod) is None:
        return []
    return [
        InvalidInputError(
            "spec.nodeName",
            "is set, so the pod would skip gpushare-scheduler and use a GPU share no placement "
            "accounts for",
            "remove spec.nodeName; pick nodes with nodeSelector or affinity instead",
        )
    ]


def _check_volumes(pod: pods.Pod, *, facts: ClusterFacts) -> list[InvalidInputError]:
    errors: list[InvalidInputError] = []
    volumes = pods.spec(pod).get("volumes")
    for i, vol in enumerate(volumes if isinstance(volumes, list) else []):
        host = vol.get("hostPath") if isinstance(vol, Mapping) else None
        path = host.get("path") if isinstance(host, Mapping) else None
        if not isinstance(path, str) or not path:
            continue
        norm = posixpath.normpath("/" + path.lstrip("/"))
        for protected in facts.protected_host_paths:
            if (
                norm == protected
                or norm.startswith(protected.rstrip("/") + "/")
                or (protected.startswith(norm.rstrip("/") + "/"))
            ):
                errors.append(
                    InvalidInputError(
                        f"spec.volumes[{i}].hostPath.path",
                        f"{path!r} exposes {protected}, which belongs to gpushare's MPS daemons or "
                        "the kubelet's device plugins",
                        "remove the hostPath volume; gpushare mounts what the share needs",
                    )
                )
                break
    return errors


def _check_annotations(pod: pods.Pod) -> list[InvalidInputError]:
    ann = pods.annotations(pod)
    errors = [
        InvalidInputError(
            key,
            "is written by gpushare-scheduler when it binds the pod",
            "remove it from the pod; ask with gpushare.io/gpu-fraction instead",
        )
        for key in PLACEMENT_ANNOTATIONS
        if key in ann
    ]
    errors += [
        InvalidInputError(
            key,
            "is written by the gpushare operator from the pod's GpuShare (it decides how the "
            "pod's neighbours are placed)",
            "remove it; set spec.profiling or spec.packing on a GpuShare instead",
        )
        for key in OPERATOR_ANNOTATIONS
        if key in ann
    ]
    try:
        parse_avoid_gpus(ann.get(ANN_AVOID_GPUS))
    except InvalidInputError as exc:
        errors.append(exc)
    return errors


def _check_scheduler(pod: pods.Pod, *, final: bool) -> list[InvalidInputError]:
    name = pods.spec(pod).get("schedulerName") or ""
    allowed = (SCHEDULER_NAME,) if final else DEFAULT_SCHEDULERS
    if name in allowed:
        return []
    return [
        InvalidInputError(
            "spec.schedulerName",
            f"is {name!r}, but gpushare pods must be placed by {SCHEDULER_NAME}",
            "remove spec.schedulerName (the webhook sets it)",
        )
    ]


def _asks_resource(pod: pods.Pod) -> bool:
    return any(
        v is not None
        for c in pods.containers(pod)
        for v in pods.resource_value(c, RESOURCE_GPU_PERCENT)
    )


def _single_resource_errors(pod: pods.Pod) -> list[InvalidInputError]:
    """A pod asking for the gpu-percent resource directly must do so in one container."""
    holders = [
        i
        for i, c in enumerate(pods.containers(pod))
        if any(v is not None for v in pods.resource_value(c, RESOURCE_GPU_PERCENT))
    ]
    if len(holders) <= 1:
        return []
    return [
        InvalidInputError(
            f"spec.containers[{holders[1]}].resources[{RESOURCE_GPU_PERCENT}]",
            f"{RESOURCE_GPU_PERCENT} is asked for by {len(holders)} containers",
            "give the GPU share to one container (MPS limits apply per GPU client)",
        )
    ]


def _resource_errors(
    pod: pods.Pod, *, target: int, percent: int, required: bool
) -> list[InvalidInputError]:
    """A pod that also writes the gpu-percent resource must agree with its annotation; after
    mutation (``required``) the target container must carry it."""
    errors: list[InvalidInputError] = []
    for i, c in enumerate(pods.containers(pod)):
        limit, request = pods.resource_value(c, RESOURCE_GPU_PERCENT)
        if required and i == target and limit is None:
            errors.append(
                InvalidInputError(
                    f"spec.containers[{i}].resources.limits[{RESOURCE_GPU_PERCENT}]",
                    "is missing: the pod did not pass gpushare's mutating webhook",
                    "make sure the MutatingWebhookConfiguration 'gpushare' is registered, "
                    "then recreate the pod",
                )
            )
        for what, value in (("limits", limit), ("requests", request)):
            if value is None:
                continue
            wanted = str(percent) if i == target else None
            if value != wanted:
                errors.append(
                    InvalidInputError(
                        f"spec.containers[{i}].resources.{what}[{RESOURCE_GPU_PERCENT}]",
                        f"is {value!r} but the pod's annotations ask for {percent} "
                        + ("on this container" if i == target else "on another container"),
                        "remove it; the webhook sets it from gpushare.io/gpu-fraction",
                    )
                )
    return errors


def review(pod: pods.Pod, *, namespace: str, facts: ClusterFacts, mutate: bool) -> Verdict:
    """Check a pod being created; with ``mutate`` also build the JSON patch that makes it a
    gpushare pod. Without it (validation, after every mutation) the pod must already be one."""
    if not pods.has_gpushare_annotations(pod) and not pods.wants_gpushare(pod):
        return Verdict(allowed=True)
    errors: list[InvalidInputError] = _check_annotations(pod)
    request, request_errors = resolve_request(pod, facts=facts, namespace=namespace)
    errors += request_errors
    errors += _check_containers(pod, facts=facts)
    errors += _check_volumes(pod, facts=facts)
    errors += _check_node_name(pod)
    target = 0
    try:
        target = pods.target_container(pod)
    except InvalidInputError as exc:
        errors.append(exc)
    annotated = ANN_FRACTION in pods.annotations(pod) or ANN_SHARE in pods.annotations(pod)
    if request is not None and not errors:
        if annotated and (not mutate or _asks_resource(pod)):
            errors += _resource_errors(
                pod, target=target, percent=request.percent, required=not mutate
            )
        elif not annotated:
            errors += _single_resource_errors(pod)
    errors += _check_scheduler(pod, final=not mutate)
    if request is None and not errors:
        # Placement-free, request-free pod that only carries, e.g., gpushare.io/class.
        return Verdict(allowed=True)
    if errors:
        return Verdict(allowed=False, errors=tuple(errors))
    assert request is not None
    exclusive = _exclusive_reason(pod, facts=facts) if mutate and request.fractional else None
    if exclusive is not None:
        request = replace(request, percent=SLICES_PER_GPU)
    separation = (
        _separation(pod, facts=facts)
        if mutate and request.fractional and exclusive is None
        else None
    )
    patch = _patch(pod, request=request, target=target, exclusive=exclusive) if mutate else []
    warnings: tuple[str, ...] = ()
    if exclusive:
        warnings = (f"gpushare: {exclusive}; this pod gets a whole GPU",)
    if separation is not None:
        avoid, why = separation
        patch += _annotation_ops(pod, {ANN_AVOID_GPUS: ",".join(sorted(avoid))}, after=patch)
        warnings = (f"gpushare: {why}; this pod is kept off {', '.join(sorted(avoid))}",)
    return Verdict(allowed=True, patch=patch, warnings=warnings)


def _controller_uid(pod: pods.Pod) -> str | None:
    refs = pods.metadata(pod).get("ownerReferences")
    for ref in refs if isinstance(refs, list) else []:
        if isinstance(ref, Mapping) and ref.get("controller") and isinstance(ref.get("uid"), str):
            return str(ref["uid"])
    return None


def _separation(pod: pods.Pod, *, facts: ClusterFacts) -> tuple[frozenset[str], str] | None:
    """(GPUs to keep the pod off, why) when its workload was separated from the workloads it
    kept faulting with (gpushare.node.faults); the pod's own avoid-gpus are kept."""
    uid = _controller_uid(pod)
    if facts.separation_lookup is None or uid is None:
        return None
    found = facts.separation_lookup(uid)
    if found is None:
        return None
    avoid, why = found
    own = parse_avoid_gpus(pods.annotations(pod).get(ANN_AVOID_GPUS))
    if avoid <= own:
        return None
    return avoid | own, why


def _annotation_ops(
    pod: pods.Pod, values: Mapping[str, str], *, after: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """JSON patch operations that set pod annotations (``after``: the patch so far, which may
    already have created the annotations map)."""
    ops: list[dict[str, Any]] = []
    created = any(op.get("path") == "/metadata/annotations" for op in after)
    if not created and not isinstance(pods.metadata(pod).get("annotations"), Mapping):
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {}})
    for key, value in values.items():
        ops.append({"op": "add", "path": f"/metadata/annotations/{_escape(key)}", "value": value})
    return ops


def _exclusive_reason(pod: pods.Pod, *, facts: ClusterFacts) -> str | None:
    """Why the pod's workload must run alone on a GPU (its clients faulted repeatedly on shared
    GPUs, see gpushare.node.faults), or None."""
    uid = _controller_uid(pod)
    if facts.exclusive_lookup is None or uid is None:
        return None
    return facts.exclusive_lookup(uid)


def _patch(
    pod: pods.Pod, *, request: GpuRequest, target: int, exclusive: str | None = None
) -> list[dict[str, Any]]:
    ops: list[dict[str, Any]] = []
    if exclusive is not None:
        if not isinstance(pods.metadata(pod).get("annotations"), Mapping):
            ops.append({"op": "add", "path": "/metadata/annotations", "value": {}})
        for key, value in ((ANN_FRACTION, "1"), (ANN_EXCLUSIVE, exclusive)):
            ops.append(
                {"op": "add", "path": f"/metadata/annotations/{_escape(key)}", "value": value}
            )
        if ANN_LIMIT in pods.annotations(pod):  # a whole GPU is never capped
            ops.append({"op": "remove", "path": f"/metadata/annotations/{_escape(ANN_LIMIT)}"})
    container = pods.containers(pod)[target]
    base = f"/spec/containers/{target}/resources"
    resources = container.get("resources")
    if not isinstance(resources, Mapping):
        ops.append({"op": "add", "path": base, "value": {}})
        resources = {}
    value = str(request.percent)
    for what in ("limits", "requests"):
        current = resources.get(what)
        if not isinstance(current, Mapping):
            ops.append({"op": "add", "path": f"{base}/{what}", "value": {}})
        ops.append(
            {"op": "add", "path": f"{base}/{what}/{_escape(RESOURCE_GPU_PERCENT)}", "value": value}
        )
    if pods.spec(pod).get("schedulerName") != SCHEDULER_NAME:
        ops.append({"op": "add", "path": "/spec/schedulerName", "value": SCHEDULER_NAME})
    ann = pods.annotations(pod)
    if request.share is not None:
        if request.memory_bytes is not None and ANN_MEMORY not in ann:
            ops.append(
                {
                    "op": "add",
                    "path": f"/metadata/annotations/{_escape(ANN_MEMORY)}",
                    "value": format_memory(request.memory_bytes),
                }
            )
        if ANN_CLASS not in ann:
            ops.append(
                {
                    "op": "add",
                    "path": f"/metadata/annotations/{_escape(ANN_CLASS)}",
                    "value": request.gpu_class,
                }
            )
    return ops


# ---- AdmissionReview v1 wire format ------------------------------------------------------


class BadReviewError(ValueError):
    """A request body that is not an AdmissionReview we can answer (HTTP 400)."""


@dataclass(frozen=True)
class ReviewRequest:
    uid: str
    operation: str
    namespace: str
    kind: str
    pod: Mapping[str, Any] | None


def parse_review(body: bytes) -> ReviewRequest:
    """Parse an AdmissionReview; raises BadReviewError with the reason."""
    try:
        doc = load_body(body, field="body", fix="send an AdmissionReview v1 object")
    except InvalidInputError as exc:
        raise BadReviewError(str(exc)) from None
    if not isinstance(doc, dict):
        raise BadReviewError("body must be an AdmissionReview object")
    if doc.get("kind") != "AdmissionReview":
        raise BadReviewError(f"kind must be AdmissionReview, got {doc.get('kind')!r}")
    if doc.get("apiVersion") != "admission.k8s.io/v1":
        raise BadReviewError(
            f"apiVersion must be admission.k8s.io/v1, got {doc.get('apiVersion')!r} "
            "(set admissionReviewVersions: [v1])"
        )
    req = doc.get("request")
    if not isinstance(req, dict):
        raise BadReviewError("request must be an object")
    uid = req.get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadReviewError("request.uid must be a non-empty string")
    kind_obj = req.get("kind")
    kind = kind_obj.get("kind") if isinstance(kind_obj, dict) else None
    operation = req.get("operation")
    namespace = req.get("namespace") or ""
    if not isinstance(operation, str) or not isinstance(namespace, str):
        raise BadReviewError("request.operation and request.namespace must be strings")
    obj = req.get("object")
    if obj is not None and not isinstance(obj, dict):
        raise BadReviewError("request.object must be an object or null")
    if obj is not None:
        for part in ("metadata", "spec"):
            if part in obj and obj[part] is not None and not isinstance(obj[part], dict):
                raise BadReviewError(f"request.object.{part} must be an object")
    return ReviewRequest(
        uid=uid, operation=operation, namespace=namespace, kind=str(kind or ""), pod=obj
    )


def answer(
    req: ReviewRequest, *, facts: ClusterFacts, mutate: bool
) -> tuple[dict[str, Any], Verdict]:
    """The AdmissionReview response for a parsed request."""
    verdict = Verdict(allowed=True)
    if req.kind == "Pod" and req.operation == "CREATE" and req.pod is not None:
        verdict = review(req.pod, namespace=req.namespace, facts=facts, mutate=mutate)
    response: dict[str, Any] = {"uid": req.uid, "allowed": verdict.allowed}
    if not verdict.allowed:
        response["status"] = {
            "code": 403,
            "reason": "Forbidden",
            "message": f"gpushare: {verdict.message}",
        }
    if verdict.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(verdict.patch).encode()).decode()
    if verdict.warnings:
        response["warnings"] = list(verdict.warnings)
    return (
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response},
        verdict,
    )


def match_condition_expression() -> str:
    """CEL the API server evaluates before calling us: only gpushare pods are ever sent, so an
    outage of the controller cannot block any other pod (see docs/scheduling.md)."""
    gpushare_ann = (
        "has(object.metadata.annotations) && "
        "object.metadata.annotations.exists(k, k.startsWith('gpushare.io/'))"
    )
    asks = (
        "exists(c, has(c.resources) && ("
        f"(has(c.resources.limits) && '{RESOURCE_GPU_PERCENT}' in c.resources.limits) || "
        f"(has(c.resources.requests) && '{RESOURCE_GPU_PERCENT}' in c.resources.requests)))"
    )
    resource = f"object.spec.containers.{asks}"
    init = f"has(object.spec.initContainers) && object.spec.initContainers.{asks}"
    return f"({gpushare_ann}) || ({resource}) || ({init})"
