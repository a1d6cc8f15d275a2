"""What Allocate and GetPreferredAllocation decide: pure logic over pods and slice IDs.

The kubelet calls both with device IDs only, never the pod (DESIGN.md). The pod is found from
the scheduler's placement annotations: bound to this node, not yet ``allocated``, placed on
exactly the GPU(s) the slice IDs belong to, state ``assumed``, oldest bind-time first. The
request size only breaks ties between such pods; it never picks a pod on its own.

With no such pod (a pod not placed by gpushare-scheduler, or annotations that arrive late),
a safe placement is derived from the slice IDs: the GPU they belong to, an active-thread
percentage equal to the slice count, and the same share of the GPU's memory; the caller
records a Kubernetes Event saying so.
"""

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from gpushare.api.errors import InvalidInputError
from gpushare.api.inventory import GpuInfo
from gpushare.api.names import (
    ANN_CLASS,
    ANN_GPU_UUID,
    ANN_STATE,
    CLASS_BATCH,
    MPS_PRIORITY_BY_CLASS,
    SLICES_PER_GPU,
    STATE_ALLOCATED,
    STATE_ASSUMED,
)
from gpushare.api.placement import Placement, parse_placement
from gpushare.api.request import parse_class
from gpushare.deviceplugin.devices import device_id, group_by_gpu

log = logging.getLogger(__name__)

MiB = 2**20
# Where a container sees its GPU's MPS directories.
CONTAINER_MPS_DIR = "/run/gpushare/mps"
CONTAINER_PIPE_DIR = f"{CONTAINER_MPS_DIR}/pipe"
CONTAINER_LOG_DIR = f"{CONTAINER_MPS_DIR}/log"
CONTAINER_SHM_DIR = "/dev/shm"
_FINISHED = ("Succeeded", "Failed")
_UID_FIELD = "securityContext.runAsUser"


@dataclass(frozen=True)
class PodInfo:
    """What the device plugin needs to know about a pod bound to this node."""

    namespace: str
    name: str
    uid: str
    annotations: Mapping[str, str]
    phase: str = "Pending"
    run_as_user: int | None = None
    """Effective UID of the GPU container (container, else pod securityContext); None = the
    image's default user, unknown here."""
    requested_slices: tuple[int, ...] = ()
    """gpu-percent slices asked for by each container that asks for any, in spec order."""
    created: datetime | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def finished(self) -> bool:
        return self.phase in _FINISHED


class PodSource(Protocol):
    """The device plugin's only window on Kubernetes (implemented by gpushare.node.kube)."""

    def list_node_pods(self) -> list[PodInfo]:
        """Pods bound to this node, read fresh from the API server."""

    def mark_allocated(self, pod: PodInfo) -> None:
        """Set the pod's ``gpushare.io/state`` annotation to ``allocated``."""

    def record_event(
        self, *, pod: PodInfo | None, reason: str, message: str, warning: bool
    ) -> None:
        """Record a Kubernetes Event on the pod, or on this node when pod is None."""


class MpsLayout(Protocol):
    """Host paths of each GPU's MPS daemon (implemented by gpushare.mps.MpsManager)."""

    def paths(self, uuid: str) -> "MpsPathsLike": ...

    def client_shm(self, uuid: str) -> Path: ...


class MpsPathsLike(Protocol):
    @property
    def pipe(self) -> Path: ...

    @property
    def log(self) -> Path: ...


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
class _Candidate:
    pod: PodInfo
    placement: Placement | None
    error: InvalidInputError | None
    order: datetime


def _epoch() -> datetime:
    return datetime.fromtimestamp(0, tz=UTC)


def _candidate(pod: PodInfo) -> _Candidate | None:
    """A pod with a gpushare placement that is still waiting for its Allocate; else None."""
    if pod.finished or ANN_GPU_UUID not in pod.annotations:
        return None
    try:
        placement = parse_placement(pod.annotations)
    except InvalidInputError as exc:
        if pod.annotations.get(ANN_STATE, STATE_ASSUMED) == STATE_ALLOCATED:
            return None
        return _Candidate(pod, None, exc, pod.created or _epoch())
    if placement is None or placement.state != STATE_ASSUMED:
        return None
    return _Candidate(pod, placement, None, placement.bind_time)


