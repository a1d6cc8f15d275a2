"""The latency protection loop: reads GPUs holding latency-class pods, evicts as a last resort.

Decisions come from ``protection`` (pure); this module only reads the node agents, calls the
Eviction API and reports (Events on both pods, a condition and counter on the latency pod's
GpuShare, a Prometheus counter).
"""

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from gpushare.api.errors import InvalidInputError
from gpushare.api.gpushare_crd import (
    ANN_PROFILE,
    parse_profile_annotation,
)
from gpushare.api.names import METRIC_PREFIX
from gpushare.api.profile import GpuProfile
from gpushare.cluster.operator.profiler_client import ProfilerClient
from gpushare.cluster.operator.profiling import with_condition
from gpushare.cluster.operator.protection import (
    ProtectionTracker,
    choose_victim,
    judge,
    latency_tenants,
)
from gpushare.cluster.operator.readings import ProfilerError
from gpushare.cluster.operator.settings import OperatorConfig
from gpushare.cluster.state.pod_facts import PodFacts
from gpushare.cluster.state.view import ClusterView
from gpushare.kube.events import ObjectRef
from gpushare.kube.operator import EvictionOutcome, KubeApi
from gpushare.packing.interference import InterferenceModel, load_default
from gpushare.packing.stored_profile import pipe_profile

log = logging.getLogger(__name__)

COND_NEIGHBOUR_EVICTED = "NeighbourEvicted"

Predictor = Callable[[PodFacts, Sequence[PodFacts]], float | None]
"""(latency pod, its neighbours) -> predicted slowdown, or None when it cannot be predicted."""


@dataclass(frozen=True)
class EvictionRecord:
    victim: str
    """namespace/name of the evicted pod."""
    node: str
    gpu_uuid: str
    protected: tuple[str, ...]
    """The latency-class pods on that GPU."""
    why: str


def pod_profile(view: ClusterView, pod: PodFacts) -> GpuProfile | None:
    """A pod's measured profile: its ``gpushare.io/profile`` annotation, else its share's."""
    text = pod.annotations.get(ANN_PROFILE)
    try:
        if text:
            return parse_profile_annotation(text)
        share = view.share_of(pod)
        raw = share.status.get("profile") if share else None
        return GpuProfile.from_status(raw) if isinstance(raw, Mapping) else None
    except InvalidInputError as exc:
        log.warning("pod %s: unusable profile: %s", pod.key, exc)
        return None


def _threads(pod: PodFacts) -> int:
    return pod.placement.thread_percent if pod.placement else 100


def interference_predictor(view: ClusterView, model: InterferenceModel) -> Predictor:
    """Predicts from measured profiles only: a neighbour without a profile is left out rather
    than assumed heavy, so an eviction always rests on something measured."""

    def predict(target: PodFacts, neighbours: Sequence[PodFacts]) -> float | None:
        own = pod_profile(view, target)
        if own is None:
            return None
        loads = []
        for pod in neighbours:
            profile = pod_profile(view, pod)
            if profile is not None:
                loads.append((pipe_profile(profile), _threads(pod)))
        return model.predict(pipe_profile(own), _threads(target), loads)

    return predict


