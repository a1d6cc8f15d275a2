"""Interference admission: which GPUs a pod may join without anyone past its class bound.

The placement cost weighs predicted interference against fragmentation, but a cost never says
no. Admission does: a GPU where the newcomer or a tenant already there is predicted slower than
its class accepts (:data:`DEFAULT_BOUNDS`) is not a candidate, exactly as if it were full
(:func:`admit_reason`, over the model of :mod:`gpushare.packing.interference`; docs/packing.md,
"Admission"). The extender's filter and bind and the GPU benchmark ask the same
:class:`Admission` through :class:`gpushare.packing.placer.Placer`, so the benchmark measures
what a cluster does.

It applies where something measured is at stake (:func:`measured`): the newcomer has a profile
(from its GpuShare), or a latency pod with a profile would share the GPU with it. Among pods
nobody profiled there is nothing to predict from and placement is fit and fragmentation alone
(the openb traces are such pods).
"""

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from gpushare.api.names import CLASS_BATCH, CLASS_LATENCY, SLICES_PER_GPU
from gpushare.packing.interference import (
    InterferenceModel,
    busy_share,
    load_default,
    while_running,
)
from gpushare.packing.model import Demand, GpuState, NodeState, PipeProfile, Tenant
from gpushare.packing.threads import MIN_BATCH_THREADS, assign_thread_percent, tenant_threads

DEFAULT_BOUNDS: Mapping[str, float] = MappingProxyType({"latency": 1.15, "batch": 2.0})
"""Largest predicted slowdown each class accepts: a latency pod's against itself alone, a
batch pod's against itself alone on the whole GPU (its thread cap's cost charged)."""

CONSERVATIVE_PROFILE = PipeProfile(
    fp16=0.3, fp32=0.6, fp64=0.0, tensor=0.6, sm_occupancy=0.9, dram_bandwidth=0.6
)
"""Stand-in for a tenant nobody has profiled yet: assume it is heavy, so the model errs towards
refusing a latency pod rather than promising what it cannot keep."""

SHIELDED = MIN_BATCH_THREADS
"""A profiled batch pod that keeps at most this share of the SMs busy (GPU-percent) -- capped
at this many threads or fewer, or using no more alone (its SM utilization) -- runs at MPS
priority 1 and does not count against a latency pod's bound: MPS priority protects the latency
pod from it, which the model does not know (docs/packing.md, "Requests and limits")."""


def shielded(profile: PipeProfile | None, gpu_class: str, threads: int) -> bool:
    """True for a batch neighbour a latency pod's bound leaves out (:data:`SHIELDED`). A pod
    without a profile never is: nothing measured says it leaves half the GPU."""
    if gpu_class == CLASS_LATENCY or profile is None:
        return False
    return busy_share(profile, threads) <= SHIELDED / SLICES_PER_GPU


def reserved(profile: PipeProfile) -> PipeProfile:
    """A latency pod as its neighbours feel it: busy over its whole reserved share (it runs
    uncapped at MPS priority 0, and its bursts take SMs first), not at its average SM
    utilization, which understates what its neighbours lose (docs/packing.md, "Admission")."""
    return replace(profile, sm_utilization=None)


def charged_cap_cost(
    model: InterferenceModel, profile: PipeProfile, threads: int, bound: float
) -> float:
    """What admission charges a batch job for its thread cap: the model's cap cost
    (:meth:`InterferenceModel.cap_slowdown`), at most sqrt(``bound``) so the cap alone never
    takes more than half the bound (in log terms), and 1.0 for a profile without a measured SM
    utilization (the cap cost was fit on it; without it the estimate is too rough to refuse a
    placement on)."""
    if profile.sm_utilization is None:
        return 1.0
    return min(model.cap_slowdown(profile, threads), math.sqrt(bound))


