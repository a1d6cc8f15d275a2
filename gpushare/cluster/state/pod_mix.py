"""Which pods the view counts in the pod mix the gpushare policy measures against
(:class:`gpushare.packing.mix.PodMix`), and when: each pod once, as it arrives (docs/packing.md,
"The pod mix learned online"), with the GPU models its node constraints admit
(:mod:`~gpushare.cluster.state.allowed_models`); and taken back out if it is deleted before it
was ever bound (throw-away pending pods: docs/security.md, issue 67)."""

from collections.abc import Container, Mapping
from dataclasses import replace
from typing import Any

from gpushare.api.names import SCHEDULER_NAME
from gpushare.cluster.state.allowed_models import AllowedModels
from gpushare.cluster.state.nodes import NodeInfo
from gpushare.cluster.state.pod_facts import PodFacts
from gpushare.cluster.state.pods import spec
from gpushare.packing.mix import PodMix
from gpushare.packing.model import Demand, NodeState
from gpushare.packing.scarcity import HostShape, free_by_model, host_shapes


class MixCounter:
    """The pods already counted, so that none counts twice."""

    def __init__(self) -> None:
        self.counted: dict[str, str] = {}
        """Pod key -> UID of the pod counted (at most one entry per live pod)."""
        self.models = AllowedModels()
        """The GPU models each pod's node constraints admit, counted with its shape."""
        self.unbound: dict[str, tuple[str, Demand, int]] = {}
        """Pod key -> (UID, the demand counted, the mix's halvings then) of the pods counted
        while pending and not yet seen bound: deleted before they are, they are taken back."""

    def node(self, name: str, labels: object, info: NodeInfo | None) -> None:
        """A node as the view last took it in: its labels and its GPUs' model."""
        models = info.gpu_models.values() if info is not None else ()
        self.models.node(
            name, labels if isinstance(labels, Mapping) else None, next(iter(models), None)
        )

    def count(
        self,
        mix: PodMix,
        pod: Mapping[str, Any],
        f: PodFacts,
        *,
        ours: bool,
        cpu: int,
        memory: int,
        gpu_nodes: Container[str],
    ) -> None:
        """Count a pod in ``mix`` the first time the view sees it (per UID), as it arrives: a
        gpushare pod or a pod for the gpushare-scheduler at once (pending), any other pod once
        bound to a node with gpushare GPUs (``gpu_nodes``: its CPU and memory compete with them
        there). Finished pods are not counted (a restart's first list holds old ones). A pod
        seen bound counts for good; one replaced by a pod of the same name before it was bound
        is taken back first (its deletion was not seen)."""
        if f.node is not None and self.unbound.get(f.key, ("",))[0] == f.uid:
            del self.unbound[f.key]
        if f.finished or self.counted.get(f.key) == f.uid:
            return
        if ours:
            if f.demand is None:
                return
            demand = f.demand
            allowed = self.models.of(spec(pod)) if demand.gpus > 0 else None
            if allowed is not None:
                demand = replace(demand, gpu_model=allowed)
        elif spec(pod).get("schedulerName") == SCHEDULER_NAME or (
            f.node is not None and f.node in gpu_nodes
        ):
            demand = Demand(percent=0, gpus=0, cpu_milli=cpu, host_memory_bytes=memory)
        else:
            return
        self._take_back(mix, f.key)
        self.counted[f.key] = f.uid
        mix.observe(demand)
        if f.node is None:
            self.unbound[f.key] = (f.uid, demand, mix.halvings)

    def forget(self, key: str, mix: PodMix) -> None:
        """The pod is gone: seen again, it counts again. Never bound, it is taken out of
        ``mix`` (it was no demand to come)."""
        self.counted.pop(key, None)
        self._take_back(mix, key)

    def _take_back(self, mix: PodMix, key: str) -> None:
        held = self.unbound.pop(key, None)
        if held is not None:
            mix.unobserve(held[1], held[2])


class FreeByModel:
    """Free GPU-percent by GPU model over the view's nodes, what the mix prices scarce models
    against (:func:`gpushare.packing.scarcity.free_by_model`), worked out again only for the
    nodes whose version moved since the last read: the mix asks every 50 pods, and at 5,000
    nodes walking every GPU each time cost more than the pods' own filter calls."""

    def __init__(self, nodes: Mapping[str, NodeState], versions: Mapping[str, int]) -> None:
        self._nodes = nodes
        self._versions = versions
        self._kept: dict[str, tuple[int, dict[str, int]]] = {}

    def __call__(self) -> dict[str, int]:
        kept, versions = self._kept, self._versions
        for name in [n for n in kept if n not in self._nodes]:
            del kept[name]
        out: dict[str, int] = {}
        for name, node in self._nodes.items():
            version = versions.get(name, 0)
            hit = kept.get(name)
            if hit is None or hit[0] != version:
                hit = kept[name] = (version, free_by_model((node,)))
            for model, free in hit[1].items():
                out[model] = out.get(model, 0) + free
        return out


class HostShapes:
    """The kinds of node of each GPU model over the view's nodes -- (GPUs, allocatable milli-CPU,
    allocatable memory bytes) -- which limit a pod to the models whose nodes can hold it
    (:mod:`gpushare.packing.scarcity`). The mix asks at each refit (a walk over the nodes, about
    3 ms at 5,000); the kinds are grouped again only when a node came, went or changed kind."""

    def __init__(
        self, nodes: Mapping[str, NodeState], allocatable: Mapping[str, tuple[int, int]]
    ) -> None:
        self._nodes = nodes
        self._allocatable = allocatable
        self._seen: dict[str, tuple[str, HostShape]] = {}
        self._shapes: dict[str, frozenset[HostShape]] = {}

    def __call__(self) -> dict[str, frozenset[HostShape]]:
        seen: dict[str, tuple[str, HostShape]] = {}
        for name, node in self._nodes.items():
            if not node.gpus:
                continue
            host = self._allocatable.get(name)
            cpu, memory = host if host is not None else (None, None)
            seen[name] = (node.gpus[0].model, (len(node.gpus), cpu, memory))
        if seen != self._seen:
            self._seen = seen
            self._shapes = host_shapes(seen.values())
        return self._shapes
