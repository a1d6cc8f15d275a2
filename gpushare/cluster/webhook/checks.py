"""What the webhook refuses in a pod, each refusal naming the field and the fix: containers
(reserved env, GPU requests outside gpushare), volumes over gpushare's host paths, placement
annotations set by hand, the scheduler, and the GPU resources themselves (docs/security.md)."""

import posixpath
import re
from collections.abc import Mapping

from gpushare.api.dra import ANN_DRA_GPU
from gpushare.api.errors import InvalidInputError
from gpushare.api.exclusive import parse_avoid_gpus
from gpushare.api.gpushare_crd import ANN_PROFILE, ANN_PROFILING
from gpushare.api.names import (
    ANN_AVOID_GPUS,
    ANN_BIND_TIME,
    ANN_GPU_UUID,
    ANN_MEMORY_LIMIT,
    ANN_PAUSE,
    ANN_PAUSED,
    ANN_REQUEST_PERCENT,
    ANN_STATE,
    ANN_THREAD_PERCENT,
    ANN_TIER,
    GPU_RESOURCES,
    NVIDIA_GPU_RESOURCE,
    RESERVED_ENV_NAMES,
    RESERVED_ENV_PREFIXES,
    RESOURCE_GPU_OPPORTUNISTIC,
    RESOURCE_GPU_PERCENT,
    SCHEDULER_NAME,
)
from gpushare.cluster.state import pods
from gpushare.cluster.webhook.facts import ClusterFacts

PLACEMENT_ANNOTATIONS = (
    ANN_GPU_UUID,
    ANN_DRA_GPU,
    ANN_THREAD_PERCENT,
    ANN_REQUEST_PERCENT,
    ANN_MEMORY_LIMIT,
    ANN_BIND_TIME,
    ANN_STATE,
    ANN_TIER,
)
"""Written by the extender at bind (the Binding's annotations merge into the pod's, so one
written at creation would stay): a forged ``tier: opportunistic`` on a pod placed guaranteed
kept its share out of the GPU's guaranteed capacity."""


PAUSE_ANNOTATIONS = (ANN_PAUSE, ANN_PAUSED)
"""The controller's request to pause a pod and the node agent's record of the freeze
(gpushare.api.pause): a pod created with either would be frozen by its own word, or counted as
paused while it runs."""


OPERATOR_ANNOTATIONS = (ANN_PROFILING, ANN_PROFILE)
"""Written by the operator only: a pod claiming them at creation would keep neighbours off its
GPU (profiling alone) or misstate its interference profile."""


DEFAULT_SCHEDULERS = ("", "default-scheduler", SCHEDULER_NAME)


