"""Reading plain pod dicts (the API server's JSON): metadata, spec, containers and resources.

The extender receives pods as JSON, the watch delivers them as JSON, the webhook too: one set of
pure functions reads them all, so the view, the extender and the webhook agree on every pod.
What a pod asks of the GPUs is read by ``gpu_requests``; what the view keeps of a watched pod,
by ``pod_facts``.
"""

from collections.abc import Mapping
from typing import Any

from gpushare.api.dra import POD_CLAIM
from gpushare.api.errors import InvalidInputError
from gpushare.api.names import ANN_CONTAINER, ANN_FRACTION, ANN_SHARE, GPU_RESOURCES, GROUP

Pod = Mapping[str, Any]

FINISHED_PHASES = ("Succeeded", "Failed")


def as_mapping(value: object) -> Mapping[str, Any]:
    """``value`` if it is a mapping (a JSON object), else an empty one."""
    if type(value) is dict:  # decoded JSON; the ABC check below costs several times more
        return value
    return value if isinstance(value, Mapping) else {}


def metadata(pod: Pod) -> Mapping[str, Any]:
    return as_mapping(pod.get("metadata"))


def spec(pod: Pod) -> Mapping[str, Any]:
    return as_mapping(pod.get("spec"))


def annotations(pod: Pod) -> dict[str, str]:
    """The pod's annotations; non-string values (invalid in Kubernetes) are dropped."""
    raw = as_mapping(metadata(pod).get("annotations"))
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
    status = as_mapping(pod.get("status"))
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
    res = as_mapping(container.get("resources"))
    limit = as_mapping(res.get("limits")).get(resource)
    request = as_mapping(res.get("requests")).get(resource)
    return (
        str(limit) if limit is not None else None,
        str(request) if request is not None else None,
    )


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
