"""Carries out the GpuShare life cycle that ``profiling.next_step`` decides.

Each step is one tested JSON patch of the share's status (``test`` the phase it starts from),
preceded by idempotent preparations (pod annotations, the cache entry) and followed by an
Event only when the patch applied. Two racing ticks, or a restart between preparation and
patch, therefore change nothing twice and report every transition exactly once.
"""

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from gpushare.api.bounds import format_rfc3339
from gpushare.api.gpushare_crd import (
    ANN_PROFILING,
    ANN_PROFILING_WINDOW,
    PHASE_FAILED,
    PHASE_PACKED,
    PHASE_PENDING,
    PHASE_PROFILING,
    PROFILING_ACTIVE,
    PROFILING_AUTO,
    PROFILING_DONE,
    placements_status,
)
from gpushare.api.profile import GpuProfile
from gpushare.cluster.operator.cache_store import ProfileCacheStore
from gpushare.cluster.operator.grants import neighbour_rules
from gpushare.cluster.operator.profiler_client import ProfilerClient
from gpushare.cluster.operator.profiling import (
    Abandon,
    Elect,
    GiveUp,
    Measure,
    SkipProfiling,
    StartClock,
    Step,
    UseCached,
    Wait,
    attempts,
    inherited_annotations,
    next_step,
    placement_entries,
    representative,
    stale_marks,
    with_condition,
)
from gpushare.cluster.operator.readings import ProfilerError
from gpushare.cluster.operator.settings import OperatorConfig
from gpushare.cluster.operator.share_status import (
    COND_ACCEPTED,
    COND_PROFILED,
    Condition,
    describe,
    no_profiling_pod,
    profiling_place,
    sized_fields,
    sized_note,
    transition_ops,
    utcnow,
)
from gpushare.cluster.operator.unlinked import UnlinkedReporter
from gpushare.cluster.state.governance import MAX_SHARES_PER_NAMESPACE
from gpushare.cluster.state.pod_facts import PodFacts
from gpushare.cluster.state.shares import ShareSummary, share_summary
from gpushare.cluster.state.view import ClusterView
from gpushare.kube.events import ObjectRef
from gpushare.kube.operator import KubeApi

log = logging.getLogger(__name__)


