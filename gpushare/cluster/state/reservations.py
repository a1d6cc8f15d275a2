"""Binds in progress and filter-time holds (:class:`Reservation`), and per node the pods whose
Allocate is still to come: what the extender's bind gate waits on.

A reservation holds a pod's GPU share in this process before any API write is awaited, so two
binds can never oversubscribe a GPU; the view counts it as the pod's placement until the pod's
own placement annotations come back through the watch (or the bind fails and releases it).
"""

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime

from gpushare.api.names import SLICES_PER_GPU
from gpushare.cluster.state.pod_facts import PodFacts
from gpushare.packing.model import Assignment, Demand


class ReservationError(Exception):
    """A reservation that would oversubscribe a GPU or names a GPU not on the node."""


@dataclass(frozen=True)
class Reservation:
    """A bind in progress: the GPU share is held before any API write is awaited. With
    ``held_until`` set it is a *hold* taken at filter time (``--hold-in-filter``), waiting for
    its bind; it lapses at that ``time.monotonic()`` deadline."""

    key: str
    uid: str
    node: str
    assignment: Assignment
    demand: Demand
    bind_time: datetime
    held_until: float | None = None

    @property
    def is_hold(self) -> bool:
        return self.held_until is not None


def per_gpu_demand(demand: Demand) -> Demand:
    """What a (possibly multi-GPU) demand asks of each one of its GPUs."""
    if demand.gpus > 1:
        return replace(demand, gpus=1, percent=SLICES_PER_GPU)
    return demand


class Reservations:
    """Reservations by pod key, indexed by node, and the pods waiting for their Allocate.

    ``progress`` is told the node whenever a pod there stopped waiting for its Allocate or a
    reservation there ended: it wakes the binds waiting on that node."""

    def __init__(self, *, progress: Callable[[str], None]) -> None:
        self.by_key: dict[str, Reservation] = {}
        self._progress = progress
        self._reserved_on: dict[str, set[str]] = {}
        self._held_on: dict[str, set[str]] = {}
        self._awaiting: dict[str, set[str]] = {}
        self._awaiting_node: dict[str, str] = {}
        self._allocations_seen: dict[str, int] = {}

    def keep(self, res: Reservation) -> None:
        """Keep ``res``, in place of the pod's earlier reservation."""
        self.drop(res.key)
        self.by_key[res.key] = res
        if not res.assignment.gpu_uuids:
            return  # host resources only: nothing will wait for an Allocate
        # A hold's pod is not bound: nothing for the gate to wait for yet.
        index = self._held_on if res.is_hold else self._reserved_on
        index.setdefault(res.node, set()).add(res.key)

    def drop(self, key: str) -> None:
        """End the pod's reservation, if it has one."""
        res = self.by_key.pop(key, None)
        if res is None:
            return
        index = self._held_on if res.is_hold else self._reserved_on
        keys = index.get(res.node)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del index[res.node]
        self._progress(res.node)

    def lapsed(self, moment: float) -> list[Reservation]:
        """The holds whose deadline is at or before ``moment``."""
        return [
            r for r in self.by_key.values() if r.held_until is not None and r.held_until <= moment
        ]

    def track_awaiting(self, key: str, f: PodFacts | None) -> None:
        """Note whether pod ``key`` (None: gone) waits for its Allocate, and where."""
        old = self._awaiting_node.pop(key, None)
        if old is not None:
            keys = self._awaiting[old]
            keys.discard(key)
            if not keys:
                del self._awaiting[old]
        if f is not None and f.awaiting_allocation and f.node is not None:
            self._awaiting.setdefault(f.node, set()).add(key)
            self._awaiting_node[key] = f.node
        elif old is not None:
            self._allocations_seen[old] = self._allocations_seen.get(old, 0) + 1
            self._progress(old)

    def awaiting_allocation(self, node: str, *, exclude: str = "") -> list[str]:
        """Pods on ``node`` whose Allocate is still to come: bound with state ``assumed`` and
        Pending, or being bound by this process right now."""
        keys = self._awaiting.get(node, set()) | self._reserved_on.get(node, set())
        keys.discard(exclude)
        return sorted(keys)

    def pending_on(self, node: str) -> Iterator[str]:
        """Pods on ``node`` waiting for their Allocate, being bound, or held there by filter
        (a pod may come up twice); nothing is copied."""
        for index in (self._awaiting, self._reserved_on, self._held_on):
            keys = index.get(node)
            if keys:
                yield from keys

    def held_on(self, node: str) -> set[str]:
        """Pods holding a share on ``node`` from filter (``--hold-in-filter``) whose bind has
        not come yet: they will be waiting for their Allocate there shortly."""
        return self._held_on.get(node, set())

    def allocations_seen(self, node: str) -> int:
        """How many pods on ``node`` stopped waiting for their Allocate (allocated, started,
        failed or gone) since this process began: when it does not move while pods wait, the
        node agent or the kubelet is not answering."""
        return self._allocations_seen.get(node, 0)