def admit_reason(
    gpu: GpuState,
    demand: Demand,
    *,
    model: InterferenceModel,
    bounds: Mapping[str, float],
    charge_cap: bool = True,
    newcomer_bound: bool = True,
    equals_bound: bool = True,
) -> str | None:
    """None when nobody on ``gpu`` (newcomer included) is predicted past its class bound.

    ``bounds``: the largest acceptable slowdown by class (``{"latency": 1.15, "batch": 2.0}``);
    a class without one is not checked. Pods without a profile count as heavy
    (:data:`CONSERVATIVE_PROFILE`); a latency pod's slowdown leaves out its :data:`SHIELDED`
    batch neighbours, and it weighs on them over its whole reserved share (:func:`reserved`).
    ``charge_cap``: a batch pod's slowdown is against itself alone on the whole GPU (x
    :func:`charged_cap_cost`), else at its own cap (docs/packing.md, "Admission"); batch pods
    alone are predicted as one pack. ``newcomer_bound=False``: the tenants only (an
    opportunistic pod is held to its gain); ``equals_bound=False``: not those that opted in
    (``Tenant.equal``). Paused tenants use no compute (``GpuState.running``)."""
    gpu = gpu.running()
    if not gpu.tenants:
        return None
    newcomer = demand.profile or CONSERVATIVE_PROFILE
    threads = assign_thread_percent(demand, gpu)
    loads = [tenant_load(t) for t in gpu.tenants]
    kept_out = [shielded(t.profile, t.gpu_class, tenant_threads(t)) for t in gpu.tenants]
    pack = _batch_pack(gpu, demand, newcomer=newcomer, threads=threads, loads=loads, model=model)
    if newcomer_bound:
        reason = _newcomer_reason(
            gpu,
            demand,
            newcomer=newcomer,
            threads=threads,
            loads=loads,
            kept_out=kept_out,
            model=model,
            bounds=bounds,
            charge_cap=charge_cap,
            predicted=None if pack is None else pack[-1],
        )
        if reason is not None:
            return reason
    new_kept_out = shielded(demand.profile, demand.gpu_class, threads)
    if demand.gpu_class == CLASS_LATENCY:
        threads = max(1, min(demand.percent, SLICES_PER_GPU))
        newcomer = reserved(newcomer)
    return _tenants_reason(
        gpu,
        (newcomer, threads),
        new_kept_out=new_kept_out,
        loads=loads,
        kept_out=kept_out,
        model=model,
        bounds=bounds,
        charge_cap=charge_cap,
        predicted=pack,
        equals_bound=equals_bound,
    )


Load = tuple[PipeProfile, int]
"""A pod as its neighbours feel it: its profile and the GPU-percent it keeps busy."""


def tenant_load(tenant: Tenant) -> Load:
    """A tenant as its neighbours feel it: a latency pod runs uncapped for its bursts and weighs
    its whole reserved share (:func:`reserved`); a batch pod its profile at its thread cap. A
    tenant nobody profiled is assumed heavy (:data:`CONSERVATIVE_PROFILE`)."""
    profile = tenant.profile or CONSERVATIVE_PROFILE
    if tenant.gpu_class == CLASS_LATENCY:
        return reserved(profile), tenant.percent
    return profile, tenant_threads(tenant)


def _batch_pack(
    gpu: GpuState,
    demand: Demand,
    *,
    newcomer: PipeProfile,
    threads: int,
    loads: list[Load],
    model: InterferenceModel,
) -> list[float] | None:
    """Every tenant's predicted slowdown and the newcomer's last, as one pack
    (:meth:`InterferenceModel.predict_pack`), where all of them are batch jobs; None where a
    latency pod is among them (its neighbours are then read one by one: shielded, reserved)."""
    if demand.gpu_class != CLASS_BATCH or any(t.gpu_class != CLASS_BATCH for t in gpu.tenants):
        return None
    return model.predict_pack([*loads, (newcomer, threads)])


def _newcomer_reason(
    gpu: GpuState,
    demand: Demand,
    *,
    newcomer: PipeProfile,
    threads: int,
    loads: list[Load],
    kept_out: list[bool],
    model: InterferenceModel,
    bounds: Mapping[str, float],
    charge_cap: bool,
    predicted: float | None,
) -> str | None:
    """Why the newcomer itself would run past its class bound beside ``loads``, or None
    (``predicted``: its slowdown from the pack's prediction, where there is one)."""
    bound = bounds.get(demand.gpu_class)
    if bound is None:
        return None
    seen = loads
    if demand.gpu_class == CLASS_LATENCY:
        seen = [load for load, s in zip(loads, kept_out, strict=True) if not s]
    slowdown = model.predict(newcomer, threads, seen) if predicted is None else predicted
    if demand.gpu_class != CLASS_LATENCY:
        slowdown = while_running(slowdown, newcomer)
        if charge_cap:
            slowdown *= charged_cap_cost(model, newcomer, threads, bound)
    if slowdown <= bound:
        return None
    unknown = "" if demand.profile else " (pod has no profile: assumed heavy)"
    return (
        f"predicted {slowdown:.2f}x slowdown for this {demand.gpu_class} pod beside "
        f"{len(gpu.tenants)} tenant(s), over its {bound:.2f}x bound{unknown}"
    )


