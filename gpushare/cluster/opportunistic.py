"""The leader's opportunistic duties: pause, resume, evict, promote, judge by measurement.

What to do is decided in ``gpushare.packing`` (the pauses and evictions a guaranteed bind names,
:meth:`Opportunism.resumptions`, :meth:`Opportunism.promotions`,
:func:`gpushare.packing.governor.review`); this module reads the view, asks the node agents for
their GPUs' counters (``/profile``, as the operator's profiler does) and writes
(docs/packing.md, "The sharing contract"):

- a pause: the pod's ``gpushare.io/pause`` (``api.pause.PauseRequest``), which the node agent
  carries out by freezing the pod's cgroups and reports in ``gpushare.io/paused``; a
  ``Paused`` Event naming who needs the room or what harm was measured. A guaranteed pod's
  pauses are written before its Binding (:meth:`OpportunisticDuties.pause_for`), so it never
  starts beside the compute it needs;
- a resumption: the annotation removed, a ``Resumed`` Event;
- an eviction, only for GPU memory or MPS clients a guaranteed pod needs and no pause frees:
  through the Eviction API, with a ``Preempted`` Event saying so;
- a promotion: ``gpushare.io/tier: guaranteed``, a ``Promoted`` Event.

The annotations are the state of record: a new leader's view reads them, so a pod its
predecessor paused stays counted as paused and is resumed by the next resumption round that
finds room for it.
"""

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gpushare.api.bounds import format_rfc3339
from gpushare.api.errors import InvalidInputError
from gpushare.api.names import ANN_TIER, TIER_GUARANTEED
from gpushare.api.pause import REASON_GUARANTEED, REASON_HARM, PauseRequest
from gpushare.cluster.metrics import Metrics
from gpushare.cluster.operator.profiler_client import ProfilerClient
from gpushare.cluster.operator.readings import ProfilerError
from gpushare.cluster.state.placements import pause_of
from gpushare.cluster.state.view import ClusterView
from gpushare.kube.controller import Kube
from gpushare.kube.events import ObjectRef
from gpushare.packing.governor import review
from gpushare.packing.model import Assignment
from gpushare.packing.opportunistic import EVICT_CLIENTS, Opportunism
from gpushare.packing.promotion import NO_WAITING, WaitingPods
from gpushare.packing.stored_profile import measured_pipe_profile

log = logging.getLogger(__name__)

PROMOTE_PERIOD_S = 2.0
"""How often GPUs with opportunistic or paused tenants are checked for resumptions and
promotions."""
EVICTION_RETRY_S = 10.0
"""An eviction a PodDisruptionBudget blocks is tried again this often."""


