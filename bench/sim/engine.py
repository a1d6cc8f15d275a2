"""The openb placement experiment: pods arrive one by one, are placed or fail, none departs.

The cluster is a list of :class:`gpushare.packing.model.NodeState` and every feasibility check,
fragmentation value, GPU choice, thread percentage and slowdown prediction comes from
``gpushare.packing`` -- the code the extender runs. What lives here is only the experiment
(arrivals, bookkeeping, metrics) and the baselines' node scores from the FGD paper's simulator.

The product's policies (``gpushare``, the default, and the ``binpack`` and ``spread`` options)
are placed exactly as the installed extender places them: one
:class:`gpushare.packing.placer.Placer` ranks every node by its exact cost (ties to the name that
sorts first) against a :class:`gpushare.packing.mix.PodMix` fed in arrival order as the
controller's watch feeds it, and picks the GPUs. Pods without GPUs go to gpushare-scheduler as
the replay sends them: under ``gpushare`` the placer places them too; under ``binpack`` and
``spread`` the extender passes every node and kube-scheduler's own scores decide
(:mod:`bench.sim.stock`). ``gpushare-cpu-default`` is ``gpushare`` with pods without GPUs left
to the stock default-scheduler (what a cluster gets that does not route them to
gpushare-scheduler).

Speed: a node's score for a pod depends only on the node's state and the pod's *shape* (CPU,
memory, GPUs, share, allowed models). Each shape keeps an index of node scores; a placement
marks one node dirty, and a shape re-scores only the nodes that changed since it last looked.
Baselines score 0..100 integers (as in the paper's kube-scheduler plugins); ties go to the first
node in name order, as in the paper's patched kube-scheduler.
"""

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from bench.sim.profiles import profile_of
from bench.sim.stock import NodeWindow, StockScheduler, chart_nodes_percent
from bench.sim.trace import GPU_MEMORY_GIB, NodeSpec, PodSpec
from gpushare.api.names import SLICES_PER_GPU
from gpushare.packing.admission import Admission
from gpushare.packing.fit import fit_reason, model_allows, node_fit_reason
from gpushare.packing.fragmentation import (
    TaskClass,
    Workload,
    fgd_score,
    placement_options,
)
from gpushare.packing.interference import InterferenceModel
from gpushare.packing.mix import PodMix
from gpushare.packing.model import Demand, GpuState, NodeState, Tenant
from gpushare.packing.placer import Placer
from gpushare.packing.policy import Policy
from gpushare.packing.scarcity import free_by_model, host_shapes
from gpushare.packing.threads import assign_thread_percent, tenant_threads

MIB = 1 << 20
MAX_SPEC_CPU = 128_000
"""The FGD simulator's normalisation constants (milli-CPU, milli-GPU) for best-fit/dot-product."""
MAX_SPEC_GPU_PERCENT = 800

BASELINES = ("random", "dotprod", "gpupacking", "bestfit", "fgd")
PRODUCT: dict[str, Policy] = {
    "binpack": Policy.BINPACK,
    "spread": Policy.SPREAD,
    "gpushare": Policy.GPUSHARE,
    "gpushare-cpu-default": Policy.GPUSHARE,
}
"""Simulator policy -> the product policy the placer runs."""
POLICIES = (*BASELINES, *PRODUCT)
LEVELS = tuple(range(10, 131, 10))
"""Arrived GPU demand (percent of capacity) at which a run records the allocation."""


# --- cluster -------------------------------------------------------------------------------


