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

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpushare.api.names import SLICES_PER_GPU
from gpushare.packing.model import Demand, GpuState, Tenant


@dataclass(frozen=True)
class Waiting:
    """A pod waiting for a GPU by its guaranteed share: the scheduler tried it and no GPU had
    the room."""

    key: str
    demand: Demand
    since: float
    """When it started waiting (its creation), on the clock of ``Tenant.placed_at``."""


def promoted(
    gpu: GpuState, waiting: Sequence[Waiting], placeable: Callable[[Demand], bool]
) -> list[str]:
    """Keys of the running opportunistic tenants of ``gpu`` to promote now, oldest first, each
    taking its share before the next is tried; a ``waiting`` pod that came before a tenant,
    fits the room left and is ``placeable`` on ``gpu`` takes its share first."""
    free = SLICES_PER_GPU - gpu.used_percent
    tenants = [t for t in gpu.tenants if t.opportunistic and t.pause is None]
    if not tenants:
        return []
    queue: list[tuple[float, int, Tenant | Waiting]] = [(t.placed_at, 1, t) for t in tenants]
    queue += [(w.since, 0, w) for w in waiting if w.demand.gpus == 1]
    out: list[str] = []
    for _, _, party in sorted(queue, key=lambda q: (q[0], q[1])):
        if isinstance(party, Waiting):
            if party.demand.percent <= free and placeable(party.demand):
                free -= party.demand.percent
        elif party.percent <= free:
            free -= party.percent
            out.append(party.key)
    return out
