"""Which GPUs each gpushare pod holds now (its *tenancy*), and so each GPU's tenants.

A pod's tenancy comes from exactly two sources: its reservation while this process binds or
holds it, else its placement annotations. A placement stops counting once the pod finished, or
when it was written but the pod was never bound within ``stale_assume_seconds`` of its bind
time. Every change gives the GPUs concerned a new tenant list (``GpuState.tenants``; the
packing's kept totals rely on a new list) and moves their nodes' versions.
"""

from collections.abc import Callable, Mapping
from datetime import datetime

from gpushare.api.bounds import parse_rfc3339
from gpushare.api.errors import InvalidInputError
from gpushare.api.names import ANN_PAUSE, SLICES_PER_GPU
from gpushare.api.pause import PauseRequest
from gpushare.cluster.state.pod_facts import PodFacts
from gpushare.cluster.state.reservations import Reservation, per_gpu_demand
from gpushare.cluster.state.tenancy import Tenancies
from gpushare.packing.model import Demand, GpuState, Pause, Tenant


def pause_of(request: PauseRequest) -> Pause:
    """The policy's view of a pod's ``gpushare.io/pause`` (an unreadable time reads as 0)."""
    try:
        since = parse_rfc3339(request.since, field=ANN_PAUSE).timestamp()
    except InvalidInputError:
        since = 0.0
    return Pause(request.reason, since, frozenset(request.for_pods))


