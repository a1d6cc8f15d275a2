"""GPU fragmentation measured against the workload, and FGD placement.

From Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation
Gradient Descent" (USENIX ATC'23). A node's unallocated GPU capacity is a *fragment* for a task
when the task cannot use it: the node lacks the task's CPU, has too few GPUs with enough free
share, or has GPUs of a model the task may not use. For a task that does fit, the fragment is
the free share stranded on GPUs too full for it. Tasks that use no GPU see every free GPU share
as a fragment. The node's fragmentation against a workload M is the expectation over M's task
popularity:

    F_n(M) = sum_m p_m * F_n(m)

with F_n(m) = all free GPU share when m does not fit on n (lack of GPU, CPU or model access),
else the free share of GPUs whose free share is below m's per-GPU demand. Fragmentation
Gradient Descent places each task where F_n(M) grows least (or falls most).

Units here are GPU-percent (100 = one GPU), the extender's unit. Evaluations are memoised on the
node's *shape* (sorted free shares, free CPU, GPU model): nodes repeat shapes constantly and a
node's shape changes only when a pod lands on or leaves it, so the extender's per-node cost
stays a dictionary lookup most of the time.
"""

import bisect
import copy
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from gpushare.api.names import SLICES_PER_GPU
from gpushare.packing.fit import gpu_fit, model_allows
from gpushare.packing.model import Demand, NodeState

_MEMO_LIMIT = 400_000
RELIABLE_SHARE = 0.05
"""Popularity of the tasks fitting a gap from which on the gap counts as filled by them."""


@dataclass(frozen=True)
class TaskClass:
    """One kind of task in the workload: what it asks for and how popular it is."""

    weight: float
    """Relative popularity (normalised by :class:`Workload`)."""
    percent: int
    """Per-GPU share in GPU-percent (100 for whole GPUs); 0 for a task without GPUs."""
    gpus: int = 1
    """GPUs the task needs (0 for a CPU-only task)."""
    cpu_milli: int = 0
    gpu_model: str | None = None
    """Allowed GPU models, ``"A|B"``; None = any."""
    host_memory_bytes: int = 0


@dataclass(frozen=True)
class _Group:
    percent: int
    gpus: int
    cpus: tuple[int, ...]
    cumulative: tuple[float, ...]
    """cumulative[i] = weight of the tasks with the i smallest CPU demands."""
    total: float


_Rows = tuple[float, tuple[tuple[int, int, float, float, float], ...]]
"""(weight of the tasks no GPU of the model serves, per task group: its terms)."""


