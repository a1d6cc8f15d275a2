"""Events for the objects the view held out (gpushare.cluster.state.quarantine), on the leader.

``kubectl describe`` of the object then says that gpushare ignores it and why, so its owner can
fix it; the metric ``gpushare_controller_quarantined_objects`` counts them for the platform team.
"""

import asyncio
import logging
from collections.abc import Sequence

from gpushare.api.gpushare_crd import API_VERSION, KIND
from gpushare.cluster.state.quarantine import Held, Quarantine
from gpushare.kube.controller import Kube
from gpushare.kube.events import ObjectRef

log = logging.getLogger(__name__)

REASON = "GpushareUnreadable"
PER_ROUND = 20
"""Events posted per round at most (a flood of bad objects cannot flood the API server)."""
_API_VERSIONS = {
    "Pod": "v1",
    "Node": "v1",
    "Namespace": "v1",
    "GpuShare": API_VERSION,
    KIND: API_VERSION,
    "ResourceSlice": "resource.k8s.io/v1",
    "ResourceClaim": "resource.k8s.io/v1",
}


def message(held: Held) -> str:
    return (
        f"gpushare could not read this {held.kind} ({held.error}); it is left out of GPU "
        "scheduling until it changes, and the rest of the cluster is scheduled as before. "
        "Fix: correct or recreate the object; if it looks valid, report it as a gpushare bug."
    )


async def report_round(kube: Kube, quarantines: Sequence[Quarantine]) -> int:
    """Post the Event of each held object not reported yet (at most PER_ROUND); returns how
    many were posted. An Event the API server refuses is tried again next round."""
    posted = 0
    for quarantine in quarantines:
        for held in quarantine.unreported():
            if posted >= PER_ROUND:
                return posted
            about = ObjectRef(
                _API_VERSIONS.get(held.kind, "v1"), held.kind, held.namespace, held.name, held.uid
            )
            try:
                await kube.record_event(
                    about=about, reason=REASON, message=message(held), warning=True
                )
            except Exception as exc:
                log.warning(
                    "could not record the event of a held-out object",
                    extra={"kind": held.kind, "object": held.key, "error": str(exc)},
                )
                return posted
            quarantine.mark_reported(held)
            posted += 1
    return posted


async def report_loop(
    kube: Kube, quarantines: Sequence[Quarantine], *, period_s: float = 5.0
) -> None:
    """Report held-out objects every ``period_s``, forever (the leader's duty)."""
    while True:
        await asyncio.sleep(period_s)
        await report_round(kube, quarantines)
