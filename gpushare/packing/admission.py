"""Interference admission: which GPUs a pod may join without anyone past its class bound.

The placement cost weighs predicted interference against fragmentation, but a cost never says
no. Admission does: a GPU where the newcomer or a tenant already there is predicted slower than
its class accepts (:data:`DEFAULT_BOUNDS`) is not a candidate, exactly as if it were full
(:func:`gpushare.packing.interference.admit_reason`; docs/packing.md, "Admission"). The
extender's filter and bind and the GPU benchmark ask the same :class:`Admission` through
:class:`gpushare.packing.placer.Placer`, so the benchmark measures what a cluster does.

It applies where something measured is at stake (:func:`measured`): the newcomer has a profile
(from its GpuShare), or a latency pod with a profile would share the GPU with it. Among pods
nobody profiled there is nothing to predict from and placement is fit and fragmentation alone
(the openb traces are such pods).
"""

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from gpushare.api.names import CLASS_LATENCY
from gpushare.packing.interference import InterferenceModel, admit_reason, load_default
from gpushare.packing.model import Demand, GpuState, NodeState

DEFAULT_BOUNDS: Mapping[str, float] = MappingProxyType({"latency": 1.15, "batch": 2.0})
"""Largest predicted slowdown each class accepts: a latency pod's against itself alone, a
batch pod's against itself alone on the whole GPU (its thread cap's cost charged)."""


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