class Workload:
    """The distribution of task demands fragmentation is measured against.

    The FGD paper uses the "typical" tasks: the most popular demand shapes that together cover
    most tasks. :meth:`typical` builds that from observed demands; :meth:`default` is a small
    prior for a cluster that has not observed anything yet.
    """

    def __init__(self, tasks: Sequence[TaskClass]) -> None:
        total = sum(t.weight for t in tasks)
        if not tasks or total <= 0:
            raise ValueError("a workload needs at least one task class with positive weight")
        self.tasks: tuple[TaskClass, ...] = tuple(
            TaskClass(
                t.weight / total, t.percent, t.gpus, t.cpu_milli, t.gpu_model, t.host_memory_bytes
            )
            for t in tasks
        )
        self.basis: Workload = self
        """The workload without prices this one shares everything else with (itself, unless
        made by :meth:`with_prices`): what is worked out from the tasks is kept by it, and
        costs under it stay good when only the prices move."""
        self.prices: Mapping[str, float] = {}
        """Cost per GPU-percent a placement takes on a GPU of each model: what the pods that
        may use only some models would lose (:mod:`gpushare.packing.scarcity`); 0 for a model
        not named."""
        self._tables: dict[str, tuple[float, tuple[_Group, ...]]] = {}
        self._cpu_points: dict[str, tuple[int, ...]] = {}
        """Per GPU model, every CPU demand of its groups, sorted: a node's free CPU matters to
        :meth:`fragmentation` only through where it falls among them."""
        self._waste: dict[str, tuple[float, ...]] = {}
        self._memo: dict[tuple[tuple[int, ...], int | None, str], float] = {}
        """Fragmentation by (free shares, rank of the free CPU among the model's CPU demands,
        model): nodes whose free CPU differs but falls between the same two task demands get
        one evaluation (free CPU varies with every pod placed; its rank rarely does)."""
        self._rows: dict[tuple[str, int | None], _Rows] = {}
        """Per (model, free CPU rank): the task groups' terms (:meth:`_rows_for`)."""
        gpu_tasks = [t for t in self.tasks if t.gpus > 0 and t.percent > 0]
        share = sum(t.weight * t.percent * t.gpus for t in gpu_tasks)
        cpu = sum(t.weight * t.cpu_milli for t in gpu_tasks)
        memory = sum(t.weight * t.host_memory_bytes for t in gpu_tasks)
        self.cpu_per_percent: float | None = cpu / share if share > 0 and cpu > 0 else None
        """Mean milli-CPU GPU tasks bring per GPU-percent (None: the workload has no CPU)."""
        self.memory_per_percent: float | None = memory / share if share > 0 and memory > 0 else None
        """Mean host memory bytes GPU tasks bring per GPU-percent (None: not known)."""

    def with_prices(self, prices: Mapping[str, float]) -> "Workload":
        """The same workload with other :attr:`prices` (what it worked out is shared: none of
        it reads the prices); its :attr:`basis` when ``prices`` is empty."""
        if not prices:
            return self.basis
        other = copy.copy(self.basis)
        other.prices = dict(prices)
        return other

    @classmethod
    def typical(cls, tasks: Iterable[TaskClass], *, coverage: float = 0.95) -> "Workload":
        """The most popular task shapes covering ``coverage`` of ``tasks`` (each counted with
        its weight), weighted by popularity: the FGD paper's "typical pods" at 0.95; 1.0 keeps
        every shape, rare multi-GPU and model-restricted ones included."""
        counts: dict[tuple[int, int, int, str | None, int], float] = {}
        n = 0.0
        for t in tasks:
            key = (t.percent, t.gpus, t.cpu_milli, t.gpu_model or None, t.host_memory_bytes)
            counts[key] = counts.get(key, 0.0) + t.weight
            n += t.weight
        if n <= 0:
            raise ValueError("no demands to learn a workload from")
        ranked = sorted(
            counts.items(),
            key=lambda kv: (-kv[1], kv[0][2], kv[0][0], kv[0][1], kv[0][3] or "", kv[0][4]),
        )
        chosen: list[TaskClass] = []
        covered = 0.0
        for (percent, gpus, cpu, model, memory), count in ranked:
            chosen.append(TaskClass(count, percent, gpus, cpu, model, memory))
            covered += count
            if covered >= coverage * n - 1e-9:
                break
        return cls(chosen)

    def stranded(self, free: int, cpu_free: int | None, memory_free: int | None) -> float:
        """GPU-percent of ``free`` that the node's CPU and memory cannot feed, at the workload's
        mean CPU and memory per GPU-percent: the fragmentation that builds up over the next
        several tasks, which FGD's one-task look-ahead misses."""
        worst = 0.0
        if cpu_free is not None and self.cpu_per_percent:
            worst = max(worst, free - cpu_free / self.cpu_per_percent)
        if memory_free is not None and self.memory_per_percent:
            worst = max(worst, free - memory_free / self.memory_per_percent)
        return worst

    def waste_table(self, model: str) -> tuple[float, ...]:
        """``table[f]``: GPU-percent of a GPU with ``f`` free that is expected to stay unused for
        good, looking past the next task (FGD's measure looks one task ahead only).

        The gap is filled by the GPU tasks that fit it, in proportion to their popularity, and
        what each leaves is valued the same way; but a gap only the rare tasks fit mostly stays
        empty (there are many such gaps and few such tasks), so its filling is trusted only in
        proportion ``min(1, P(fit) / RELIABLE_SHARE)``. A 36% gap (a 32% task fills it to 4) is
        worth far less waste than a 21% gap (only the rare 5-16% tasks fit), which FGD ranks
        the other way round."""
        table = self._waste.get(model)
        if table is not None:
            return table
        sizes: dict[int, float] = {}
        for t in self.tasks:
            if t.gpus > 0 and t.percent > 0 and model_allows(t.gpu_model, model):
                p = min(t.percent, SLICES_PER_GPU)
                sizes[p] = sizes.get(p, 0.0) + t.weight * t.gpus
        total = sum(sizes.values())
        values = [0.0] * (SLICES_PER_GPU + 1)
        if total > 0:
            ranked = sorted((p, w / total) for p, w in sizes.items())
            for f in range(1, SLICES_PER_GPU + 1):
                fitting = [(p, w) for p, w in ranked if p <= f]
                p_fit = sum(w for _, w in fitting)
                if p_fit <= 0:
                    values[f] = float(f)
                    continue
                trust = min(1.0, p_fit / RELIABLE_SHARE)
                filled = sum(w * values[f - p] for p, w in fitting) / p_fit
                values[f] = (1.0 - trust) * f + trust * filled
        else:
            values = [float(f) for f in range(SLICES_PER_GPU + 1)]
        table = tuple(values)
        self._waste[model] = table
        return table

    @classmethod
    def default(cls) -> "Workload":
        return _default_workload()

    # -- evaluation ------------------------------------------------------------------------

    def _table(self, model: str) -> tuple[float, tuple[_Group, ...]]:
        table = self._tables.get(model)
        if table is not None:
            return table
        constant = 0.0
        grouped: dict[tuple[int, int], list[tuple[int, float]]] = {}
        for t in self.tasks:
            if t.gpus <= 0 or t.percent <= 0 or not model_allows(t.gpu_model, model):
                constant += t.weight
            else:
                grouped.setdefault((t.percent, t.gpus), []).append((t.cpu_milli, t.weight))
        groups: list[_Group] = []
        for (percent, gpus), items in sorted(grouped.items()):
            items.sort()
            cumulative: list[float] = [0.0]
            for _, w in items:
                cumulative.append(cumulative[-1] + w)
            groups.append(
                _Group(
                    percent=percent,
                    gpus=gpus,
                    cpus=tuple(c for c, _ in items),
                    cumulative=tuple(cumulative),
                    total=cumulative[-1],
                )
            )
        table = (constant, tuple(groups))
        self._tables[model] = table
        self._cpu_points[model] = tuple(sorted({c for g in groups for c in g.cpus}))
        return table

    def cpu_points(self, model: str) -> tuple[int, ...]:
        """Every CPU demand of the task groups a GPU of ``model`` serves, ascending: where a
        node's free CPU falls among them (``bisect_right``) is all :meth:`fragmentation` reads
        of it."""
        self._table(model)
        return self._cpu_points[model]

    def fragmentation(self, free: tuple[int, ...], cpu_free: int | None, model: str) -> float:
        """Expected fragmented GPU-percent of a node whose GPUs have ``free`` shares (sorted
        ascending), with ``cpu_free`` milli-CPU (None = not tracked) and GPUs of ``model``.

        Worked out from the task groups' terms for the free CPU's rank (:meth:`_rows`), in
        the order and with the float operations of :meth:`fragmentation_reference`, so the
        result is its float (the filter meets new nodes and shapes mostly here: a node's free
        shares after one more pod, at 5,000 nodes or after a refit; docs/scale.md)."""
        points = self._cpu_points.get(model)
        if points is None:
            self._table(model)
            points = self._cpu_points[model]
        rank = None if cpu_free is None else bisect.bisect_right(points, cpu_free)
        key = (free, rank, model)
        cached = self._memo.get(key)
        if cached is not None:
            return cached
        total = sum(free)
        if total <= 0:
            return 0.0
        rows = self._rows.get((model, rank))
        if rows is None:
            rows = self._rows_for(model, rank, cpu_free)
        frag = rows[0] * total
        n = len(free)
        idx = 0
        below = 0  # sum of free shares below the current group's percent
        for percent, gpus, fits_cpu, rest, whole in rows[1]:
            while idx < n and free[idx] < percent:
                below += free[idx]
                idx += 1
            if n - idx >= gpus:
                frag += fits_cpu * below + rest * total
            else:
                frag += whole * total
        if len(self._memo) >= _MEMO_LIMIT:
            self._memo.clear()
        self._memo[key] = frag
        return frag

    def _rows_for(self, model: str, rank: int | None, cpu_free: int | None) -> _Rows:
        """Per task group of ``model``, for a free CPU of ``rank``: (percent, GPUs, weight of
        the tasks whose CPU fits, weight of those whose CPU does not, all its weight) -- what
        :meth:`fragmentation_reference` works out per group on every call (``cpu_free``: any
        free CPU of that rank; the groups' CPU demands are among the rank's points)."""
        constant, groups = self._table(model)
        rows = []
        for g in groups:
            if cpu_free is None:
                fits_cpu = g.total
            else:
                fits_cpu = g.cumulative[bisect.bisect_right(g.cpus, cpu_free)]
            rows.append((g.percent, g.gpus, fits_cpu, g.total - fits_cpu, g.total))
        out = (constant, tuple(rows))
        self._rows[(model, rank)] = out
        return out

    def fragmentation_reference(
        self, free: tuple[int, ...], cpu_free: int | None, model: str
    ) -> float:
        """:meth:`fragmentation` as the FGD sum over the task groups, worked out afresh (no
        memo, no kept terms): the reference the tests hold it to."""
        constant, groups = self._table(model)
        total = sum(free)
        if total <= 0:
            return 0.0
        frag = constant * total
        n = len(free)
        idx = 0
        below = 0  # sum of free shares below the current group's percent
        for g in groups:
            while idx < n and free[idx] < g.percent:
                below += free[idx]
                idx += 1
            if cpu_free is None:
                fits_cpu = g.total
            else:
                fits_cpu = g.cumulative[bisect.bisect_right(g.cpus, cpu_free)]
            if n - idx >= g.gpus:
                frag += fits_cpu * below + (g.total - fits_cpu) * total
            else:
                frag += g.total * total
        return frag


