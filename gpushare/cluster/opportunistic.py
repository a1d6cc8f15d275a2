"""The leader's opportunistic duties: promote, judge by measurement, preempt.

What to do is decided in ``gpushare.packing`` (:meth:`Opportunism.promotions`,
:func:`gpushare.packing.governor.review`, the preemptions a guaranteed bind names); this module
reads the view, asks the node agents for their GPUs' counters (``/profile``, as the operator's
profiler does) and writes: the ``gpushare.io/tier`` annotation when it promotes a pod, an
eviction with a ``Preempted`` Event naming why when it preempts one (docs/packing.md, "The
sharing contract").
"""

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from gpushare.api.errors import InvalidInputError
from gpushare.api.names import ANN_TIER, TIER_GUARANTEED
from gpushare.cluster.metrics import Metrics
from gpushare.cluster.operator.profiler_client import ProfilerClient
from gpushare.cluster.operator.readings import ProfilerError
from gpushare.cluster.state.view import ClusterView
from gpushare.kube.controller import Kube
from gpushare.kube.events import ObjectRef
from gpushare.packing.governor import review
from gpushare.packing.model import Assignment
from gpushare.packing.opportunistic import Opportunism
from gpushare.packing.stored_profile import measured_pipe_profile

log = logging.getLogger(__name__)

PROMOTE_PERIOD_S = 2.0
"""How often GPUs with opportunistic tenants are checked for promotions."""
EVICTION_RETRY_S = 10.0
"""A preemption a PodDisruptionBudget blocks is tried again this often."""