@dataclass
class OpportunisticDuties:
    """Pauses, resumptions, evictions, promotion and the governor, on the leader
    (``gpushare.cluster.leading``)."""

    view: ClusterView
    kube: Kube
    opportunism: Opportunism
    metrics: Metrics
    period_s: float
    settle_s: float
    agent_url: str
    clock: Callable[[], float] = time.time
    waiting: Callable[[], WaitingPods] = lambda: NO_WAITING
    """The pods waiting for a guaranteed share, by the node they wait for room on (the
    extender's refusals, ``RefusedPods.waiting``): promotion leaves them their room."""
    _evicting: dict[str, str] = field(default_factory=dict)
    """Pod key -> why, for evictions under way (one a budget blocks is retried)."""
    _resumed_at: dict[str, float] = field(default_factory=dict)
    """Pod key -> when this leader resumed it: the governor lets it settle again."""
    _tasks: set["asyncio.Task[None]"] = field(default_factory=set)

    # ---- called from the extender's bind ---------------------------------------------------

    async def pause_for(self, key: str, assignment: Assignment) -> str | None:
        """Before guaranteed pod ``key`` is bound (``Extender.pauser``): pause the tenants its
        assignment names. Returns why the bind must not go ahead (a pause request could not
        be written: the pod would start beside compute it needs), else None. A tenant gone
        or paused since the assignment was made is left alone."""
        gpu = assignment.gpu_uuids[0]
        for victim in assignment.pause:
            if not self._running(victim):
                continue
            error = await self._pause(
                victim,
                REASON_GUARANTEED,
                f"a guaranteed pod ({key}) needs the compute on GPU {gpu}: paused, it keeps its "
                "GPU memory and loses no work, and runs again when room frees",
                (key,),
            )
            if error is not None:
                # Those paused already run again on the next resumption round: the pod that
                # needed the room is not bound.
                return error
        return None

    def bound(self, key: str, assignment: Assignment) -> None:
        """A pod was bound (``Extender.bound_listeners``): evict what its assignment names for
        memory; say so on an opportunistic one."""
        if assignment.opportunistic:
            self.metrics.opportunistic_events.labels(event="placed", reason="").inc()
            self._spawn(
                self._event(
                    key,
                    "PlacedOpportunistically",
                    f"placed beyond GPU {assignment.gpu_uuids[0]}'s guaranteed capacity: "
                    f"predicted to add {assignment.predicted_gain:.2f} jobs' worth of work per "
                    "second; paused when a guaranteed pod needs its compute, until its request "
                    "fits, then promoted",
                    warning=False,
                )
            )
        what = "MPS clients" if assignment.evict_reason == EVICT_CLIENTS else "GPU memory"
        for victim in assignment.evict:
            self.evict(
                victim,
                f"a guaranteed pod ({key}) needs {what} on GPU {assignment.gpu_uuids[0]} that "
                "pausing this pod would not free",
                reason=assignment.evict_reason,
            )

    def evict(self, key: str, why: str, *, reason: str) -> None:
        """Evict opportunistic pod ``key`` (through the Eviction API: its grace period and
        PodDisruptionBudgets hold) with a ``Preempted`` Event saying ``why``. It held no
        guaranteed share, so nothing guaranteed is over capacity while it goes."""
        if key in self._evicting:
            return
        self._evicting[key] = why
        self.metrics.opportunistic_events.labels(event="evicted", reason=reason).inc()
        log.info("evicting an opportunistic pod", extra={"pod": key, "why": why})
        self._spawn(self._evict(key, why))

    # ---- the writes ----------------------------------------------------------------------

    def _running(self, key: str) -> bool:
        """Pod ``key`` is in the view, opportunistic (not promoted meanwhile: a pod holding a
        guaranteed share is never paused) and not paused."""
        return any(
            t.key == key and t.opportunistic and t.pause is None
            for _, gpu in self.view.opportunistic_gpus()
            for t in gpu.tenants
        )

    async def _pause(
        self, key: str, reason: str, message: str, for_pods: tuple[str, ...]
    ) -> str | None:
        """Write pod ``key``'s pause request (counted in the view first); why not, or None."""
        namespace, _, name = key.partition("/")
        known = self.view.pod(key)
        request = PauseRequest(
            reason=reason,
            message=message,
            since=format_rfc3339(datetime.fromtimestamp(self.clock(), UTC)),
            for_pods=for_pods,
        )
        self.view.mark_pause(key, pause_of(request))  # before any await: no filter counts it
        try:
            await self.kube.request_pause(
                namespace=namespace, name=name, uid=known.uid if known else "", request=request
            )
        except Exception as exc:
            self.view.unmark_pause(key)
            log.warning("pause failed", extra={"pod": key, "error": str(exc)})
            return f"could not pause opportunistic pod {key} ({exc})"
        self._resumed_at.pop(key, None)
        self.metrics.opportunistic_events.labels(event="paused", reason=reason).inc()
        log.info("paused an opportunistic pod", extra={"pod": key, "why": message})
        self._spawn(self._event(key, "Paused", f"paused: {message}", warning=False))
        return None

    async def _resume(self, key: str, gpu: str) -> bool:
        """Remove pod ``key``'s pause request (counted running in the view first)."""
        namespace, _, name = key.partition("/")
        known = self.view.pod(key)
        since = known.pause.since if known is not None and known.pause is not None else ""
        self.view.mark_pause(key, None)
        try:
            await self.kube.request_pause(
                namespace=namespace, name=name, uid=known.uid if known else "", request=None
            )
        except Exception as exc:
            self.view.unmark_pause(key)
            log.warning("resumption failed; retrying", extra={"pod": key, "error": str(exc)})
            return False
        self._resumed_at[key] = self.clock()
        self.metrics.opportunistic_events.labels(event="resumed", reason="").inc()
        log.info("resumed an opportunistic pod", extra={"pod": key, "paused_since": since})
        await self._event(
            key,
            "Resumed",
            f"resumed on GPU {gpu}"
            + (f" (paused since {since})" if since else "")
            + ": room freed, running it keeps every guaranteed neighbour within its class bound",
            warning=False,
        )
        return True

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _evict(self, key: str, why: str) -> None:
        namespace, _, name = key.partition("/")
        await self._event(key, "Preempted", f"evicted: {why}", warning=True)
        try:
            while self.view.pod(key) is not None:
                try:
                    if await self.kube.evict_pod(namespace=namespace, name=name):
                        return
                except Exception as exc:
                    log.warning("eviction failed; retrying", extra={"pod": key, "error": str(exc)})
                await asyncio.sleep(EVICTION_RETRY_S)
        finally:
            self._evicting.pop(key, None)

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

    async def resume_round(self) -> list[str]:
        """Resume every paused pod its GPU has room for now (``Opportunism.resumptions``:
        oldest first); returns their keys. Pods paused by an earlier leader are among them:
        the view reads their requests from the annotations."""
        resumed: list[str] = []
        for key in [k for k in self._resumed_at if self.view.pod(k) is None]:
            del self._resumed_at[key]  # gone: nothing left to settle
        for _, gpu in self.view.opportunistic_gpus():
            for key in self.opportunism.resumptions(gpu):
                if key not in self._evicting and await self._resume(key, gpu.uuid):
                    resumed.append(key)
        return resumed

    async def promote_round(self) -> list[str]:
        """Promote every running opportunistic pod whose request fits among its GPU's
        guaranteed shares now (oldest first), leaving the room a pod waiting for its
        guaranteed share since before it was placed needs (:attr:`waiting`); returns their
        keys."""
        promoted: list[str] = []
        gpus = self.view.opportunistic_gpus()
        waiting = self.waiting() if gpus else NO_WAITING
        for node, gpu in gpus:
            for key in self.opportunism.promotions(gpu, waiting.on(node)):
                if key in self._evicting or not self.view.may_guarantee(key):
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
                self.metrics.opportunistic_events.labels(event="promoted", reason="").inc()
                await self._event(
                    key,
                    "Promoted",
                    f"promoted to guaranteed on GPU {gpu.uuid}: its request now fits among "
                    "the guaranteed shares (no restart; it is no longer paused for others)",
                    warning=False,
                )
        return promoted

    async def govern_round(self, profiler: ProfilerClient) -> list[str]:
        """Read every shared GPU's counters: learn the corrections, and pause the newest
        running opportunistic tenant of a GPU that measured harm to a pod that did not opt in;
        returns the keys paused."""
        paused: list[str] = []
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
            verdict = review(
                current,
                measured,
                self.opportunism,
                now=now,
                settle_s=self.settle_s,
                resumed=self._resumed_at,
            )
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
            if verdict.pause is not None and verdict.pause not in self._evicting:
                error = await self._pause(
                    verdict.pause,
                    REASON_HARM,
                    f"the governor measured GPU {gpu.uuid}: {verdict.reason}; it runs again once "
                    + (", ".join(verdict.beside) or "they")
                    + " left the GPU",
                    verdict.beside,
                )
                if error is None:
                    paused.append(verdict.pause)
        return paused

    async def run(self) -> None:
        """Resume and promote every few seconds and govern every ``period_s``, forever."""
        profiler = ProfilerClient(url_template=self.agent_url, timeout_s=5.0)
        next_govern = self.clock() + self.period_s
        try:
            while True:
                await asyncio.sleep(PROMOTE_PERIOD_S)
                try:
                    await self.resume_round()
                    await self.promote_round()
                    if self.clock() >= next_govern:
                        next_govern = self.clock() + self.period_s
                        await self.govern_round(profiler)
                except Exception:
                    log.exception("opportunistic duties failed; going on")
        finally:
            await profiler.close()