@lru_cache(maxsize=1)
def _default_workload() -> Workload:
    # A prior, not data: whole GPUs dominate, with a spread of common fractions and a few
    # multi-GPU tasks. The controller replaces it with Workload.typical() of the pods it sees.
    return Workload(
        [
            TaskClass(0.40, 100, 1),
            TaskClass(0.05, 100, 2),
            TaskClass(0.03, 100, 4),
            TaskClass(0.02, 100, 8),
            TaskClass(0.10, 50, 1),
            TaskClass(0.10, 25, 1),
            TaskClass(0.08, 75, 1),
            TaskClass(0.07, 30, 1),
            TaskClass(0.05, 10, 1),
        ]
    )


# --- nodes and placements ------------------------------------------------------------------


def node_model(node: NodeState) -> str:
    """The node's GPU model (its first GPU's; nodes are homogeneous in practice)."""
    return node.gpus[0].model if node.gpus else ""


def free_shares(node: NodeState) -> tuple[int, ...]:
    """Sorted free GPU-percent of the node's healthy GPUs (unhealthy GPUs are not capacity)."""
    return tuple(sorted(g.free_percent for g in node.gpus if g.healthy))


def node_fragmentation(node: NodeState, workload: Workload) -> float:
    return workload.fragmentation(free_shares(node), node.cpu_milli_free, node_model(node))


