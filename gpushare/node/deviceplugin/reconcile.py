"""Allocate answers checked against the kubelet's pod-resources API: pods a restarted kubelet
forgot, and pods that got another pod's answer (exchanges).

A kubelet that dies between our Allocate answer and its checkpoint asks again, for the same pod,
after it restarts; that pod is already ``allocated``. So a pod ``allocated`` under an earlier
kubelet, still Pending with no container ever started, which the current kubelet holds no slices
for (its pod-resources API), waits again with its own placement (``forgotten_pods``); the
slices it had are offered again first (gpushare.node.deviceplugin.steering.steer).

Pods of the same size that wait together cannot be told apart from the device IDs alone: the
kubelet may give the answer meant for one to another. ``reconcile`` finds which pod holds each
answer and rewrites placement annotations so that they say what each pod's containers run with.
"""

from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from gpushare.api.names import ANN_GPU_UUID, ANN_STATE, STATE_ALLOCATED, STATE_ASSUMED
from gpushare.api.pod import PodInfo
from gpushare.node.core.pods import placement_values
from gpushare.node.deviceplugin.holdings import Answer

UNVERIFIED_FOR_S = 120.0
"""An answer no pod holds after this long is given up on (the kubelet refused the pod)."""


def suspect_pods(
    pods: Iterable[PodInfo], *, answers: Mapping[str, Answer], kubelet: str | None
) -> list[PodInfo]:
    """Pods the running kubelet may have forgotten: allocated (by the annotation, or by an
    answer of ours whose mark may not show yet), still Pending, no container ever started, a
    placement that parses, and not answered (or confirmed held) under this very kubelet.

    Only these need the kubelet's pod-resources answer; any other pod cannot come back."""
    found = []
    for pod in pods:
        answer = answers.get(pod.uid)
        if pod.phase != "Pending" or pod.started or ANN_GPU_UUID not in pod.annotations:
            continue
        if pod.annotations.get(ANN_STATE) != STATE_ALLOCATED and answer is None:
            continue
        if answer is not None and kubelet is not None and answer.kubelet == kubelet:
            continue
        if pod.placement is None:
            continue
        found.append(pod)
    return found


def forgotten_pods(
    suspects: Iterable[PodInfo], held: Mapping[str, tuple[str, ...]]
) -> frozenset[str]:
    """UIDs of the suspects the kubelet lists holding no slices (``held``: namespace/name ->
    slice IDs, from its pod-resources API): their Allocate will come again. A suspect the
    kubelet does not list yet is not concluded forgotten: a restarted kubelet lists a pod once
    it learns it from the API server, with the slices its checkpoint kept for it."""
    return frozenset(p.uid for p in suspects if p.key in held and not held[p.key])


@dataclass
class Reconciliation:
    """What the kubelet's pod-resources answer says about unverified Allocate answers."""

    settled: list[tuple[Answer, PodInfo]] = field(default_factory=list)
    """Each answer and the pod the kubelet gave it to."""
    patches: dict[str, dict[str, str]] = field(default_factory=dict)
    """Pod UID -> placement annotations to write so that they say what its containers run
    with (the pod that got another's answer), or what it waits for now (the pod it was meant
    for, which takes over the first pod's unused placement)."""
    reopened: set[str] = field(default_factory=set)
    """UIDs of pods an answer was meant for that still wait for their Allocate."""
    exchanged: list[tuple[PodInfo, Answer]] = field(default_factory=list)
    stale: list[Answer] = field(default_factory=list)
    """Answers whose slice IDs a later answer covered: the kubelet that asked forgot them
    (it restarted) and gave the same slices out again, so the pod holding them now holds the
    later answer, not this one."""


