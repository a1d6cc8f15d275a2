"""The pod-size mix the gpushare policy measures fragmentation against, learned online.

FGD (see :mod:`fragmentation`) judges a placement by how much of the free GPU share the
*coming* pods could no longer use, so it needs their mix: shares, GPU counts, CPU and host
memory (the stranding term reads the last two), allowed GPU models. Nobody can write that mix
down in advance, and a mix from another cluster misleads (openb default: 91.6% allocation with
the built-in prior against 96% with the trace's own mix, docs/packing.md). So the controller
counts the pods it sees, in the order it sees them, and refits the
:class:`~gpushare.packing.fragmentation.Workload` from the counts:

- after ``refit_every`` pods, and later once the pods counted since the last refit reach
  ``refit_growth`` of all counted (by default: whenever the count doubled; an estimate from n
  pods moves by about 1/n per pod, so the refits thin out as the mix settles; the mix stays
  the same between refits, so answers the extender cached stay valid; a refit bumps
  :attr:`PodMix.generation`); and at once when the first pod arrives that only some GPU
  models' nodes can hold by its size (:meth:`PodMix._newly_limited`): waiting for the count to
  double left those models unpriced while smaller pods took them (issue 69);
- memory is bounded: at most ``max_shapes`` distinct shapes are kept (the rarest go first) and
  once more than ``horizon`` pods were counted every count is halved, so the mix follows a
  cluster whose pods change;
- before the first refit the built-in prior (:meth:`Workload.default`) stands in.

A restarted controller rebuilds the mix from the pods its first list returns. The simulator
(``bench/sim``) feeds the same class in arrival order, exactly as the controller's watch does.
"""

from collections.abc import Callable, Collection, Iterable, Mapping

from gpushare.api.names import SLICES_PER_GPU
from gpushare.packing.fragmentation import TaskClass, Workload
from gpushare.packing.model import Demand
from gpushare.packing.scarcity import DemandClass, HostShape, model_prices

REFIT_EVERY = 200
"""Fewest pods counted between two refits of the mix."""
REFIT_GROWTH = 0.5
"""A refit is also due only once the pods counted since the last one reach this share of all
counted: 0.5 refits whenever the count doubles (docs/packing.md: on openb default and
gpushare40 the same allocation as refitting every 200 pods, with an eighth of the refits; each
refit makes the extender cost every node afresh)."""
REPRICE_EVERY = 50
"""Pods counted between two pricings of scarce GPU models against the free capacity."""
PRICE_TOLERANCE = 0.25
"""A pricing between refits keeps the prices in force while every model's new price is within
this share of its old one: the free capacity moves with every placement, and each change of
price drops the extender's kept answers (issue 69: 197 generations instead of 6 on
``gpuspec33`` doubled the filter's mean; at 0.25, 20 generations, the filter's cost before
any pricing and the placement within 0.11 points: bench/results/scale-flow-scarcity.md)."""
MAX_SHAPES = 2048
"""Distinct pod shapes remembered; beyond it the rarest are forgotten."""
HORIZON = 20_000
"""Pods counted before every count is halved (the mix's memory, in pods)."""

Shape = tuple[int, int, int, str | None, int]
"""(per-GPU percent, GPUs, milli-CPU, allowed GPU models, host memory bytes)."""


def shape_of(demand: Demand) -> Shape:
    """What the mix tells pods apart by. A pod without GPUs is ``(0, 0, cpu, None, memory)``."""
    gpus = demand.gpus if demand.gpus > 0 and demand.percent > 0 else 0
    percent = min(demand.percent, SLICES_PER_GPU) if gpus else 0
    return (
        percent,
        gpus,
        max(demand.cpu_milli, 0),
        (demand.gpu_model or None) if gpus else None,
        max(demand.host_memory_bytes, 0),
    )


def prices_close(new: Mapping[str, float], old: Mapping[str, float], tolerance: float) -> bool:
    """Every model's price in ``new`` within ``tolerance`` of its share of the one in ``old``
    (a model missing from one is priced 0 there: a price appearing or going is a change)."""
    for model in new.keys() | old.keys():
        a, b = new.get(model, 0.0), old.get(model, 0.0)
        if abs(a - b) > tolerance * max(abs(a), abs(b)):
            return False
    return True


