"""The container's answer, whichever plugin gives it: the environment (CUDA_VISIBLE_DEVICES,
the MPS client limits), mounts (the GPU's MPS pipe and shared-memory directories) and device
nodes for one container (``ContainerAllocation``), with the GPU's CDI device names on CDI
nodes (gpushare.node.core.vendor_cdi), or the refusal (``AllocationError``) the
kubelet shows on the pod.

A shared GPU goes through its MPS daemon (``mps_allocation``), whole GPUs without MPS
(``whole_allocation``); an MPS server serves one UID at a time (``check_uid``). The device
plugin answers Allocate with these (gpushare.node.deviceplugin.response) and the DRA plugin
writes them into a claim's CDI spec (gpushare.node.dra.driver).
"""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from gpushare.api.errors import InvalidInputError
from gpushare.api.inventory import GpuInfo
from gpushare.api.pod import PodInfo
from gpushare.node.core.vendor_cdi import VendorCdi, names_for
from gpushare.node.mps.client import ClientLimits, client_limits

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
    limits: ClientLimits | None = None
    """The MPS client limits ``envs`` tells the container (None: whole GPUs, without MPS), as
    numbers: what the GPU's MPS server must allow."""
    gpu_uuid: str | None = None
    """The GPU of an MPS answer."""
    cdi_devices: tuple[str, ...] = ()
    """Fully qualified CDI device names the runtime injects too (the GPU's device nodes and
    driver libraries on CDI nodes: gpushare.node.core.vendor_cdi); not part of gpushare's own
    CDI edits."""


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
    vendor_cdi: VendorCdi | None = None
    """The GPUs' CDI device names, for nodes whose runtime injects GPUs from CDI specs."""


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
    return ContainerAllocation(
        envs=envs,
        devices=_devices(ctx, uuids),
        pod=pod,
        cdi_devices=names_for(ctx.vendor_cdi, ctx.gpus, uuids),
    )


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
    limits = client_limits(
        thread_percent=thread_percent,
        gpu_class=gpu_class,
        memory_limit_bytes=memory_limit_bytes,
        gpu_memory_bytes=ctx.gpus[uuid].memory_bytes,
        request_percent=request_percent,
    )
    envs = {
        "CUDA_VISIBLE_DEVICES": uuid,
        "CUDA_MPS_PIPE_DIRECTORY": CONTAINER_PIPE_DIR,
        **limits.env(),
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
    return ContainerAllocation(
        envs=envs,
        mounts=mounts,
        devices=_devices(ctx, [uuid]),
        pod=pod,
        limits=limits,
        gpu_uuid=uuid,
        cdi_devices=names_for(ctx.vendor_cdi, ctx.gpus, [uuid]),
    )
