"""The claim allocator's bookkeeping of gated pods: what it knows of each pod waiting for its
claims to be placed (:class:`Waiting`), where its gate is, and the host room of the pods it
placed that are not bound yet (:class:`HostHolds`). Pure: no I/O.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpushare.api.dra import PLACEMENT_GATE


@dataclass
class Waiting:
    """A pod gated by ``gpushare.io/placement``, as the allocator last saw and decided it."""

    pod: Mapping[str, Any]
    refused_at: tuple[int, int] | None = None
    """``DraDevices.version`` and the agents' verdicts' generation when no GPU had room
    (tried again once either moves)."""
    retry_at: float = 0.0
    told: str = ""
    """The last refusal the pod's event said (said once)."""
    writing: bool = False
    """Its placement is being written (not decided again meanwhile)."""
    gone: bool = False
    """Deleted or ungated while its placement was being written: dropped once it ends."""
    claims: set[str] = field(default_factory=set)
    gpus: tuple[str, ...] = ()
    """UUIDs of the GPUs its claims were placed on here (the last decision)."""
    avoid: frozenset[str] = frozenset()
    """GPU UUIDs the pod must not use (``gpushare.io/avoid-gpus``, the webhook's separation)."""
    node: str | None = None
    """The node its claims were placed on here (the last decision): the gate's removal pins
    the pod there (gpushare.cluster.dra.pin)."""


def meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """The object's ``metadata`` (empty when it has none)."""
    value = obj.get("metadata")
    return value if isinstance(value, Mapping) else {}


def gate_index(pod: Mapping[str, Any]) -> int | None:
    """Where the pod's ``gpushare.io/placement`` gate is in ``spec.schedulingGates``."""
    spec = pod.get("spec")
    gates = spec.get("schedulingGates") if isinstance(spec, Mapping) else None
    for i, gate in enumerate(gates if isinstance(gates, list) else ()):
        if isinstance(gate, Mapping) and gate.get("name") == PLACEMENT_GATE:
            return i
    return None


def other_gates(pod: Mapping[str, Any]) -> list[str]:
    """The pod's scheduling gates other than ``gpushare.io/placement`` (a queue's, such as
    Kueue's ``kueue.x-k8s.io/admission``): while one is on, nothing may schedule the pod, so
    its claims are not placed either (docs/queues.md, "DRA mode")."""
    spec = pod.get("spec")
    gates = spec.get("schedulingGates") if isinstance(spec, Mapping) else None
    return [
        str(gate.get("name"))
        for gate in (gates if isinstance(gates, list) else ())
        if isinstance(gate, Mapping) and gate.get("name") != PLACEMENT_GATE
    ]


class HostHolds:
    """Host room (milli-CPU, memory) of pods placed here and not yet bound: the view counts a
    pod's requests only once it is bound, so the search takes these off their nodes."""

    def __init__(self) -> None:
        self._of: dict[str, tuple[str, int, int]] = {}
        """Pod key -> (node, milli-CPU, memory)."""
        self.on: dict[str, tuple[int, int]] = {}
        """Node -> what the pods held here take of it (the search's ``held``)."""

    def pods(self) -> list[str]:
        """Keys of the pods holding room."""
        return list(self._of)

    def hold(self, key: str, node: str, cpu: int, memory: int) -> None:
        """Pod ``key`` takes ``cpu``/``memory`` of ``node`` (instead of what it held before)."""
        self.release(key)
        self._of[key] = (node, cpu, memory)
        c, m = self.on.get(node, (0, 0))
        self.on[node] = (c + cpu, m + memory)

    def release(self, key: str) -> None:
        """Pod ``key`` holds nothing any more (bound, deleted, or its placement undone)."""
        held = self._of.pop(key, None)
        if held is None:
            return
        node, cpu, memory = held
        c, m = self.on.get(node, (0, 0))
        if (c - cpu, m - memory) == (0, 0):
            self.on.pop(node, None)
        else:
            self.on[node] = (c - cpu, m - memory)


__all__ = ["HostHolds", "Waiting", "gate_index", "meta", "other_gates"]