class PodMix:
    """Counts of pod shapes seen, and the :class:`Workload` fitted to them."""

    def __init__(
        self,
        *,
        refit_every: int = REFIT_EVERY,
        refit_growth: float = REFIT_GROWTH,
        max_shapes: int = MAX_SHAPES,
        horizon: int = HORIZON,
        prior: Workload | None = None,
        free_capacity: Callable[[], Mapping[str, int]] | None = None,
        host_shapes: Callable[[], Mapping[str, Collection[HostShape]]] | None = None,
    ) -> None:
        if refit_every < 1 or max_shapes < 1 or horizon < 1 or refit_growth < 0:
            raise ValueError("refit_every, max_shapes and horizon must be positive")
        self.refit_every = refit_every
        self.refit_growth = refit_growth
        self.max_shapes = max_shapes
        self.horizon = horizon
        self._counts: dict[Shape, float] = {}
        self._total = 0.0
        self._since_refit = 0
        self._workload = prior or Workload.default()
        self.free_capacity = free_capacity
        """The cluster's free GPU-percent by GPU model, which the prices of scarce models are
        measured against (:mod:`gpushare.packing.scarcity`); None: no prices."""
        self.host_shapes = host_shapes
        """The kinds of node of each GPU model (GPUs, allocatable CPU and memory): a pod that
        only some models' nodes can hold is limited to them (:mod:`gpushare.packing.scarcity`);
        None: pods are limited by their node constraints only. Read at each refit (nodes
        change kind rarely; at 5,000 nodes a read costs about 3 ms)."""
        self._shapes: Mapping[str, Collection[HostShape]] | None = None
        self._size_limited = False
        """Some class of the last refit is limited to some models by its size."""
        self._demands: list[DemandClass] = []
        self.observed = 0
        """Pods counted since this mix was made (not decayed)."""
        self.generation = 0
        """Bumped whenever :attr:`workload` changes: a cache key for costs computed from it."""
        self.halvings = 0
        """How many times every count was halved: a pod counted at ``h`` weighs
        ``0.5 ** (halvings - h)`` now (:meth:`unobserve`)."""

    @property
    def workload(self) -> Workload:
        """The mix as of the last refit (the prior before the first)."""
        return self._workload

    def observe(self, demand: Demand) -> bool:
        """Count one pod; refit when due (see the module docstring). Returns True when this
        call refitted the mix."""
        shape = shape_of(demand)
        novel = shape not in self._counts
        self._counts[shape] = self._counts.get(shape, 0.0) + 1.0
        self._total += 1.0
        self.observed += 1
        if len(self._counts) > self.max_shapes:
            self._forget_rarest()
        if self._total > self.horizon:
            self._halve()
        self._since_refit += 1
        due = self._since_refit >= max(self.refit_every, self.refit_growth * self._total)
        if due or (novel and self._newly_limited(shape)):
            self.refit()
            return True
        if self.observed % REPRICE_EVERY == 0:
            self.reprice()
        return False

    def unobserve(self, demand: Demand, halvings: int) -> bool:
        """Take back a pod counted when :attr:`halvings` was ``halvings``: one deleted before it
        was ever bound was no demand to come (a tenant's throw-away pending pods would
        otherwise skew the mix; issue 67, docs/security.md). A shape forgotten since is left
        alone. It counts towards the next refit as an arrival does, so the mix goes back once
        such pods are gone. Returns True when this call refitted the mix."""
        shape = shape_of(demand)
        have = self._counts.get(shape)
        if have is None:
            return False
        weight = min(have, 0.5 ** max(0, self.halvings - halvings))
        if have - weight <= 1e-9:
            del self._counts[shape]
        else:
            self._counts[shape] = have - weight
        self._total = max(0.0, self._total - weight)
        self._since_refit += 1
        if self._since_refit >= max(self.refit_every, self.refit_growth * self._total):
            self.refit()
            return True
        return False

    def reprice(self) -> bool:
        """The prices of scarce GPU models (:mod:`gpushare.packing.scarcity`) for the mix as of
        the last refit against the free capacity now; True when they changed (the generation
        moves, as after a refit)."""
        if not self._may_price():
            return False  # no pod limited to some models: nothing to price
        prices = self._prices()
        if prices_close(prices, self._workload.prices, PRICE_TOLERANCE):
            return False
        self._workload = self._workload.with_prices(prices)
        self.generation += 1
        return True

    def observe_all(self, demands: Iterable[Demand]) -> None:
        for demand in demands:
            self.observe(demand)

    def refit(self) -> None:
        """Fit the workload to the counts now (a no-op before the first pod)."""
        self._since_refit = 0
        if not self._counts:
            return
        counts = self._counts.items()
        self._demands = [
            (count, percent, gpus, model, cpu, memory)
            for (percent, gpus, cpu, model, memory), count in counts
        ]
        self._workload = Workload.typical(
            (
                TaskClass(count, percent, gpus, cpu, model, memory)
                for (percent, gpus, cpu, model, memory), count in counts
            ),
            coverage=1.0,
        )
        self._shapes = self.host_shapes() if self.host_shapes is not None else None
        self._size_limited = self._limits(self._demands)
        if self._may_price():
            self._workload = self._workload.with_prices(self._prices())
        self.generation += 1

    def _newly_limited(self, shape: Shape) -> bool:
        """A shape first seen now that only some GPU models' nodes can hold by its size, in a
        mix whose last refit had none: refitting at once prices those models before the pods
        that could go anywhere take them (issue 69)."""
        if self._size_limited:
            return False
        percent, gpus, cpu, _, memory = shape
        return self._limits([(1.0, percent, gpus, None, cpu, memory)])

    def _limits(self, demands: list[DemandClass]) -> bool:
        """Some of ``demands`` is limited to some GPU models by the node kinds of the last
        refit (by its size, or by its node constraints); False while those are not known."""
        shapes = self._shapes
        return shapes is not None and bool(
            model_prices(demands, dict.fromkeys(shapes, 1), shapes=shapes)
        )

    def _may_price(self) -> bool:
        """Some class is limited to some models: by its node constraints, or by its size. Else
        nothing is priced, and a pricing costs nothing (no walk over the nodes)."""
        return self.free_capacity is not None and (
            self._size_limited or any(d[3] for d in self._demands)
        )

    def _prices(self) -> dict[str, float]:
        assert self.free_capacity is not None
        return model_prices(self._demands, self.free_capacity(), shapes=self._shapes)

    def shapes(self) -> dict[Shape, float]:
        """A copy of the (decayed) counts, for reports and tests."""
        return dict(self._counts)

    def _forget_rarest(self) -> None:
        keep = sorted(self._counts.items(), key=lambda kv: (-kv[1], kv[0][:3]))
        keep = keep[: max(1, self.max_shapes // 2)]
        self._counts = dict(keep)
        self._total = sum(self._counts.values())

    def _halve(self) -> None:
        self.halvings += 1
        self._counts = {k: v / 2 for k, v in self._counts.items() if v / 2 >= 0.25}
        self._total = sum(self._counts.values())