@dataclass
class OpportunisticDuties:
    """Promotion, the governor and preemption, on the leader (``gpushare.cluster.main``)."""

    view: ClusterView
    kube: Kube
    opportunism: Opportunism
    metrics: Metrics
    period_s: float
    settle_s: float
    agent_url: str
    clock: Callable[[], float] = time.time
    _preempting: dict[str, str] = field(default_factory=dict)
    """Pod key -> why, for preemptions under way (an eviction blocked is retried)."""
    _tasks: set["asyncio.Task[None]"] = field(default_factory=set)

    # ---- called from the extender's bind ---------------------------------------------------

    def bound(self, key: str, assignment: Assignment) -> None:
        """A pod was bound (``Extender.bound_listeners``): preempt what its assignment names;
        say so on an opportunistic one."""
        if assignment.opportunistic:
            self.metrics.opportunistic_events.labels(event="placed").inc()
            self._spawn(
                self._event(
                    key,
                    "PlacedOpportunistically",
                    f"placed beyond GPU {assignment.gpu_uuids[0]}'s guaranteed capacity: "
                    f"predicted to add {assignment.predicted_gain:.2f} jobs' worth of work per "
                    "second; preemptible until its request fits, then promoted",
                    warning=False,
                )
            )
        for victim in assignment.preempt:
            self.preempt(
                victim,
                f"a guaranteed pod ({key}) needs the room on GPU {assignment.gpu_uuids[0]}",
                event="preempted_for_guaranteed",
            )

    def preempt(self, key: str, why: str, *, event: str) -> None:
        """Evict opportunistic pod ``key`` (through the Eviction API: its grace period and
        PodDisruptionBudgets hold) with a ``Preempted`` Event saying ``why``. It held no
        guaranteed share, so nothing guaranteed is over capacity while it goes."""
        if key in self._preempting:
            return
        self._preempting[key] = why
        self.metrics.opportunistic_events.labels(event=event).inc()
        log.info("preempting an opportunistic pod", extra={"pod": key, "why": why})
        self._spawn(self._evict(key, why))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _evict(self, key: str, why: str) -> None:
        namespace, _, name = key.partition("/")
        await self._event(key, "Preempted", f"preempted: {why}", warning=True)
        try:
            while self.view.pod(key) is not None:
                try:
                    if await self.kube.evict_pod(namespace=namespace, name=name):
                        return
                except Exception as exc:
                    log.warning(
                        "preemption failed; retrying", extra={"pod": key, "error": str(exc)}
                    )
                await asyncio.sleep(EVICTION_RETRY_S)
        finally:
            self._preempting.pop(key, None)

    async def _event(self, key: str, reason: str, message: str, *, warning: bool) -> None:
        namespace, _, name = key.partition("/")
        known = self.view.pod(key)
        about = ObjectRef.pod(namespace=namespace, name=name, uid=known.uid if known else "")
        try:
            await self.kube.record_event(
                about=about, reason=reason, message=message, warning=warning
            )
        except Exception as exc:
            log.warning("could not record an event", extra={"pod": key, "error": str(exc)})

    # ---- the loops ---------------------------------------------------------------------------

    async def promote_round(self) -> list[str]:
        """Promote every opportunistic pod whose request fits among its GPU's guaranteed
        shares now (oldest first); returns their keys."""
        promoted: list[str] = []
        for _, gpu in self.view.opportunistic_gpus():
            for key in self.opportunism.promotions(gpu):
                if key in self._preempting or not self.view.may_guarantee(key):
                    continue  # (or its namespace's quota on gpu-percent would be exceeded)
                self.view.promote(key)  # counted before any await: no bind takes the share
                namespace, _, name = key.partition("/")
                try:
                    await self.kube.annotate_pod(
                        namespace=namespace, name=name, annotations={ANN_TIER: TIER_GUARANTEED}
                    )
                except Exception as exc:
                    self.view.unpromote(key)
                    log.warning("promotion failed", extra={"pod": key, "error": str(exc)})
                    continue
                promoted.append(key)
                self.metrics.opportunistic_events.labels(event="promoted").inc()
                await self._event(
                    key,
                    "Promoted",
                    f"promoted to guaranteed on GPU {gpu.uuid}: its request now fits among "
                    "the guaranteed shares (no restart; it is no longer preempted)",
                    warning=False,
                )
        return promoted

    async def govern_round(self, profiler: ProfilerClient) -> list[str]:
        """Read every shared GPU's counters: learn the corrections, and preempt the newest
        opportunistic tenant of a GPU that measured less than it was placed for; returns the
        keys preempted."""
        preempted: list[str] = []
        now = self.clock()
        window = max(1, int(self.period_s))
        for node, gpu in self.view.governed_gpus():
            info = self.view.node_info(node)
            try:
                reading = await profiler.fetch(
                    node=node,
                    node_ip=info.address if info else None,
                    gpu_uuid=gpu.uuid,
                    window_s=window,
                )
                measured = measured_pipe_profile(reading)
            except (ProfilerError, InvalidInputError) as exc:
                log.debug(
                    "no counters for the governor", extra={"gpu": gpu.uuid, "error": str(exc)}
                )
                continue
            current = self.view.gpu(gpu.uuid) or gpu  # the view may have moved meanwhile
            verdict = review(current, measured, self.opportunism, now=now, settle_s=self.settle_s)
            if verdict.estimate is not None:
                log.info(
                    "governor",
                    extra={
                        "gpu": gpu.uuid,
                        "measured_jobs_per_s": round(verdict.estimate.work_rate, 3),
                        "predicted_jobs_per_s": round(verdict.estimate.predicted, 3),
                        "verdict": verdict.reason,
                    },
                )
            if verdict.preempt is not None:
                self.preempt(verdict.preempt, verdict.reason, event="preempted_by_measurement")
                preempted.append(verdict.preempt)
        return preempted

    async def run(self) -> None:
        """Promote every few seconds and govern every ``period_s``, forever."""
        profiler = ProfilerClient(url_template=self.agent_url, timeout_s=5.0)
        next_govern = self.clock() + self.period_s
        try:
            while True:
                await asyncio.sleep(PROMOTE_PERIOD_S)
                try:
                    await self.promote_round()
                    if self.clock() >= next_govern:
                        next_govern = self.clock() + self.period_s
                        await self.govern_round(profiler)
                except Exception:
                    log.exception("opportunistic duties failed; going on")
        finally:
            await profiler.close()
