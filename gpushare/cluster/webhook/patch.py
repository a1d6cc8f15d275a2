"""What the mutating webhook adds to a gpushare pod: the ``gpushare.io/gpu-percent`` request
(``gpushare.io/opportunistic-gpu-percent`` for a pod opted in to opportunistic placement),
``schedulerName: gpushare-scheduler``, a GpuShare's memory and class, and the annotations that
keep a faulting workload on a GPU of its own or away from the GPUs it faulted on
(docs/scheduling.md, "Admission webhook")."""

from collections.abc import Mapping
from typing import Any

from gpushare.api.exclusive import parse_avoid_gpus
from gpushare.api.names import (
    ANN_AVOID_GPUS,
    ANN_CLASS,
    ANN_EXCLUSIVE,
    ANN_FRACTION,
    ANN_LIMIT,
    ANN_MEMORY,
    ANN_OPPORTUNISTIC,
    RESOURCE_GPU_OPPORTUNISTIC,
    RESOURCE_GPU_PERCENT,
    SCHEDULER_NAME,
)
from gpushare.api.quantities import format_memory
from gpushare.api.request import GpuRequest
from gpushare.cluster.state import pods
from gpushare.cluster.webhook.facts import ClusterFacts, PriorityRef


def escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def controller_uid(pod: pods.Pod) -> str | None:
    refs = pods.metadata(pod).get("ownerReferences")
    for ref in refs if isinstance(refs, list) else []:
        if isinstance(ref, Mapping) and ref.get("controller") and isinstance(ref.get("uid"), str):
            return str(ref["uid"])
    return None


def separation(
    pod: pods.Pod, *, facts: ClusterFacts, namespace: str
) -> tuple[frozenset[str], str] | None:
    """(GPUs to keep the pod off, why) when its workload was separated from the workloads it
    kept faulting with (gpushare.node.faults); the pod's own avoid-gpus are kept. Marks of
    ``namespace`` only: the controller UID is the pod's own word."""
    uid = controller_uid(pod)
    if facts.separation_lookup is None or uid is None:
        return None
    found = facts.separation_lookup(uid, namespace)
    if found is None:
        return None
    avoid, why = found
    own = parse_avoid_gpus(pods.annotations(pod).get(ANN_AVOID_GPUS))
    if avoid <= own:
        return None
    return avoid | own, why


def annotation_ops(
    pod: pods.Pod, values: Mapping[str, str], *, after: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """JSON patch operations that set pod annotations (``after``: the patch so far, which may
    already have created the annotations map)."""
    ops: list[dict[str, Any]] = []
    created = any(op.get("path") == "/metadata/annotations" for op in after)
    if not created and not isinstance(pods.metadata(pod).get("annotations"), Mapping):
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {}})
    for key, value in values.items():
        ops.append({"op": "add", "path": f"/metadata/annotations/{escape(key)}", "value": value})
    return ops


def exclusive_reason(pod: pods.Pod, *, facts: ClusterFacts, namespace: str) -> str | None:
    """Why the pod's workload must run alone on a GPU (its clients faulted repeatedly on shared
    GPUs, see gpushare.node.faults), or None. Marks of ``namespace`` only: a tenant pod naming
    another namespace's workload UID in its ownerReferences gets none of its marks."""
    uid = controller_uid(pod)
    if facts.exclusive_lookup is None or uid is None:
        return None
    return facts.exclusive_lookup(uid, namespace)


def priority_ops(pod: pods.Pod, priority: PriorityRef) -> list[dict[str, Any]]:
    """Give an opted-in pod that names no PriorityClass ``priority``: its name, and the value
    and preemption policy the API server's Priority admission would have set from it (that
    plugin ran before this webhook, and sets them again consistently if reinvoked)."""
    if pods.spec(pod).get("priorityClassName"):
        return []  # the user's choice wins
    return [
        {"op": "add", "path": "/spec/priorityClassName", "value": priority.name},
        {"op": "add", "path": "/spec/priority", "value": priority.value},
        {"op": "add", "path": "/spec/preemptionPolicy", "value": priority.preemption_policy},
    ]


def pod_patch(
    pod: pods.Pod,
    *,
    request: GpuRequest,
    target: int,
    exclusive: str | None = None,
    priority: PriorityRef | None = None,
) -> list[dict[str, Any]]:
    ops: list[dict[str, Any]] = []
    if exclusive is not None:
        if not isinstance(pods.metadata(pod).get("annotations"), Mapping):
            ops.append({"op": "add", "path": "/metadata/annotations", "value": {}})
        for key, value in ((ANN_FRACTION, "1"), (ANN_EXCLUSIVE, exclusive)):
            ops.append(
                {"op": "add", "path": f"/metadata/annotations/{escape(key)}", "value": value}
            )
        if ANN_LIMIT in pods.annotations(pod):  # a whole GPU is never capped
            ops.append({"op": "remove", "path": f"/metadata/annotations/{escape(ANN_LIMIT)}"})
    container = pods.containers(pod)[target]
    base = f"/spec/containers/{target}/resources"
    resources = container.get("resources")
    if not isinstance(resources, Mapping):
        ops.append({"op": "add", "path": base, "value": {}})
        resources = {}
    value = str(request.percent)
    opted_in = bool(request.opportunistic) and exclusive is None
    resource = RESOURCE_GPU_OPPORTUNISTIC if opted_in else RESOURCE_GPU_PERCENT
    for what in ("limits", "requests"):
        current = resources.get(what)
        if not isinstance(current, Mapping):
            ops.append({"op": "add", "path": f"{base}/{what}", "value": {}})
        ops.append({"op": "add", "path": f"{base}/{what}/{escape(resource)}", "value": value})
    if opted_in and pods.annotations(pod).get(ANN_OPPORTUNISTIC) is None:
        # Say where the opt-in came from (the pod's GpuShare, or the cluster's default).
        ops += annotation_ops(pod, {ANN_OPPORTUNISTIC: "true"}, after=ops)
    if opted_in and priority is not None:
        ops += priority_ops(pod, priority)
    if pods.spec(pod).get("schedulerName") != SCHEDULER_NAME:
        ops.append({"op": "add", "path": "/spec/schedulerName", "value": SCHEDULER_NAME})
    ann = pods.annotations(pod)
    if request.share is not None:
        if request.memory_bytes is not None and ANN_MEMORY not in ann:
            ops.append(
                {
                    "op": "add",
                    "path": f"/metadata/annotations/{escape(ANN_MEMORY)}",
                    "value": format_memory(request.memory_bytes),
                }
            )
        if ANN_CLASS not in ann:
            ops.append(
                {
                    "op": "add",
                    "path": f"/metadata/annotations/{escape(ANN_CLASS)}",
                    "value": request.gpu_class,
                }
            )
    return ops