def _raw_gpus(pod: PodInfo) -> frozenset[str]:
    return frozenset(u.strip() for u in pod.annotations.get(ANN_GPU_UUID, "").split(",") if u)


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


class Allocator:
    """Decides Allocate and GetPreferredAllocation answers. Thread-safe (one call at a time)."""

    def __init__(
        self,
        *,
        node_name: str,
        gpus: Callable[[], Sequence[GpuInfo]],
        pods: PodSource,
        mps: MpsLayout,
        device_nodes: Callable[[str], list[DeviceNode]] | None = None,
        nvidia_runtime_env: bool = False,
        retry_delays_s: Sequence[float] = (0.2, 0.5),
    ) -> None:
        self.node_name = node_name
        self.gpus = gpus
        self.pods = pods
        self.mps = mps
        self.device_nodes = device_nodes
        self.nvidia_runtime_env = nvidia_runtime_env
        """Also set NVIDIA_VISIBLE_DEVICES, for nodes whose runtime injects the driver from it."""
        self.retry_delays_s = tuple(retry_delays_s)
        self._lock = threading.Lock()
        # Pods this process already allocated or refused, in case the API server has not yet
        # shown our annotation patch (or the kubelet's Failed phase) when the next call comes.
        self._handled: dict[str, float] = {}

    # --- shared --------------------------------------------------------------------------

    def _gpu_map(self) -> dict[str, GpuInfo]:
        return {g.uuid: g for g in self.gpus()}

    def _candidates(self, pods: Sequence[PodInfo]) -> list[_Candidate]:
        found = [c for p in pods if p.uid not in self._handled and (c := _candidate(p))]
        return sorted(found, key=lambda c: (c.order, c.pod.key))

    def _remember(self, pod: PodInfo) -> None:
        now = time.monotonic()
        self._handled[pod.uid] = now
        for uid, seen in list(self._handled.items()):
            if now - seen > 3600:
                del self._handled[uid]

    # --- GetPreferredAllocation ----------------------------------------------------------

    def preferred(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        """Pick ``size`` slice IDs: those of the GPU the scheduler chose for the oldest waiting
        pod that fits, else a best fit (the GPU with the fewest free slices that suffice)."""
        free = group_by_gpu(available)
        must = list(dict.fromkeys(must_include))
        must_gpus = set(group_by_gpu(must))
        target: list[str] | None = None
        with self._lock:
            try:
                pods = self.pods.list_node_pods()
            except Exception as exc:  # the API server is not essential for a hint
                log.warning("GetPreferredAllocation: listing pods failed (%s); best fit", exc)
                pods = []
            candidates = self._candidates(pods)
        for cand in candidates:
            if cand.placement is None:
                continue
            gpus = list(cand.placement.gpu_uuids)
            if must_gpus - set(gpus):
                continue
            per_gpu = size if len(gpus) == 1 else SLICES_PER_GPU
            if len(gpus) * per_gpu != size and len(gpus) > 1:
                continue
            if all(len(free.get(g, [])) >= per_gpu for g in gpus):
                target = gpus
                log.info(
                    "GetPreferredAllocation: %d slices steered to %s for pod %s",
                    size,
                    gpus,
                    cand.pod.key,
                )
                break
        if target is None:
            target = _best_fit(free, size)
        chosen = list(must)
        for uuid in target:
            for index in free.get(uuid, []):
                if len(chosen) >= size:
                    break
                ident = device_id(uuid, index)
                if ident not in chosen:
                    chosen.append(ident)
        # Top up from anything available if the target could not fill the request.
        for ident in available:
            if len(chosen) >= size:
                break
            if ident not in chosen:
                chosen.append(ident)
        return chosen[:size]

    # --- Allocate ------------------------------------------------------------------------

    def allocate(self, container_requests: Sequence[Sequence[str]]) -> list[ContainerAllocation]:
        """Answer one Allocate call (all its containers belong to one pod)."""
        gpu_map = self._gpu_map()
        groups = [group_by_gpu(ids) for ids in container_requests]
        for group in groups:
            for uuid in group:
                if uuid not in gpu_map:
                    raise AllocationError(
                        f"device IDs name GPU {uuid}, which is not on node {self.node_name}"
                    )
        wanted = frozenset(u for g in groups for u in g)
        sizes = tuple(sum(len(s) for s in g.values()) for g in groups)
        with self._lock:
            pod, placement, pods = self._find_pod(wanted, sizes)
            if pod is None or placement is None:
                return [self._derived(group, gpu_map) for group in groups]
            try:
                result = [self._for_pod(pod, placement, gpu_map, pods) for _ in groups]
            except AllocationError:
                self._remember(pod)
                raise
            self._remember(pod)
        try:
            self.pods.mark_allocated(pod)
        except Exception as exc:
            # The container is set up correctly either way; _handled keeps us from giving this
            # placement to another pod. Surface it, since the scheduler's view is now stale.
            log.error(
                "pod %s allocated but marking it %s failed: %s", pod.key, STATE_ALLOCATED, exc
            )
        return result

    def _find_pod(
        self, wanted: frozenset[str], sizes: tuple[int, ...]
    ) -> tuple[PodInfo | None, Placement | None, list[PodInfo]]:
        pods: list[PodInfo] = []
        for attempt, delay in enumerate((0.0, *self.retry_delays_s)):
            if delay:
                time.sleep(delay)
            pods = self.pods.list_node_pods()
            matching = [
                c
                for c in self._candidates(pods)
                if (c.placement is not None and frozenset(c.placement.gpu_uuids) == wanted)
                or (c.placement is None and _raw_gpus(c.pod) == wanted)
            ]
            if not matching:
                log.info("Allocate: no waiting pod placed on %s (try %d)", sorted(wanted), attempt)
                continue
            sized = [c for c in matching if c.pod.requested_slices == sizes]
            best = (sized or matching)[0]
            if best.error is not None:
                self._remember(best.pod)
                raise AllocationError(f"pod {best.pod.key}: {best.error}")
            return best.pod, best.placement, pods
        return None, None, pods

    def _neighbours(self, pod: PodInfo, gpu: str, pods: Sequence[PodInfo]) -> list[PodInfo]:
        """Pods already allocated on this GPU and still running."""
        result = []
        for other in pods:
            if other.uid == pod.uid or other.finished or gpu not in _raw_gpus(other):
                continue
            if other.annotations.get(ANN_STATE) == STATE_ALLOCATED or other.uid in self._handled:
                result.append(other)
        return result

    def _for_pod(
        self,
        pod: PodInfo,
        placement: Placement,
        gpu_map: Mapping[str, GpuInfo],
        pods: Sequence[PodInfo],
    ) -> ContainerAllocation:
        try:
            gpu_class = parse_class(pod.annotations.get(ANN_CLASS))
        except InvalidInputError as exc:
            raise AllocationError(f"pod {pod.key}: {exc}") from None
        uuids = list(placement.gpu_uuids)
        asked = sum(pod.requested_slices)
        fractional = len(uuids) == 1 and (
            placement.thread_percent < SLICES_PER_GPU or 0 < asked < SLICES_PER_GPU
        )
        if fractional:
            warning = check_uid(pod, self._neighbours(pod, uuids[0], pods), uuids[0])
            if warning:
                self._event(pod, "GpushareUidUnchecked", warning, warning=True)
            return self._mps_allocation(
                uuids[0],
                gpu_map,
                thread_percent=placement.thread_percent,
                memory_limit_bytes=placement.memory_limit_bytes,
                gpu_class=gpu_class,
                pod=pod.key,
            )
        return self._whole_allocation(uuids, pod=pod.key)

    def _derived(
        self, group: Mapping[str, list[int]], gpu_map: Mapping[str, GpuInfo]
    ) -> ContainerAllocation:
        """No pod found: a safe placement from the slice IDs alone, and an Event saying so."""
        whole = [u for u, s in group.items() if len(s) == SLICES_PER_GPU]
        if len(group) > 1 and len(whole) == len(group):
            message = (
                f"Allocate found no pod waiting with gpushare placement annotations on node "
                f"{self.node_name} for whole GPUs {', '.join(group)}; gave them without MPS"
            )
            self._event(None, "GpushareAllocationDerived", message, warning=True)
            return self._whole_allocation(list(group), pod=None)
        # One process can use one MPS daemon: keep the GPU that holds most of the slices.
        uuid = max(group, key=lambda u: (len(group[u]), u))
        slices = len(group[uuid])
        gpu = gpu_map[uuid]
        memory = gpu.memory_bytes * slices // SLICES_PER_GPU
        message = (
            f"Allocate found no pod waiting with gpushare placement annotations on node "
            f"{self.node_name} for {sum(len(s) for s in group.values())} slice(s) of GPU(s) "
            f"{', '.join(group)}; derived a safe placement: GPU {uuid}, active-thread "
            f"percentage {slices}, memory limit {memory // MiB} MiB, batch priority"
        )
        self._event(None, "GpushareAllocationDerived", message, warning=True)
        if slices >= SLICES_PER_GPU:
            return self._whole_allocation([uuid], pod=None)
        return self._mps_allocation(
            uuid,
            gpu_map,
            thread_percent=slices,
            memory_limit_bytes=memory,
            gpu_class=CLASS_BATCH,
            pod=None,
        )

    def _event(self, pod: PodInfo | None, reason: str, message: str, *, warning: bool) -> None:
        log.warning("%s: %s", reason, message)
        try:
            self.pods.record_event(pod=pod, reason=reason, message=message, warning=warning)
        except Exception as exc:
            log.error("could not record Event %s: %s", reason, exc)

    def _devices(self, uuids: Sequence[str]) -> list[DeviceNode]:
        if self.device_nodes is None:
            return []
        nodes: dict[str, DeviceNode] = {}
        for uuid in uuids:
            for node in self.device_nodes(uuid):
                nodes[node.container_path] = node
        return list(nodes.values())

    def _whole_allocation(self, uuids: Sequence[str], *, pod: str | None) -> ContainerAllocation:
        """Whole GPUs: no MPS (one process cannot use several daemons, and none is needed)."""
        envs = {"CUDA_VISIBLE_DEVICES": ",".join(uuids)}
        if self.nvidia_runtime_env:
            envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(uuids)
        return ContainerAllocation(envs=envs, devices=self._devices(uuids), pod=pod)

    def _mps_allocation(
        self,
        uuid: str,
        gpu_map: Mapping[str, GpuInfo],
        *,
        thread_percent: int,
        memory_limit_bytes: int,
        gpu_class: str,
        pod: str | None,
    ) -> ContainerAllocation:
        paths = self.mps.paths(uuid)
        envs = {
            "CUDA_VISIBLE_DEVICES": uuid,
            "CUDA_MPS_PIPE_DIRECTORY": CONTAINER_PIPE_DIR,
            "CUDA_MPS_LOG_DIRECTORY": CONTAINER_LOG_DIR,
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(thread_percent),
            "CUDA_MPS_CLIENT_PRIORITY": str(MPS_PRIORITY_BY_CLASS[gpu_class]),
        }
        limit = memory_limit_bytes or gpu_map[uuid].memory_bytes * thread_percent // 100
        if limit > 0:
            # The container sees exactly one GPU, so device ordinal 0 is this GPU.
            envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = pinned_memory_limit(limit)
        if self.nvidia_runtime_env:
            envs["NVIDIA_VISIBLE_DEVICES"] = uuid
        mounts = [
            MountSpec(CONTAINER_PIPE_DIR, str(paths.pipe)),
            MountSpec(CONTAINER_LOG_DIR, str(paths.log)),
            MountSpec(CONTAINER_SHM_DIR, str(self.mps.client_shm(uuid))),
        ]
        return ContainerAllocation(envs=envs, mounts=mounts, devices=self._devices([uuid]), pod=pod)


def pinned_memory_limit(limit_bytes: int) -> str:
    """``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` for device ordinal 0, in whole MiB (at least 1)."""
    return f"0={max(1, limit_bytes // MiB)}M"


def _best_fit(free: Mapping[str, list[int]], size: int) -> list[str]:
    """GPUs to take ``size`` slices from when no pod tells us: whole GPUs for multiples of 100,
    else the GPU with the fewest free slices that still fits (keeps big holes for big pods)."""
    if size >= SLICES_PER_GPU:
        full = sorted(u for u, s in free.items() if len(s) == SLICES_PER_GPU)
        return full[: size // SLICES_PER_GPU] + sorted(free, key=lambda u: -len(free[u]))
    fits = [u for u, s in free.items() if len(s) >= size]
    if fits:
        return [min(fits, key=lambda u: (len(free[u]), u))]
    return sorted(free, key=lambda u: -len(free[u]))
