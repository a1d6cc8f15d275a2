"""The GpuShare life cycle as a pure decision: Pending -> Profiling -> Packed (or Failed).

``next_step`` looks at a share's status and its governed pods and names the one thing to do
next; the reconciler (``reconcile.py``) does it with a tested patch, so a step taken twice
(two ticks racing, or a restart between effect and record) changes nothing the second time.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from gpushare.api.bounds import format_rfc3339, parse_rfc3339
from gpushare.api.errors import InvalidInputError
from gpushare.api.gpushare_crd import (
    ANN_MAX_PODS_PER_GPU,
    ANN_PACKING_POLICY,
    ANN_PROFILE,
    ANN_PROFILING,
    PHASE_PENDING,
    PHASE_PROFILING,
    PROFILING_ACTIVE,
    PROFILING_AUTO,
    PROFILING_DONE,
    PROFILING_SKIP,
    GpuShareSpec,
    PlacementEntry,
    missing_annotations,
    profile_annotation,
)
from gpushare.api.profile import GpuProfile
from gpushare.cluster.state.pod_facts import PodFacts
from gpushare.cluster.state.shares import ShareSummary

MAX_PROFILING_ATTEMPTS = 3
"""Profiling pods that ended before their window; after this many the share is packed
without a profile (the job is shorter than the window: lower spec.profiling.windowSeconds)."""


@dataclass(frozen=True)
class Wait:
    reason: str


@dataclass(frozen=True)
class SkipProfiling:
    """spec.profiling.mode is skip: Pending -> Packed without a profile."""


@dataclass(frozen=True)
class UseCached:
    """The cache holds this job's profile: Pending -> Packed without running it alone."""

    profile: GpuProfile


@dataclass(frozen=True)
class Elect:
    """Make ``pod`` the profiling pod: mark it (if not yet scheduled), Pending -> Profiling."""

    pod: PodFacts
    mark: bool
    """True when the pod is not bound yet, so the extender can still place it alone."""


@dataclass(frozen=True)
class Abandon:
    """The profiling pod went away before its window ended, or never started: back to
    Pending, its mark set to ``done`` so the next election picks another pod."""

    reason: str
    pod: PodFacts | None = None


@dataclass(frozen=True)
class GiveUp:
    """Profiling cannot finish: Profiling -> Packed without a profile, saying why."""

    reason: str


@dataclass(frozen=True)
class StartClock:
    """The profiling pod runs on its GPU: record when, the window counts from here."""

    pod: PodFacts
    at: datetime


@dataclass(frozen=True)
class Measure:
    """The window has passed: read the profile of ``gpu_uuid`` from the node agent."""

    pod: PodFacts
    node: str
    gpu_uuid: str
    window_seconds: int


Step = Wait | SkipProfiling | UseCached | Elect | Abandon | GiveUp | StartClock | Measure


def _time_field(status: Mapping[str, Any], key: str) -> datetime | None:
    raw = status.get(key)
    if not isinstance(raw, str) or not raw:
        return None
    try:
        return parse_rfc3339(raw, field=f"status.{key}")
    except InvalidInputError:
        return None


def profiling_started(status: Mapping[str, Any]) -> datetime | None:
    return _time_field(status, "profilingStarted")


def attempts(status: Mapping[str, Any]) -> int:
    raw = status.get("profilingAttempts", 0)
    return raw if isinstance(raw, int) and not isinstance(raw, bool) else 0


def representative(pods: Sequence[PodFacts]) -> PodFacts | None:
    """The pod whose image and command key the profile cache: the one being or to be
    profiled (marked first), else the oldest active one."""
    active = [p for p in pods if p.active]
    marked = [p for p in active if p.annotations.get(ANN_PROFILING) == PROFILING_ACTIVE]
    chosen = marked or active
    return chosen[0] if chosen else None


def next_step(
    share: ShareSummary,
    pods: Sequence[PodFacts],
    *,
    cached: GpuProfile | None,
    now: datetime,
    measure_grace: timedelta = timedelta(minutes=5),
    start_timeout: timedelta = timedelta(minutes=5),
    warmup: timedelta = timedelta(0),
) -> Step:
    """The next thing to do for ``share`` given its governed ``pods`` (oldest first)."""
    spec = share.spec
    phase = share.status.get("phase")
    if spec is None:
        return Wait(f"spec is invalid: {share.spec_error}")
    if phase is None:
        return Wait("not accepted yet")
    if phase == PHASE_PENDING:
        return _pending_step(spec, pods, cached=cached)
    if phase != PHASE_PROFILING:
        return Wait(f"phase {phase}")
    return _profiling_step(
        spec,
        share.status,
        pods,
        now=now,
        measure_grace=measure_grace,
        start_timeout=start_timeout,
        warmup=warmup,
    )


def _pending_step(
    spec: GpuShareSpec, pods: Sequence[PodFacts], *, cached: GpuProfile | None
) -> Step:
    """Pending: skip, reuse the cache, or elect a pod to profile (one already marked, else an
    unbound one to mark so it is placed alone, else one that runs already)."""
    if spec.profiling.mode == PROFILING_SKIP:
        return SkipProfiling()
    if spec.profiling.mode == PROFILING_AUTO and cached is not None:
        return UseCached(cached)
    active = [p for p in pods if p.active]
    if not active:
        return Wait("no governed pod yet")
    marked = [p for p in active if p.annotations.get(ANN_PROFILING) == PROFILING_ACTIVE]
    untried = [p for p in active if p.annotations.get(ANN_PROFILING) != PROFILING_DONE]
    unbound = [p for p in untried if p.node is None]
    if marked:
        return Elect(marked[0], mark=False)
    if unbound:
        return Elect(unbound[0], mark=True)
    return Elect((untried or active)[0], mark=False)


