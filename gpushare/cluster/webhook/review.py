"""Admission webhook for gpushare pods: mutate (add the gpu-percent resource, pick the scheduler;
in DRA mode, a ResourceClaim instead) and validate (refuse what gpushare cannot honour, naming
the field and the fix).

The checks are pure functions of the pod and a few facts from the view, so the same code answers
the API server, the unit tests and the fuzzer.
"""

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpushare.api.bounds import load_body
from gpushare.api.errors import InvalidInputError
from gpushare.api.limit import check_limit
from gpushare.api.names import (
    ANN_AVOID_GPUS,
    ANN_CLASS,
    ANN_EXCLUSIVE,
    ANN_FRACTION,
    ANN_MEMORY,
    ANN_OPPORTUNISTIC,
    ANN_SHARE,
    CLASS_BATCH,
    RESOURCE_GPU_PERCENT,
    SLICES_PER_GPU,
)
from gpushare.api.quantities import format_memory
from gpushare.api.request import GpuRequest, check_opportunistic, parse_request
from gpushare.cluster.state import gpu_requests, pods
from gpushare.cluster.webhook import claims
from gpushare.cluster.webhook.annotation_keys import no_request_errors, unknown_key_errors
from gpushare.cluster.webhook.checks import (
    asks_opportunistic,
    asks_resource,
    check_annotations,
    check_containers,
    check_node_name,
    check_pausable,
    check_scheduler,
    check_volumes,
    resource_errors,
    single_resource_errors,
)
from gpushare.cluster.webhook.facts import ClusterFacts
from gpushare.cluster.webhook.patch import annotation_ops, exclusive_reason, pod_patch, separation
from gpushare.cluster.webhook.scheduling import scheduling_ops
from gpushare.cluster.webhook.share_match import NO_LINK, selector_link


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


def resolve_request(
    pod: pods.Pod, *, facts: ClusterFacts, namespace: str
) -> tuple[GpuRequest | None, list[InvalidInputError]]:
    """The pod's request with a GpuShare link resolved; (None, []) for pods that ask nothing."""
    ann = pods.annotations(pod)
    try:
        request = parse_request(ann)
        if request is not None and request.share is not None:
            request = _from_share(request, ann, facts=facts, namespace=namespace)
        if request is None:
            # No annotation: a pod asking for the gpu-percent resource directly.
            request = gpu_requests.request_of(pod)
    except InvalidInputError as exc:
        return None, [exc]
    if request is None:
        return None, []
    errors = _size_errors(request, facts)
    stated = request.opportunistic is not None
    request, opt_errors = resolve_opt_in(request, facts=facts)
    if request.opportunistic and (unpausable := check_pausable(pod)):
        # An opportunistic pod is paused, never restarted for it: a stated opt-in is refused,
        # the cluster's default leaves such a pod guaranteed.
        if stated:
            opt_errors += unpausable
        else:
            request = replace(request, opportunistic=False)
    return request, errors + opt_errors


def _from_share(
    request: GpuRequest, ann: Mapping[str, str], *, facts: ClusterFacts, namespace: str
) -> GpuRequest:
    """A pod linked to a GpuShare asks for the share's request; its own fraction, memory,
    class, limit and opt-in annotations win (docs/operator.md). Raises InvalidInputError for a
    share that is not there."""
    assert request.share is not None
    shared = facts.share_lookup(namespace, request.share) if facts.share_lookup else None
    if shared is None:
        raise InvalidInputError(
            ANN_SHARE,
            f"no GpuShare {request.share!r} in namespace {namespace!r}",
            "create the GpuShare first, or set gpushare.io/gpu-fraction on the pod",
        )
    percent = request.percent if ANN_FRACTION in ann else shared.percent
    check_limit(request.limit_percent, percent)
    return GpuRequest(
        percent=percent,
        memory_bytes=(
            request.memory_bytes
            if ANN_MEMORY in ann or percent > SLICES_PER_GPU  # whole GPUs take all their memory
            else shared.memory_bytes
        ),
        gpu_class=request.gpu_class if ANN_CLASS in ann else shared.gpu_class,
        share=request.share,
        limit_percent=request.limit_percent,
        opportunistic=(
            request.opportunistic if request.opportunistic is not None else shared.opportunistic
        ),
    )