class Placements:
    """Tenancies by pod and tenants by GPU, on the GPUs of the node inventory (``gpus``,
    ``gpu_node``; ``bump`` moves a node's version)."""

    def __init__(
        self,
        *,
        gpus: Mapping[str, GpuState],
        gpu_node: Mapping[str, str],
        bump: Callable[[str], None],
        clock: Callable[[], datetime],
    ) -> None:
        self.by_pod: dict[str, dict[str, Tenant]] = {}
        """Pod key -> GPU uuid -> the pod as a tenant of that GPU."""
        self.by_gpu: dict[str, dict[str, Tenant]] = {}
        """GPU uuid -> pod key -> tenant: each GPU's tenants, kept for GPUs whose node is not
        (yet) known too."""
        self._gpus = gpus
        self._gpu_node = gpu_node
        self._bump = bump
        self._clock = clock
        self.promoted: set[str] = set()
        """Pods promoted from opportunistic to guaranteed by this process, counted so before
        their tier annotation comes back through the watch (no bind may take the share
        meanwhile)."""
        self.pausing: dict[str, Pause | None] = {}
        """Pods this process asked to pause (a :class:`Pause`) or to run again (None), counted
        so before their ``gpushare.io/pause`` comes back through the watch (no filter counts
        a paused pod's compute, no resumption round resumes it twice)."""
        self.opportunistic: set[str] = set()
        """GPUs with an opportunistic or a paused tenant (what the promotion and resumption
        rounds read), kept as tenants change: scanning every GPU for them every few seconds
        took tens of milliseconds of the event loop at 5,000 nodes (docs/scale.md)."""
        self.governed: set[str] = set()
        """GPUs the governor reads: an opportunistic tenant, or two profiled ones."""

    def update(
        self,
        key: str,
        res: Reservation | None,
        f: PodFacts | None,
        *,
        stale_after: float,
        tenancies: Tenancies,
    ) -> bool:
        """Set pod ``key``'s tenancy from its reservation ``res``, else from what the watch
        said of it (``f``); True when it changed."""
        new = self._desired(key, res, f, stale_after=stale_after, tenancies=tenancies)
        old = self.by_pod.get(key, {})
        if new == old:
            return False
        for uuid in old:
            tenants = self.by_gpu.get(uuid)
            if tenants is not None:
                tenants.pop(key, None)
                if not tenants:
                    del self.by_gpu[uuid]
        for uuid, tenant in new.items():
            self.by_gpu.setdefault(uuid, {})[key] = tenant
        if new:
            self.by_pod[key] = new
        else:
            self.by_pod.pop(key, None)
        for uuid in set(old) | set(new):
            listed = list(self.by_gpu.get(uuid, {}).values())
            self._index(uuid, listed)
            gpu = self._gpus.get(uuid)
            if gpu is not None:
                gpu.tenants = listed
                self._bump(self._gpu_node[uuid])
        return True

    def _index(self, uuid: str, tenants: list[Tenant]) -> None:
        """Keep :attr:`opportunistic` and :attr:`governed` true of GPU ``uuid``."""
        opportunistic = any(t.opportunistic or t.pause is not None for t in tenants)
        profiled = sum(1 for t in tenants if t.profile is not None)
        for kept, member in (
            (self.opportunistic, opportunistic),
            (self.governed, opportunistic or profiled >= 2),
        ):
            if member:
                kept.add(uuid)
            else:
                kept.discard(uuid)

    def _desired(
        self,
        key: str,
        res: Reservation | None,
        f: PodFacts | None,
        *,
        stale_after: float,
        tenancies: Tenancies,
    ) -> dict[str, Tenant]:
        if res is not None:
            return self._tenants(
                key,
                res.assignment.gpu_uuids,
                res.demand,
                res.assignment.memory_limit_bytes,
                res.assignment.thread_percent,
                opportunistic=res.assignment.opportunistic,
                placed_at=res.bind_time.timestamp(),
            )
        if f is None or f.finished or f.placement is None:
            return {}
        if f.node is None:
            age = (self._clock() - f.placement.bind_time).total_seconds()
            if age > stale_after:
                return {}
        demand = f.demand
        if demand is None:
            demand = Demand(
                percent=min(f.placement.guaranteed_percent, SLICES_PER_GPU),
                tenancy=tenancies.tenancy(key.partition("/")[0]),
            )
        return self._tenants(
            key,
            f.placement.gpu_uuids,
            demand,
            f.placement.memory_limit_bytes,
            f.placement.thread_percent,
            opportunistic=f.placement.opportunistic and key not in self.promoted,
            placed_at=f.placement.bind_time.timestamp(),
            pause=self._pause(key, f),
        )

    def _pause(self, key: str, f: PodFacts) -> Pause | None:
        """The pod's pause as this process asked it, else as its annotation says."""
        if key in self.pausing:
            return self.pausing[key]
        return None if f.pause is None else pause_of(f.pause)

    def seen(self, key: str, f: PodFacts) -> None:
        """The watch shows pod ``key`` as ``f``: a pause or resumption this process asked for
        that the pod now carries is the annotation's to tell from here on."""
        if key not in self.pausing:
            return
        asked = self.pausing[key]
        if (None if f.pause is None else pause_of(f.pause)) == asked:
            del self.pausing[key]

    def _tenants(
        self,
        key: str,
        uuids: tuple[str, ...],
        demand: Demand,
        memory_limit: int,
        threads: int,
        *,
        opportunistic: bool = False,
        placed_at: float = 0.0,
        pause: Pause | None = None,
    ) -> dict[str, Tenant]:
        """The pod as a tenant of each of its GPUs, with the MPS thread cap it was given (a
        batch pod alone may run uncapped: its neighbours feel all of it, docs/packing.md),
        and its tier (an opportunistic tenant holds no guaranteed share)."""
        out: dict[str, Tenant] = {}
        per_gpu = per_gpu_demand(demand)
        for uuid in uuids:
            memory = memory_limit
            if memory <= 0:
                gpu = self._gpus.get(uuid)
                memory = gpu.memory_bytes if gpu is not None else 0
            out[uuid] = Tenant(
                key=key,
                percent=per_gpu.percent,
                memory_bytes=memory,
                gpu_class=demand.gpu_class,
                processes=demand.processes,
                profile=demand.profile,
                thread_percent=threads if threads > 0 else None,
                tenancy=demand.tenancy,
                opportunistic=opportunistic,
                workload=demand.workload,
                placed_at=placed_at,
                opted_in=demand.opportunistic,
                pause=pause,
            )
        return out