@dataclass(frozen=True)
class Option:
    """One way to place a demand on a node and what it does to the node's fragmentation."""

    gpus: tuple[int, ...]
    """Positions in ``node.gpus``."""
    frag_delta: float
    """Change of the node's fragmentation (GPU-percent); negative is good."""
    free_after: int
    """Free share left on the (first) chosen GPU: the best-fit tie-breaker."""
    strand_delta: float = 0.0
    """Change of :meth:`Workload.stranded` on the node (GPU-percent)."""
    waste_delta: float = 0.0
    """Change of :meth:`Workload.waste_table` on the chosen GPU(s) (GPU-percent)."""
    price: float = 0.0
    """What taking the GPU share costs the pods limited to the node's model
    (:attr:`Workload.prices` x GPU-percent taken)."""


def moved_shares(free: tuple[int, ...], old: int, new: int, count: int = 1) -> tuple[int, ...]:
    """``free`` (ascending) with ``count`` GPUs' free share ``old`` become ``new``."""
    items = list(free)
    for _ in range(count):
        items.remove(old)
    for _ in range(count):
        bisect.insort(items, new)
    return tuple(items)


def placement_options(
    node: NodeState, demand: Demand, workload: Workload, *, every_gpu: bool = False
) -> list[Option]:
    """Every distinct way ``demand`` fits on ``node``, with its fragmentation change.

    Fractional demands: one option per distinct free share among fitting GPUs (for
    fragmentation GPUs with equal free share are interchangeable; the lowest index represents
    them). ``every_gpu`` keeps one option per fitting GPU instead (idle GPUs still collapse into
    one), for callers that tell GPUs apart by their tenants. Whole-GPU demands: the first
    ``gpus`` idle fitting GPUs by index (idle GPUs are interchangeable).
    """
    if node.cpu_milli_free is not None and demand.cpu_milli > node.cpu_milli_free:
        return []
    if node.memory_free_bytes is not None and demand.host_memory_bytes > node.memory_free_bytes:
        return []
    percent = min(demand.percent, SLICES_PER_GPU)
    gpus = max(demand.gpus, 0) if percent > 0 else 0
    used = [g.totals()[0] for g in node.gpus]
    fitting: list[int] = []
    if gpus:
        fitting = _fitting_gpus(node, demand, used, percent=percent, every_gpu=every_gpu)
        if len(fitting) < (gpus if demand.whole else 1):
            return []
    model = node_model(node)
    free = tuple(
        sorted(SLICES_PER_GPU - u for g, u in zip(node.gpus, used, strict=True) if g.healthy)
    )
    cpu_after = None if node.cpu_milli_free is None else node.cpu_milli_free - demand.cpu_milli
    memory = node.memory_free_bytes
    memory_after = None if memory is None else memory - demand.host_memory_bytes
    before = workload.fragmentation(free, node.cpu_milli_free, model)
    total = sum(free)
    strand = workload.stranded(total - percent * gpus, cpu_after, memory_after) - (
        workload.stranded(total, node.cpu_milli_free, memory)
    )
    options: list[Option] = []
    price = workload.prices.get(model, 0.0) * (percent * gpus)
    if gpus == 0:  # CPU-only: only the node's free CPU and memory change
        after = workload.fragmentation(free, cpu_after, model)
        return [Option((), after - before, 0, strand)]
    waste = workload.waste_table(model)
    if demand.whole:
        chosen = fitting[:gpus]
        after = workload.fragmentation(
            moved_shares(free, SLICES_PER_GPU, 0, gpus), cpu_after, model
        )
        return [
            Option(tuple(chosen), after - before, 0, strand, -gpus * waste[SLICES_PER_GPU], price)
        ]
    seen: set[int] = set()
    for i in fitting:
        f = SLICES_PER_GPU - used[i]
        key = (-1 if not node.gpus[i].tenants else i) if every_gpu else f
        if key in seen:
            continue
        seen.add(key)
        after = workload.fragmentation(moved_shares(free, f, f - percent), cpu_after, model)
        wasted = waste[f - percent] - waste[f]
        options.append(Option((i,), after - before, f - percent, strand, wasted, price))
    return options


