"""Which GPU(s) of a node a pod gets, and how much the scheduler should like the node.

Three policies (who asks: :mod:`gpushare.packing.placer`):

- ``binpack``: fill the fullest GPU that fits and the fullest node; keeps whole GPUs and whole
  nodes free for large pods.
- ``spread``: the emptiest GPU and node; fewer neighbours per pod.
- ``gpushare`` (the default, :data:`DEFAULT_POLICY`): fragmentation gradient descent (FGD, see
  :mod:`fragmentation`) with exact costs instead of the paper's 0-100 integer score, plus the
  GPU-percent the placement is predicted to lose to interference (see :mod:`interference`),
  both in GPU-percent:

      cost = frag_delta + STRANDING_WEIGHT * strand_delta + LOOKAHEAD_WEIGHT * waste_delta
             + INTERFERENCE_WEIGHT * loss_delta + BEST_FIT_WEIGHT * free_after

  ``strand_delta`` is the change of the GPU share the node's free CPU and memory can no longer
  feed (see :meth:`Workload.stranded`): FGD looks one task ahead and so lets CPU-hungry pods
  drain a node whose GPUs later nobody can use. ``waste_delta`` is the change of the chosen
  GPU's expected lasting waste (:meth:`Workload.waste_table`): FGD also looks one task ahead on
  a GPU, and leaves gaps only rare tasks fit. ``loss_delta`` (share lost below the tenants'
  guarantees, :func:`guaranteed_loss`) only grows when a pod joins
  neighbours, so a placement with no neighbours is never penalised, and it only counts pods
  with measured profiles; ``free_after`` breaks near-ties towards the fuller GPU (best fit).
"""

from collections.abc import Sequence
from enum import StrEnum

from gpushare.api.names import SLICES_PER_GPU
from gpushare.packing.fit import demand_memory, gpu_fit
from gpushare.packing.fragmentation import Option, Workload, placement_options
from gpushare.packing.interference import InterferenceModel, add_loads, load_default, load_of
from gpushare.packing.model import Assignment, Demand, GpuState, NodeState, PipeProfile
from gpushare.packing.threads import assign_thread_percent, tenant_threads


class Policy(StrEnum):
    BINPACK = "binpack"
    SPREAD = "spread"
    GPUSHARE = "gpushare"


DEFAULT_POLICY = Policy.GPUSHARE
"""The policy the controller, the chart and the benchmarks use unless told otherwise: the one
the openb benchmarks justify (bench/results/openb-replay.md, docs/packing.md)."""


INTERFERENCE_WEIGHT = 1.0
"""GPU-percent of fragmentation worth one GPU-percent lost to interference."""
STRANDING_WEIGHT = 4.0
"""Weight of GPU share stranded by CPU/memory exhaustion against FGD's one-task fragmentation
(tuned on the openb default trace with seeds 1-4, not the reported 42-51)."""
LOOKAHEAD_WEIGHT = 2.0
"""Weight of the change of :meth:`Workload.waste_table` on the chosen GPU(s): FGD ranks a gap
only the rare small tasks fit above one a popular task fills (tuned on openb default seeds 1-4,
checked on 5-8, not on the reported 42-51)."""
BEST_FIT_WEIGHT = 0.01
"""Per GPU-percent left free on the chosen GPU: a tie-breaker, below any real cost difference."""


def guaranteed_loss(
    tenants: Sequence[tuple[float, PipeProfile, int]], model: InterferenceModel
) -> float:
    """GPU-percent a GPU's tenants (percent, profile, threads) run below their guarantee: a
    tenant loses ``percent x (1 - rate)``, its rate being its predicted speed beside the others
    relative to running alone capped at its guaranteed percent (at most 1).

    A tenant whose thread cap exceeds its percent (latency pods, profiled batch pods: see
    :mod:`threads`) has headroom: it loses nothing until its neighbours slow it by more than
    its larger cap gained it. Counting slowdown against the cap instead calls harmless
    colocations harmful and spreads pods for nothing (docs/packing.md, "Interference").
    """
    if len(tenants) < 2:
        return 0.0
    key = tuple(tenants)
    if _loss_memo.model is not model:
        _loss_memo.model, _loss_memo.values = model, {}
    cached = _loss_memo.values.get(key)
    if cached is not None:
        return cached
    loads = [load_of(profile, threads) for _, profile, threads in tenants]
    lost = 0.0
    for k, (percent, profile, threads) in enumerate(tenants):
        rest = [load for j, load in enumerate(loads) if j != k]
        others = rest[0]
        for load in rest[1:]:
            others = add_loads(others, load)
        slowdown = model.predict_load(loads[k], others)
        if slowdown <= 1.0:
            continue
        share = max(1, min(round(percent), SLICES_PER_GPU))
        headroom = model.cap_slowdown(profile, share) / model.cap_slowdown(profile, threads)
        lost += percent * max(0.0, 1.0 - headroom / slowdown)
    if len(_loss_memo.values) >= _LOSS_MEMO_LIMIT:
        _loss_memo.values.clear()
    _loss_memo.values[key] = lost
    return lost


class _LossMemo:
    """Losses by tenant set: a GPU's tenants stay the same across many pods' scoring."""

    def __init__(self) -> None:
        self.model: InterferenceModel | None = None
        self.values: dict[tuple[tuple[float, PipeProfile, int], ...], float] = {}


_loss_memo = _LossMemo()
_LOSS_MEMO_LIMIT = 200_000


