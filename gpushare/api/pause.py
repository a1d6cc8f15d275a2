"""Pausing an opportunistic pod: the controller's request and the node agent's answer.

Preempting an opportunistic pod for compute pauses it instead of evicting it: its containers'
cgroups are frozen, so its MPS clients give their SMs back at once and lose no work; their GPU
memory stays allocated (measured on an H100: docs/packing.md, "The sharing contract"). Eviction
remains for GPU memory a guaranteed pod needs and nothing else can free.

Two pod annotations, one writer each:

- ``gpushare.io/pause`` (:class:`PauseRequest`, written by the controller's leader): the pod is
  to be paused, and why. Removing it asks for the pod to run again.
- ``gpushare.io/paused`` (:class:`PauseState`, written by the node agent): the freeze in effect
  on the node, since when, for which request. Removed once the pod is thawed.

The request is the state of record: a node agent that starts finds every pod of its node and
freezes or thaws each to match its request, so a pod paused by an agent that died is never
forgotten, and one whose request was withdrawn while no agent ran is thawed.
"""

import json
from dataclasses import dataclass
from typing import Final

from gpushare.api.bounds import check_length, load_json, object_field
from gpushare.api.errors import InvalidInputError
from gpushare.api.names import ANN_PAUSE, ANN_PAUSED

REASON_GUARANTEED: Final = "guaranteed-needs-room"
"""A guaranteed pod was placed on the GPU and needs the compute the pod used."""
REASON_HARM: Final = "harm"
"""The governor measured the pod harming a neighbour past the neighbour's class bound."""
REASONS: Final = (REASON_GUARANTEED, REASON_HARM)

_MAX_MESSAGE: Final = 1024
_MAX_PODS: Final = 64
_MAX_KEY: Final = 317
"""A namespace (63), a slash and a pod name (253)."""


@dataclass(frozen=True)
class PauseRequest:
    """The controller's request that a pod be paused (annotation ``gpushare.io/pause``)."""

    reason: str
    """One of :data:`REASONS`."""
    message: str
    """What a user reads: who needs the room, or what harm was measured."""
    since: str
    """RFC 3339 time the controller asked."""
    for_pods: tuple[str, ...] = ()
    """The pods (``namespace/name``) it was paused for: the guaranteed pod that needed the
    room, or the neighbours the governor judged it beside. A pod paused for harm runs again
    only once they have left its GPU (``gpushare.packing.opportunistic``). Optional."""

    def dump(self) -> str:
        out: dict[str, object] = {
            "reason": self.reason,
            "message": self.message,
            "since": self.since,
        }
        if self.for_pods:
            out["forPods"] = list(self.for_pods)
        return json.dumps(out, separators=(",", ":"), sort_keys=True)


@dataclass(frozen=True)
class PauseState:
    """The node agent's record of a freeze in effect (annotation ``gpushare.io/paused``)."""

    since: str
    """RFC 3339 time the pod's containers were frozen."""
    request_since: str
    """The ``since`` of the request it carried out, so a stale state is told from a new one."""

    def dump(self) -> str:
        return json.dumps(
            {"requestSince": self.request_since, "since": self.since},
            separators=(",", ":"),
            sort_keys=True,
        )


def _string(raw: dict[str, object], key: str, *, field: str, fix: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str):
        raise InvalidInputError(f"{field}.{key}", "must be a string", fix)
    return check_length(value, field=f"{field}.{key}", fix=fix, limit=_MAX_MESSAGE)


def load_pause_request(text: str) -> PauseRequest:
    """Parse ``gpushare.io/pause``; InvalidInputError naming the annotation when malformed."""
    fix = "only the gpushare controller writes it; delete the annotation to let the pod run"
    raw = dict(object_field(load_json(text, field=ANN_PAUSE, fix=fix), field=ANN_PAUSE, fix=fix))
    reason = _string(raw, "reason", field=ANN_PAUSE, fix=fix)
    if reason not in REASONS:
        raise InvalidInputError(f"{ANN_PAUSE}.reason", f"must be one of {', '.join(REASONS)}", fix)
    pods = raw.get("forPods", [])
    if (
        not isinstance(pods, list)
        or len(pods) > _MAX_PODS
        or not all(isinstance(p, str) and 0 < len(p) <= _MAX_KEY for p in pods)
    ):
        raise InvalidInputError(
            f"{ANN_PAUSE}.forPods", f"must be a list of at most {_MAX_PODS} pod keys", fix
        )
    return PauseRequest(
        reason=reason,
        message=_string(raw, "message", field=ANN_PAUSE, fix=fix),
        since=_string(raw, "since", field=ANN_PAUSE, fix=fix),
        for_pods=tuple(pods),
    )


def load_pause_state(text: str) -> PauseState:
    """Parse ``gpushare.io/paused``; InvalidInputError naming the annotation when malformed."""
    fix = "only the gpushare node agent writes it; it rewrites it on its next pass"
    raw = dict(object_field(load_json(text, field=ANN_PAUSED, fix=fix), field=ANN_PAUSED, fix=fix))
    return PauseState(
        since=_string(raw, "since", field=ANN_PAUSED, fix=fix),
        request_since=_string(raw, "requestSince", field=ANN_PAUSED, fix=fix),
    )