def _size_errors(request: GpuRequest, facts: ClusterFacts) -> list[InvalidInputError]:
    """A request no GPU or node of the cluster could hold, or a part-GPU share over one GPU."""
    errors: list[InvalidInputError] = []
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
    return errors


def resolve_opt_in(
    request: GpuRequest, *, facts: ClusterFacts
) -> tuple[GpuRequest, list[InvalidInputError]]:
    """The pod's opt-in to opportunistic placement: its own ``gpushare.io/opportunistic``, else
    its GpuShare's ``spec.opportunistic``, else the cluster's default, which applies only where
    it can (batch pods of one GPU or less, device-plugin mode). A stated opt-in gpushare cannot
    honour is refused naming the field and the fix."""
    eligible = request.gpu_class == CLASS_BATCH and request.percent <= SLICES_PER_GPU
    dra = facts.dra_device_class is not None
    if request.opportunistic is None:
        default = facts.opportunistic_placement and facts.opportunistic_default
        return replace(request, opportunistic=default and eligible and not dra), []
    if not request.opportunistic:
        return request, []
    field = ANN_OPPORTUNISTIC if request.share is None else f"GpuShare {request.share}"
    if not facts.opportunistic_placement:
        return request, [
            InvalidInputError(
                field,
                "opts in to opportunistic placement, which this cluster's gpushare controller "
                "runs without (--no-opportunistic-placement)",
                "remove the opt-in, or ask an admin to enable it (the controller's "
                "--opportunistic-placement, chart controller.opportunistic.enabled; "
                'docs/packing.md, "The sharing contract")',
            )
        ]
    try:
        check_opportunistic(True, percent=request.percent, gpu_class=request.gpu_class, field=field)
    except InvalidInputError as exc:
        return request, [exc]
    if dra:
        return request, [
            InvalidInputError(
                field,
                "opts in to opportunistic placement, which DRA mode does not offer yet",
                "remove the opt-in, or run the pod on a node pool in device-plugin mode "
                "(docs/dra.md)",
            )
        ]
    return request, []


def review(pod: pods.Pod, *, namespace: str, facts: ClusterFacts, mutate: bool) -> Verdict:
    """Check a pod being created; with ``mutate`` also build the JSON patch that makes it a
    gpushare pod. Without it (validation, after every mutation) the pod must already be one.
    A new pod a GpuShare's selector links is reviewed as if it named the share itself
    (gpushare.cluster.webhook.share_match), and the patch writes that link on it."""
    link = selector_link(pod, namespace=namespace, facts=facts) if mutate else NO_LINK
    if link.errors:
        return Verdict(allowed=False, errors=link.errors)
    verdict = _review(link.pod or pod, namespace=namespace, facts=facts, mutate=mutate)
    if not verdict.allowed:
        return verdict
    patch = [*link.ops, *verdict.patch] if verdict.patch or link.ops else []
    return replace(verdict, patch=patch, warnings=link.warnings + verdict.warnings)


def _review(pod: pods.Pod, *, namespace: str, facts: ClusterFacts, mutate: bool) -> Verdict:
    """:func:`review` of the pod as linked."""
    if not pods.has_gpushare_annotations(pod) and not pods.wants_gpushare(pod):
        return Verdict(allowed=True)
    checked = _check(pod, namespace=namespace, facts=facts, mutate=mutate)
    if checked.errors:
        return Verdict(allowed=False, errors=tuple(checked.errors))
    if checked.request is None:
        # Placement-free, request-free pod that only carries, e.g., gpushare.io/class.
        return Verdict(allowed=True)
    return _admit(pod, checked, namespace=namespace, facts=facts, mutate=mutate)