class ShareReconciler:
    """Reconciles one GpuShare at a time per share (a lock each); safe to call any time."""

    def __init__(
        self,
        *,
        config: OperatorConfig,
        kube: KubeApi,
        view: ClusterView,
        profiler: ProfilerClient,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.config = config
        self.kube = kube
        self.view = view
        self.profiler = profiler
        self.clock = clock
        self._locks: dict[str, asyncio.Lock] = {}
        self._kicks: dict[str, asyncio.Task[None]] = {}
        self.unlinked = UnlinkedReporter(kube)
        self._told_over_limit: set[str] = set()
        self.profiles = ProfileCacheStore(config=config, kube=kube, view=view)
        self.synced = asyncio.Event()
        """Set once the view holds a full listing of pods and nodes. Until then nothing acts:
        after a restart, a pod not yet seen again must not read as a deleted one."""
        if view.synced:
            self.synced.set()
        view.sync_listeners.append(self.synced.set)

    async def seed(self) -> None:
        """List pods and nodes once, so the first decisions see the whole cluster; watch
        events that arrived meanwhile are newer and win. Retries until it succeeds. For the
        standalone operator, whose view only Kopf's handlers feed."""
        delay = 1.0
        while True:
            try:
                namespaces: tuple[str | None, ...] = self.config.watch_namespaces or (None,)
                pods = [p for ns in namespaces for p in await self.kube.list_pods(namespace=ns)]
                nodes = await self.kube.list_nodes()
                break
            except Exception as exc:  # API down at start-up: keep trying, act on nothing
                log.warning("listing pods and nodes failed (%s); retrying in %.0f s", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
        self.view.add_listed(nodes=nodes, pods=pods)
        self.synced.set()
        log.info("view seeded with %d pods and %d nodes", len(pods), len(nodes))

    def kick(self, key: str) -> None:
        """Reconcile ``key`` soon, without waiting (from event handlers); coalesces kicks."""
        running = self._kicks.get(key)
        if running is not None and not running.done():
            return
        self._kicks[key] = asyncio.get_running_loop().create_task(self._kicked(key))

    def pod_changed(self, pod: PodFacts) -> None:
        """The view's pod listener: a governed GPU pod changed, so reconcile its GpuShare."""
        if not pod.gpu_pod:
            return
        share = self.view.share_of(pod)
        if share is not None:
            self.kick(share.key)

    async def _kicked(self, key: str) -> None:
        try:
            await self.reconcile(key)
        except Exception:
            log.exception("reconciling GpuShare %s failed; the next tick retries", key)

    async def close(self) -> None:
        if self.synced.set in self.view.sync_listeners:
            self.view.sync_listeners.remove(self.synced.set)
        for task in self._kicks.values():
            task.cancel()
        await asyncio.gather(*self._kicks.values(), return_exceptions=True)

    async def reconcile(self, key: str) -> Step | None:
        if not self.synced.is_set():
            return None
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            share = self.view.share(key)
            if share is None or (share.body.get("metadata") or {}).get("deletionTimestamp"):
                return None
            if not self.view.governs(share):
                await self._over_limit(share)
                return None
            pods = self.view.governed_pods(share)
            await self._inherit(share, pods)
            await self._release(share, pods)
            await self._sync_placements(share, pods)
            await self.unlinked.check(share)
            cached = await self._cached(share, pods)
            now = self.clock()
            step = next_step(
                share,
                pods,
                cached=cached,
                now=now,
                measure_grace=timedelta(seconds=self.config.measure_grace_s),
                start_timeout=timedelta(seconds=self.config.profiling_start_timeout_s),
                warmup=timedelta(seconds=self.config.profiling_warmup_s),
            )
            if not isinstance(step, Wait):
                log.info("GpuShare %s: %s", key, type(step).__name__)
            await self._take(share, step, now=now)
            return step

    async def _over_limit(self, share: ShareSummary) -> None:
        """Say once that a share past its namespace's bound governs nothing (governance)."""
        if share.key in self._told_over_limit:
            return
        self._told_over_limit.add(share.key)
        why = (
            f"namespace {share.namespace} holds more than {MAX_SHARES_PER_NAMESPACE} GpuShares; "
            "only the first by name govern pods, and this one governs none: delete unused ones"
        )
        await self.event(share, "TooManyShares", why, warning=True)

    # ---- idempotent housekeeping -----------------------------------------------------------

    async def _inherit(self, share: ShareSummary, pods: Sequence[PodFacts]) -> None:
        """Unscheduled governed pods get the share's request; every active one its profile,
        once known: the pod it profiled, and one placed before the share's status reached the
        webhook, would otherwise count as unprofiled (assumed heavy) for as long as they run,
        and keep opportunistic pods off their GPUs (docs/packing.md, "The sharing contract")."""
        for pod in pods:
            wanted = inherited_annotations(share, pod)
            if wanted:
                await self.kube.annotate_pod(
                    namespace=pod.namespace, name=pod.name, annotations=wanted
                )

    async def _release(self, share: ShareSummary, pods: Sequence[PodFacts]) -> None:
        for pod in stale_marks(share, pods):
            await self.kube.annotate_pod(
                namespace=pod.namespace, name=pod.name, annotations={ANN_PROFILING: PROFILING_DONE}
            )

    async def _sync_placements(self, share: ShareSummary, pods: Sequence[PodFacts]) -> None:
        if "phase" not in share.status:
            return  # the create handler writes the first status
        entries = placement_entries(pods)
        desired: dict[str, Any] = {"placements": placements_status(entries), "pods": len(entries)}
        status = share.status
        request = share.sized_fraction  # None: not auto, and a stale value is removed
        if request is not None or "request" in status:
            desired["request"] = request
        if all(status.get(k, [] if k == "placements" else None) == v for k, v in desired.items()):
            return
        await self.kube.merge_share_status(
            namespace=share.namespace, name=share.name, status=desired
        )

    async def _cached(self, share: ShareSummary, pods: Sequence[PodFacts]) -> GpuProfile | None:
        spec = share.spec
        if spec is None or share.status.get("phase") != PHASE_PENDING:
            return None
        if spec.profiling.mode != PROFILING_AUTO:
            return None
        pod = representative(pods)
        return await self.profiles.lookup(share, pod) if pod is not None else None

    # ---- steps -----------------------------------------------------------------------------

    async def transition(
        self,
        share: ShareSummary,
        *,
        to_phase: str,
        fields: Mapping[str, Any] | None = None,
        condition: Condition | None = None,
        tests: Mapping[str, Any] | None = None,
        now: datetime,
    ) -> bool:
        """Move the share from its current phase to ``to_phase`` iff nobody did it already."""
        ops = transition_ops(
            share, to_phase=to_phase, fields=fields, condition=condition, tests=tests, now=now
        )
        return await self.kube.patch_share_status(
            namespace=share.namespace, name=share.name, ops=ops
        )

    async def event(
        self, share: ShareSummary, reason: str, message: str, *, warning: bool = False
    ) -> None:
        await self.kube.post_event(
            about=ObjectRef.share(namespace=share.namespace, name=share.name, uid=share.uid),
            reason=reason,
            message=message,
            warning=warning,
        )

    async def _take(self, share: ShareSummary, step: Step, *, now: datetime) -> None:
        """Carry out ``step`` (one of :mod:`operator.profiling`'s decisions)."""
        if isinstance(step, Wait):
            return
        if isinstance(step, SkipProfiling):
            await self._skip(share, now=now)
        elif isinstance(step, UseCached):
            await self._use_cached(share, step, now=now)
        elif isinstance(step, Elect):
            await self._elect(share, step, now=now)
        elif isinstance(step, StartClock):
            await self._start_clock(share, step)
        elif isinstance(step, Measure):
            await self._measure(share, step, now=now)
        elif isinstance(step, Abandon):
            await self._abandon(share, step, now=now)
        elif isinstance(step, GiveUp):
            await self._give_up(share, step, now=now)

    async def _skip(self, share: ShareSummary, *, now: datetime) -> None:
        if await self.transition(
            share,
            to_phase=PHASE_PACKED,
            condition=(COND_PROFILED, False, "ProfilingSkipped", "spec.profiling.mode is skip"),
            now=now,
        ):
            await self.event(share, "Packed", "profiling skipped (spec.profiling.mode: skip)")

    async def _use_cached(self, share: ShareSummary, step: UseCached, *, now: datetime) -> None:
        profile = dataclasses.replace(step.profile, source="cache")
        message = await self._packed(
            share, profile, how="reused the cached profile", reason="CacheHit", now=now
        )
        if message is not None:
            await self.event(share, "ProfileReused", message)

    async def _packed(
        self,
        share: ShareSummary,
        profile: GpuProfile,
        *,
        how: str,
        reason: str,
        now: datetime,
        tests: Mapping[str, Any] | None = None,
    ) -> str | None:
        """To Packed with ``profile`` and the sizes it suggests; the message (``how``, the
        profile, the sizes) when this call moved the share, None when it had moved already."""
        size = sized_fields(share, profile)
        message = f"{how}: {describe(profile)}{sized_note(size, share, profile, self.view.nodes())}"
        if not await self.transition(
            share,
            to_phase=PHASE_PACKED,
            fields={"profile": profile.to_status(), **size},
            tests=tests,
            condition=(COND_PROFILED, True, reason, message),
            now=now,
        ):
            return None
        return message

    async def _start_clock(self, share: ShareSummary, step: StartClock) -> None:
        # Not an event: the clock start is bookkeeping inside the Profiling phase.
        await self.kube.patch_share_status(
            namespace=share.namespace,
            name=share.name,
            ops=[
                {"op": "test", "path": "/status/phase", "value": PHASE_PROFILING},
                {"op": "test", "path": "/status/profilingPod", "value": step.pod.name},
                {"op": "test", "path": "/status/profilingStarted", "value": None},
                {"op": "add", "path": "/status/profilingStarted", "value": format_rfc3339(step.at)},
            ],
        )

    async def _abandon(self, share: ShareSummary, step: Abandon, *, now: datetime) -> None:
        if step.pod is not None:
            await self.kube.annotate_pod(
                namespace=step.pod.namespace,
                name=step.pod.name,
                annotations={ANN_PROFILING: PROFILING_DONE},
            )
        if await self.transition(
            share,
            to_phase=PHASE_PENDING,
            fields=no_profiling_pod(attempts=attempts(share.status) + 1),
            condition=(COND_PROFILED, False, "ProfilingRestarted", step.reason),
            now=now,
        ):
            await self.event(share, "ProfilingRestarted", step.reason, warning=True)

    async def _give_up(self, share: ShareSummary, step: GiveUp, *, now: datetime) -> None:
        if await self.transition(
            share,
            to_phase=PHASE_PACKED,
            condition=(COND_PROFILED, False, "ProfilingFailed", step.reason),
            now=now,
        ):
            await self.event(share, "ProfilingFailed", step.reason, warning=True)

    async def _elect(self, share: ShareSummary, step: Elect, *, now: datetime) -> None:
        assert share.spec is not None
        pod = step.pod
        window = share.spec.profiling.window_seconds
        if step.mark:
            marked = await self.kube.annotate_pod(
                namespace=pod.namespace,
                name=pod.name,
                annotations={ANN_PROFILING: PROFILING_ACTIVE, ANN_PROFILING_WINDOW: str(window)},
            )
            if not marked:
                return  # the pod went away; the next tick elects another
        marked = step.mark or pod.annotations.get(ANN_PROFILING) == PROFILING_ACTIVE
        granted = await neighbour_rules(self.view, self.kube, pod.namespace)
        policy = share.spec.packing.policy
        where = profiling_place(policy=policy, granted=granted, marked=marked, node=pod.node)
        message = f"profiling pod {pod.name} for {window} s {where}"
        if await self.transition(
            share,
            to_phase=PHASE_PROFILING,
            fields={
                "profilingPod": pod.name,
                "profilingStarted": None,
                "profilingElected": format_rfc3339(now),
            },
            condition=(COND_PROFILED, False, "Profiling", message),
            now=now,
        ):
            await self.event(share, "ProfilingStarted", message)

    async def _measure(self, share: ShareSummary, step: Measure, *, now: datetime) -> None:
        node = self.view.node_info(step.node)
        try:
            reading = await self.profiler.fetch(
                node=step.node,
                node_ip=node.address if node else None,
                gpu_uuid=step.gpu_uuid,
                window_s=step.window_seconds,
            )
        except ProfilerError as exc:
            log.warning("GpuShare %s: profiler: %s; retrying", share.key, exc)
            conditions = with_condition(
                share.status.get("conditions"),
                type_=COND_PROFILED,
                status=False,
                reason="AgentUnreachable",
                message=f"waiting for the node agent's profile: {exc}",
                now=now,
            )
            if conditions != share.status.get("conditions"):
                await self.kube.patch_share_status(
                    namespace=share.namespace,
                    name=share.name,
                    ops=[
                        {"op": "test", "path": "/status/phase", "value": PHASE_PROFILING},
                        {"op": "add", "path": "/status/conditions", "value": conditions},
                    ],
                )
            return
        profile = reading.stored(now=now)
        pod = step.pod
        await self.profiles.remember(share, pod, profile)
        message = await self._packed(
            share,
            profile,
            how=f"profiled pod {pod.name}",
            reason="Measured",
            now=now,
            tests={"profilingPod": pod.name},
        )
        if message is not None:
            await self.kube.annotate_pod(
                namespace=pod.namespace, name=pod.name, annotations={ANN_PROFILING: PROFILING_DONE}
            )
            await self.event(share, "Profiled", message)

    # ---- validation (create / spec update) -------------------------------------------------

    async def validate(self, share: ShareSummary, *, now: datetime) -> bool | None:
        """Set phase and the Accepted condition after the spec was created or changed: an
        invalid spec fails the share; a valid one (re)starts a failed or new share at Pending.

        Reads the share afresh (a handler's body may predate our own writes). True when this
        call changed the phase (the caller announces it, once), False when nothing was to be
        done, None when the status changed meanwhile (the caller retries)."""
        fresh = await self.kube.get_share(namespace=share.namespace, name=share.name)
        if fresh is None:
            return False
        share = share_summary(fresh)
        phase = share.status.get("phase")
        if share.spec is None:
            if phase == PHASE_FAILED:
                return False
            changed = await self.transition(
                share,
                to_phase=PHASE_FAILED,
                condition=(COND_ACCEPTED, False, "InvalidSpec", f"{share.spec_error}"),
                now=now,
            )
            return True if changed else None
        if phase not in (None, PHASE_FAILED):
            return False
        changed = await self.transition(
            share,
            to_phase=PHASE_PENDING,
            fields=no_profiling_pod(attempts=0),
            condition=(COND_ACCEPTED, True, "Valid", "spec accepted"),
            now=now,
        )
        return True if changed else None

    async def announce(self, share: ShareSummary) -> None:
        """The Event that goes with ``validate`` (a separate Kopf sub-handler, run once)."""
        if share.spec is None:
            await self.event(share, "InvalidSpec", f"{share.spec_error}", warning=True)
        else:
            spec = share.spec
            await self.event(
                share,
                "Accepted",
                f"{spec.fraction} of a GPU per pod, class {spec.gpu_class}, packing "
                f"{spec.packing.policy}, profiling {spec.profiling.mode}",
            )

    async def release_all(self, share: ShareSummary) -> None:
        """On deletion: free every GPU held for this share's profiling."""
        for pod in self.view.governed_pods(share):
            if pod.annotations.get(ANN_PROFILING) == PROFILING_ACTIVE:
                await self.kube.annotate_pod(
                    namespace=pod.namespace,
                    name=pod.name,
                    annotations={ANN_PROFILING: PROFILING_DONE},
                )
