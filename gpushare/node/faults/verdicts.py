"""Verdicts across incidents (pure): the workload behind a pod, the culprit of repeated
faults (:class:`RepeatOffenders`), and which pod to move when workloads keep faulting
together (:func:`pick_to_separate`)."""

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Workload:
    """What recreates a pod: its controller, else the pod itself."""

    uid: str
    kind: str
    namespace: str
    name: str

    @property
    def label(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


def workload_of(pod: Mapping[str, Any]) -> Workload:
    meta = pod.get("metadata") or {}
    namespace = str(meta.get("namespace", ""))
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller") and ref.get("uid"):
            return Workload(str(ref["uid"]), str(ref.get("kind", "")), namespace, str(ref["name"]))
    return Workload(str(meta.get("uid", "")), "Pod", namespace, str(meta.get("name", "")))


UNKNOWN_WORKLOAD = "?"
"""An involved client no pod was found for: it may be the same workload every time, so it
counts as one partner common to every incident it appears in (it never clears anyone)."""


@dataclass(frozen=True)
class Verdict:
    """What the faults within the window say after one more incident."""

    culprits: Mapping[str, int]
    """Workload UID -> faults it was involved in, for each workload involved in ``threshold``
    faults whose other involved workloads have no workload in common: it is the common factor
    (a victim shares its faults only with the faulter)."""
    together: tuple[str, ...]
    """Workloads involved in every one of ``threshold`` faults with each other (the same set
    keeps faulting together): nothing can be concluded; one of them should be moved away.
    Empty when there are culprits."""


class RepeatOffenders:
    """Fatal faults within a sliding window, each as the set of workloads it involved.

    Pure: the monitor feeds it the involved workloads of each incident (every client the fault
    tore down, not the one the MPS server named, which on driver 580 is right about half the
    time) and acts on the :class:`Verdict`. Once a culprit is found, the faults it was involved
    in are explained and dropped, so its victims are not implicated by them later."""

    def __init__(self, *, threshold: int, window_s: float) -> None:
        self.threshold = threshold
        self.window_s = window_s
        self._incidents: deque[tuple[float, frozenset[str]]] = deque()

    def record(self, involved: Iterable[str], at: float) -> Verdict:
        """Add one fault (the UIDs of the workloads it involved, ``UNKNOWN_WORKLOAD`` for a
        client without a pod) at ``at``; returns what the window now says."""
        workloads = frozenset(involved)
        self._incidents.append((at, workloads))
        self._incidents = deque((t, ws) for t, ws in self._incidents if at - self.window_s <= t)
        if self.threshold <= 0:
            return Verdict(culprits={}, together=())
        culprits: dict[str, int] = {}
        together: set[str] = set()
        for uid in sorted(workloads - {UNKNOWN_WORKLOAD}):
            partners = [ws - {uid} for _, ws in self._incidents if uid in ws]
            if len(partners) < self.threshold:
                continue
            common = frozenset.intersection(*partners)
            if common:
                together |= {uid} | (common - {UNKNOWN_WORKLOAD})
            else:
                culprits[uid] = len(partners)
        if culprits:
            self._incidents = deque(
                (t, ws) for t, ws in self._incidents if not ws.intersection(culprits)
            )
            together = set()
        return Verdict(culprits=culprits, together=tuple(sorted(together)))

    def involved(self, uid: str) -> int:
        """Faults within the window (not yet explained by a culprit) that involved ``uid``."""
        return sum(1 for _, ws in self._incidents if uid in ws)


def _created(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("creationTimestamp") or "")


def pick_to_separate(pods: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The pod to move away from pods that keep faulting together, or None.

    Only a pod with a controller is moved (its controller recreates it, elsewhere if the
    scheduler can; evicting a bare pod would delete it for good). Among those, the youngest
    (latest ``creationTimestamp``: the least work lost, and the long-running neighbour stays),
    then by namespace/name, so every agent picks the same one."""

    def key(pod: Mapping[str, Any]) -> tuple[str, str, str]:
        meta = pod.get("metadata") or {}
        return (_created(pod), str(meta.get("namespace", "")), str(meta.get("name", "")))

    owned = [p for p in pods if workload_of(p).kind != "Pod"]
    if not owned:
        return None
    newest = max(_created(p) for p in owned)
    return min((p for p in owned if _created(p) == newest), key=key)
