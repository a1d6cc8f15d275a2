"""What a GPU model is worth to the pods that can use no other: the price of taking its capacity.

FGD (see :mod:`fragmentation`) looks one pod ahead on one node. When some pods may only use
some GPU models, the damage a pod that could go anywhere does on a node of a model other pods
need is elsewhere: on openb's ``gpuspec33`` list T4-only pods ask for more GPU-percent than the
cluster has T4s, and pods that could have gone anywhere took the T4 nodes early, so at 100%
arrived demand the T4-only pods found none (docs/packing.md, "Scarce GPU models").

The mix the controller measures (:class:`~gpushare.packing.mix.PodMix`) says how much of the
GPU demand to come is limited to each set of models, and the cluster's inventory how much of
each model there is. For a model ``m`` its *pressure* is

    pressure(m) = sum over model sets S containing m of  d_S * K / K_S

with ``d_S`` the share of the mix's GPU demand (GPU-percent) limited to ``S``, ``K_S`` the
cluster's GPUs of the models in ``S`` and ``K`` all its GPUs: the captive demand of each set,
spread over its models by their capacity, relative to the model's share of the cluster. Above
1, pods that can use nothing else would fill the model before the cluster is full. Pods
without a model limit (and sets covering every model the cluster has) add the same to every
model and are left out. A placement then costs ``SCARCITY_WEIGHT x pressure(m)`` per
GPU-percent it takes on a GPU of model ``m`` (:func:`model_prices`): only differences between
the models a pod may use change where it goes, so a list without model limits places exactly
as before (every price 0).

A pod is limited to models by its node constraints, and also by its size: where the cluster's
nodes are known (:data:`HostShape`, by model), a pod may use only the models with a node whose
GPU count, allocatable CPU and allocatable memory hold it. On openb's lists, 8-GPU pods asking
for 120 CPUs and 640-720 GiB fit only the 39 G3 nodes of 1,213 (128 CPUs, 768 GiB); smaller
CPU-hungry pods took those nodes first and such a pod failed at 62-84% arrived demand, where
FGD placed it (docs/packing.md, "Results"). The set a pod's size leaves is compared with the
set its GPU count alone leaves: pods of 8 GPUs that fit every 8-GPU node are not limited here
(whole idle nodes for them are FGD's fragmentation term's to keep).
"""

from collections.abc import Collection, Iterable, Mapping

from gpushare.api.names import SLICES_PER_GPU
from gpushare.packing.fit import allowed_models
from gpushare.packing.model import NodeState

SCARCITY_WEIGHT = 1.0
"""GPU-percent of cost per GPU-percent taken on a model at pressure 1."""

HostShape = tuple[int, int | None, int | None]
"""One kind of node: (GPUs, allocatable milli-CPU, allocatable memory bytes; None = unknown)."""

DemandClass = tuple[float, int, int, str | None, int, int]
"""(popularity, per-GPU percent, GPUs, allowed models or None, milli-CPU, memory bytes) of one
class of the mix."""


def _holds(shape: HostShape, gpus: int, cpu_milli: int, memory_bytes: int) -> bool:
    node_gpus, cpu, memory = shape
    return (
        gpus <= node_gpus
        and (cpu is None or cpu_milli <= cpu)
        and (memory is None or memory_bytes <= memory)
    )


def model_prices(
    demands: Iterable[DemandClass],
    capacity: Mapping[str, int],
    *,
    weight: float | None = None,
    shapes: Mapping[str, Collection[HostShape]] | None = None,
) -> dict[str, float]:
    """Cost per GPU-percent taken on each model of ``capacity`` (GPUs by model).

    ``demands``: the mix's classes. ``shapes``: the kinds of node of each model (None: not
    known; a model missing from it is taken to hold any pod). Models with no captive demand
    are left out (price 0); so is everything when no class is limited or ``capacity`` is
    empty."""
    if weight is None:
        weight = SCARCITY_WEIGHT
    total_capacity = sum(max(n, 0) for n in capacity.values())
    if total_capacity <= 0 or weight == 0:
        return {}
    present = frozenset(m for m, n in capacity.items() if n > 0)
    total = 0.0
    captive: dict[frozenset[str], float] = {}
    for popularity, percent, gpus, spec, cpu_milli, memory_bytes in demands:
        if popularity <= 0 or percent <= 0 or gpus <= 0:
            continue
        share = popularity * min(percent, SLICES_PER_GPU) * gpus
        total += share
        models = allowed_models(spec) & present if spec else present
        reference = present
        if shapes is not None:
            kinds = {m: shapes.get(m) for m in present}
            reference = frozenset(
                m for m, k in kinds.items() if k is None or any(s[0] >= gpus for s in k)
            )
            models = frozenset(
                m
                for m in models
                if (k := kinds[m]) is None
                or any(_holds(s, gpus, cpu_milli, memory_bytes) for s in k)
            )
        if not models or models == reference:
            continue  # fits nowhere here (kube-scheduler refuses it), or wherever its GPUs do
        captive[models] = captive.get(models, 0.0) + share
    if total <= 0 or not captive:
        return {}
    pressures: dict[str, float] = {}
    for models, share in sorted(captive.items(), key=lambda kv: sorted(kv[0])):
        room = sum(capacity[m] for m in models)
        pressure = (share / total) * total_capacity / room
        for m in sorted(models):
            pressures[m] = pressures.get(m, 0.0) + pressure
    return {m: weight * p for m, p in pressures.items()}


def host_shapes(nodes: Iterable[tuple[str, HostShape]]) -> dict[str, frozenset[HostShape]]:
    """The kinds of node of each model, from (model, shape) per node."""
    out: dict[str, set[HostShape]] = {}
    for model, shape in nodes:
        out.setdefault(model, set()).add(shape)
    return {m: frozenset(k) for m, k in out.items()}


def free_by_model(nodes: Iterable[NodeState]) -> dict[str, int]:
    """Free GPU-percent of the healthy GPUs of ``nodes``, by GPU model."""
    out: dict[str, int] = {}
    for node in nodes:
        for gpu in node.gpus:
            if gpu.healthy:
                out[gpu.model] = out.get(gpu.model, 0) + gpu.free_percent
    return out