def _tenants_reason(
    gpu: GpuState,
    newcomer: Load,
    *,
    new_kept_out: bool,
    loads: list[Load],
    kept_out: list[bool],
    model: InterferenceModel,
    bounds: Mapping[str, float],
    charge_cap: bool,
    predicted: Sequence[float] | None,
    equals_bound: bool = True,
) -> str | None:
    """Why a tenant already on ``gpu`` would run past its class bound with the newcomer
    (``newcomer``: as its neighbours feel it), or None (``predicted``: the tenants'
    slowdowns from the pack's prediction, where there is one; ``equals_bound``: see
    :func:`admit_reason`)."""
    for i, tenant in enumerate(gpu.tenants):
        bound = bounds.get(tenant.gpu_class)
        if bound is None or (not equals_bound and tenant.equal):
            continue
        others = [load for k, load in enumerate(loads) if k != i] + [newcomer]
        if tenant.gpu_class == CLASS_LATENCY:
            flags = [s for k, s in enumerate(kept_out) if k != i] + [new_kept_out]
            others = [load for load, s in zip(others, flags, strict=True) if not s]
        own = tenant_threads(tenant)
        slowdown = model.predict(loads[i][0], own, others) if predicted is None else predicted[i]
        if tenant.gpu_class != CLASS_LATENCY:
            slowdown = while_running(slowdown, loads[i][0])
            if charge_cap:
                slowdown *= charged_cap_cost(model, loads[i][0], own, bound)
        if slowdown > bound:
            return (
                f"would slow {tenant.gpu_class} pod {tenant.key} to {slowdown:.2f}x, "
                f"over its {bound:.2f}x bound"
            )
    return None


def measured(gpu: GpuState, demand: Demand) -> bool:
    """True when admission has a measured pod to protect on ``gpu``: the newcomer has a
    profile, or a profiled tenant is latency-class or the newcomer is (latency pods are kept
    from unknown neighbours, which count as heavy). A batch newcomer nobody profiled beside
    profiled batch pods is not checked: counted heavy, it would be refused beside nearly
    everyone (the openb simulator with profiled tenants fell from 96% to 83% allocation)."""
    if demand.profile is not None:
        return True
    profiled, profiled_latency = gpu.measured_tenants()
    return (profiled if demand.gpu_class == CLASS_LATENCY else profiled_latency) > 0


@dataclass(frozen=True)
class Admission:
    """The interference model and the class bounds admission holds pods to."""

    model: InterferenceModel = field(default_factory=load_default)
    bounds: Mapping[str, float] = field(default_factory=lambda: DEFAULT_BOUNDS)

    def gpu_reason(self, gpu: GpuState, demand: Demand) -> str | None:
        """Why ``demand`` may not join ``gpu``'s tenants, or None. Whole-GPU pods and empty
        GPUs are always admitted (nobody to slow down)."""
        if demand.whole or not gpu.tenants or not measured(gpu, demand):
            return None
        return admit_reason(gpu, demand, model=self.model, bounds=self.bounds)

    def admitted(self, node: NodeState, demand: Demand) -> NodeState:
        """``node`` with only the GPUs admission lets ``demand`` join (the same object when
        it refuses none, so nothing is copied on the common path)."""
        if demand.whole:
            return node
        keep = [g for g in node.gpus if self.gpu_reason(g, demand) is None]
        return node if len(keep) == len(node.gpus) else replace(node, gpus=keep)

    def node_reason(self, node: NodeState, demand: Demand) -> str | None:
        """The first refusal admission gives on ``node`` (for the scheduler's events)."""
        for gpu in node.gpus:
            reason = self.gpu_reason(gpu, demand)
            if reason is not None:
                return f"GPU {gpu.uuid}: {reason}"
        return None