@dataclass(frozen=True)
class _Checked:
    """What :func:`_check` found: the pod's request (None: it asks for none), the container
    the GPU goes to, whether it is a DRA-mode pod, and every error."""

    request: GpuRequest | None
    target: int
    dra: bool
    errors: list[InvalidInputError]


def _check(pod: pods.Pod, *, namespace: str, facts: ClusterFacts, mutate: bool) -> _Checked:
    """Every check of a gpushare pod, each error kept (a user fixes them all in one go)."""
    errors: list[InvalidInputError] = check_annotations(pod)
    errors += unknown_key_errors(pods.annotations(pod))
    request, request_errors = resolve_request(pod, facts=facts, namespace=namespace)
    errors += request_errors
    places = request is not None or asks_resource(pod)
    if not places and not request_errors:
        errors += no_request_errors(pods.annotations(pod))
    errors += check_containers(pod, facts=facts)
    errors += check_volumes(pod, facts=facts)
    errors += check_node_name(pod)
    target = 0
    try:
        target = pods.target_container(pod)
    except InvalidInputError as exc:
        errors.append(exc)
    annotated = ANN_FRACTION in pods.annotations(pod) or ANN_SHARE in pods.annotations(pod)
    dra = annotated and facts.dra_device_class is not None
    if request is not None and not errors:
        if dra:
            errors += _dra_resource_errors(pod)
        elif annotated and (not mutate or asks_resource(pod)):
            errors += _resource_errors(pod, request, target=target, facts=facts, mutate=mutate)
        elif not annotated:
            errors += single_resource_errors(pod)
    if not dra and places:  # a claim is allocated by any DRA-enabled scheduler
        errors += check_scheduler(pod, final=not mutate)
    return _Checked(request, target, dra, errors)


def _resource_errors(
    pod: pods.Pod, request: GpuRequest, *, target: int, facts: ClusterFacts, mutate: bool
) -> list[InvalidInputError]:
    """The GPU resource an annotated pod asks for must be its request's (required once
    mutated). Validation reads the opt-in the mutation chose from the resource it wrote."""
    opted = asks_opportunistic(pod, target=target) if not mutate else request.opportunistic
    errors = resource_errors(
        pod,
        target=target,
        percent=request.percent,
        required=not mutate,
        opportunistic=bool(opted),
    )
    if opted and not mutate:
        errors += resolve_opt_in(replace(request, opportunistic=True), facts=facts)[1]
    return errors


def _admit(
    pod: pods.Pod, checked: _Checked, *, namespace: str, facts: ClusterFacts, mutate: bool
) -> Verdict:
    """The verdict for a pod that passed every check: with ``mutate``, the patch that makes
    it a gpushare pod (a whole GPU when it must be exclusive, kept off GPUs it is separated
    from)."""
    request, target = checked.request, checked.target
    assert request is not None
    exclusive = (
        exclusive_reason(pod, facts=facts, namespace=namespace)
        if mutate and request.fractional
        else None
    )
    if exclusive is not None:
        request = replace(request, percent=SLICES_PER_GPU)
    separated = (
        separation(pod, facts=facts, namespace=namespace)
        if mutate and request.fractional and exclusive is None
        else None
    )
    if checked.dra:
        return _dra_verdict(
            pod,
            request=request,
            target=target,
            namespace=namespace,
            mutate=mutate,
            exclusive=exclusive,
            separated=separated,
            facts=facts,
        )
    patch: list[dict[str, Any]] = []
    if mutate:
        priority = facts.opportunistic_priority
        patch = pod_patch(
            pod, request=request, target=target, exclusive=exclusive, priority=priority
        )
        patch += scheduling_ops(
            pod, tolerations=facts.pod_tolerations, runtime_class=facts.pod_runtime_class
        )
    warnings: tuple[str, ...] = ()
    if exclusive:
        warnings = (f"gpushare: {exclusive}; this pod gets a whole GPU",)
    if separated is not None:
        patch, warnings = _kept_off(pod, separated, patch)
    return Verdict(allowed=True, patch=patch, warnings=warnings)


