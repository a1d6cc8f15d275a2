"""What fault handling does in Kubernetes: warning Events on the pods involved (or the node),
and moving workloads off shared GPUs (:class:`WorkloadMoves`): the culprit of repeated faults
to a GPU of its own, one of the workloads that keep faulting together elsewhere, both marked
on the node and their pods marked for eviction (the controller evicts)."""

import logging
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from gpushare.api.exclusive import (
    ExclusiveWorkload,
    dump_exclusive,
    load_exclusive,
    load_separated,
)
from gpushare.api.names import (
    ANN_EVICT,
    ANN_EXCLUSIVE,
    ANN_NODE_EXCLUSIVE,
    ANN_NODE_SEPARATED,
    SLICES_PER_GPU,
)
from gpushare.api.placement import format_time
from gpushare.api.pod import PodInfo
from gpushare.node.faults.incidents import FaultIncident
from gpushare.node.faults.metrics import FaultStats
from gpushare.node.faults.verdicts import (
    UNKNOWN_WORKLOAD,
    RepeatOffenders,
    Workload,
    pick_to_separate,
    workload_of,
)

# The package's one logger: its lines keep the name they have always had.
log = logging.getLogger("gpushare.node.faults")


class FaultKube(Protocol):
    """The Kubernetes calls the monitor makes (gpushare.kube.node.NodeKube implements them)."""

    def record_event(
        self, *, pod: PodInfo | None, reason: str, message: str, warning: bool
    ) -> None: ...

    def publish_node(
        self, *, annotations: Mapping[str, str], labels: Mapping[str, str | None]
    ) -> None: ...

    def node_annotations(self) -> dict[str, str]: ...

    def annotate_pod(
        self, *, namespace: str, name: str, annotations: Mapping[str, str]
    ) -> None: ...


@dataclass(frozen=True)
class PodRef:
    """A pod an incident involves."""

    pid: int
    uid: str | None
    pod: PodInfo | None
    """The agent's projection of the pod (its placement parsed once); None when not found."""

    @property
    def manifest(self) -> Mapping[str, Any] | None:
        return self.pod.manifest if self.pod is not None else None

    @property
    def key(self) -> str:
        meta = (self.manifest or {}).get("metadata") or {}
        return f"{meta.get('namespace', '?')}/{meta.get('name', '?')}" if self.manifest else "?"


def _shares_gpu(pod: PodInfo) -> bool:
    """True when the pod runs on a share of a GPU (through MPS), not on whole GPUs. A share is
    told by its request: a burstable pod's thread cap may be the whole GPU. A malformed
    placement counts as a share."""
    if pod.placement_error is not None:
        return True
    placement = pod.placement
    return placement is None or (
        len(placement.gpu_uuids) == 1 and placement.guaranteed_percent < SLICES_PER_GPU
    )


def _mark(workload: Workload, incident: FaultIncident, count: int) -> ExclusiveWorkload:
    """The node annotation entry for ``workload`` after ``count`` faults, the last
    ``incident``."""
    return ExclusiveWorkload(
        uid=workload.uid,
        kind=workload.kind,
        namespace=workload.namespace,
        name=workload.name,
        faults=count,
        since=format_time(datetime.fromtimestamp(incident.logged_at, tz=UTC)),
        gpu_uuid=incident.gpu_uuid,
    )


def warning_event(kube: FaultKube | None, ref: PodRef | None, reason: str, message: str) -> None:
    """A warning Event on the pod of ``ref``, or on the node when ``ref`` is None."""
    if kube is None or (ref is not None and ref.pod is None):
        return
    pod = ref.pod if ref is not None else None
    try:
        kube.record_event(pod=pod, reason=reason, message=message, warning=True)
    except Exception as exc:
        where = ref.key if ref is not None else "the node"
        log.warning("could not record event %s on %s: %s", reason, where, exc)


