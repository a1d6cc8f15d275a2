"""The Allocate response for one container: environment (CUDA_VISIBLE_DEVICES, the MPS
client limits), mounts (the GPU's MPS pipe and shared-memory directories), device nodes; or
the refusal (``AllocationError``) the kubelet shows on the pod.

A pod gpushare placed gets the answer its placement says (``allocation_for_pod``), after the
one-UID-per-GPU check of MPS (``check_uid``); a pod nobody placed gets a safe answer derived
from the slice IDs alone (``derived_allocation``).
"""

from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from gpushare.api.errors import InvalidInputError
from gpushare.api.inventory import GpuInfo
from gpushare.api.names import ANN_CLASS, ANN_STATE, CLASS_BATCH, SLICES_PER_GPU, STATE_ALLOCATED
from gpushare.api.placement import Placement
from gpushare.api.request import parse_class
from gpushare.node.deviceplugin.pods import PodInfo, annotated_gpus
from gpushare.node.mps.client import MiB, client_limits_env, runs_under_mps

# Where a container sees its GPU's MPS directories.
CONTAINER_MPS_DIR = "/run/gpushare/node/mps"
CONTAINER_PIPE_DIR = f"{CONTAINER_MPS_DIR}/pipe"
CONTAINER_SHM_DIR = "/dev/shm"
MPS_DEFAULT_PIPE_DIR = "/tmp/nvidia-mps"
"""Where CUDA looks for the MPS daemon when CUDA_MPS_PIPE_DIRECTORY is unset: the GPU's pipe
directory is mounted there too, so unsetting the variable does not take a client out of MPS
(and out of its server's limits)."""
_UID_FIELD = "securityContext.runAsUser"


class MpsLayout(Protocol):
    """Host paths of each GPU's MPS daemon (implemented by gpushare.node.mps.MpsManager)."""

    def paths(self, uuid: str) -> "MpsPathsLike": ...

    def client_shm(self, uuid: str) -> Path: ...


class MpsPathsLike(Protocol):
    @property
    def pipe(self) -> Path: ...


@dataclass(frozen=True)
class MountSpec:
    container_path: str
    host_path: str
    read_only: bool = False


@dataclass(frozen=True)
class DeviceNode:
    container_path: str
    host_path: str
    permissions: str = "rw"


@dataclass(frozen=True)
class ContainerAllocation:
    """The answer for one container: environment, mounts and device nodes."""

    envs: dict[str, str]
    mounts: list[MountSpec] = field(default_factory=list)
    devices: list[DeviceNode] = field(default_factory=list)
    pod: str | None = None
    """namespace/name of the pod it was decided for; None when derived from the slice IDs."""


class AllocationError(Exception):
    """Allocate must fail: the message is what the kubelet shows on the pod."""


@dataclass(frozen=True)
class AllocationContext:
    """The node-level inputs of an Allocate answer."""

    node_name: str
    gpus: Mapping[str, GpuInfo]
    mps: MpsLayout
    device_nodes: Callable[[str], list[DeviceNode]] | None = None
    nvidia_runtime_env: bool = False
    """Also set NVIDIA_VISIBLE_DEVICES, for nodes whose runtime injects the driver from it."""


def check_uid(pod: PodInfo, neighbours: Sequence[PodInfo], gpu: str) -> str | None:
    """Refuse a pod whose UID would stall behind the GPU's MPS server; return a warning text
    when the UIDs cannot be compared (a pod runs as its image's default user).

    An MPS server serves one Linux UID at a time and a client of another UID waits until all
    the server's clients exit, so gpushare keeps one UID per GPU while pods share it.
    """
    explicit = {p.run_as_user for p in neighbours if p.run_as_user is not None}
    if pod.run_as_user is not None and explicit and pod.run_as_user not in explicit:
        served = ", ".join(str(u) for u in sorted(explicit))
        names = ", ".join(p.key for p in neighbours[:5])
        raise AllocationError(
            str(
                InvalidInputError(
                    _UID_FIELD,
                    f"pod {pod.key} runs as UID {pod.run_as_user} but the MPS server of GPU "
                    f"{gpu} serves UID {served} (pods {names}); its CUDA calls would wait until "
                    "those pods exit",
                    f"run the pod as UID {served}, or delete it so the scheduler places it again",
                )
            )
        )
    unknown = any(p.run_as_user is None for p in neighbours)
    if (pod.run_as_user is None and explicit) or (pod.run_as_user is not None and unknown):
        return (
            f"cannot check that pod {pod.key} and the pods already on GPU {gpu} run as the same "
            f"UID (set {_UID_FIELD} on all of them); an MPS server serves one UID at a time"
        )
    return None


def allocated_neighbours(
    pod: PodInfo, gpu: str, pods: Iterable[PodInfo], *, also: AbstractSet[str] = frozenset()
) -> list[PodInfo]:
    """Pods still running on ``gpu`` that were already allocated (or are in ``also``)."""
    return [
        other
        for other in pods
        if other.uid != pod.uid
        and not other.finished
        and gpu in annotated_gpus(other)
        and (other.annotations.get(ANN_STATE) == STATE_ALLOCATED or other.uid in also)
    ]