def _fitting_gpus(
    node: NodeState, demand: Demand, used: list[int], *, percent: int, every_gpu: bool
) -> list[int]:
    """Indexes of the GPUs ``demand`` fits on, checked in full (memory, clients, class,
    model) only where the free share is enough, and of GPUs with equal free share only as many
    as can matter: on a busy cluster most GPUs are ruled out by their share alone, on an idle
    node one GPU stands for all (all of them with ``every_gpu``)."""
    gpus = demand.gpus
    wanted = gpus if demand.whole else 1
    fitting: list[int] = []
    found: dict[int, int] = {}
    for i, g in enumerate(node.gpus):
        f = SLICES_PER_GPU - used[i]
        if f < percent or (not every_gpu and found.get(f, 0) >= wanted):
            continue
        if gpu_fit(g, demand)[0] is None:
            fitting.append(i)
            found[f] = found.get(f, 0) + 1
            if demand.whole and len(fitting) >= gpus:
                break
    return fitting


def fgd_option(node: NodeState, demand: Demand, workload: Workload) -> Option | None:
    """FGD's pick on one node: the option with the smallest fragmentation change (ties: the
    fuller GPU, then the lower index)."""
    options = placement_options(node, demand, workload)
    if not options:
        return None
    return min(options, key=lambda o: (o.frag_delta, o.free_after, o.gpus))


def fgd_score(delta: float) -> int:
    """The published FGD node score: ``int(100 * sigmoid(-delta / 100))``, delta in GPU-percent
    (the paper's simulator divides milli-GPU by 1000)."""
    x = -delta / SLICES_PER_GPU
    if x >= 0:
        s = 1.0 / (1.0 + math.exp(-x))
    else:
        e = math.exp(x)
        s = e / (1.0 + e)
    return int(s * 100)