class LatencyGuard:
    def __init__(
        self,
        *,
        config: OperatorConfig,
        kube: KubeApi,
        view: ClusterView,
        profiler: ProfilerClient,
        predictor: Predictor | None = None,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
        synced: asyncio.Event | None = None,
    ) -> None:
        self.config = config
        self.kube = kube
        self.view = view
        self.profiler = profiler
        self.predictor = predictor
        self.clock = clock
        self.synced = synced
        """Set once the view holds every pod: never pick a victim from a partial view."""
        self.tracker = ProtectionTracker(config.protection_policy)
        self.evictions: list[EvictionRecord] = []
        self._counter = (
            Counter(
                f"{METRIC_PREFIX}protection_evictions",
                "Batch pods evicted to protect a latency-class pod on the same GPU",
                ["node", "gpu_uuid"],
                registry=registry,
            )
            if registry is not None
            else None
        )
        self._counted: set[tuple[str, str]] = set()

    @classmethod
    def with_default_model(cls, **kwargs: Any) -> "LatencyGuard":
        guard = cls(**kwargs)
        try:
            guard.predictor = interference_predictor(guard.view, load_default())
        except (OSError, InvalidInputError) as exc:
            log.warning("no interference model (%s): protection judges saturation only", exc)
        return guard

    async def run(self) -> None:
        """Until cancelled: one tick per protection interval; a failed tick is logged."""
        if self.synced is not None:
            await self.synced.wait()
        while True:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception(
                    "protection tick failed; next one in %s s", self.config.protection_interval_s
                )
            await asyncio.sleep(self.config.protection_interval_s)

    async def _read(self, node: str, uuid: str) -> GpuProfile | None:
        info = self.view.node_info(node)
        try:
            return await self.profiler.fetch(
                node=node,
                node_ip=info.address if info else None,
                gpu_uuid=uuid,
                window_s=self.config.protection_window_s,
            )
        except ProfilerError as exc:
            log.info("protection: no reading of %s on %s: %s", uuid, node, exc)
            return None

    async def tick(self) -> list[EvictionRecord]:
        """Read every GPU holding a latency-class pod once; evict where hysteresis says so."""
        self._zero_counters()
        scope = set(self.config.watch_namespaces)
        watched = {
            gpu: tenants
            for gpu, every in self.view.tenants_by_gpu().items()
            # DRA-mode pods come from a cluster-wide claim watch: keep to the operator's scope.
            if (tenants := [t for t in every if not scope or t.namespace in scope])
            and latency_tenants(tenants)
        }
        self.tracker.forget_except({uuid for _, uuid in watched})
        keys = list(watched)
        readings = await asyncio.gather(*(self._read(node, uuid) for node, uuid in keys))
        done: list[EvictionRecord] = []
        for (node, uuid), reading in zip(keys, readings, strict=True):
            if reading is None:
                continue  # no evidence either way: the streak neither grows nor resets
            record = await self._judge(node, uuid, watched[(node, uuid)], reading)
            if record is not None:
                done.append(record)
        return done

    def _zero_counters(self) -> None:
        """One eviction series per known GPU, at 0 until an eviction: the cluster dashboard's
        "Protection evictions" then shows 0 rather than no data (docs/observability.md)."""
        if self._counter is None:
            return
        gpus = {(n.name, uuid) for n in self.view.node_infos().values() for uuid in n.gpu_models}
        for node, uuid in gpus - self._counted:
            self._counter.labels(node=node, gpu_uuid=uuid)
        for node, uuid in self._counted - gpus:
            self._counter.remove(node, uuid)
        self._counted = gpus

    async def _judge(
        self, node: str, uuid: str, tenants: list[PodFacts], reading: GpuProfile
    ) -> EvictionRecord | None:
        """Judge one GPU's reading; after enough bad ones in a row, evict its newest batch pod."""
        latency = latency_tenants(tenants)
        verdict = judge(
            reading,
            policy=self.config.protection_policy,
            predicted_slowdown=self._predicted(latency, tenants),
        )
        if not self.tracker.observe(uuid, bad=verdict.bad, now=self.clock()):
            if verdict.bad:
                in_row = self.tracker.bad_in_row(uuid)
                log.info("GPU %s on %s: %s (%d in a row)", uuid, node, verdict.why, in_row)
            return None
        victim = choose_victim(tenants)
        if victim is None:
            log.warning("GPU %s on %s: %s, but no batch pod to evict", uuid, node, verdict.why)
            return None
        readings = self.config.protection_policy.bad_readings
        why = f"{verdict.why} for {readings} readings in a row"
        if not await self._evict(victim, uuid, why):
            return None
        self.tracker.evicted(uuid, now=self.clock())
        record = EvictionRecord(
            victim=victim.key,
            node=node,
            gpu_uuid=uuid,
            protected=tuple(p.key for p in latency),
            why=why,
        )
        self.evictions.append(record)
        if self._counter is not None:
            self._counter.labels(node=node, gpu_uuid=uuid).inc()
        log.warning("evicted %s from GPU %s on %s: %s", victim.key, uuid, node, why)
        await self._report(record, victim, latency)
        return record

    def _predicted(self, latency: list[PodFacts], tenants: list[PodFacts]) -> float | None:
        """The worst predicted slowdown of a latency pod beside its neighbours (None: no
        predictor, or nothing measured to predict from)."""
        if self.predictor is None:
            return None
        values = [
            v
            for pod in latency
            if (v := self.predictor(pod, [t for t in tenants if t.key != pod.key])) is not None
        ]
        return max(values) if values else None

    async def _evict(self, victim: PodFacts, uuid: str, why: str) -> bool:
        """Evict ``victim``; False when a PodDisruptionBudget blocks it (told once on the pod
        with an Event, then retried) or it is gone already."""
        outcome = await self.kube.evict(
            namespace=victim.namespace, name=victim.name, uid=victim.uid or None
        )
        if outcome is EvictionOutcome.BLOCKED:
            if self.tracker.blocked(uuid):
                await self.kube.post_event(
                    about=ObjectRef.pod(
                        namespace=victim.namespace, name=victim.name, uid=victim.uid
                    ),
                    reason="EvictionBlocked",
                    message=f"gpushare wants to evict this pod from GPU {uuid} ({why}) but a "
                    "PodDisruptionBudget forbids it now; retrying",
                    warning=True,
                )
            return False
        return outcome is not EvictionOutcome.GONE

    async def _report(
        self, record: EvictionRecord, victim: PodFacts, latency: Sequence[PodFacts]
    ) -> None:
        protected = ", ".join(record.protected)
        await self.kube.post_event(
            about=ObjectRef.pod(namespace=victim.namespace, name=victim.name, uid=victim.uid),
            reason="EvictedForLatency",
            message=f"evicted from GPU {record.gpu_uuid} on {record.node}: {record.why}; "
            f"protecting latency-class {protected}",
            warning=True,
        )
        message = f"evicted batch pod {record.victim} from GPU {record.gpu_uuid}: {record.why}"
        shares = {}
        for pod in latency:
            await self.kube.post_event(
                about=ObjectRef.pod(namespace=pod.namespace, name=pod.name, uid=pod.uid),
                reason="NeighbourEvicted",
                message=message,
            )
            share = self.view.share_of(pod)
            if share is not None:
                shares[share.key] = share
        now = datetime.now(UTC)
        for share in shares.values():
            await self.kube.post_event(
                about=ObjectRef.share(namespace=share.namespace, name=share.name, uid=share.uid),
                reason="NeighbourEvicted",
                message=message,
            )
            fresh = await self.kube.get_share(namespace=share.namespace, name=share.name)
            status = (fresh or {}).get("status")
            if not isinstance(status, Mapping):
                continue
            count = status.get("evictions")
            conditions = with_condition(
                status.get("conditions"),
                type_=COND_NEIGHBOUR_EVICTED,
                status=True,
                reason="Saturation",
                message=message,
                now=now,
            )
            await self.kube.patch_share_status(
                namespace=share.namespace,
                name=share.name,
                ops=[
                    {"op": "test", "path": "/status/evictions", "value": count},
                    {"op": "add", "path": "/status/evictions", "value": (count or 0) + 1},
                    {"op": "add", "path": "/status/conditions", "value": conditions},
                ],
            )