def interference_delta(
    gpu: GpuState, demand: Demand, threads: int, model: InterferenceModel
) -> float:
    """GPU-percent the GPU's tenants (newcomer included) are predicted to lose below their
    guarantees once ``demand`` joins them, minus what they lose now (:func:`guaranteed_loss`).

    Only measured profiles count: a pod without one has no interference opinion here (the
    placement falls back to pure FGD for it), while :func:`admission.admit_reason` keeps
    assuming the worst for latency pods.
    """
    if demand.profile is None or not gpu.tenants:
        return 0.0
    before = [
        (float(t.percent), t.profile, tenant_threads(t))
        for t in gpu.tenants
        if t.profile is not None
    ]
    if not before:
        return 0.0
    newcomer = (float(min(demand.percent, SLICES_PER_GPU)), demand.profile, threads)
    return guaranteed_loss([*before, newcomer], model) - guaranteed_loss(before, model)


def base_cost(option: Option) -> float:
    """The gpushare cost of an option without interference: a lower bound of
    :func:`option_cost`, since interference never lowers a cost."""
    return (
        option.frag_delta
        + STRANDING_WEIGHT * option.strand_delta
        + LOOKAHEAD_WEIGHT * option.waste_delta
        + BEST_FIT_WEIGHT * option.free_after
        + option.price
    )


def option_cost(
    node: NodeState,
    demand: Demand,
    option: Option,
    *,
    model: InterferenceModel,
    interference_weight: float = INTERFERENCE_WEIGHT,
) -> float:
    """The gpushare policy's cost of one placement option (lower is better), GPU-percent."""
    cost = base_cost(option)
    if demand.profile is not None and option.gpus and not demand.whole and interference_weight > 0:
        gpu = node.gpus[option.gpus[0]]
        threads = assign_thread_percent(demand, gpu)
        cost += interference_weight * interference_delta(gpu, demand, threads, model)
    return cost


def _choose_indices(
    node: NodeState,
    demand: Demand,
    policy: Policy,
    workload: Workload | None,
    model: InterferenceModel | None,
) -> tuple[tuple[int, ...], float] | None:
    """Chosen GPU positions and the policy's cost of the choice (lower is better)."""
    if policy is Policy.GPUSHARE:
        options = placement_options(
            node, demand, workload or Workload.default(), every_gpu=demand.profile is not None
        )
        if not options:
            return None
        m = model or load_default()
        costs = [(option_cost(node, demand, o, model=m), o.gpus) for o in options]
        cost, gpus = min(costs)
        return gpus, cost
    if node.cpu_milli_free is not None and demand.cpu_milli > node.cpu_milli_free:
        return None
    if node.memory_free_bytes is not None and demand.host_memory_bytes > node.memory_free_bytes:
        return None
    capacity = SLICES_PER_GPU * max(len(node.gpus), 1)
    fullest = policy is Policy.BINPACK
    used_total = 0
    fitting: list[int] = []
    best: int | None = None
    best_free = 0
    for i, g in enumerate(node.gpus):
        reason, used = gpu_fit(g, demand)
        used_total += used
        if reason is not None:
            continue
        fitting.append(i)
        free = SLICES_PER_GPU - used
        if best is None or (free < best_free if fullest else free > best_free):
            best, best_free = i, free
    if demand.whole:
        wanted = max(demand.gpus, 1)
        if len(fitting) < wanted:
            return None
        after = used_total + SLICES_PER_GPU * wanted
        chosen = tuple(fitting[:wanted])
    else:
        if best is None:
            return None
        after = used_total + min(demand.percent, SLICES_PER_GPU)
        chosen = (best,)
    utilization = after / capacity
    return chosen, (1.0 - utilization if fullest else utilization)


def choose_gpus(
    node: NodeState,
    demand: Demand,
    *,
    policy: Policy = Policy.BINPACK,
    workload: Workload | None = None,
    model: InterferenceModel | None = None,
) -> Assignment | None:
    """The GPU(s) ``demand`` gets on ``node`` under ``policy``; None if it does not fit.

    Sets the MPS active-thread percentage (:func:`assign_thread_percent`) and the pinned
    memory limit (the demand's cap, else its percent of the GPU's memory; for several GPUs the
    smallest of them). ``workload`` and ``model`` default to the shipped prior and model.
    """
    if demand.gpus <= 0 or demand.percent <= 0:
        return None  # a pod without GPUs is not ours to place on a GPU
    chosen = _choose_indices(node, demand, policy, workload, model)
    if chosen is None or not chosen[0]:
        return None
    gpus = [node.gpus[i] for i in chosen[0]]
    first = gpus[0]
    threads = SLICES_PER_GPU if demand.whole else assign_thread_percent(demand, first)
    memory = min(demand_memory(demand, g) for g in gpus)
    return Assignment(
        node=node.name,
        gpu_uuids=tuple(g.uuid for g in gpus),
        thread_percent=threads,
        memory_limit_bytes=memory,
    )


def node_cost(
    node: NodeState,
    demand: Demand,
    *,
    policy: Policy,
    workload: Workload | None = None,
    model: InterferenceModel | None = None,
) -> float | None:
    """The policy's cost of putting ``demand`` on ``node`` (lower is better; None: no fit).

    binpack/spread: the share of the node's GPU capacity left free (used) after placement;
    gpushare: the cost of its best option in GPU-percent. :class:`gpushare.packing.placer.Placer`
    ranks nodes by it (in the extender and the simulator alike).
    """
    chosen = _choose_indices(node, demand, policy, workload, model)
    return None if chosen is None else chosen[1]