def _profiling_step(
    spec: GpuShareSpec,
    status: Mapping[str, Any],
    pods: Sequence[PodFacts],
    *,
    now: datetime,
    measure_grace: timedelta,
    start_timeout: timedelta,
    warmup: timedelta,
) -> Step:
    """Profiling: wait for the elected pod to run on a GPU, start the clock, wait out the
    warm-up and the window, then measure; abandon or give up when that cannot happen."""
    name = status.get("profilingPod")
    pod = next((p for p in pods if p.name == name), None)
    if pod is None or not pod.active:
        why = "was deleted" if pod is None or pod.deleting else f"ended ({pod.phase})"
        reason = f"profiling pod {name} {why} before its {spec.profiling.window_seconds} s window"
        if attempts(status) >= MAX_PROFILING_ATTEMPTS:
            return GiveUp(
                f"{reason}, {MAX_PROFILING_ATTEMPTS} times; lower spec.profiling.windowSeconds "
                "below the job's run time, or set spec.profiling.mode to skip"
            )
        return Abandon(reason)
    uuid = pod.profiled_gpu
    if uuid is None or pod.node is None or pod.phase != "Running":
        elected = _time_field(status, "profilingElected")
        if elected is not None and now > elected + start_timeout:
            return Abandon(
                f"profiling pod {pod.name} did not start on a GPU within "
                f"{int(start_timeout.total_seconds())} s",
                pod=pod,
            )
        return Wait(f"profiling pod {pod.name} is not running on a GPU yet")
    started = profiling_started(status)
    if started is None:
        return StartClock(pod, now)
    # The window covers [started + warmup, started + warmup + window]: the job's start-up
    # (and the node agent noticing it) stays out of its profile.
    end = started + warmup + timedelta(seconds=spec.profiling.window_seconds)
    if now < end:
        return Wait(f"profiling {pod.name} until {format_rfc3339(end)}")
    if now > end + measure_grace:
        return GiveUp(
            f"the node agent on {pod.node} gave no profile for GPU {uuid} within "
            f"{int(measure_grace.total_seconds())} s after the window; check the node agent"
        )
    return Measure(pod, pod.node, uuid, spec.profiling.window_seconds)


DRA_INHERITED = (ANN_PACKING_POLICY, ANN_MAX_PODS_PER_GPU)
"""What a DRA-mode pod inherits of its GpuShare: the placement rules, not the request (its
claim was made from the request when the pod was created)."""


def inherited_annotations(share: ShareSummary, pod: PodFacts) -> dict[str, str]:
    """The annotations governed pod ``pod`` lacks of ``share`` (none for an inactive pod or
    an invalid share): an unscheduled pod its request and rules (a DRA-mode pod only the
    rules), every active pod the share's profile once it is known."""
    if share.spec is None or not pod.active:
        return {}
    wanted: dict[str, str] = {}
    if pod.node is None:
        wanted = missing_annotations(share.spec, share_name=share.name, annotations=pod.annotations)
    if pod.dra:  # its request is its claim's, fixed at creation: only the rules
        wanted = {k: v for k, v in wanted.items() if k in DRA_INHERITED}
    profile = share.status.get("profile")
    if isinstance(profile, Mapping) and ANN_PROFILE not in pod.annotations:
        wanted[ANN_PROFILE] = profile_annotation(profile)
    return wanted


def stale_marks(share: ShareSummary, pods: Sequence[PodFacts]) -> list[PodFacts]:
    """Pods still marked ``profiling=true`` although they are not (or no longer) profiling:
    their mark must become ``done`` so their GPU takes neighbours again."""
    status = share.status
    current = status.get("profilingPod") if status.get("phase") == PHASE_PROFILING else None
    pending_pick = status.get("phase") == PHASE_PENDING
    out: list[PodFacts] = []
    for pod in pods:
        if pod.annotations.get(ANN_PROFILING) != PROFILING_ACTIVE or pod.name == current:
            continue
        if pending_pick and pod.active:
            continue  # a mark left by an interrupted election: Elect re-uses it
        out.append(pod)
    return out


def placement_entries(pods: Sequence[PodFacts]) -> list[PlacementEntry]:
    out = []
    for pod in pods:
        uuid = pod.gpu_uuid
        if uuid is None or pod.placement is None or pod.node is None or not pod.active:
            continue
        out.append(
            PlacementEntry(
                pod=pod.name,
                node=pod.node,
                gpu_uuid=uuid,
                thread_percent=pod.placement.thread_percent,
                memory_limit_bytes=pod.placement.memory_limit_bytes,
            )
        )
    return out


def with_condition(
    conditions: object,
    *,
    type_: str,
    status: bool,
    reason: str,
    message: str,
    now: datetime,
    generation: int | None = None,
) -> list[dict[str, Any]]:
    """Conditions with ``type_`` set; lastTransitionTime moves only when the status flips."""
    items = conditions if isinstance(conditions, list) else []
    current = [dict(c) for c in items if isinstance(c, Mapping)]
    text = "True" if status else "False"
    old = next((c for c in current if c.get("type") == type_), None)
    entry: dict[str, Any] = {
        "type": type_,
        "status": text,
        "reason": reason,
        "message": message,
        "lastTransitionTime": (
            old["lastTransitionTime"]
            if old is not None and old.get("status") == text and "lastTransitionTime" in old
            else format_rfc3339(now)
        ),
    }
    if generation is not None:
        entry["observedGeneration"] = generation
    return [c for c in current if c.get("type") != type_] + [entry]
