"""Binds in progress in the view: :class:`Reserving`.

The extender holds a pod's share before it awaits any API write (``reserve``; a filter-time
hold with ``hold_seconds``), promotes a share to guaranteed and pauses or resumes an
opportunistic pod before its annotation is written, and lets go of what a failed bind or a
lapsed hold held (``reservations``).
"""

import time
from datetime import datetime

from gpushare.cluster.state.reservations import Reservation, ReservationError, per_gpu_demand
from gpushare.cluster.state.view_reads import ViewReads
from gpushare.packing.model import Assignment, Demand, Pause
from gpushare.packing.opportunistic import reservation_reason


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
        """Let go of filter-time holds whose bind never came; returns their pod keys."""
        moment = time.monotonic() if now is None else now
        lapsed = self._reservations.lapsed(moment)
        for res in lapsed:
            self.release(res)
        return [r.key for r in lapsed]

    def release(self, res: Reservation) -> None:
        """Undo a reservation (bind failed); a later reservation of the pod is left alone."""
        if self._reserved.get(res.key) is res:
            self._reservations.drop(res.key)
            self._apply(res.key)
