"""Tell kube-scheduler to retry pods the extender refused once capacity it cannot see frees up.

kube-scheduler parks a pod the extender left without a node among its unschedulable pods and
tries it again on the next cluster event (any Pod or Node change), or after five minutes. Some
of the capacity the extender refuses is invisible to it: filter-time holds whose bind never
came, placements written but never bound. When such capacity is let go in a quiet cluster no
event follows, and the pods refused meanwhile wait up to five minutes beside a free GPU. The
controller then touches each refused pod that is still unbound (one annotation), which is the
Pod update event that sends it back to the scheduling queue.
"""

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from gpushare.api.names import ANN_REQUEUED_AT
from gpushare.cluster.state.pod_facts import PodFacts

log = logging.getLogger(__name__)


class PodAnnotator(Protocol):
    async def annotate_pod(
        self, *, namespace: str, name: str, annotations: Mapping[str, str]
    ) -> None: ...


@dataclass
class RefusedPods:
    """Pods the extender's filter left without a node, by key, with when (monotonic)."""

    limit: int = 2000
    """Most pods remembered (oldest forgotten first): a nudge is a courtesy, not a promise."""
    _refused: dict[str, float] = field(default_factory=dict)

    def refused(self, key: str, *, now: float | None = None) -> None:
        self._refused.pop(key, None)
        self._refused[key] = time.monotonic() if now is None else now
        while len(self._refused) > self.limit:
            del self._refused[next(iter(self._refused))]

    def placed(self, key: str) -> None:
        self._refused.pop(key, None)

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
