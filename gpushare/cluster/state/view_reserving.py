"""Binds in progress in the view: :class:`Reserving`.

The extender holds a pod's share before it awaits any API write (``reserve``; a filter-time
hold with ``hold_seconds``), promotes a share to guaranteed and pauses or resumes an
opportunistic pod before its annotation is written, and lets go of what a failed bind or a
lapsed hold held (``reservations``).
"""

import time
from dataclasses import replace
from datetime import datetime

from gpushare.cluster.state.quotas import KUEUE_QUEUE_LABEL
from gpushare.cluster.state.reservations import Reservation, ReservationError, per_gpu_demand
from gpushare.cluster.state.view_reads import ViewReads
from gpushare.packing.model import Assignment, Demand, Pause
from gpushare.packing.opportunistic import reservation_reason

MAX_LAPSED_HOLDS = 2
"""Filter-time holds a pod may let lapse before filter holds nothing more for it."""
MAX_LAPSED_KEPT = 100_000
"""Pods whose lapsed holds are counted before the count starts over (a bound on memory)."""


class Reserving(ViewReads):
    """The view's reservations, promotions and releases for the extender's binds."""

    def reserve(
        self,
        *,
        key: str,
        uid: str,
        node: str,
        assignment: Assignment,
        demand: Demand,
        bind_time: datetime,
        hold_seconds: float | None = None,
    ) -> Reservation:
        """Hold the assignment's share now. Raises ReservationError (holding nothing) when a GPU
        is not on the node or would be oversubscribed; replaces the pod's earlier share.
        ``hold_seconds``: a filter-time hold that lapses unless a bind replaces it."""
        current = self.node_for(node, key)
        if current is None:
            raise ReservationError(f"node {node!r} has no GPUs shared by gpushare")
        if (
            demand.opportunistic
            and not assignment.opportunistic
            and not self.may_guarantee(key, demand)
        ):
            # Its quota did not count it (a quota written since its filter): it holds no
            # guaranteed share.
            assignment = replace(assignment, opportunistic=True)
        per_gpu = per_gpu_demand(demand)
        for uuid in assignment.gpu_uuids:
            gpu = next((g for g in current.gpus if g.uuid == uuid), None)
            if gpu is None:
                raise ReservationError(f"GPU {uuid} is not on node {node}")
            reason = reservation_reason(gpu, per_gpu, assignment)
            if reason is not None:
                raise ReservationError(f"GPU {uuid} on {node}: {reason}")
        until = time.monotonic() + hold_seconds if hold_seconds is not None else None
        res = Reservation(key, uid, node, assignment, demand, bind_time, until)
        self._reservations.keep(res)
        self._apply(key)
        return res

    def may_guarantee(self, key: str, demand: Demand | None = None) -> bool:
        """May pod ``key``, which asks for the opportunistic resource, hold ``demand`` (else
        its own) as a guaranteed share: its namespace's guaranteed shares stay within every
        ResourceQuota on gpu-percent there, and no queue (Kueue) admitted it by the
        opportunistic resource's quota (gpushare.cluster.state.quotas)."""
        known = self._pods.get(key)
        if known is not None and KUEUE_QUEUE_LABEL in known.labels:
            return False
        namespace = key.partition("/")[0]
        hard = self.quotas.hard(namespace)
        if hard is None:
            return True
        demand = demand or (known.demand if known is not None else None)
        if demand is None:
            return False
        return self.guaranteed_in(namespace, besides=key) + _share(demand) <= hard

    def guaranteed_in(self, namespace: str, *, besides: str = "") -> int:
        """GPU-percent the namespace's live pods hold or ask for as guaranteed shares: every
        pod asking for gpu-percent (a quota counted it at creation), and every pod asking for
        the opportunistic resource that holds its share as guaranteed (bound so, promoted, or
        reserved so), but ``besides``. Walks the view's pods: read only for a namespace with
        a quota on gpu-percent."""
        prefix = namespace + "/"
        promoted = self._placements.promoted
        total = 0
        for key, f in self._pods.items():
            if key == besides or not key.startswith(prefix) or f.demand is None:
                continue
            if f.finished or not f.active:
                continue
            demand = f.demand
            if not demand.opportunistic:
                total += _share(demand)
                continue
            held = self._reserved.get(key)
            if (
                key in promoted
                or (f.placement is not None and not f.placement.opportunistic)
                or (held is not None and not held.assignment.opportunistic)
            ):
                total += _share(demand)
        return total

    def promote(self, key: str) -> None:
        """Count pod ``key``'s share as guaranteed from now on (its tier annotation follows
        through the watch), so no bind takes it meanwhile."""
        self._placements.promoted.add(key)
        self._apply(key)

    def unpromote(self, key: str) -> None:
        """Undo :meth:`promote` (the annotation could not be written)."""
        if key in self._placements.promoted:
            self._placements.promoted.discard(key)
            self._apply(key)

    def mark_pause(self, key: str, pause: Pause | None) -> None:
        """Count pod ``key`` as paused (``pause``) or running (None) from now on: its
        ``gpushare.io/pause`` is being written, and follows through the watch."""
        self._placements.pausing[key] = pause
        self._apply(key)

    def unmark_pause(self, key: str) -> None:
        """Undo :meth:`mark_pause` (the annotation could not be written)."""
        if key in self._placements.pausing:
            del self._placements.pausing[key]
            self._apply(key)

    def expire_holds(self, now: float | None = None) -> list[str]:
        """Let go of filter-time holds whose bind never came; returns their pod keys. Each
        pod's lapsed holds are counted (``may_hold_again``)."""
        moment = time.monotonic() if now is None else now
        lapsed = self._reservations.lapsed(moment)
        for res in lapsed:
            self.release(res)
            if len(self.lapsed_holds) >= MAX_LAPSED_KEPT:
                self.lapsed_holds.clear()
            uid_count = self.lapsed_holds.get(res.key)
            count = uid_count[1] if uid_count is not None and uid_count[0] == res.uid else 0
            self.lapsed_holds[res.key] = (res.uid, count + 1)
        return [r.key for r in lapsed]

    def may_hold_again(self, key: str, uid: str) -> bool:
        """Filter may hold a share for the pod: fewer than MAX_LAPSED_HOLDS of its holds
        lapsed without a bind. A pod that passes filter and never binds (a volume that cannot
        bind, a plugin that rejects it later) renewed its hold on every retry and kept GPUs
        from other tenants (issue 67); it is filtered and bound as before, without a hold."""
        found = self.lapsed_holds.get(key)
        return found is None or found[0] != uid or found[1] < MAX_LAPSED_HOLDS

    def release(self, res: Reservation) -> None:
        """Undo a reservation (bind failed); a later reservation of the pod is left alone."""
        if self._reserved.get(res.key) is res:
            self._reservations.drop(res.key)
            self._apply(res.key)


def _share(demand: Demand) -> int:
    """GPU-percent a demand asks for (whole GPUs: 100 each), as a quota counts it."""
    return demand.percent * demand.gpus if demand.whole else demand.percent
