"""Annotated pods in DRA mode: the ResourceClaim a ``gpushare.io/gpu-fraction`` pod gets.

With ``--annotation-mode=dra`` (the chart's ``mode: dra``) the mutating webhook turns a pod's
gpushare annotations into a claim of the DeviceClass ``mps.gpushare.io`` instead of the
``gpushare.io/gpu-percent`` resource: users keep their annotations, kube-scheduler's DRA
allocator places the claim and the node agent's kubelet plugin prepares it (docs/dra.md,
"Keeping annotations").

A pod cannot hold a claim inline, so the webhook points it at a ResourceClaimTemplate in its
namespace named for what it asks (``gpushare-30pct-4gi-latency``): pods asking the same share
use one template, and kube-controller-manager makes each pod a claim of its own from it (owned
by the pod, deleted with it). The webhook makes nothing: the controller makes the template once
the pod is stored (gpushare.cluster.dra.templates); one that exists with another spec is
refused, never used or overwritten.
"""

from collections.abc import Mapping
from typing import Any

from gpushare.api.dra import (
    CAPACITY_GPU_PERCENT,
    CAPACITY_MEMORY,
    CONFIG_API_VERSION,
    CONFIG_KIND,
    DRIVER,
    PLACEMENT_GATE,
    POD_CLAIM,
)
from gpushare.api.errors import InvalidInputError
from gpushare.api.names import CLASS_BATCH, SLICES_PER_GPU
from gpushare.api.quantities import format_memory
from gpushare.api.request import GpuRequest
from gpushare.cluster.state import pods

TEMPLATE_API_VERSION = "resource.k8s.io/v1"
MANAGED_BY = {"app.kubernetes.io/managed-by": "gpushare"}
_REQUEST = "gpu"


def template_name(request: GpuRequest) -> str:
    """``gpushare-<percent>pct[-<memory>][-<class>][-limit<L>]``, lower case: the same request
    always names the same template, and a user reading the pod sees what it asked."""
    parts = [f"gpushare-{request.percent}pct"]
    if request.fractional and request.memory_bytes is not None:
        parts.append(format_memory(request.memory_bytes).lower())
    if request.gpu_class != CLASS_BATCH:
        parts.append(request.gpu_class)
    if request.fractional and request.limit_percent is not None:
        parts.append(f"limit{request.limit_percent}")
    return "-".join(parts)


def claim_template(request: GpuRequest, *, namespace: str, device_class: str) -> dict[str, Any]:
    """The ResourceClaimTemplate for ``request``: one device of ``device_class`` consuming the
    share (and memory) for a fraction, ``n`` whole devices for ``n`` whole GPUs; the class and
    limit travel in the driver's opaque ``MpsConfig``."""
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    parameters: dict[str, Any] = {
        "apiVersion": CONFIG_API_VERSION,
        "kind": CONFIG_KIND,
        "class": request.gpu_class,
    }
    if request.fractional:
        capacity = {CAPACITY_GPU_PERCENT: str(request.percent)}
        if request.memory_bytes is not None:
            capacity[CAPACITY_MEMORY] = format_memory(request.memory_bytes)
        exactly["capacity"] = {"requests": capacity}
        if request.limit_percent is not None:
            parameters["limit"] = request.limit_percent
    else:
        exactly["count"] = request.whole_gpus
        exactly["capacity"] = {"requests": {CAPACITY_GPU_PERCENT: str(SLICES_PER_GPU)}}
    return {
        "apiVersion": TEMPLATE_API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": template_name(request), "namespace": namespace, "labels": MANAGED_BY},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": _REQUEST, "exactly": exactly}],
                    "config": [
                        {
                            "requests": [_REQUEST],
                            "opaque": {"driver": DRIVER, "parameters": parameters},
                        }
                    ],
                }
            }
        },
    }


def _pod_claims(pod: pods.Pod) -> list[Any]:
    claims = pods.spec(pod).get("resourceClaims")
    return claims if isinstance(claims, list) else []


def _container_claims(container: Mapping[str, Any]) -> list[Any]:
    resources = container.get("resources")
    claims = resources.get("claims") if isinstance(resources, Mapping) else None
    return claims if isinstance(claims, list) else []


def has_claim(pod: pods.Pod, *, template: str, target: int) -> bool:
    """The pod already refers ``template`` as its gpushare claim, used by container ``target``
    (what the mutation makes; also true when the webhook is invoked again)."""
    pod_ok = any(
        isinstance(c, Mapping)
        and c.get("name") == POD_CLAIM
        and c.get("resourceClaimTemplateName") == template
        for c in _pod_claims(pod)
    )
    container = pods.containers(pod)[target]
    used = any(
        isinstance(c, Mapping) and c.get("name") == POD_CLAIM for c in _container_claims(container)
    )
    return pod_ok and used