def mark_for_eviction(kube: FaultKube, info: PodInfo, reason: str) -> bool:
    """Annotate the pod for the controller to evict (``gpushare.io/evict``, the controller
    holds the eviction right); False, logged, when the mark could not be written."""
    try:
        kube.annotate_pod(namespace=info.namespace, name=info.name, annotations={ANN_EVICT: reason})
    except Exception as exc:
        log.warning("could not mark %s for eviction: %s", info.key, exc)
        return False
    log.warning("asked the controller to evict %s: %s", info.key, reason)
    return True


class WorkloadMoves:
    """Moves workloads off shared GPUs after faults: the culprit the verdicts name gets a GPU
    of its own, one pod of workloads that keep faulting together is moved elsewhere; both are
    published on the node (``gpushare.io/exclusive-workloads``, ``-separated-workloads``)."""

    def __init__(
        self,
        *,
        kube: FaultKube | None,
        offenders: RepeatOffenders,
        stats: FaultStats,
        clock: Callable[[], float],
        exclusive_ttl_s: float,
    ) -> None:
        self.kube = kube
        self.offenders = offenders
        self.stats = stats
        self.clock = clock
        self.exclusive_ttl_s = exclusive_ttl_s
        self.exclusive: dict[str, ExclusiveWorkload] = {}
        """Workload UID -> its mark for a GPU of its own."""
        self._loaded = False
        self.separated: dict[str, str] = {}
        """Pod UID -> why it is moved away from pods it keeps faulting with (marked once)."""
        self.apart: dict[str, ExclusiveWorkload] = {}
        """Workload UID -> its separation (published as ``gpushare.io/separated-workloads``:
        the webhook keeps its new pods off ``gpu_uuid``)."""

    def load(self) -> None:
        """Take in the marks this node published before (once, at the first check)."""
        if self._loaded or self.kube is None:
            return
        self._loaded = True
        try:
            annotations = self.kube.node_annotations()
        except Exception as exc:
            log.warning("could not read this node's annotations: %s", exc)
            return
        for key, load, into in (
            (ANN_NODE_EXCLUSIVE, load_exclusive, self.exclusive),
            (ANN_NODE_SEPARATED, load_separated, self.apart),
        ):
            try:
                text = annotations.get(key)
                if text:
                    into.update({w.uid: w for w in load(text)})
            except Exception as exc:
                log.warning("ignoring this node's %s: %s", key, exc)

    def judge(self, incident: FaultIncident, refs: list[PodRef]) -> None:
        """Record the workloads the incident involved; move the culprit to a GPU of its own, or
        separate workloads that keep faulting together."""
        workloads: dict[str, list[PodRef]] = defaultdict(list)
        for ref in refs:
            # By namespace too: a controller ownerReference is the pod's own word (the API
            # server checks no UID), so a tenant pod naming another namespace's workload must
            # not share its fault record (#45).
            workload = workload_of(ref.manifest) if ref.manifest is not None else None
            key = f"{workload.namespace}/{workload.uid}" if workload and workload.uid else ""
            workloads[key or UNKNOWN_WORKLOAD].append(ref)
        verdict = self.offenders.record(workloads, incident.logged_at)
        for uid, count in verdict.culprits.items():
            for ref in workloads[uid]:
                self._mark_exclusive(ref, incident, count)
        if verdict.together:
            self._separate(incident, {uid: workloads[uid] for uid in verdict.together})

    def _mark_exclusive(self, ref: PodRef, incident: FaultIncident, count: int) -> None:
        assert ref.manifest is not None
        workload = workload_of(ref.manifest)
        mark = _mark(workload, incident, count)
        first = workload.uid not in self.exclusive
        self.exclusive[workload.uid] = mark
        if first:
            self._publish()
        info = ref.pod
        assert info is not None
        if not _shares_gpu(info):
            return
        recreate = (
            f"its {workload.kind} recreates it on a GPU of its own"
            if workload.kind != "Pod"
            else 'it has no controller: recreate it with gpushare.io/gpu-fraction: "1"'
        )
        warning_event(
            self.kube,
            ref,
            "GpuShareExclusiveGpu",
            f"{mark.reason}; evicting this pod from its shared GPU so it stops breaking its "
            f"neighbours; {recreate}",
        )
        if self.kube is None:
            return
        try:
            # The controller evicts it (it holds that right; this agent does not).
            self.kube.annotate_pod(
                namespace=info.namespace,
                name=info.name,
                annotations={ANN_EXCLUSIVE: mark.reason, ANN_EVICT: mark.reason},
            )
            self.stats.evicted += 1
        except Exception as exc:
            log.warning("could not move %s to an exclusive GPU: %s", info.key, exc)

    def _separate(self, incident: FaultIncident, together: Mapping[str, list[PodRef]]) -> None:
        """Evict one pod of workloads that keep faulting together (not marked exclusive): its
        controller recreates it, and the next fault, beside other neighbours, tells."""
        pods = {
            str((r.pod.manifest.get("metadata") or {}).get("uid")): r
            for refs in together.values()
            for r in refs
            if r.pod is not None and _shares_gpu(r.pod)
        }
        labels = sorted(workload_of(r.manifest).label for r in pods.values() if r.manifest)
        count = max(self.offenders.involved(uid) for uid in together)
        window = f"{self.offenders.window_s / 3600:g} h"
        if pods.keys() & self.separated.keys():
            return  # one of them is already being moved
        chosen = pick_to_separate([r.manifest for r in pods.values() if r.manifest is not None])
        if chosen is None:
            for ref in pods.values():
                warning_event(
                    self.kube,
                    ref,
                    "GpuShareFaultSeparate",
                    f"{', '.join(labels)} keep being involved in the same fatal GPU faults "
                    f"({count} within {window}, last on shared GPU {incident.gpu_uuid}), so "
                    "gpushare cannot tell which one "
                    "faults; none has a controller that would recreate it, so none is evicted: "
                    "recreate one of them on another GPU (or with gpushare.io/gpu-fraction: "
                    '"1").',
                )
            return
        ref = pods[str((chosen.get("metadata") or {}).get("uid"))]
        info = ref.pod
        assert info is not None
        mine = workload_of(chosen).label
        others = ", ".join(label for label in labels if label != mine) or "nothing else"
        reason = (
            f"{mine} and {others} keep being involved in the same fatal GPU faults ({count} "
            f"within {window}, last on shared GPU {incident.gpu_uuid}), so which one faults "
            "cannot be told; this pod is "
            "moved (not to an exclusive GPU) so the next fault, beside other neighbours, tells"
        )
        warning_event(
            self.kube,
            ref,
            "GpuShareFaultSeparate",
            f"{reason}; evicting it, its controller recreates it",
        )
        self.separated[info.uid] = reason
        moved = workload_of(chosen)
        self.apart[moved.uid] = _mark(moved, incident, count)
        self._publish()
        self._ask_eviction(info, reason)

    def _ask_eviction(self, info: PodInfo, reason: str) -> None:
        """Mark the pod for the controller to evict (``gpushare.io/evict``); a mark that cannot
        be written is forgotten, so the next fault tries again."""
        if self.kube is None:
            return
        if mark_for_eviction(self.kube, info, reason):
            self.stats.separated += 1
        else:
            self.separated.pop(info.uid, None)

    def _publish(self) -> None:
        """Publish the exclusive and the separated workloads (marks older than
        ``exclusive_ttl_s`` dropped)."""
        cutoff = self.clock() - self.exclusive_ttl_s
        for marks in (self.exclusive, self.apart):
            for uid, mark in list(marks.items()):
                try:
                    marked = datetime.fromisoformat(mark.since.replace("Z", "+00:00")).timestamp()
                except ValueError:
                    continue
                if marked < cutoff:
                    del marks[uid]
        if self.kube is None:
            return
        try:
            self.kube.publish_node(
                annotations={
                    ANN_NODE_EXCLUSIVE: dump_exclusive(list(self.exclusive.values())),
                    ANN_NODE_SEPARATED: dump_exclusive(list(self.apart.values())),
                },
                labels={},
            )
        except Exception as exc:
            log.warning(
                "could not publish %s and %s: %s", ANN_NODE_EXCLUSIVE, ANN_NODE_SEPARATED, exc
            )
