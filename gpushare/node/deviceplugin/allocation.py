"""What Allocate and GetPreferredAllocation decide. The module-level functions are pure logic
over pods and slice IDs; ``Allocator`` adds the Kubernetes reads and writes around them.

The kubelet calls both with device IDs only, never the pod (docs/node-agent.md). The pod is
found from the scheduler's placement annotations: bound to this node, still Pending, not yet
``allocated``, placed on exactly the GPU(s) the slice IDs belong to, state ``assumed``, oldest
bind-time first. The request size only breaks ties between such pods; it never picks a pod on
its own.

A kubelet that dies between our Allocate answer and its checkpoint asks again, for the same pod,
after it restarts; that pod is already ``allocated``. So a pod ``allocated`` under an earlier
kubelet, still Pending with no container ever started, which the current kubelet holds no slices
for (its pod-resources API), waits again with its own placement (``forgotten_pods``); the
slices it had are offered again first (``steer``).

With no such pod, Allocate derives an answer only for a pod gpushare did not place: a
Pending pod on the node with no placement annotations asking for that many slices (bound by
another scheduler, say). It then gets a safe placement derived from the slice IDs (the GPU
they belong to, an active-thread percentage equal to the slice count, the same share of the
GPU's memory) and an Event says so. A pod with a malformed placement is refused, naming the
annotation, whichever GPU's slices the kubelet took; when no pod could be the one asking,
Allocate refuses rather than hand out a placement nobody chose (docs/node-agent.md).
"""

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from gpushare.api.errors import InvalidInputError
from gpushare.api.inventory import GpuInfo
from gpushare.api.names import (
    ANN_CLASS,
    ANN_GPU_UUID,
    ANN_MEMORY_LIMIT,
    ANN_STATE,
    ANN_THREAD_PERCENT,
    CLASS_BATCH,
    SLICES_PER_GPU,
    STATE_ALLOCATED,
    STATE_ASSUMED,
)
from gpushare.api.placement import Placement, parse_placement
from gpushare.api.request import parse_class
from gpushare.node.deviceplugin.devices import device_id, group_by_gpu
from gpushare.node.deviceplugin.holdings import Answer, AnswerBook
from gpushare.node.mps.client import MiB, client_limits_env, runs_under_mps

log = logging.getLogger(__name__)

