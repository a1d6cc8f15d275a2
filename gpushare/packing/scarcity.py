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
"""

from collections.abc import Iterable, Mapping

from gpushare.api.names import SLICES_PER_GPU
from gpushare.packing.fit import allowed_models
from gpushare.packing.model import NodeState

SCARCITY_WEIGHT = 1.0
"""GPU-percent of cost per GPU-percent taken on a model at pressure 1."""


def model_prices(
    demands: Iterable[tuple[float, int, int, str | None]],
    capacity: Mapping[str, int],
    *,
    weight: float | None = None,
) -> dict[str, float]:
    """Cost per GPU-percent taken on each model of ``capacity`` (GPUs by model).

    ``demands``: (popularity, per-GPU percent, GPUs, allowed models or None) of the mix's
    classes. Models with no captive demand are left out (price 0); so is everything when the
    mix has no model limits or ``capacity`` is empty."""
    if weight is None:
        weight = SCARCITY_WEIGHT
    total_capacity = sum(max(n, 0) for n in capacity.values())
    if total_capacity <= 0 or weight == 0:
        return {}
    present = frozenset(m for m, n in capacity.items() if n > 0)
    total = 0.0
    captive: dict[frozenset[str], float] = {}
    for popularity, percent, gpus, spec in demands:
        if popularity <= 0 or percent <= 0 or gpus <= 0:
            continue
        share = popularity * min(percent, SLICES_PER_GPU) * gpus
        total += share
        if not spec:
            continue
        models = allowed_models(spec) & present
        if not models or models == present:
            continue  # fits nowhere here (kube-scheduler refuses it) or anywhere
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


def free_by_model(nodes: Iterable[NodeState]) -> dict[str, int]:
    """Free GPU-percent of the healthy GPUs of ``nodes``, by GPU model."""
    out: dict[str, int] = {}
    for node in nodes:
        for gpu in node.gpus:
            if gpu.healthy:
                out[gpu.model] = out.get(gpu.model, 0) + gpu.free_percent
    return out