class Cluster:
    """Nodes as gpushare.packing sees them, plus a change log for the score indexes."""

    def __init__(self, nodes: Sequence[NodeSpec]) -> None:
        self.nodes: list[NodeState] = []
        for spec in nodes:
            memory = GPU_MEMORY_GIB.get(spec.model, 32) << 30
            gpus = [
                GpuState(uuid=f"{spec.name}/{i}", memory_bytes=memory, model=spec.model, index=i)
                for i in range(spec.gpus)
            ]
            self.nodes.append(
                NodeState(
                    name=spec.name,
                    gpus=gpus,
                    cpu_milli_free=spec.cpu_milli,
                    memory_free_bytes=spec.memory_mib * MIB,
                )
            )
        self.capacity = SLICES_PER_GPU * sum(len(n.gpus) for n in self.nodes)
        self.allocated = 0
        self.log: list[int] = []
        self.pods: dict[str, tuple[PodSpec, int, tuple[int, ...]]] = {}

    def place(
        self,
        node_index: int,
        gpus: tuple[int, ...],
        pod: PodSpec,
        demand: Demand,
        threads: int,
    ) -> None:
        node = self.nodes[node_index]
        for i in gpus:
            gpu = node.gpus[i]
            gpu.tenants.append(
                Tenant(
                    key=pod.name,
                    percent=demand.percent,
                    memory_bytes=gpu.memory_bytes * demand.percent // SLICES_PER_GPU,
                    gpu_class=demand.gpu_class,
                    processes=demand.processes,
                    profile=demand.profile,
                    thread_percent=threads,
                )
            )
        assert node.cpu_milli_free is not None and node.memory_free_bytes is not None
        node.cpu_milli_free -= demand.cpu_milli
        node.memory_free_bytes -= demand.host_memory_bytes
        self.allocated += demand.percent * len(gpus)
        self.pods[pod.name] = (pod, node_index, gpus)
        self.log.append(node_index)


def demand_of(pod: PodSpec, *, with_profile: bool = False) -> Demand:
    return Demand(
        percent=pod.percent if pod.num_gpu else 0,
        gpus=pod.num_gpu,
        gpu_model=pod.gpu_spec or None,
        cpu_milli=pod.cpu_milli,
        host_memory_bytes=pod.memory_mib * MIB,
        profile=profile_of(pod) if with_profile and pod.num_gpu else None,
    )


# --- baseline scores (FGD paper's simulator, 0..100) ----------------------------------------


def _free(node: NodeState) -> list[int]:
    return [g.free_percent for g in node.gpus]


def _best_fit_gpus(node: NodeState, demand: Demand) -> tuple[int, ...]:
    """The paper simulator's default GPU choice: share pods on the fitting GPU with the least
    free share (lowest index on ties), whole-GPU pods on the first idle GPUs."""
    if demand.gpus <= 0 or demand.percent <= 0:
        return ()
    if demand.whole:
        idle = [i for i, g in enumerate(node.gpus) if fit_reason(g, demand) is None]
        return tuple(idle[: demand.gpus])
    best: int | None = None
    best_free = 0
    for i, g in enumerate(node.gpus):
        if fit_reason(g, demand) is None and (best is None or g.free_percent < best_free):
            best, best_free = i, g.free_percent
    return () if best is None else (best,)


def _random_gpus(node: NodeState, demand: Demand, rng: random.Random) -> tuple[int, ...]:
    if demand.gpus <= 0 or demand.percent <= 0 or demand.whole:
        return _best_fit_gpus(node, demand)
    fitting = [i for i, g in enumerate(node.gpus) if fit_reason(g, demand) is None]
    return (rng.choice(fitting),)


def score_random(node: NodeState, demand: Demand, workload: Workload) -> int | None:
    return None if node_fit_reason(node, demand) is not None else 1


def score_bestfit(node: NodeState, demand: Demand, workload: Workload) -> int | None:
    """Best-fit: 100 * (1 - sum_r 0.5 * (free_r - request_r) / max_spec_r), r in (CPU, GPU)."""
    if node_fit_reason(node, demand) is not None:
        return None
    assert node.cpu_milli_free is not None
    gpu_free = sum(_free(node))
    cpu_term = (node.cpu_milli_free - demand.cpu_milli) / MAX_SPEC_CPU
    gpu_term = (gpu_free - demand.percent * demand.gpus) / MAX_SPEC_GPU_PERCENT
    return int((1.0 - 0.5 * cpu_term - 0.5 * gpu_term) * 100)


def score_dotprod(node: NodeState, demand: Demand, workload: Workload) -> int | None:
    """Tetris dot product of free and requested (CPU, GPU), max-normalised; the paper's
    simulator ranks the *smaller* product higher: 100 * (1 - dot / 2)."""
    if node_fit_reason(node, demand) is not None:
        return None
    assert node.cpu_milli_free is not None
    dot = (node.cpu_milli_free / MAX_SPEC_CPU) * (demand.cpu_milli / MAX_SPEC_CPU) + (
        sum(_free(node)) / MAX_SPEC_GPU_PERCENT
    ) * (demand.percent * demand.gpus / MAX_SPEC_GPU_PERCENT)
    return int(100 * (1.0 - dot / 2))