def _kept_off(
    pod: pods.Pod, separated: tuple[frozenset[str], str], patch: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], tuple[str, ...]]:
    """``patch`` with the pod kept off a separated workload's GPUs (gpushare.io/avoid-gpus),
    and the warning that says so."""
    avoid, why = separated
    ops = annotation_ops(pod, {ANN_AVOID_GPUS: ",".join(sorted(avoid))}, after=patch)
    return [*patch, *ops], (f"gpushare: {why}; this pod is kept off {', '.join(sorted(avoid))}",)


def _dra_resource_errors(pod: pods.Pod) -> list[InvalidInputError]:
    if not asks_resource(pod):
        return []
    return [
        InvalidInputError(
            RESOURCE_GPU_PERCENT,
            "is asked for beside gpushare annotations, but annotated pods get a ResourceClaim "
            "in DRA mode",
            f"drop the {RESOURCE_GPU_PERCENT} resource (the annotations say the share)",
        )
    ]


def _dra_verdict(
    pod: pods.Pod,
    *,
    request: GpuRequest,
    target: int,
    namespace: str,
    mutate: bool,
    exclusive: str | None,
    separated: tuple[frozenset[str], str] | None,
    facts: ClusterFacts,
) -> Verdict:
    """An annotated pod in DRA mode: its claim from the template its request names, and with
    ``facts.dra_gate`` the scheduling gate that lets the controller place the claim. A workload
    the node agents separated after faults is kept off its GPUs as in device-plugin mode: the
    controller's claim allocator reads ``gpushare.io/avoid-gpus``.

    The webhook makes no template: the controller makes it once the pod is stored
    (gpushare.cluster.dra.templates), since anyone may post a review to this port. Here it only
    refuses, from the template watch, a template of that name with another spec and one more
    template than the namespace's bound."""
    name = claims.template_name(request)
    errors = claims.claim_errors(pod, template=name, target=target)
    if mutate and not errors and facts.template_check is not None:
        refusal = facts.template_check(namespace, name)
        if refusal is not None:
            errors.append(refusal)
    if not mutate and not errors and not claims.has_claim(pod, template=name, target=target):
        errors.append(claims.missing_claim_error(name))
    if errors:
        return Verdict(allowed=False, errors=tuple(errors))
    if not mutate:
        return Verdict(allowed=True)
    patch = claims.claim_ops(pod, template=name, target=target)
    if facts.dra_gate:
        patch += claims.gate_ops(pod)
    warnings: tuple[str, ...] = ()
    if exclusive is not None:
        # The fraction is rewritten so that validation names the same (whole-GPU) template.
        patch += annotation_ops(pod, {ANN_FRACTION: "1", ANN_EXCLUSIVE: exclusive}, after=patch)
        warnings = (f"gpushare: {exclusive}; this pod gets a whole GPU",)
    if separated is not None:
        patch, warnings = _kept_off(pod, separated, patch)
    return Verdict(allowed=True, patch=patch, warnings=warnings)


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
    dry_run: bool = False
    """The API server persists nothing (``kubectl --dry-run=server``): no side effects."""


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
        uid=uid,
        operation=operation,
        namespace=namespace,
        kind=str(kind or ""),
        pod=obj,
        dry_run=req.get("dryRun") is True,
    )


def answer(
    req: ReviewRequest, *, facts: ClusterFacts, mutate: bool
) -> tuple[dict[str, Any], Verdict]:
    """The AdmissionReview response for a parsed request."""
    verdict = Verdict(allowed=True)
    if req.kind == "Pod" and req.operation == "CREATE" and req.pod is not None:
        verdict = review(req.pod, namespace=req.namespace, facts=facts, mutate=mutate)
    return response_doc(req, verdict), verdict


def response_doc(req: ReviewRequest, verdict: Verdict) -> dict[str, Any]:
    """The AdmissionReview document that carries ``verdict``."""
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
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
