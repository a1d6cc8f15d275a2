"""The Allocator: answers Allocate and GetPreferredAllocation with the pure logic of
``matching`` (which pod), ``steering`` (which slices), ``reconcile`` (checks against the
kubelet's pod-resources API) and ``response`` (the container answer), adding the Kubernetes
reads and writes around them and the state kept between calls (pods handled, answers given).
"""

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet

from gpushare.api.errors import InvalidInputError
from gpushare.api.inventory import GpuInfo
from gpushare.api.names import (
    ANN_GPU_UUID,
    ANN_MEMORY_LIMIT,
    ANN_THREAD_PERCENT,
    RESOURCE_GPU_OPPORTUNISTIC,
    STATE_ALLOCATED,
)
from gpushare.api.placement import Placement
from gpushare.api.pod import PodInfo
from gpushare.node.core.answer import (
    AllocationContext,
    AllocationError,
    ContainerAllocation,
    DeviceNode,
    MpsLayout,
)
from gpushare.node.core.pods import PodSource, placement_values
from gpushare.node.core.vendor_cdi import VendorCdi
from gpushare.node.deviceplugin.devices import group_by_gpu, is_opportunistic
from gpushare.node.deviceplugin.holdings import Answer, AnswerBook
from gpushare.node.deviceplugin.matching import (
    MalformedPlacementError,
    ambiguous,
    select_pod,
    unplaced_pods,
    unplaced_refusal,
    waiting_pods,
)
from gpushare.node.deviceplugin.reconcile import (
    UNVERIFIED_FOR_S,
    forgotten_pods,
    reconcile,
    suspect_pods,
)
from gpushare.node.deviceplugin.response import (
    allocated_neighbours,
    allocation_for_pod,
    derived_allocation,
)
from gpushare.node.deviceplugin.steering import steer

log = logging.getLogger(__name__)


