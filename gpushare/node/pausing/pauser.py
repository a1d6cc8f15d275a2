"""The node agent's pause loop: for every pod gpushare placed on this node, freeze or thaw its
containers to match its ``gpushare.io/pause`` request, record the freeze in effect in
``gpushare.io/paused`` and say so in Events (docs/node-agent.md, "Pausing a pod").

Each pass starts from the pods as the API server has them and the cgroups as the kernel has
them, never from what an earlier pass believed: an agent that starts resolves every pod on its
first pass (a pod frozen by an agent that died is kept frozen when its request stands, thawed
when it was withdrawn meanwhile). One pod that cannot be handled never stops the others.

Events, on the pod: ``Paused`` and ``Resumed`` (Normal, the request's reason and message, or
why it runs again), ``PauseFailed`` and ``ResumeFailed`` (Warning, what failed and the fix). A
failure is reported when it first happens or changes, and again every
:data:`REPORT_AGAIN_S`; a failed thaw is tried again on every pass, a failed freeze after a
growing wait (:data:`FREEZE_RETRY_S`).
"""

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Protocol

from gpushare.api.names import ANN_PAUSED
from gpushare.api.pause import PauseState
from gpushare.api.pod import PodInfo
from gpushare.node.core.allocations import container_id
from gpushare.node.pausing.decisions import (
    MALFORMED,
    NOT_GPUSHARE,
    TERMINATING,
    WITHDRAWN,
    FreezeState,
    Step,
    Wanted,
    next_step,
    recorded,
    wanted,
)
from gpushare.node.pausing.freezer import FreezeError, Freezer

log = logging.getLogger(__name__)

PAUSED: Final = "Paused"
RESUMED: Final = "Resumed"
PAUSE_FAILED: Final = "PauseFailed"
RESUME_FAILED: Final = "ResumeFailed"
API_FAILED: Final = "api"
"""The failure reason of a freeze or thaw done whose annotation could not be written."""
REPORT_AGAIN_S: Final = 300.0
FREEZE_RETRY_S: Final = (2.0, 60.0)
"""First and longest wait before a failed freeze is tried again (doubling in between)."""
_STATUS_KEYS: Final = ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses")


class PauseKube(Protocol):
    """The pause loop's window on Kubernetes (gpushare.kube.node.NodeKube)."""

    def set_pod_annotation(self, *, pod: PodInfo, key: str, value: str | None) -> None:
        """Set (or, with None, remove) one annotation of the pod."""

    def record_event(
        self, *, pod: PodInfo | None, reason: str, message: str, warning: bool
    ) -> None:
        """Record a Kubernetes Event on the pod."""


@dataclass
class PauseStats:
    """What the pause loop counted, for gpushare.node.pausing.metrics."""

    pauses: Counter[str] = field(default_factory=Counter)
    """Request reason -> freezes carried out."""
    resumes: Counter[str] = field(default_factory=Counter)
    """Why (withdrawn | terminating | malformed) -> thaws carried out."""
    failures: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(operation pause | resume, reason) -> failed attempts."""
    paused_done_s: float = 0.0
    """Seconds pods spent frozen, of freezes that ended, counted from the agent's start."""
    frozen_since: dict[str, float] = field(default_factory=dict)
    """Pod UID -> when its freeze began (or the agent started, if later), of pods frozen now."""

    def paused_seconds(self, now: float) -> float:
        return self.paused_done_s + sum(max(0.0, now - s) for s in self.frozen_since.values())


def container_ids(manifest: Mapping[str, Any]) -> list[str]:
    """The IDs of the pod's containers (init and ephemeral ones too; never its sandbox) from
    its status, runtime prefix stripped."""
    status = manifest.get("status") or {}
    out: list[str] = []
    for key in _STATUS_KEYS:
        for cs in status.get(key) or []:
            raw = cs.get("containerID") if isinstance(cs, Mapping) else None
            if isinstance(raw, str) and raw:
                out.append(container_id(raw))
    return out