def check_containers(pod: pods.Pod, *, facts: ClusterFacts) -> list[InvalidInputError]:
    errors: list[InvalidInputError] = []
    for kind, i, c in pods.all_containers(pod):
        where = f"spec.{kind}[{i}]"
        asked = next((r for r in GPU_RESOURCES if any(pods.resource_value(c, r))), None)
        if kind != "containers" and asked is not None:
            # The kubelet would Allocate slices to it that no placement accounts for.
            errors.append(
                InvalidInputError(
                    f"{where}.resources[{asked}]",
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


def check_node_name(pod: pods.Pod) -> list[InvalidInputError]:
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


PROC_ROOT = re.compile(
    r"/proc(?:/(?:self|thread-self|[0-9]+)(?:/task(?:/[0-9]+)?)?(?:/(?:root|cwd)(?:/.*)?)?)?"
)
"""A host path into a process's view of the file system (``/proc/1/root/...``, ``/proc``,
``/proc/<pid>``) reaches the whole host, so it is judged as ``/``, as the chart's policy does
(issue 67: ``/proc/1/root/var/lib/kubelet/device-plugins`` passed the guard)."""


def through_proc(norm: str) -> str:
    """The host path a normalized hostPath stands for: ``/`` for one through /proc."""
    return "/" if PROC_ROOT.fullmatch(norm) else norm


def check_volumes(pod: pods.Pod, *, facts: ClusterFacts) -> list[InvalidInputError]:
    errors: list[InvalidInputError] = []
    volumes = pods.spec(pod).get("volumes")
    for i, vol in enumerate(volumes if isinstance(volumes, list) else []):
        host = vol.get("hostPath") if isinstance(vol, Mapping) else None
        path = host.get("path") if isinstance(host, Mapping) else None
        if not isinstance(path, str) or not path:
            continue
        norm = through_proc(posixpath.normpath("/" + path.lstrip("/")))
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


def check_annotations(pod: pods.Pod) -> list[InvalidInputError]:
    ann = pods.annotations(pod)
    errors = [
        InvalidInputError(
            key,
            "is written by gpushare when it places the pod",
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
    errors += [
        InvalidInputError(
            key,
            "is written by gpushare when it pauses or resumes the pod",
            "remove it from the pod; gpushare pauses opportunistic pods when guaranteed ones "
            "need the GPU",
        )
        for key in PAUSE_ANNOTATIONS
        if key in ann
    ]
    try:
        parse_avoid_gpus(ann.get(ANN_AVOID_GPUS))
    except InvalidInputError as exc:
        errors.append(exc)
    return errors


def check_scheduler(pod: pods.Pod, *, final: bool) -> list[InvalidInputError]:
    name = pods.spec(pod).get("schedulerName") or ""
    allowed = (SCHEDULER_NAME,) if final else DEFAULT_SCHEDULERS
    if name in allowed:
        return []
    if final and name in DEFAULT_SCHEDULERS:  # the API server's default: nobody wrote it
        return [
            InvalidInputError(
                "spec.schedulerName",
                f"is {name or 'unset'!r}: the pod did not pass gpushare's mutating webhook, "
                f"which sets {SCHEDULER_NAME}",
                "make sure the MutatingWebhookConfiguration 'gpushare' is registered, then "
                "recreate the pod",
            )
        ]
    return [
        InvalidInputError(
            "spec.schedulerName",
            f"is {name!r}, but gpushare pods must be placed by {SCHEDULER_NAME}",
            "remove spec.schedulerName (the webhook sets it)",
        )
    ]


def asks_resource(pod: pods.Pod) -> bool:
    return any(
        v is not None
        for c in pods.containers(pod)
        for r in GPU_RESOURCES
        for v in pods.resource_value(c, r)
    )


def asks_opportunistic(pod: pods.Pod, *, target: int) -> bool:
    """The pod's GPU container asks for ``gpushare.io/opportunistic-gpu-percent``: the webhook
    opted it in (validation reads the decision from the resource, not from the defaults)."""
    items = pods.containers(pod)
    if not 0 <= target < len(items):
        return False
    return any(
        v is not None for v in pods.resource_value(items[target], RESOURCE_GPU_OPPORTUNISTIC)
    )


def single_resource_errors(pod: pods.Pod) -> list[InvalidInputError]:
    """A pod asking for a gpushare resource directly must do so in one container, and for one
    of the two (gpu-percent, or opportunistic-gpu-percent when opted in)."""
    holders = [
        (i, r)
        for i, c in enumerate(pods.containers(pod))
        for r in GPU_RESOURCES
        if any(v is not None for v in pods.resource_value(c, r))
    ]
    if len(holders) <= 1:
        return []
    index, resource = holders[1]
    return [
        InvalidInputError(
            f"spec.containers[{index}].resources[{resource}]",
            f"gpushare GPU resources are asked for {len(holders)} times",
            "give one GPU share to one container (MPS limits apply per GPU client), as "
            f"{RESOURCE_GPU_PERCENT} or, opted in to opportunistic placement, "
            f"{RESOURCE_GPU_OPPORTUNISTIC}",
        )
    ]


def resource_errors(
    pod: pods.Pod, *, target: int, percent: int, required: bool, opportunistic: bool = False
) -> list[InvalidInputError]:
    """A pod that also writes a gpushare resource must agree with its annotation; after
    mutation (``required``) the target container must carry it: gpu-percent, or
    opportunistic-gpu-percent for a pod opted in to opportunistic placement."""
    errors: list[InvalidInputError] = []
    wanted_resource = RESOURCE_GPU_OPPORTUNISTIC if opportunistic else RESOURCE_GPU_PERCENT
    for i, c in enumerate(pods.containers(pod)):
        for resource in GPU_RESOURCES:
            limit, request = pods.resource_value(c, resource)
            if required and i == target and resource == wanted_resource and limit is None:
                errors.append(
                    InvalidInputError(
                        f"spec.containers[{i}].resources.limits[{resource}]",
                        "is missing: the pod did not pass gpushare's mutating webhook",
                        "make sure the MutatingWebhookConfiguration 'gpushare' is registered, "
                        "then recreate the pod",
                    )
                )
            for what, value in (("limits", limit), ("requests", request)):
                if value is None:
                    continue
                wanted = str(percent) if i == target and resource == wanted_resource else None
                if value != wanted:
                    errors.append(
                        InvalidInputError(
                            f"spec.containers[{i}].resources.{what}[{resource}]",
                            f"is {value!r} but the pod's annotations ask for {percent} of "
                            f"{wanted_resource} "
                            + ("on this container" if i == target else "on another container"),
                            "remove it; the webhook sets it from gpushare.io/gpu-fraction "
                            "(and gpushare.io/opportunistic)",
                        )
                    )
    return errors


RESTARTING_PROBES = ("livenessProbe", "startupProbe")
"""Probes whose failures restart a container. An opportunistic pod may be paused at any time
(its containers frozen, docs/node-agent.md "Pausing a pod"), and measured on the local cluster
(runc, cgroup freezer): a frozen container's ``exec`` probe errors and is not counted (no
restart), a ``tcpSocket`` probe passes (the kernel answers the handshake), an ``httpGet``
probe times out and the kubelet restarted the container after its failure threshold; a
``grpc`` probe waits on the frozen server the same way."""
UNPAUSABLE_HANDLERS = ("httpGet", "grpc")


def check_pausable(pod: pods.Pod) -> list[InvalidInputError]:
    """An opportunistic pod is paused, not evicted, when a guaranteed pod needs its compute:
    refuse one whose containers (and sidecars: init containers that keep running) have a
    liveness or startup probe that a pause would fail, so the kubelet would restart the
    container and throw its work away (docs/packing.md, "The sharing contract")."""
    errors: list[InvalidInputError] = []
    for kind, i, c in pods.all_containers(pod):
        if kind == "ephemeralContainers" or (
            kind == "initContainers" and c.get("restartPolicy") != "Always"
        ):
            continue  # no probes, or done before the pod runs
        for probe_name in RESTARTING_PROBES:
            probe = c.get(probe_name)
            if not isinstance(probe, Mapping):
                continue
            for handler in UNPAUSABLE_HANDLERS:
                if handler in probe:
                    errors.append(
                        InvalidInputError(
                            f"spec.{kind}[{i}].{probe_name}.{handler}",
                            "would fail while the pod is paused (an opportunistic pod is "
                            "paused, its containers frozen, when a guaranteed pod needs the "
                            "GPU), and the kubelet would restart the container, losing its work",
                            f"use an exec or tcpSocket {probe_name} (a paused container's exec "
                            "probe is not counted, a tcpSocket probe passes), move the check to "
                            "a readinessProbe, or remove gpushare.io/opportunistic",
                        )
                    )
    return errors
