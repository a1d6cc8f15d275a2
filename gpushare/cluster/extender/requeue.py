"""Tell kube-scheduler to retry pods the extender refused once capacity it cannot see frees up.

kube-scheduler parks a pod the extender left without a node among its unschedulable pods and
tries it again on the next cluster event (any Pod or Node change), or after five minutes. Some
of the capacity the extender refuses is invisible to it: filter-time holds whose bind never
came, placements written but never bound. When such capacity is let go in a quiet cluster no
event follows, and the pods refused meanwhile wait up to five minutes beside a free GPU. The
controller then touches each refused pod that is still unbound (one annotation), which is the
Pod update event that sends it back to the scheduling queue.

The pods refused for want of a guaranteed share are also what the promotion round leaves room
for (:meth:`RefusedPods.waiting`, ``Opportunism.promotions``): an opportunistic pod placed
after such a pod was created is not promoted into the room that pod waits for.
"""

import logging
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from gpushare.api.names import ANN_REQUEUED_AT
from gpushare.cluster.state.pod_facts import EPOCH, PodFacts
from gpushare.packing.model import Demand
from gpushare.packing.promotion import Waiting, WaitingPods

log = logging.getLogger(__name__)


class PodAnnotator(Protocol):
    async def annotate_pod(
        self, *, namespace: str, name: str, annotations: Mapping[str, str]
    ) -> None: ...


MAX_WAITING_NODES = 64
"""The nodes a refused pod waits for room on are remembered up to this many; beyond, it counts
as waiting for room on any node."""


@dataclass(frozen=True)
class Refusal:
    """What the filter read of a pod it found no room for: its demand, and the nodes where
    room alone stood in its way (None: more than :data:`MAX_WAITING_NODES`)."""

    demand: Demand
    nodes: frozenset[str] | None


@dataclass
class RefusedPods:
    """Pods the extender's filter left without a node, by key, with when (monotonic), and
    what each asked for."""

    limit: int = 2000
    """Most pods remembered (oldest forgotten first): a nudge is a courtesy, not a promise,
    and a pod forgotten here only no longer holds back a promotion."""
    _refused: dict[str, float] = field(default_factory=dict)
    _asked: dict[str, Refusal] = field(default_factory=dict)
    """Kept across :meth:`take` until the pod is placed, bound or gone (:meth:`waiting`)."""

    def refused(
        self,
        key: str,
        *,
        now: float | None = None,
        demand: Demand | None = None,
        nodes: Collection[str] = (),
    ) -> None:
        self._refused.pop(key, None)
        self._refused[key] = time.monotonic() if now is None else now
        while len(self._refused) > self.limit:
            del self._refused[next(iter(self._refused))]
        self._asked.pop(key, None)
        if demand is not None:
            offered = frozenset(nodes) if len(nodes) <= MAX_WAITING_NODES else None
            self._asked[key] = Refusal(demand, offered)
            while len(self._asked) > self.limit:
                del self._asked[next(iter(self._asked))]

    def placed(self, key: str) -> None:
        self._refused.pop(key, None)
        self._asked.pop(key, None)

    def waiting(self, pods: Mapping[str, PodFacts]) -> WaitingPods:
        """The pods refused that still wait for a node, by the nodes they wait for room on,
        each since its creation (pods bound, finished or gone since are forgotten)."""
        anywhere: list[Waiting] = []
        by_node: dict[str, list[Waiting]] = {}
        for key, asked in list(self._asked.items()):
            f = pods.get(key)
            if f is None or f.node is not None or not f.active:
                del self._asked[key]
                continue
            since = f.created.timestamp() if f.created > EPOCH else 0.0
            one = Waiting(key, asked.demand, since)
            if asked.nodes is None:
                anywhere.append(one)
            else:
                for node in asked.nodes:
                    by_node.setdefault(node, []).append(one)
        return WaitingPods(tuple(anywhere), {n: tuple(w) for n, w in by_node.items()})

    def __len__(self) -> int:
        return len(self._refused)

    def take(self, pods: Mapping[str, PodFacts]) -> list[str]:
        """Keys of refused pods still waiting for a node (forgets the rest and these)."""
        waiting = [
            k
            for k in self._refused
            if (f := pods.get(k)) is not None and f.node is None and not f.finished
        ]
        self._refused.clear()
        return waiting


async def requeue(
    refused: RefusedPods, pods: Mapping[str, PodFacts], kube: PodAnnotator
) -> list[str]:
    """Touch every refused pod still unbound; returns the keys touched. A failed patch is
    logged and skipped (the scheduler's own five-minute retry still comes)."""
    touched: list[str] = []
    stamp = f"{time.time():.3f}"
    for key in refused.take(pods):
        namespace, _, name = key.partition("/")
        try:
            await kube.annotate_pod(
                namespace=namespace, name=name, annotations={ANN_REQUEUED_AT: stamp}
            )
        except Exception as exc:
            log.warning(
                "could not ask the scheduler to retry pod", extra={"pod": key, "error": str(exc)}
            )
            continue
        touched.append(key)
    return touched