def allocation_for_pod(
    ctx: AllocationContext,
    pod: PodInfo,
    placement: Placement,
    neighbours: Sequence[PodInfo],
) -> tuple[ContainerAllocation, str | None]:
    """The answer for a container of ``pod``, and a warning to record (UIDs not comparable).

    A single GPU with a fractional share goes through that GPU's MPS daemon; whole GPUs go
    without MPS (one process cannot use several daemons, and a whole GPU needs none).
    """
    try:
        gpu_class = parse_class(pod.annotations.get(ANN_CLASS))
    except InvalidInputError as exc:
        raise AllocationError(f"pod {pod.key}: {exc}") from None
    uuids = list(placement.gpu_uuids)
    asked = sum(pod.requested_slices)
    if not runs_under_mps(
        gpus=len(uuids), thread_percent=placement.thread_percent, requested_percent=asked
    ):
        return whole_allocation(ctx, uuids, pod=pod.key), None
    warning = check_uid(pod, neighbours, uuids[0])
    allocation = mps_allocation(
        ctx,
        uuids[0],
        thread_percent=placement.thread_percent,
        memory_limit_bytes=placement.memory_limit_bytes,
        gpu_class=gpu_class,
        pod=pod.key,
        request_percent=placement.guaranteed_percent,
    )
    return allocation, warning


def derived_allocation(
    ctx: AllocationContext, group: Mapping[str, list[int]]
) -> tuple[ContainerAllocation, str]:
    """No pod found: a safe placement from the slice IDs alone, and the Event text saying so."""
    total = sum(len(s) for s in group.values())
    intro = (
        f"Allocate found no pod waiting with gpushare placement annotations on node "
        f"{ctx.node_name} for {total} slice(s) of GPU(s) {', '.join(group)}"
    )
    if len(group) > 1 and all(len(s) == SLICES_PER_GPU for s in group.values()):
        return whole_allocation(
            ctx, list(group), pod=None
        ), f"{intro}; gave the whole GPUs without MPS"
    # One process can use one MPS daemon: keep the GPU that holds most of the slices.
    uuid = max(group, key=lambda u: (len(group[u]), u))
    slices = len(group[uuid])
    memory = ctx.gpus[uuid].memory_bytes * slices // SLICES_PER_GPU
    if slices >= SLICES_PER_GPU:
        return whole_allocation(
            ctx, [uuid], pod=None
        ), f"{intro}; gave GPU {uuid} whole, without MPS"
    message = (
        f"{intro}; derived a safe placement: GPU {uuid}, active-thread percentage {slices}, "
        f"memory limit {memory // MiB} MiB, batch priority"
    )
    allocation = mps_allocation(
        ctx,
        uuid,
        thread_percent=slices,
        memory_limit_bytes=memory,
        gpu_class=CLASS_BATCH,
        pod=None,
    )
    return allocation, message


def _devices(ctx: AllocationContext, uuids: Sequence[str]) -> list[DeviceNode]:
    if ctx.device_nodes is None:
        return []
    nodes: dict[str, DeviceNode] = {}
    for uuid in uuids:
        for node in ctx.device_nodes(uuid):
            nodes[node.container_path] = node
    return list(nodes.values())


def whole_allocation(
    ctx: AllocationContext, uuids: Sequence[str], *, pod: str | None
) -> ContainerAllocation:
    """Whole GPUs without MPS (also the DRA plugin's answer for a claim of whole GPUs)."""
    envs = {"CUDA_VISIBLE_DEVICES": ",".join(uuids)}
    if ctx.nvidia_runtime_env:
        envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(uuids)
    return ContainerAllocation(envs=envs, devices=_devices(ctx, uuids), pod=pod)


def mps_allocation(
    ctx: AllocationContext,
    uuid: str,
    *,
    thread_percent: int,
    memory_limit_bytes: int,
    gpu_class: str,
    pod: str | None,
    request_percent: int | None = None,
) -> ContainerAllocation:
    """One GPU through its MPS daemon: the pipe and shm directories, the client limits (also
    the DRA plugin's answer for a shared claim; the server-level limits are set apart)."""
    paths = ctx.mps.paths(uuid)
    envs = {
        "CUDA_VISIBLE_DEVICES": uuid,
        "CUDA_MPS_PIPE_DIRECTORY": CONTAINER_PIPE_DIR,
        **client_limits_env(
            thread_percent=thread_percent,
            gpu_class=gpu_class,
            memory_limit_bytes=memory_limit_bytes,
            gpu_memory_bytes=ctx.gpus[uuid].memory_bytes,
            request_percent=request_percent,
        ),
    }
    if ctx.nvidia_runtime_env:
        envs["NVIDIA_VISIBLE_DEVICES"] = uuid
    # No log directory: clients never write it (the daemon and its servers do), and the agent
    # reads it to judge faults, so tenants must not be able to write lines into it.
    mounts = [
        MountSpec(CONTAINER_PIPE_DIR, str(paths.pipe)),
        MountSpec(MPS_DEFAULT_PIPE_DIR, str(paths.pipe)),
        MountSpec(CONTAINER_SHM_DIR, str(ctx.mps.client_shm(uuid))),
    ]
    return ContainerAllocation(envs=envs, mounts=mounts, devices=_devices(ctx, [uuid]), pod=pod)
