"""Which running opportunistic tenants take a guaranteed share that frees: first come, first
served, with the pods still waiting for one.

An opportunistic tenant is promoted (``Opportunism.promotions``) once its request fits among
its GPU's guaranteed shares. Room that frees goes in the order the parties started waiting
for it: a tenant since it was placed, a pod the scheduler could not place by its guaranteed
share (:class:`Waiting`) since its creation. A waiting pod counts only where its share would
go on the GPU now without evicting anyone, so a tenant's work is never thrown away for it.
Opting in thus never makes a pod that waits for its guarantee wait longer (docs/packing.md,
"The sharing contract").
"""

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from gpushare.api.names import SLICES_PER_GPU
from gpushare.packing.model import Demand, GpuState, Tenant

MAX_CHECKS = 16
"""Waiting pods asked about per GPU and round (each ask is an admission check): the oldest
that fit the room first. Pending pods are any tenant's to create, so their number must not set
the leader's work; a pod beyond this many waits as it did before the rule."""


@dataclass(frozen=True)
class Waiting:
    """A pod waiting for a GPU by its guaranteed share: the scheduler tried it and no GPU had
    the room."""

    key: str
    demand: Demand
    since: float
    """When it started waiting (its creation), on the clock of ``Tenant.placed_at``."""


@dataclass(frozen=True)
class WaitingPods:
    """The waiting pods of one promotion round, by the node they wait for room on."""

    anywhere: tuple[Waiting, ...] = ()
    by_node: Mapping[str, tuple[Waiting, ...]] = field(default_factory=dict)

    def on(self, node: str) -> list[Waiting]:
        return [*self.anywhere, *self.by_node.get(node, ())]


NO_WAITING = WaitingPods()


def promoted(
    gpu: GpuState, waiting: Iterable[Waiting], placeable: Callable[[Demand], bool]
) -> list[str]:
    """Keys of the running opportunistic tenants of ``gpu`` to promote now, oldest first, each
    taking its share before the next is tried; a ``waiting`` pod that came before a tenant,
    fits the room left and is ``placeable`` on ``gpu`` takes its share first (at most
    :data:`MAX_CHECKS` asked)."""
    free = SLICES_PER_GPU - gpu.used_percent
    tenants = [t for t in gpu.tenants if t.opportunistic and t.pause is None]
    if not any(t.percent <= free for t in tenants):
        return []
    last = max(t.placed_at for t in tenants)
    queue: list[tuple[float, int, Tenant | Waiting]] = [(t.placed_at, 1, t) for t in tenants]
    queue += [
        (w.since, 0, w)
        for w in waiting
        if w.since < last and w.demand.gpus == 1 and w.demand.percent <= free
    ]
    out: list[str] = []
    checks = 0
    for _, _, party in sorted(queue, key=lambda q: (q[0], q[1])):
        if isinstance(party, Waiting):
            if party.demand.percent <= free and checks < MAX_CHECKS:
                checks += 1
                if placeable(party.demand):
                    free -= party.demand.percent
        elif party.percent <= free:
            free -= party.percent
            out.append(party.key)
    return out