def score_gpupacking(node: NodeState, demand: Demand, workload: Workload) -> int | None:
    """GPU packing: prefer a shared GPU (score 50..100, fuller is better), then idle GPUs on a
    used node (33..50, fewer is better), then an idle node (<= 33)."""
    if node_fit_reason(node, demand) is not None:
        return None
    if demand.gpus <= 0 or demand.percent <= 0:
        return 0
    free = _free(node)
    idle = sum(1 for f in free if f >= SLICES_PER_GPU)
    if idle == len(free):
        return max(33 - idle, idle)
    wanted = demand.gpus
    idle_used = 0
    left_on_used = 0
    for i in sorted(range(len(free)), key=lambda k: free[k]):
        if wanted == 0:
            break
        if free[i] >= demand.percent and fit_reason(node.gpus[i], demand) is None:
            wanted -= 1
            left_on_used += free[i]
            if free[i] >= SLICES_PER_GPU:
                idle_used += 1
    if idle_used > 0:
        return max(50 - idle_used, 33)
    return max(100 - left_on_used // 10, 50)


def score_fgd(node: NodeState, demand: Demand, workload: Workload) -> int | None:
    """FGD: 100 * sigmoid(-fragmentation increase / one GPU), best GPU of the node."""
    options = placement_options(node, demand, workload)
    if not options:
        return None
    return fgd_score(min(o.frag_delta for o in options))


def _fgd_gpus(node: NodeState, demand: Demand, workload: Workload) -> tuple[int, ...]:
    """The paper's GPU choice: the lowest-index GPU among those with the best *integer* score."""
    options = placement_options(node, demand, workload)
    best = max(fgd_score(o.frag_delta) for o in options)
    return min(o.gpus for o in options if fgd_score(o.frag_delta) == best)


Scorer = Callable[[NodeState, Demand, Workload], int | None]
SCORERS: dict[str, Scorer] = {
    "random": score_random,
    "dotprod": score_dotprod,
    "gpupacking": score_gpupacking,
    "bestfit": score_bestfit,
    "fgd": score_fgd,
}


# --- per-shape score indexes ---------------------------------------------------------------


class _IndexedSet:
    __slots__ = ("items", "where")

    def __init__(self) -> None:
        self.items: list[int] = []
        self.where: dict[int, int] = {}

    def add(self, x: int) -> None:
        self.where[x] = len(self.items)
        self.items.append(x)

    def discard(self, x: int) -> None:
        pos = self.where.pop(x)
        last = self.items.pop()
        if last != x:
            self.items[pos] = last
            self.where[last] = pos


class BucketIndex:
    """Integer node scores for one pod shape, bucketed for an O(1) random pick among the best."""

    def __init__(self, cluster: Cluster, scorer: Scorer, demand: Demand, wl: Workload) -> None:
        self.cluster, self.scorer, self.demand, self.workload = cluster, scorer, demand, wl
        self.score: list[int | None] = [None] * len(cluster.nodes)
        self.buckets: dict[int, _IndexedSet] = {}
        for i in range(len(cluster.nodes)):
            self._set(i)
        self.pos = len(cluster.log)

    def _set(self, i: int) -> None:
        old = self.score[i]
        if old is not None:
            bucket = self.buckets[old]
            bucket.discard(i)
            if not bucket.items:
                del self.buckets[old]
        new = self.scorer(self.cluster.nodes[i], self.demand, self.workload)
        self.score[i] = new
        if new is not None:
            self.buckets.setdefault(new, _IndexedSet()).add(i)

    def refresh(self) -> None:
        log = self.cluster.log
        if self.pos < len(log):
            for i in set(log[self.pos :]):
                self._set(i)
            self.pos = len(log)

    def pick(self, rng: random.Random | None = None) -> int | None:
        """A best-scored node; ties go to the first node in name order, as in the FGD paper's
        simulator (its kube-scheduler picks the lexicographically smallest name "for
        reproducibility" instead of a random one). With ``rng``: a uniformly random one (the
        Random policy, whose score plugin gives one random feasible node the top score)."""
        self.refresh()
        if not self.buckets:
            return None
        items = self.buckets[max(self.buckets)].items
        return items[rng.randrange(len(items))] if rng is not None else min(items)


class PlacerIndex:
    """The product's costs (:class:`gpushare.packing.placer.Placer`) for one pod shape, per node,
    recomputed for the nodes changed since it last looked, and for every node after a refit of
    the placer's mix (the extender caches and drops its answers the same way). Node positions
    follow node names, so ties go to the name that sorts first, as in
    :func:`gpushare.packing.placer.best_node`."""

    def __init__(self, cluster: Cluster, placer: Placer, demand: Demand) -> None:
        self.cluster, self.placer, self.demand = cluster, placer, demand
        self.version = -1
        self.cost: list[float | None] = []
        self.pos = 0

    def refresh(self) -> None:
        nodes, log = self.cluster.nodes, self.cluster.log
        if self.version != self.placer.version:
            self.version = self.placer.version
            self.cost = [self.placer.node_cost(n, self.demand) for n in nodes]
        elif self.pos < len(log):
            for i in set(log[self.pos :]):
                self.cost[i] = self.placer.node_cost(nodes[i], self.demand)
        self.pos = len(log)

    def pick_among(self, candidates: Sequence[int]) -> int | None:
        """The cheapest of ``candidates`` (the nodes kube-scheduler offers the extender; ties:
        the first by name); None when the pod fits on none of them."""
        self.refresh()
        best: tuple[float, int] | None = None
        for i in candidates:
            cost = self.cost[i]
            if cost is not None and (best is None or (cost, i) < best):
                best = (cost, i)
        return None if best is None else best[1]


# --- the experiment ------------------------------------------------------------------------


def scheduler_passes(node: NodeState, demand: Demand) -> bool:
    """kube-scheduler's own filters before the extender: CPU, memory and the node's total
    ``gpushare.io/gpu-percent`` (NodeResourcesFit, as the chart configures it; which GPU has
    room is the extender's) and the GPU models allowed (required node affinity)."""
    if node.cpu_milli_free is not None and demand.cpu_milli > node.cpu_milli_free:
        return False
    if node.memory_free_bytes is not None and demand.host_memory_bytes > node.memory_free_bytes:
        return False
    if demand.percent > 0 and demand.percent * demand.gpus > sum(
        g.free_percent for g in node.gpus if g.healthy
    ):
        return False
    return (
        not demand.gpu_model or not node.gpus or model_allows(demand.gpu_model, node.gpus[0].model)
    )


def arrivals(
    pods: Sequence[PodSpec], capacity: int, ratio: float, rng: random.Random
) -> list[PodSpec]:
    """The FGD experiment's workload: every pod of the list in a seeded random order, then pods
    drawn with replacement until the next one would push arrived GPU demand past ``ratio`` x
    capacity (or random pods removed while the list alone exceeds it)."""
    by_name = sorted(pods, key=lambda p: p.name)
    order = list(by_name)
    rng.shuffle(order)
    target = ratio * capacity
    total = sum(p.gpu_percent_total for p in order)
    while total > target and order:
        removed = order.pop(rng.randrange(len(order)))
        total -= removed.gpu_percent_total
    copy = 0
    while total < target:
        pod = by_name[rng.randrange(len(by_name))]
        if total + pod.gpu_percent_total > target:
            break
        order.append(replace(pod, name=f"{pod.name}~{copy}"))
        total += pod.gpu_percent_total
        copy += 1
    return order


def typical_workload(pods: Sequence[PodSpec], *, coverage: float = 0.95) -> Workload:
    """FGD's target workload (the baseline's): the pod shapes covering 95% of the pod list, by
    popularity, known in advance. (The product learns its mix online, see :class:`PodMix`.)
    ``coverage=1.0`` keeps every shape with the pods' host memory."""
    full = coverage >= 1.0
    return Workload.typical(
        (
            TaskClass(
                1.0,
                p.percent if p.num_gpu else 0,
                p.num_gpu,
                p.cpu_milli,
                p.gpu_spec or None,
                p.memory_mib * MIB if full else 0,
            )
            for p in pods
        ),
        coverage=coverage,
    )


@dataclass
class RunResult:
    trace: str
    policy: str
    seed: int
    alloc_100: float
    alloc_130: float
    effective_throughput_130: float
    """Every policy's pods under gpushare's MPS thread caps: the placements alone differ."""
    effective_throughput_130_uncapped: float
    """Baselines' tenants uncapped (as their published systems share GPUs without compute
    caps), gpushare's under its caps: the systems as a whole differ."""
    pods: int
    placed: int
    failed: int
    curve: list[float] = field(default_factory=list)
    """Allocation when arrived GPU demand first reaches each of :data:`LEVELS` percent of
    capacity (the run's last allocation for a level it never reaches)."""
    seconds: float = 0.0
    violations: list[str] = field(default_factory=list)


def simulate(
    nodes: Sequence[NodeSpec],
    pods: Sequence[PodSpec],
    *,
    policy: str,
    seed: int,
    model: InterferenceModel,
    ratio: float = 1.3,
    trace: str = "",
    watch: Callable[[PodMix], None] | None = None,
) -> RunResult:
    """One run of the experiment; see the module docstring. ``watch``, for the product's
    policies, is called with the controller's pod mix before each arrival: what else its watch
    would count there (``bench.sim.throwaway``: a tenant's throw-away pending pods)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; use one of {', '.join(POLICIES)}")
    rng = random.Random(seed)
    cluster = Cluster(nodes)
    workload = typical_workload(pods)
    queue = arrivals(pods, cluster.capacity, ratio, rng)
    buckets: dict[tuple[int, int, int, int, str], BucketIndex] = {}
    costs: dict[tuple[int, int, int, int, str], PlacerIndex] = {}
    # The controller's defaults: interference admission on (openb's pods carry no profile,
    # so it never refuses here; docs/packing.md, "Admission").
    placer = Placer(
        PRODUCT.get(policy, Policy.GPUSHARE), mix=PodMix(), model=model, admission=Admission(model)
    )
    placer.mix.free_capacity = lambda: free_by_model(cluster.nodes)
    shapes = host_shapes((s.model, (s.gpus, s.cpu_milli, s.memory_mib * MIB)) for s in nodes)
    placer.mix.host_shapes = lambda: shapes
    placer_places_cpu_pods = policy == "gpushare"
    # gpushare-scheduler offers the extender the nodes its own filters pass, as many as the
    # chart's percentageOfNodesToScore says; the stock default-scheduler keeps its default.
    window = NodeWindow(len(cluster.nodes), chart_nodes_percent())
    stock = StockScheduler(
        cpu_milli=[s.cpu_milli for s in nodes],
        memory_bytes=[s.memory_mib * MIB for s in nodes],
        rng=rng,
        window=None if policy == "gpushare-cpu-default" else window,
    )
    arrived = 0
    curve: list[float] = []
    placed = failed = 0
    for pod in queue:
        arrived += pod.gpu_percent_total
        shape = pod.shape
        if watch is not None and policy in PRODUCT:
            watch(placer.mix)
        if policy in PRODUCT:
            demand = demand_of(pod)
            assignment = None
            if pod.num_gpu or placer_places_cpu_pods:
                # The controller counts a pod for gpushare-scheduler when its watch first
                # shows it, before the scheduler asks the extender where it goes, with the GPU
                # models its node affinity admits (the replay's pods state them so).
                placer.mix.observe(demand)
                index = costs.get(shape)
                if index is None:
                    index = costs[shape] = PlacerIndex(cluster, placer, demand)
                offered = window.candidates(
                    lambda i, d=demand: scheduler_passes(cluster.nodes[i], d)
                )
                i_or_none = index.pick_among(offered)
                if i_or_none is not None and pod.num_gpu:
                    assignment = placer.choose_gpus(cluster.nodes[i_or_none], demand)
            else:
                # kube-scheduler's own scores place it: the stock default-scheduler, or the
                # gpushare-scheduler profile after the extender passed every node. The
                # controller counts it once its watch shows it bound to a GPU node.
                i_or_none = stock.pick(cluster.nodes, demand)
                if i_or_none is not None:
                    placer.mix.observe(demand)
            if i_or_none is None or (pod.num_gpu and assignment is None):
                failed += 1
            else:
                node = cluster.nodes[i_or_none]
                gpus = (
                    tuple(i for i, g in enumerate(node.gpus) if g.uuid in assignment.gpu_uuids)
                    if assignment is not None
                    else ()
                )
                profiled = demand_of(pod, with_profile=True)
                threads = (
                    assign_thread_percent(profiled, node.gpus[gpus[0]]) if gpus else SLICES_PER_GPU
                )
                cluster.place(i_or_none, gpus, pod, profiled, threads)
                placed += 1
        else:
            bindex = buckets.get(shape)
            if bindex is None:
                bindex = buckets[shape] = BucketIndex(
                    cluster, SCORERS[policy], demand_of(pod), workload
                )
            i_or_none = bindex.pick(rng if policy == "random" else None)
            if i_or_none is None:
                failed += 1
            else:
                node = cluster.nodes[i_or_none]
                demand = demand_of(pod, with_profile=True)
                if policy == "fgd" and demand.gpus:
                    gpus = _fgd_gpus(node, demand, workload)
                elif policy == "random":
                    gpus = _random_gpus(node, demand, rng)
                else:
                    gpus = _best_fit_gpus(node, demand)
                threads = (
                    assign_thread_percent(demand, node.gpus[gpus[0]]) if gpus else SLICES_PER_GPU
                )
                cluster.place(i_or_none, gpus, pod, demand, threads)
                placed += 1
        while len(curve) < len(LEVELS) and 100 * arrived >= LEVELS[len(curve)] * cluster.capacity:
            curve.append(100.0 * cluster.allocated / cluster.capacity)
    alloc_130 = 100.0 * cluster.allocated / cluster.capacity
    curve += [alloc_130] * (len(LEVELS) - len(curve))
    return RunResult(
        trace=trace,
        policy=policy,
        seed=seed,
        alloc_100=curve[LEVELS.index(100)],
        alloc_130=alloc_130,
        curve=curve,
        effective_throughput_130=effective_throughput(cluster, model),
        effective_throughput_130_uncapped=effective_throughput(
            cluster, model, uncapped=policy not in PRODUCT
        ),
        pods=len(queue),
        placed=placed,
        failed=failed,
        violations=violations(cluster),
    )


def effective_throughput(
    cluster: Cluster, model: InterferenceModel, *, uncapped: bool = False
) -> float:
    """Allocated GPU-percent weighted by the pod's predicted rate relative to running alone
    with its guaranteed share as MPS thread cap (at most 1), as a percent of cluster capacity.

    Pods are profiled by :func:`bench.sim.profiles.profile_of` whatever policy placed them.
    ``uncapped`` predicts every tenant at 100% threads (no compute isolation)."""
    total = 0.0
    for node in cluster.nodes:
        for gpu in node.gpus:
            tenants = gpu.tenants
            if len(tenants) == 1:
                total += tenants[0].percent
                continue
            loads = [
                (
                    profile_of(cluster.pods[t.key][0]),
                    SLICES_PER_GPU if uncapped else tenant_threads(t),
                )
                for t in tenants
            ]
            for k, t in enumerate(tenants):
                profile, threads = loads[k]
                others = loads[:k] + loads[k + 1 :]
                reference = model.cap_slowdown(profile, t.percent)
                slowdown = model.predict_vs_full_gpu(profile, threads, others)
                total += t.percent * min(1.0, reference / slowdown)
    return 100.0 * total / cluster.capacity


def violations(cluster: Cluster) -> list[str]:
    """Broken constraints after a run (an empty list is the expected outcome)."""
    found: list[str] = []
    for node in cluster.nodes:
        assert node.cpu_milli_free is not None and node.memory_free_bytes is not None
        if node.cpu_milli_free < 0:
            found.append(f"{node.name}: CPU over-allocated by {-node.cpu_milli_free}m")
        if node.memory_free_bytes < 0:
            found.append(f"{node.name}: memory over-allocated")
        for gpu in node.gpus:
            if gpu.used_percent > SLICES_PER_GPU:
                found.append(f"{gpu.uuid}: {gpu.used_percent}% allocated")
            if gpu.clients > gpu.max_clients:
                found.append(f"{gpu.uuid}: {gpu.clients} MPS clients")
            for t in gpu.tenants:
                spec = cluster.pods[t.key][0].gpu_spec
                if spec and not model_allows(spec, gpu.model):
                    found.append(f"{t.key} on a {gpu.model} but asks for {spec}")
    return found