# Where a container sees its GPU's MPS directories.
CONTAINER_MPS_DIR = "/run/gpushare/node/mps"
CONTAINER_PIPE_DIR = f"{CONTAINER_MPS_DIR}/pipe"
CONTAINER_SHM_DIR = "/dev/shm"
MPS_DEFAULT_PIPE_DIR = "/tmp/nvidia-mps"
"""Where CUDA looks for the MPS daemon when CUDA_MPS_PIPE_DIRECTORY is unset: the GPU's pipe
directory is mounted there too, so unsetting the variable does not take a client out of MPS
(and out of its server's limits)."""
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
    started: bool = False
    """Some container of the pod has been created or has run (a container ID, a running or
    terminated state, or a restart): the kubelet admitted it for good."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def finished(self) -> bool:
        return self.phase in _FINISHED


class PodSource(Protocol):
    """The device plugin's only window on Kubernetes (implemented by gpushare.kube.node)."""

    def list_node_pods(self) -> list[PodInfo]:
        """Pods bound to this node, read fresh from the API server."""

    def mark_allocated(self, pod: PodInfo) -> None:
        """Set the pod's ``gpushare.io/state`` annotation to ``allocated``."""

    def annotate_pod(self, *, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        """Merge ``annotations`` into the pod's."""

    def record_event(
        self, *, pod: PodInfo | None, reason: str, message: str, warning: bool
    ) -> None:
        """Record a Kubernetes Event on the pod, or on this node when pod is None."""


class MpsLayout(Protocol):
    """Host paths of each GPU's MPS daemon (implemented by gpushare.node.mps.MpsManager)."""

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


class MalformedPlacementError(AllocationError):
    """The pod an Allocate is for carries placement annotations that do not parse."""

    def __init__(self, pod: "PodInfo", message: str) -> None:
        super().__init__(message)
        self.pod = pod


@dataclass(frozen=True)
class WaitingPod:
    """A pod whose placement waits for its Allocate; ``error`` set when it does not parse."""

    pod: PodInfo
    placement: Placement | None
    error: InvalidInputError | None
    order: datetime


def _epoch() -> datetime:
    return datetime.fromtimestamp(0, tz=UTC)


def _candidate(pod: PodInfo, again: AbstractSet[str] = frozenset()) -> WaitingPod | None:
    """A pod with a gpushare placement that is still waiting for its Allocate; else None.

    Only Pending pods wait: a pod whose containers run was admitted long ago, whatever its
    state annotation says (a stale ``assumed`` must not capture other pods' slices). A pod in
    ``again`` (forgotten by a restarted kubelet) waits whatever its state."""
    if pod.phase != "Pending" or ANN_GPU_UUID not in pod.annotations:
        return None
    if pod.uid in again:
        try:
            placement = parse_placement(pod.annotations)
        except InvalidInputError:
            return None
        return None if placement is None else WaitingPod(pod, placement, None, placement.bind_time)
    try:
        placement = parse_placement(pod.annotations)
    except InvalidInputError as exc:
        if pod.annotations.get(ANN_STATE, STATE_ASSUMED) == STATE_ALLOCATED:
            return None
        return WaitingPod(pod, None, exc, pod.created or _epoch())
    if placement is None or placement.state != STATE_ASSUMED:
        return None
    return WaitingPod(pod, placement, None, placement.bind_time)


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


@dataclass(frozen=True)
class AllocationContext:
    """The node-level inputs of an Allocate answer."""

    node_name: str
    gpus: Mapping[str, GpuInfo]
    mps: MpsLayout
    device_nodes: Callable[[str], list[DeviceNode]] | None = None
    nvidia_runtime_env: bool = False
    """Also set NVIDIA_VISIBLE_DEVICES, for nodes whose runtime injects the driver from it."""


def suspect_pods(
    pods: Iterable[PodInfo], *, answers: Mapping[str, Answer], kubelet: str | None
) -> list[PodInfo]:
    """Pods the running kubelet may have forgotten: allocated (by the annotation, or by an
    answer of ours whose mark may not show yet), still Pending, no container ever started, a
    placement that parses, and not answered (or confirmed held) under this very kubelet.

    Only these need the kubelet's pod-resources answer; any other pod cannot come back."""
    found = []
    for pod in pods:
        answer = answers.get(pod.uid)
        if pod.phase != "Pending" or pod.started or ANN_GPU_UUID not in pod.annotations:
            continue
        if pod.annotations.get(ANN_STATE) != STATE_ALLOCATED and answer is None:
            continue
        if answer is not None and kubelet is not None and answer.kubelet == kubelet:
            continue
        try:
            if parse_placement(pod.annotations) is None:
                continue
        except InvalidInputError:
            continue
        found.append(pod)
    return found


def forgotten_pods(
    suspects: Iterable[PodInfo], held: Mapping[str, tuple[str, ...]]
) -> frozenset[str]:
    """UIDs of the suspects the kubelet lists holding no slices (``held``: namespace/name ->
    slice IDs, from its pod-resources API): their Allocate will come again. A suspect the
    kubelet does not list yet is not concluded forgotten: a restarted kubelet lists a pod once
    it learns it from the API server, with the slices its checkpoint kept for it."""
    return frozenset(p.uid for p in suspects if p.key in held and not held[p.key])


PLACEMENT_KEYS = (ANN_GPU_UUID, ANN_THREAD_PERCENT, ANN_MEMORY_LIMIT)
"""The placement annotations an Allocate answer's environment is made of."""
UNVERIFIED_FOR_S = 120.0
"""An answer no pod holds after this long is given up on (the kubelet refused the pod)."""


def placement_values(pod: PodInfo) -> tuple[tuple[str, str], ...]:
    return tuple((k, pod.annotations[k]) for k in PLACEMENT_KEYS if k in pod.annotations)


def ambiguous(waiting: Iterable[WaitingPod], sizes: tuple[int, ...]) -> bool:
    """Several pods of the requested sizes wait with different placements: the kubelet may be
    admitting any of them (it admits a batch, after a restart say, in creation-time order with
    ties unordered), and the device-plugin API does not say which."""
    return (
        len(
            {
                placement_values(c.pod)
                for c in waiting
                if c.placement is not None and c.pod.requested_slices == sizes
            }
        )
        > 1
    )


@dataclass
class Reconciliation:
    """What the kubelet's pod-resources answer says about unverified Allocate answers."""

    settled: list[tuple[Answer, PodInfo]] = field(default_factory=list)
    """Each answer and the pod the kubelet gave it to."""
    patches: dict[str, dict[str, str]] = field(default_factory=dict)
    """Pod UID -> placement annotations to write so that they say what its containers run
    with (the pod that got another's answer), or what it waits for now (the pod it was meant
    for, which takes over the first pod's unused placement)."""
    reopened: set[str] = field(default_factory=set)
    """UIDs of pods an answer was meant for that still wait for their Allocate."""
    exchanged: list[tuple[PodInfo, Answer]] = field(default_factory=list)
    stale: list[Answer] = field(default_factory=list)
    """Answers whose slice IDs a later answer covered: the kubelet that asked forgot them
    (it restarted) and gave the same slices out again, so the pod holding them now holds the
    later answer, not this one."""


def reconcile(
    pods: Sequence[PodInfo],
    held: Mapping[str, tuple[str, ...]],
    unverified: Iterable[Answer],
    *,
    others: Iterable[Answer] = (),
    running: AbstractSet[str] = frozenset(),
) -> Reconciliation:
    """Match unverified answers to the pods the kubelet gave them to (same slice IDs).

    A pod P holding the answer meant for Q runs with the placement that answer carried: P's
    annotations get it, and the pod that carries that placement now and waits (Q, or whoever
    took it over in an earlier exchange) gets P's vacated placement in exchange (state
    assumed), so that its Allocate, steered to that GPU, gets it. Every exchange is a swap of
    two pods' placements, so each GPU's total stays what the scheduler booked, also when
    answers chain (P holds Q's, Q's went to R, ...) within one check or across several, and
    every running pod's annotations say what it runs with. Only a pod that waits (no slices
    held, no container started) gives its placement up; when none carries it, P's placement is
    rewritten alone (its old placement then counts for nobody until the pod that holds its
    answer shows up).

    Slice IDs held by one pod may have been answered more than once: a restarted kubelet that
    forgot an answer hands the same slices out again. The pod holds the latest answer for
    them; earlier ones (among ``unverified`` and ``others``, the rest of the answers) are
    ``stale`` and match nobody. ``running``: UIDs of pods whose containers run (seen on the
    node) though the API may not say so yet; they never give their placement up."""
    answers = sorted(unverified, key=lambda a: a.at)
    latest: dict[tuple[str, ...], float] = {}
    for a in (*answers, *others):
        latest[a.devices] = max(a.at, latest.get(a.devices, a.at))
    by_key = {p.key: p for p in pods}
    by_uid = {p.uid: p for p in pods}
    holder_of = {tuple(sorted(devices)): key for key, devices in held.items() if devices}
    current = {p.uid: placement_values(p) for p in pods}
    plan = Reconciliation()

    def waits(pod: PodInfo) -> bool:
        return (
            not held.get(pod.key)
            and not pod.started
            and pod.phase == "Pending"
            and pod.uid not in running
        )

    def owner(answer: Answer, holder: PodInfo) -> PodInfo | None:
        """The waiting pod that carries the answer's placement now, the one meant first."""
        meant = by_uid.get(answer.uid)
        candidates = [meant] if meant is not None else []
        candidates += sorted((p for p in pods if p.uid != answer.uid), key=lambda p: p.key)
        for pod in candidates:
            if pod.uid != holder.uid and current[pod.uid] == answer.placement and waits(pod):
                return pod
        return None

    for answer in answers:
        key = holder_of.get(answer.devices)
        holder = by_key.get(key) if key is not None else None
        if holder is None:
            continue
        if answer.at < latest[answer.devices]:
            plan.stale.append(answer)
            continue
        plan.settled.append((answer, holder))
        if holder.uid == answer.uid or not answer.placement:
            continue
        vacated = current[holder.uid]
        if vacated == answer.placement:
            continue
        giver = owner(answer, holder)
        plan.patches[holder.uid] = {**dict(answer.placement), ANN_STATE: STATE_ALLOCATED}
        plan.exchanged.append((holder, answer))
        current[holder.uid] = answer.placement
        if giver is not None and vacated:
            plan.patches[giver.uid] = {**dict(vacated), ANN_STATE: STATE_ASSUMED}
            plan.reopened.add(giver.uid)
            current[giver.uid] = vacated
    return plan


def waiting_pods(
    pods: Iterable[PodInfo],
    *,
    skip: AbstractSet[str] = frozenset(),
    again: AbstractSet[str] = frozenset(),
) -> list[WaitingPod]:
    """Pods with a placement still waiting for their Allocate, oldest bind-time first: assumed
    pods not in ``skip``, and the forgotten pods in ``again``."""
    found = [
        c for p in pods if (p.uid not in skip or p.uid in again) and (c := _candidate(p, again))
    ]
    return sorted(found, key=lambda c: (c.order, c.pod.key))


def select_pod(
    pods: Iterable[PodInfo],
    *,
    gpus: AbstractSet[str],
    sizes: tuple[int, ...],
    skip: AbstractSet[str] = frozenset(),
    again: AbstractSet[str] = frozenset(),
    previous: Mapping[str, tuple[str, ...]] | None = None,
    devices: AbstractSet[str] = frozenset(),
) -> tuple[PodInfo, Placement] | None:
    """The pod an Allocate for slices of ``gpus`` is for: placed on exactly those GPUs, state
    assumed (or forgotten by a restarted kubelet: ``again``), a container of it asking for
    that many slices, oldest bind-time; among those, pods whose per-container requests equal
    ``sizes`` go first, then a forgotten pod whose earlier answer (``previous``: uid -> slice
    IDs) covered exactly ``devices``. When no such pod waits on ``gpus``, a single-GPU pod of
    exactly ``sizes`` waiting on another GPU: the kubelet took the slices where it saw room
    (after a restart its free slices need not match the placements), and the answer's
    environment follows the pod's placement, not the slice IDs. Last, a pod of exactly
    ``sizes`` whose placement does not parse, on any GPU. None when no pod fits.

    A pod of another size is never chosen: the kubelet asks for exactly what one container
    requested, so that pod cannot be the one admitted.

    Raises MalformedPlacementError when the pod it lands on carries malformed annotations.
    """
    waiting = waiting_pods(pods, skip=skip, again=again)

    def could_be(c: WaitingPod) -> bool:
        asked = c.pod.requested_slices
        return not asked or all(size in asked for size in sizes)

    matching = [
        c
        for c in waiting
        if could_be(c)
        and (
            (c.placement is not None and frozenset(c.placement.gpu_uuids) == gpus)
            or (c.placement is None and _raw_gpus(c.pod) == gpus)
        )
    ]
    if not matching:
        matching = [
            c
            for c in waiting
            if c.placement is not None
            and len(c.placement.gpu_uuids) == 1
            and c.pod.requested_slices == sizes
        ]
    if not matching:
        # Last, a pod of that size with a malformed placement, whatever GPU the kubelet took
        # the slices from: it must be refused, not served as if no pod were waiting.
        matching = [c for c in waiting if c.placement is None and c.pod.requested_slices == sizes]
    if not matching:
        return None
    earlier = previous or {}
    wanted = tuple(sorted(devices))

    def rank(c: WaitingPod) -> tuple[bool, bool]:
        same = bool(wanted) and c.pod.uid in again and earlier.get(c.pod.uid) == wanted
        return c.pod.requested_slices != sizes, not same

    best = min(matching, key=rank)  # min is stable: oldest bind-time within a rank
    if best.error is not None or best.placement is None:
        raise MalformedPlacementError(best.pod, f"pod {best.pod.key}: {best.error}")
    return best.pod, best.placement


def steer(
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    pods: Iterable[PodInfo],
    *,
    skip: AbstractSet[str] = frozenset(),
    again: AbstractSet[str] = frozenset(),
    previous: Mapping[str, tuple[str, ...]] | None = None,
) -> tuple[list[str], str | None]:
    """GetPreferredAllocation: ``size`` slice IDs from ``available`` (``must_include`` first),
    taken from the GPU(s) the scheduler chose for the oldest waiting pod that fits there, else
    a best fit. Returns the IDs and the pod steered for (None for a best fit). A pod forgotten
    by a restarted kubelet (``again``) gets the very slices its earlier answer covered
    (``previous``: uid -> slice IDs) when they are all still available.

    Pods that asked for exactly ``size`` slices in one container are tried first: with pods of
    several sizes waiting on one node, the kubelet's request for 30 slices is for a 30-slice
    pod, and steering it to an older 50-slice pod's GPU would make Allocate derive a placement.
    """
    free = group_by_gpu(available)
    must = list(dict.fromkeys(must_include))
    must_gpus = set(group_by_gpu(must))
    target: list[str] | None = None
    steered: str | None = None
    waiting = waiting_pods(pods, skip=skip, again=again)
    sized = [c for c in waiting if size in c.pod.requested_slices]
    offered = set(available)
    for cand in sized + [c for c in waiting if c not in sized]:
        if cand.placement is None:
            # Malformed: still steer to the GPU it names (when it names one of ours), so the
            # slices come from where its annotation points; Allocate then refuses it.
            gpus = sorted(_raw_gpus(cand.pod) & set(free))
            if len(gpus) == 1 and size < SLICES_PER_GPU and len(free[gpus[0]]) >= size:
                target, steered = gpus, cand.pod.key
                break
            continue
        same = (previous or {}).get(cand.pod.uid, ()) if cand.pod.uid in again else ()
        if len(same) == size and offered.issuperset(same) and set(must) <= set(same):
            return list(same), cand.pod.key
        gpus = list(cand.placement.gpu_uuids)
        if must_gpus - set(gpus):
            continue
        per_gpu = size if len(gpus) == 1 else SLICES_PER_GPU
        if len(gpus) > 1 and len(gpus) * per_gpu != size:
            continue
        if all(len(free.get(g, [])) >= per_gpu for g in gpus):
            target, steered = gpus, cand.pod.key
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
    return chosen[:size], steered


def allocated_neighbours(
    pod: PodInfo, gpu: str, pods: Iterable[PodInfo], *, also: AbstractSet[str] = frozenset()
) -> list[PodInfo]:
    """Pods still running on ``gpu`` that were already allocated (or are in ``also``)."""
    return [
        other
        for other in pods
        if other.uid != pod.uid
        and not other.finished
        and gpu in _raw_gpus(other)
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
        return _whole(ctx, uuids, pod=pod.key), None
    warning = check_uid(pod, neighbours, uuids[0])
    allocation = _mps(
        ctx,
        uuids[0],
        thread_percent=placement.thread_percent,
        memory_limit_bytes=placement.memory_limit_bytes,
        gpu_class=gpu_class,
        pod=pod.key,
        request_percent=placement.guaranteed_percent,
    )
    return allocation, warning


def unplaced_pods(
    pods: Iterable[PodInfo], *, sizes: tuple[int, ...], skip: AbstractSet[str] = frozenset()
) -> list[PodInfo]:
    """Pods gpushare did not place that an Allocate for ``sizes`` could be for: Pending, no
    container started, no gpushare placement annotation, a container asking for that many
    slices, not already answered or refused by this process (``skip``)."""
    return [
        p
        for p in pods
        if p.phase == "Pending"
        and not p.started
        and p.uid not in skip
        and ANN_GPU_UUID not in p.annotations
        and all(size in p.requested_slices for size in sizes)
    ]


def unplaced_refusal(node: str, group: Mapping[str, list[int]]) -> str:
    """Why an Allocate no pod can be found for is refused (the kubelet shows it on the pod)."""
    total = sum(len(s) for s in group.values())
    return (
        f"Allocate found no pod on node {node} waiting for {total} gpushare.io/gpu-percent "
        f"slice(s) of GPU(s) {', '.join(sorted(group))}: no pod with a gpushare placement "
        "(gpushare.io/gpu-uuid, state assumed) of that size, and none without a placement; "
        "refusing rather than run a pod with a share nobody chose. Delete the pod so its "
        "controller recreates it and gpushare-scheduler places it"
    )


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
        return _whole(ctx, list(group), pod=None), f"{intro}; gave the whole GPUs without MPS"
    # One process can use one MPS daemon: keep the GPU that holds most of the slices.
    uuid = max(group, key=lambda u: (len(group[u]), u))
    slices = len(group[uuid])
    memory = ctx.gpus[uuid].memory_bytes * slices // SLICES_PER_GPU
    if slices >= SLICES_PER_GPU:
        return _whole(ctx, [uuid], pod=None), f"{intro}; gave GPU {uuid} whole, without MPS"
    message = (
        f"{intro}; derived a safe placement: GPU {uuid}, active-thread percentage {slices}, "
        f"memory limit {memory // MiB} MiB, batch priority"
    )
    allocation = _mps(
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


def _whole(ctx: AllocationContext, uuids: Sequence[str], *, pod: str | None) -> ContainerAllocation:
    envs = {"CUDA_VISIBLE_DEVICES": ",".join(uuids)}
    if ctx.nvidia_runtime_env:
        envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(uuids)
    return ContainerAllocation(envs=envs, devices=_devices(ctx, uuids), pod=pod)


def _mps(
    ctx: AllocationContext,
    uuid: str,
    *,
    thread_percent: int,
    memory_limit_bytes: int,
    gpu_class: str,
    pod: str | None,
    request_percent: int | None = None,
) -> ContainerAllocation:
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


class Allocator:
    """Answers Allocate and GetPreferredAllocation: the functions above plus the Kubernetes
    reads and writes around them. Thread-safe (one decision at a time)."""

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
        kubelet: Callable[[], str | None] | None = None,
        held: Callable[[], Mapping[str, tuple[str, ...]]] | None = None,
        answers: AnswerBook | None = None,
        running: Callable[[], AbstractSet[str]] | None = None,
        on_answer: Callable[[str, int, int], None] | None = None,
    ) -> None:
        """``kubelet`` names the running kubelet (holdings.kubelet_identity), ``held`` asks it
        which pods hold our slices (holdings.kubelet_held), ``answers`` remembers what each
        Allocate answered, ``running`` lists the UIDs of pods whose containers run on the node
        (attribution.pods_with_running_containers). Without ``held`` a restarted kubelet's
        repeated Allocate is not recognised; without ``running`` a container the old kubelet
        started just before it died counts as never started until the API says otherwise
        (the new kubelet does not ask Allocate for it again: it sees it running)."""
        self.node_name = node_name
        self.gpus = gpus
        self.pods = pods
        self.mps = mps
        self.device_nodes = device_nodes
        self.nvidia_runtime_env = nvidia_runtime_env
        self.retry_delays_s = tuple(retry_delays_s)
        """Waits before listing pods again when none waits (annotations may trail the bind)."""
        self._lock = threading.Lock()
        # Pods this process already allocated or refused, in case the API server has not yet
        # shown our annotation patch (or the kubelet's Failed phase) when the next call comes.
        self._handled: dict[str, float] = {}
        self.kubelet = kubelet or (lambda: None)
        self.held = held
        self.answers = answers or AnswerBook()
        self.running: Callable[[], AbstractSet[str]] = running or frozenset
        self.on_answer = on_answer
        """Told (GPU uuid, thread percent, memory limit bytes) of each MPS answer before it is
        returned: the node agent raises the GPU's MPS server limits to cover it before the
        container starts (gpushare.node.mps.limits)."""
        now = time.monotonic()
        for uid in self.answers.all():
            self._handled[uid] = now
        self.reallocations = 0
        self.exchanges = 0
        """Pods whose placement annotations were rewritten to the answer the kubelet gave
        them (another pod's of the same size)."""
        """Allocate calls answered again for a pod a restarted kubelet had forgotten."""

    def _context(self) -> AllocationContext:
        return AllocationContext(
            node_name=self.node_name,
            gpus={g.uuid: g for g in self.gpus()},
            mps=self.mps,
            device_nodes=self.device_nodes,
            nvidia_runtime_env=self.nvidia_runtime_env,
        )

    def _remember(self, pod: PodInfo) -> None:
        now = time.monotonic()
        self._handled[pod.uid] = now
        for uid, seen in list(self._handled.items()):
            if now - seen > 3600:
                del self._handled[uid]

    def _event(
        self, pod: PodInfo | None, reason: str, message: str, *, warning: bool = True
    ) -> None:
        """Log ``message`` and record it as an Event on ``pod`` (or the node)."""
        subject = f"pod {pod.key}" if pod is not None else reason
        log.warning("%s: %s", subject, message)
        try:
            self.pods.record_event(pod=pod, reason=reason, message=message, warning=warning)
        except Exception as exc:
            log.error("could not record Event %s: %s", reason, exc)

    def _running(self) -> AbstractSet[str]:
        try:
            return self.running()
        except Exception as exc:  # a hint only: without it the API's status decides
            log.warning("cannot tell which pods' containers run: %s", exc)
            return frozenset()

    def _forgotten(self, pods: Sequence[PodInfo]) -> frozenset[str]:
        """UIDs of allocated pods the running kubelet holds nothing for (it died before its
        checkpoint): their Allocate comes again. Asks the kubelet only when some pod could be
        one; pods it does hold are confirmed so that it is not asked about them again."""
        if self.held is None:
            return frozenset()
        kubelet = self.kubelet()
        suspects = suspect_pods(pods, answers=self.answers.all(), kubelet=kubelet)
        if suspects:
            # A container the old kubelet started just before it died runs with its answer;
            # the new kubelet will not ask Allocate for it again, and its status may not show
            # it yet.
            running = self._running()
            suspects = [p for p in suspects if p.uid not in running]
        if not suspects:
            return frozenset()
        try:
            held = self.held()
        except Exception as exc:
            log.warning(
                "pod-resources List failed (%s); cannot check %d pod(s)", exc, len(suspects)
            )
            return frozenset()
        forgotten = forgotten_pods(suspects, held)
        if kubelet is not None:
            self.answers.confirm(
                {p.uid: (p.key, held[p.key]) for p in suspects if held.get(p.key)}, kubelet
            )
        if forgotten:
            names = ", ".join(p.key for p in suspects if p.uid in forgotten)
            log.info("kubelet holds no slices for allocated pod(s) %s: they wait again", names)
        return forgotten

    def reconcile(self) -> int:
        """Check unverified answers against the kubelet's pod-resources answer and rewrite the
        placement annotations of pods that got another's (``reconcile``). Returns how many
        pods were exchanged. Called before each decision and from the agent's pod loop."""
        with self._lock:
            return self._reconcile()

    def _reconcile(self) -> int:
        unverified = self.answers.unverified()
        if not unverified or self.held is None:
            return 0
        try:
            held = self.held()
            pods = self.pods.list_node_pods()
        except Exception as exc:
            log.warning("cannot check %d Allocate answer(s): %s", len(unverified), exc)
            return 0
        plan = reconcile(
            pods, held, unverified, others=self.answers.all().values(), running=self._running()
        )
        by_uid = {p.uid: p for p in pods}
        for uid, annotations in plan.patches.items():
            target = by_uid[uid]
            try:
                self.pods.annotate_pod(
                    namespace=target.namespace, name=target.name, annotations=annotations
                )
            except Exception as exc:
                log.error("could not rewrite the placement of pod %s: %s", target.key, exc)
                return 0  # try again next time, nothing settled
        for uid in plan.reopened:
            self._handled.pop(uid, None)
        for answer, holder in plan.settled:
            self.answers.settle(answer, uid=holder.uid, pod=holder.key)
            self._remember(holder)
        for answer in plan.stale:
            log.info(
                "Allocate answer for pod %s is stale: the kubelet gave its slices out again "
                "after forgetting it",
                answer.pod,
            )
            self.answers.settle(answer, uid=answer.uid, pod=answer.pod)
        settled = {a.uid for a, _ in plan.settled} | {a.uid for a in plan.stale}
        cutoff = time.time() - UNVERIFIED_FOR_S
        for answer in unverified:
            if answer.uid not in settled and answer.at < cutoff:
                self.answers.settle(answer, uid=answer.uid, pod=answer.pod)
        for holder, answer in plan.exchanged:
            self.exchanges += 1
            values = dict(answer.placement)
            message = (
                f"the kubelet gave this pod the slices Allocate answered for pod {answer.pod}: "
                "pods of the same size waited together and the device-plugin API does not say "
                "which pod an Allocate is for; its placement annotations now say what its "
                f"containers run with: GPU {values.get(ANN_GPU_UUID)}, active-thread "
                f"percentage {values.get(ANN_THREAD_PERCENT)}, memory limit "
                f"{values.get(ANN_MEMORY_LIMIT)} bytes"
            )
            self._event(holder, "GpusharePlacementExchanged", message)
        return len(plan.exchanged)

    def _previous(self, uids: AbstractSet[str]) -> dict[str, tuple[str, ...]]:
        return {uid: a.devices for uid in uids if (a := self.answers.get(uid)) is not None}

    def preferred(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        with self._lock:
            self._reconcile()
            try:
                pods = self.pods.list_node_pods()
            except Exception as exc:  # the API server is not essential for a hint
                log.warning("GetPreferredAllocation: listing pods failed (%s); best fit", exc)
                pods = []
            again = self._forgotten(pods)
            chosen, steered = steer(
                available,
                must_include,
                size,
                pods,
                skip=set(self._handled),
                again=again,
                previous=self._previous(again),
            )
        if steered:
            log.info("GetPreferredAllocation: %d slice(s) steered for pod %s", size, steered)
        return chosen

    def allocate(self, container_requests: Sequence[Sequence[str]]) -> list[ContainerAllocation]:
        """Answer one Allocate call (all its containers belong to one pod)."""
        if not container_requests or not all(container_requests):
            raise AllocationError("Allocate named a container with no device IDs")
        ctx = self._context()
        try:
            groups = [group_by_gpu(ids) for ids in container_requests]
        except InvalidInputError as exc:
            raise AllocationError(str(exc)) from None
        for group in groups:
            for uuid in group:
                if uuid not in ctx.gpus:
                    raise AllocationError(
                        f"device IDs name GPU {uuid}, which is not on node {self.node_name}"
                    )
        wanted = frozenset(u for g in groups for u in g)
        sizes = tuple(sum(len(s) for s in g.values()) for g in groups)
        devices = frozenset(d for ids in container_requests for d in ids)
        with self._lock:
            self._reconcile()
            found = None
            pods: list[PodInfo] = []
            again: frozenset[str] = frozenset()
            for delay in (0.0, *self.retry_delays_s):
                time.sleep(delay)
                pods = self.pods.list_node_pods()
                again = self._forgotten(pods)
                try:
                    found = select_pod(
                        pods,
                        gpus=wanted,
                        sizes=sizes,
                        skip=set(self._handled),
                        again=again,
                        previous=self._previous(again),
                        devices=devices,
                    )
                except MalformedPlacementError as exc:
                    self._remember(exc.pod)
                    raise
                if found is not None:
                    break
            if found is None:
                if not unplaced_pods(pods, sizes=sizes, skip=set(self._handled)):
                    message = unplaced_refusal(self.node_name, groups[0])
                    log.warning("%s", message)
                    raise AllocationError(message)
                answers = [derived_allocation(ctx, group) for group in groups]
                for _, message in answers[:1]:
                    self._event(None, "GpushareAllocationDerived", message)
                return self._announce([allocation for allocation, _ in answers])
            pod, placement = found
            repeated = pod.uid in again
            # With the kubelet's pod-resources API at hand every answer is checked against
            # it: which pod the kubelet admits is not ours to know (after a restart it may be
            # one this process counts as handled, or its List may not answer yet).
            unsure = (
                self.held is not None
                or frozenset(placement.gpu_uuids) != wanted
                or ambiguous(waiting_pods(pods, skip=set(self._handled), again=again), sizes)
            )
            self._remember(pod)
            self.answers.record(
                Answer(
                    pod.uid,
                    pod.key,
                    tuple(sorted(devices)),
                    self.kubelet(),
                    time.time(),
                    placement=placement_values(pod),
                    verified=not unsure,
                ),
                live=[p.uid for p in pods],
            )
            result = []
            for _ in groups:
                neighbours = allocated_neighbours(
                    pod, placement.gpu_uuids[0], pods, also=set(self._handled)
                )
                allocation, warning = allocation_for_pod(ctx, pod, placement, neighbours)
                if warning:
                    self._event(pod, "GpushareUidUnchecked", warning)
                result.append(allocation)
        if repeated:
            self.reallocations += 1
            message = (
                f"the kubelet restarted before recording this pod's slices and asked again; "
                f"gave it its own placement again (GPU {', '.join(placement.gpu_uuids)}, "
                f"active-thread percentage {placement.thread_percent})"
            )
            self._event(pod, "GpushareAllocatedAgain", message, warning=False)
        try:
            self.pods.mark_allocated(pod)
        except Exception as exc:
            # The container is set up correctly either way, and _handled keeps this placement
            # from going to another pod; but the scheduler's view is stale, so say it loudly.
            log.error(
                "pod %s allocated but marking it %s failed: %s", pod.key, STATE_ALLOCATED, exc
            )
        return self._announce(result)

    def _announce(self, answers: list[ContainerAllocation]) -> list[ContainerAllocation]:
        """Tell ``on_answer`` the MPS limits each answer gives its container."""
        if self.on_answer is None:
            return answers
        for answer in answers:
            envs = answer.envs
            threads = envs.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
            if threads is None:
                continue  # a whole GPU, without MPS
            memory = envs.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=0M")
            try:
                self.on_answer(
                    envs["CUDA_VISIBLE_DEVICES"],
                    int(threads),
                    int(memory.partition("=")[2].removesuffix("M") or 0) * MiB,
                )
            except Exception as exc:  # the answer stands; the agent's loop sets limits too
                log.warning("could not raise the MPS limits for an answer: %s", exc)
        return answers


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