def _qos(manifest: Mapping[str, Any]) -> str | None:
    value = (manifest.get("status") or {}).get("qosClass")
    return value if isinstance(value, str) else None


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _epoch(text: str) -> float | None:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class Pauser:
    """Carries out pause requests on one node; :meth:`reconcile` is one pass."""

    def __init__(
        self,
        *,
        freezer: Freezer,
        kube: PauseKube | None,
        placed: Callable[[PodInfo], bool],
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``placed``: whether gpushare placed the pod on this node (placement annotations in
        device-plugin mode, a claim this agent prepared in DRA mode); no other pod is ever
        frozen."""
        self.freezer = freezer
        self.kube = kube
        self.placed = placed
        self.clock = clock
        self.started = clock()
        self.stats = PauseStats()
        self._announced: dict[str, str] = {}
        """Pod UID -> the last of Paused/Resumed said of it (not said again)."""
        self._reported: dict[str, tuple[str, float]] = {}
        """Pod UID -> (the failure last reported, when)."""
        self._retry_at: dict[str, tuple[float, float]] = {}
        """Pod UID -> (when a failed freeze may be tried again, the wait before that)."""

    # --- one pass --------------------------------------------------------------------------

    def reconcile(self, pods: Iterable[PodInfo]) -> None:
        """Bring every pod on the node to its request."""
        live: set[str] = set()
        for pod in pods:
            if pod.finished:
                continue
            live.add(pod.uid)
            try:
                self._one(pod)
            except Exception:
                log.exception("pausing: could not handle pod %s", pod.key)
        self._forget(live)

    def _forget(self, live: set[str]) -> None:
        """Pods gone from the node: their paused time ends, their memory goes."""
        now = self.clock()
        for uid in [u for u in self.stats.frozen_since if u not in live]:
            self.stats.paused_done_s += max(0.0, now - self.stats.frozen_since.pop(uid))
        for table in (self._announced, self._reported, self._retry_at):
            for uid in [u for u in table if u not in live]:
                del table[uid]
        self.freezer.forget(live)

    def _one(self, pod: PodInfo) -> None:
        placed = self.placed(pod)
        want = wanted(pod, placed_here=placed)
        if want.problem is not None:
            self._failed(
                pod, operation="pause", reason=want.reason, message=want.problem, each=False
            )
        elif want.reason == WITHDRAWN:
            self._retry_at.pop(pod.uid, None)
        if not placed:
            return  # never frozen, thawed or annotated by gpushare
        ids = container_ids(pod.manifest)
        try:
            cgroups = (
                self.freezer.containers(pod.uid, qos=_qos(pod.manifest), container_ids=ids)
                if ids
                else {}
            )
            actual = self.freezer.state(cgroups)
        except FreezeError as exc:
            # No freezer to read (the host's cgroup fs not mounted): a problem only for a pod
            # with a pause to carry out or to end.
            if want.frozen or ANN_PAUSED in pod.annotations:
                operation = "pause" if want.frozen else "resume"
                self._failed(pod, operation=operation, reason=exc.reason, message=str(exc))
            return
        record = recorded(pod)
        step = next_step(want, actual, record, has_record=ANN_PAUSED in pod.annotations)
        if actual is FreezeState.FROZEN and pod.uid not in self.stats.frozen_since:
            # Frozen before this agent saw it (an earlier agent): its time counts from now on.
            since = _epoch(record.since) if record is not None else None
            self.stats.frozen_since[pod.uid] = max(since or self.started, self.started)
        if step is Step.FREEZE:
            self._freeze(pod, want, cgroups, record)
        elif step is Step.RECORD:
            self._record(pod, want, record)
        elif step is Step.THAW:
            self._thaw(pod, want, cgroups, record)
        elif step is Step.CLEAR:
            self._clear(pod, want, record)
        elif want.problem is None:
            self._reported.pop(pod.uid, None)  # settled: a next failure is news

    # --- steps -----------------------------------------------------------------------------

    def _freeze(
        self, pod: PodInfo, want: Wanted, cgroups: Mapping[str, Path], record: PauseState | None
    ) -> None:
        now = self.clock()
        due, wait = self._retry_at.get(pod.uid, (0.0, 0.0))
        if now < due:
            return
        try:
            self.freezer.freeze(cgroups)
        except FreezeError as exc:
            first, most = FREEZE_RETRY_S
            wait = min(most, wait * 2) if wait else first
            self._retry_at[pod.uid] = (now + wait, wait)
            self._failed(pod, operation="pause", reason=exc.reason, message=f"{exc}")
            return
        self._retry_at.pop(pod.uid, None)
        self._reported.pop(pod.uid, None)
        if pod.uid not in self.stats.frozen_since:
            self.stats.frozen_since[pod.uid] = now
            self.stats.pauses[want.reason] += 1
        log.info("paused pod %s (%s): %d container(s)", pod.key, want.reason, len(cgroups))
        self._record(pod, want, record)

    def _record(self, pod: PodInfo, want: Wanted, record: PauseState | None) -> None:
        """Write ``gpushare.io/paused`` for the request carried out, and say Paused once."""
        request = want.request
        assert request is not None
        if record is None or record.request_since != request.since:
            since = self.stats.frozen_since.get(pod.uid, self.clock())
            state = PauseState(since=_iso(since), request_since=request.since)
            if not self._annotate(pod, state.dump(), operation="pause"):
                return
        if self._announced.get(pod.uid) != PAUSED:
            hier = self.freezer.hierarchy().describe()
            self._say(
                pod,
                PAUSED,
                f"paused by gpushare ({request.reason}): {request.message}. Its containers are "
                f"frozen ({hier}); its GPU memory stays allocated; it runs on where it stopped "
                "when gpushare withdraws the request",
            )

    def _thaw(
        self, pod: PodInfo, want: Wanted, cgroups: Mapping[str, Path], record: PauseState | None
    ) -> None:
        try:
            self.freezer.thaw(cgroups)
        except FreezeError as exc:
            self._failed(
                pod,
                operation="resume",
                reason=exc.reason,
                message=f"{exc}; the node agent tries again on its next pass",
            )
            return
        self._reported.pop(pod.uid, None)
        self.stats.resumes[want.reason] += 1
        log.info("resumed pod %s (%s)", pod.key, want.reason)
        self._clear(pod, want, record, has_record=pod.annotations.get(ANN_PAUSED) is not None)

    def _clear(
        self, pod: PodInfo, want: Wanted, record: PauseState | None, *, has_record: bool = True
    ) -> None:
        """The pod runs: end its paused time, remove ``gpushare.io/paused``, say Resumed once."""
        now = self.clock()
        since = self.stats.frozen_since.pop(pod.uid, None)
        if since is not None:
            self.stats.paused_done_s += max(0.0, now - since)
        if has_record and not self._annotate(pod, None, operation="resume"):
            return
        began = _epoch(record.since) if record is not None else since
        held = f" after {now - began:.0f} s paused" if began is not None else ""
        if self._announced.get(pod.uid, PAUSED) != RESUMED:
            self._say(pod, RESUMED, _resumed_message(want, held))

    # --- reporting -------------------------------------------------------------------------

    def _annotate(self, pod: PodInfo, value: str | None, *, operation: str) -> bool:
        if self.kube is None:
            return True
        try:
            self.kube.set_pod_annotation(pod=pod, key=ANN_PAUSED, value=value)
        except Exception as exc:
            self.stats.failures[(operation, API_FAILED)] += 1
            log.warning("pausing: could not write %s of pod %s: %s", ANN_PAUSED, pod.key, exc)
            return False
        return True

    def _say(self, pod: PodInfo, reason: str, message: str) -> None:
        self._announced[pod.uid] = reason
        self._event(pod, reason, message, warning=False)

    def _failed(
        self, pod: PodInfo, *, operation: str, reason: str, message: str, each: bool = True
    ) -> None:
        """Count a failure (``each`` attempt, or a refusal once per report) and report it when
        it is new, changed, or last reported :data:`REPORT_AGAIN_S` ago."""
        if each:
            self.stats.failures[(operation, reason)] += 1
        now = self.clock()
        last = self._reported.get(pod.uid)
        if last is not None and last[0] == message and now - last[1] < REPORT_AGAIN_S:
            return
        if not each:
            self.stats.failures[(operation, reason)] += 1
        self._reported[pod.uid] = (message, now)
        log.warning("pausing: pod %s: %s %s: %s", pod.key, operation, reason, message)
        event = PAUSE_FAILED if operation == "pause" else RESUME_FAILED
        self._event(pod, event, message, warning=True)

    def _event(self, pod: PodInfo, reason: str, message: str, *, warning: bool) -> None:
        if self.kube is None:
            return
        try:
            self.kube.record_event(pod=pod, reason=reason, message=message, warning=warning)
        except Exception as exc:
            log.warning("pausing: could not record %s on pod %s: %s", reason, pod.key, exc)


def _resumed_message(want: Wanted, held: str) -> str:
    if want.reason == TERMINATING:
        return f"resumed{held} so that it can stop: the pod is being deleted"
    if want.reason in (MALFORMED, NOT_GPUSHARE) and want.problem is not None:
        return f"resumed{held}: {want.problem}"
    return f"resumed{held}: gpushare withdrew its pause request"