def claim_ops(pod: pods.Pod, *, template: str, target: int) -> list[dict[str, Any]]:
    """JSON patch that gives the pod its gpushare claim from ``template``, used by container
    ``target``; empty when it has it already."""
    if has_claim(pod, template=template, target=target):
        return []
    ops: list[dict[str, Any]] = []
    entry = {"name": POD_CLAIM, "resourceClaimTemplateName": template}
    if not isinstance(pods.spec(pod).get("resourceClaims"), list):
        ops.append({"op": "add", "path": "/spec/resourceClaims", "value": [entry]})
    else:
        ops.append({"op": "add", "path": "/spec/resourceClaims/-", "value": entry})
    container = pods.containers(pod)[target]
    base = f"/spec/containers/{target}/resources"
    resources = container.get("resources")
    if not isinstance(resources, Mapping):
        ops.append({"op": "add", "path": base, "value": {"claims": [{"name": POD_CLAIM}]}})
    elif not isinstance(resources.get("claims"), list):
        ops.append({"op": "add", "path": f"{base}/claims", "value": [{"name": POD_CLAIM}]})
    else:
        ops.append({"op": "add", "path": f"{base}/claims/-", "value": {"name": POD_CLAIM}})
    return ops


def gate_ops(pod: pods.Pod) -> list[dict[str, Any]]:
    """JSON patch that adds the ``gpushare.io/placement`` scheduling gate (docs/dra.md, "Who
    places a claim"); empty when the pod has it. Gates can only be set at creation."""
    gates = pods.spec(pod).get("schedulingGates")
    entry = {"name": PLACEMENT_GATE}
    if not isinstance(gates, list):
        return [{"op": "add", "path": "/spec/schedulingGates", "value": [entry]}]
    if any(isinstance(g, Mapping) and g.get("name") == PLACEMENT_GATE for g in gates):
        return []
    return [{"op": "add", "path": "/spec/schedulingGates/-", "value": entry}]


def claim_errors(pod: pods.Pod, *, template: str, target: int) -> list[InvalidInputError]:
    """Refusals of an annotated pod in DRA mode: a claim name of ours taken by something else
    (checked before mutating), or, at validation, no gpushare claim (the mutation did not run)."""
    errors: list[InvalidInputError] = []
    for i, c in enumerate(_pod_claims(pod)):
        if (
            isinstance(c, Mapping)
            and c.get("name") == POD_CLAIM
            and c.get("resourceClaimTemplateName") != template
        ):
            errors.append(
                InvalidInputError(
                    f"spec.resourceClaims[{i}]",
                    f"the claim name {POD_CLAIM!r} is gpushare's, and it does not name the "
                    f"template {template!r} this pod's annotations ask for",
                    f"rename the claim, or drop the gpushare annotations and claim "
                    f"{POD_CLAIM!r} yourself",
                )
            )
    return errors


def missing_claim_error(template: str) -> InvalidInputError:
    return InvalidInputError(
        "spec.resourceClaims",
        f"has no claim {POD_CLAIM!r} from the template {template!r} the annotations ask for",
        "create the pod through the API server with gpushare's mutating webhook enabled",
    )


def template_conflict(namespace: str, name: str) -> InvalidInputError:
    """The template name exists with another spec (edited, or made by someone else)."""
    return InvalidInputError(
        f"ResourceClaimTemplate {namespace}/{name}",
        "exists with a spec other than the one gpushare makes for this request",
        f"delete it (kubectl delete resourceclaimtemplate -n {namespace} {name}); gpushare "
        "makes it again on the next pod",
    )


def covers(existing: Any, wanted: Any) -> bool:
    """Every field of ``wanted`` is in ``existing`` with the same value; fields the API server
    defaulted (``allocationMode``, ``count``) are allowed beside them."""
    if isinstance(wanted, Mapping):
        return isinstance(existing, Mapping) and all(
            k in existing and covers(existing[k], v) for k, v in wanted.items()
        )
    if isinstance(wanted, list):
        return (
            isinstance(existing, list)
            and len(existing) == len(wanted)
            and all(covers(e, w) for e, w in zip(existing, wanted, strict=True))
        )
    return bool(existing == wanted)


__all__ = [
    "claim_errors",
    "claim_ops",
    "claim_template",
    "covers",
    "gate_ops",
    "has_claim",
    "missing_claim_error",
    "template_conflict",
    "template_name",
]