def reconcile(
    pods: Sequence[PodInfo],
    held: Mapping[str, tuple[str, ...]],
    unverified: Iterable[Answer],
    *,
    others: Iterable[Answer] = (),
    running: AbstractSet[str] = frozenset(),
) -> Reconciliation:
    """Match unverified answers to the pods the kubelet gave them to (same slice IDs).

    A pod P holding the answer meant for Q runs with the placement that answer carried: P's
    annotations get it, and the pod that carries that placement now and waits (Q, or whoever
    took it over in an earlier exchange) gets P's vacated placement in exchange (state
    assumed), so that its Allocate, steered to that GPU, gets it. Every exchange is a swap of
    two pods' placements, so each GPU's total stays what the scheduler booked, also when
    answers chain (P holds Q's, Q's went to R, ...) within one check or across several, and
    every running pod's annotations say what it runs with. Only a pod that waits (no slices
    held, no container started) gives its placement up; when none carries it, P's placement is
    rewritten alone (its old placement then counts for nobody until the pod that holds its
    answer shows up).

    Slice IDs held by one pod may have been answered more than once: a restarted kubelet that
    forgot an answer hands the same slices out again. The pod holds the latest answer for
    them; earlier ones (among ``unverified`` and ``others``, the rest of the answers) are
    ``stale`` and match nobody. ``running``: UIDs of pods whose containers run (seen on the
    node) though the API may not say so yet; they never give their placement up."""
    answers = sorted(unverified, key=lambda a: a.at)
    latest: dict[tuple[str, ...], float] = {}
    for a in (*answers, *others):
        latest[a.devices] = max(a.at, latest.get(a.devices, a.at))
    by_key = {p.key: p for p in pods}
    holder_of = {tuple(sorted(devices)): key for key, devices in held.items() if devices}
    view = _PodView(pods, held, running)
    plan = Reconciliation()
    for answer in answers:
        key = holder_of.get(answer.devices)
        holder = by_key.get(key) if key is not None else None
        if holder is None:
            continue
        if answer.at < latest[answer.devices]:
            plan.stale.append(answer)
            continue
        plan.settled.append((answer, holder))
        _exchange(plan, view, answer, holder)
    return plan


class _PodView:
    """The pods of one reconcile: what the kubelet holds for each, and the placement each
    carries as exchanges so far rewrote it."""

    def __init__(
        self,
        pods: Sequence[PodInfo],
        held: Mapping[str, tuple[str, ...]],
        running: AbstractSet[str],
    ) -> None:
        self.pods = pods
        self.held = held
        self.running = running
        self.by_uid = {p.uid: p for p in pods}
        self.current = {p.uid: placement_values(p) for p in pods}

    def waits(self, pod: PodInfo) -> bool:
        """The pod still waits for its Allocate: no slices held, no container started."""
        return (
            not self.held.get(pod.key)
            and not pod.started
            and pod.phase == "Pending"
            and pod.uid not in self.running
        )

    def owner(self, answer: Answer, holder: PodInfo) -> PodInfo | None:
        """The waiting pod that carries the answer's placement now, the one meant first."""
        meant = self.by_uid.get(answer.uid)
        candidates = [meant] if meant is not None else []
        candidates += sorted((p for p in self.pods if p.uid != answer.uid), key=lambda p: p.key)
        for pod in candidates:
            if (
                pod.uid != holder.uid
                and self.current[pod.uid] == answer.placement
                and self.waits(pod)
            ):
                return pod
        return None


def _exchange(plan: Reconciliation, view: _PodView, answer: Answer, holder: PodInfo) -> None:
    """``holder`` got ``answer``, meant for another pod: its annotations get the answer's
    placement, and the waiting pod carrying that placement gets the holder's vacated one."""
    if holder.uid == answer.uid or not answer.placement:
        return
    vacated = view.current[holder.uid]
    if vacated == answer.placement:
        return
    giver = view.owner(answer, holder)
    plan.patches[holder.uid] = {**dict(answer.placement), ANN_STATE: STATE_ALLOCATED}
    plan.exchanged.append((holder, answer))
    view.current[holder.uid] = answer.placement
    if giver is not None and vacated:
        plan.patches[giver.uid] = {**dict(vacated), ANN_STATE: STATE_ASSUMED}
        plan.reopened.add(giver.uid)
        view.current[giver.uid] = vacated
