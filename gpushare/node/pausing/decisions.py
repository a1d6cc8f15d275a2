"""What the node agent does with one pod's pause, decided without I/O: what the pod should be
(:func:`wanted`, from its ``gpushare.io/pause`` request) and the one step that brings it there
from what its cgroups are and what ``gpushare.io/paused`` records (:func:`next_step`).

The request is the state of record (gpushare.api.pause): a pod is frozen exactly while it
carries a readable request, was placed on this node by gpushare and is not being deleted. Every
other case runs the pod:

- no request: it was withdrawn (or never made);
- a request gpushare cannot read: the controller is the only writer (the chart's
  ValidatingAdmissionPolicy), so a malformed one is a bug or tampering; keeping a pod frozen on
  a value nobody can withdraw by its own rules would leave it frozen forever, so it runs and a
  Warning Event says why;
- a pod gpushare did not place on this node: gpushare never freezes it, whatever it carries;
- a pod being deleted: frozen, it could not handle its SIGTERM and would be killed only at the
  end of its grace period.
"""

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from gpushare.api.errors import InvalidInputError
from gpushare.api.names import ANN_PAUSE, ANN_PAUSED
from gpushare.api.pause import PauseRequest, PauseState, load_pause_request, load_pause_state
from gpushare.api.pod import PodInfo

WITHDRAWN: Final = "withdrawn"
TERMINATING: Final = "terminating"
MALFORMED: Final = "malformed"
NOT_GPUSHARE: Final = "not-gpushare"
RUN_REASONS: Final = (WITHDRAWN, TERMINATING, MALFORMED, NOT_GPUSHARE)
"""Why a pod is to run: the ``reason`` of ``gpushare_pod_resumes_total``."""


class FreezeState(enum.Enum):
    """A pod's containers as the freezer has them."""

    THAWED = "thawed"
    FROZEN = "frozen"
    PARTLY = "partly"
    """Some containers frozen, some not (one started while the pod was paused, or a freeze or
    thaw cut short)."""
    NONE = "none"
    """No running container cgroup: nothing to freeze yet, or any more."""


class Step(enum.Enum):
    """The one thing to do for a pod on this pass."""

    NOTHING = "nothing"
    FREEZE = "freeze"
    THAW = "thaw"
    RECORD = "record"
    """Frozen as asked; write ``gpushare.io/paused`` (missing, or for an older request)."""
    CLEAR = "clear"
    """Running; remove a ``gpushare.io/paused`` left behind."""
    WAIT = "wait"
    """To be frozen, but no container runs yet."""


@dataclass(frozen=True)
class Wanted:
    """What the pod should be."""

    frozen: bool
    request: PauseRequest | None
    reason: str
    """For a freeze the request's reason; for a run one of :data:`RUN_REASONS`."""
    problem: str | None = None
    """A request the agent refuses (malformed, or on a pod it did not place), to report."""


def terminating(manifest: Mapping[str, Any]) -> bool:
    return bool((manifest.get("metadata") or {}).get("deletionTimestamp"))


def wanted(pod: PodInfo, *, placed_here: bool) -> Wanted:
    """What ``pod`` should be, from its request (see the module's docstring)."""
    text = pod.annotations.get(ANN_PAUSE)
    if text is None:
        return Wanted(False, None, WITHDRAWN)
    if not placed_here:
        return Wanted(
            False,
            None,
            NOT_GPUSHARE,
            problem=f"{ANN_PAUSE}: the pod was not placed on this node by gpushare, which "
            "pauses only the pods it placed; nothing was frozen",
        )
    try:
        request = load_pause_request(text)
    except InvalidInputError as exc:
        return Wanted(
            False,
            None,
            MALFORMED,
            problem=f"{exc}; the pod keeps running: a pause gpushare cannot read is never "
            "carried out",
        )
    if terminating(pod.manifest):
        return Wanted(False, request, TERMINATING)
    return Wanted(True, request, request.reason)


def recorded(pod: PodInfo) -> PauseState | None:
    """The agent's record of the freeze in effect; None when there is none or it is
    unreadable (it is written again or removed on this pass)."""
    text = pod.annotations.get(ANN_PAUSED)
    if text is None:
        return None
    try:
        return load_pause_state(text)
    except InvalidInputError:
        return None


def next_step(
    want: Wanted, actual: FreezeState, record: PauseState | None, *, has_record: bool
) -> Step:
    """The step from ``actual`` (and the record ``gpushare.io/paused``, ``has_record`` when
    the annotation is there at all) towards ``want``."""
    if want.frozen:
        if actual is FreezeState.NONE:
            return Step.WAIT
        if actual is not FreezeState.FROZEN:
            return Step.FREEZE
        assert want.request is not None
        if record is None or record.request_since != want.request.since:
            return Step.RECORD
        return Step.NOTHING
    if actual in (FreezeState.FROZEN, FreezeState.PARTLY):
        return Step.THAW
    return Step.CLEAR if has_record else Step.NOTHING