class Allocator:
    """Answers Allocate and GetPreferredAllocation: the functions of matching, steering,
    reconcile and response plus the Kubernetes reads and writes around them. Thread-safe (one
    decision at a time)."""

    def __init__(
        self,
        *,
        node_name: str,
        gpus: Callable[[], Sequence[GpuInfo]],
        pods: PodSource,
        mps: MpsLayout,
        device_nodes: Callable[[str], list[DeviceNode]] | None = None,
        nvidia_runtime_env: bool = False,
        vendor_cdi: VendorCdi | None = None,
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
        self.vendor_cdi = vendor_cdi
        """The GPUs' CDI device names, added to each answer on CDI nodes."""
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
        """Allocate calls answered again for a pod a restarted kubelet had forgotten."""
        self.exchanges = 0
        """Pods whose placement annotations were rewritten to the answer the kubelet gave
        them (another pod's of the same size)."""

    def _context(self) -> AllocationContext:
        return AllocationContext(
            node_name=self.node_name,
            gpus={g.uuid: g for g in self.gpus()},
            mps=self.mps,
            device_nodes=self.device_nodes,
            nvidia_runtime_env=self.nvidia_runtime_env,
            vendor_cdi=self.vendor_cdi,
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
        groups = self._requested_groups(ctx, container_requests)
        wanted = frozenset(u for g in groups for u in g)
        sizes = tuple(sum(len(s) for s in g.values()) for g in groups)
        devices = frozenset(d for ids in container_requests for d in ids)
        opportunistic = any(is_opportunistic(d) for d in devices)
        with self._lock:
            self._reconcile()
            found, pods, again = self._find_pod(wanted, sizes, devices, opportunistic)
            if found is None:
                return self._unplaced_answer(ctx, groups, pods, sizes, opportunistic)
            pod, placement = found
            repeated = pod.uid in again
            # With the kubelet's pod-resources API at hand every answer is checked against
            # it: which pod the kubelet admits is not ours to know (after a restart it may be
            # one this process counts as handled, or its List may not answer yet).
            unsure = (
                self.held is not None
                or frozenset(placement.gpu_uuids) != wanted
                or ambiguous(
                    waiting_pods(
                        pods, skip=set(self._handled), again=again, opportunistic=opportunistic
                    ),
                    sizes,
                )
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
            result = self._pod_allocations(ctx, pod, placement, pods, len(groups))
        self._after_answer(pod, placement, repeated)
        return self._announce(result)

    def _requested_groups(
        self, ctx: AllocationContext, container_requests: Sequence[Sequence[str]]
    ) -> list[dict[str, list[int]]]:
        """Each container's device IDs grouped by GPU; malformed IDs or a GPU not on this node
        refuse the call with a clear error."""
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
        return groups

    def _find_pod(
        self,
        wanted: frozenset[str],
        sizes: tuple[int, ...],
        devices: frozenset[str],
        opportunistic: bool,
    ) -> tuple[tuple[PodInfo, Placement] | None, list[PodInfo], frozenset[str]]:
        """The pod these slices are for, with the pods listed and those asked for again; the
        list is read again after each retry delay, as the pod's placement may be late. A
        malformed placement is remembered (never matched again) and refuses the call."""
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
                    opportunistic=opportunistic,
                )
            except MalformedPlacementError as exc:
                self._remember(exc.pod)
                raise
            if found is not None:
                break
        return found, pods, again

    def _unplaced_answer(
        self,
        ctx: AllocationContext,
        groups: list[dict[str, list[int]]],
        pods: list[PodInfo],
        sizes: tuple[int, ...],
        opportunistic: bool,
    ) -> list[ContainerAllocation]:
        """No placed pod matches: refuse when no pod waits unplaced (or the slices are
        opportunistic), else answer from the slices themselves and say so in an Event."""
        if not unplaced_pods(
            pods, sizes=sizes, skip=set(self._handled), opportunistic=opportunistic
        ):
            message = unplaced_refusal(self.node_name, groups[0])
            log.warning("%s", message)
            raise AllocationError(message)
        if opportunistic:
            # Opportunistic slices are no share of the GPU: only a placement says
            # what such a pod may use.
            message = (
                f"Allocate found no pod on node {self.node_name} placed by gpushare "
                f"for {sizes[0]} {RESOURCE_GPU_OPPORTUNISTIC}; only gpushare's "
                "scheduler places pods asking for it (their placement sets the thread "
                "and memory caps); fix: leave the pod's schedulerName to gpushare's "
                "webhook"
            )
            log.warning("%s", message)
            raise AllocationError(message)
        answers = [derived_allocation(ctx, group) for group in groups]
        for _, message in answers[:1]:
            self._event(None, "GpushareAllocationDerived", message)
        return self._announce([allocation for allocation, _ in answers])

    def _pod_allocations(
        self,
        ctx: AllocationContext,
        pod: PodInfo,
        placement: Placement,
        pods: list[PodInfo],
        containers: int,
    ) -> list[ContainerAllocation]:
        """One answer per container from the pod's placement, its MPS neighbours counted."""
        result = []
        for _ in range(containers):
            neighbours = allocated_neighbours(
                pod, placement.gpu_uuids[0], pods, also=set(self._handled)
            )
            allocation, warning = allocation_for_pod(ctx, pod, placement, neighbours)
            if warning:
                self._event(pod, "GpushareUidUnchecked", warning)
            result.append(allocation)
        return result

    def _after_answer(self, pod: PodInfo, placement: Placement, repeated: bool) -> None:
        """Outside the lock: an Event for a pod asked for again, and the pod marked allocated
        (a failure there is logged: the answer stands)."""
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

    def _announce(self, answers: list[ContainerAllocation]) -> list[ContainerAllocation]:
        """Tell ``on_answer`` the MPS limits each answer gives its container."""
        if self.on_answer is None:
            return answers
        for answer in answers:
            limits = answer.limits
            if limits is None or answer.gpu_uuid is None:
                continue  # a whole GPU, without MPS
            try:
                self.on_answer(answer.gpu_uuid, limits.thread_percent, limits.pinned_bytes)
            except Exception as exc:  # the answer stands; the agent's loop sets limits too
                log.warning("could not raise the MPS limits for an answer: %s", exc)
        return answers
