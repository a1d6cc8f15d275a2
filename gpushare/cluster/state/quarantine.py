"""Objects the controller could not take in: held out of the view, one at a time, never a list.

Every watched object (pod, node, GpuShare, namespace, ResourceSlice, ResourceClaim) goes into
the view through :meth:`Quarantine.take`. Parsing is total, so an exception there is a bug; but
the object that shows it may be any tenant's, in any namespace, and a full list meets it again
at every resync. So the one object is held out (its earlier state in the view, if any, is kept:
nothing already placed is lost), counted, logged and reported with an Event by the leader
(``gpushare.cluster.main``), and the rest of the list is taken in. The object is let go as soon
as a later version of it is taken in, or it is deleted (docs/security.md, "One bad object").
"""

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

MAX_HELD = 1000
"""Objects kept by name; beyond this they are only counted (a flood cannot grow memory)."""
_MAX_TEXT = 253


@dataclass(frozen=True)
class Held:
    """One object held out of the view."""

    kind: str
    namespace: str
    name: str
    uid: str
    error: str
    reported: bool = False

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


Take = Callable[[str, Mapping[str, Any], Callable[[Any], object]], bool]
"""(kind, object, take it in) -> taken: :meth:`Quarantine.take`, or :func:`take_plainly`."""


def take_plainly(kind: str, obj: Mapping[str, Any], take_in: Callable[[Any], object]) -> bool:
    """Take the object in, letting an exception through (for callers without a quarantine)."""
    take_in(obj)
    return True


def _text(value: object) -> str:
    return value[:_MAX_TEXT] if isinstance(value, str) else ""


def identity(obj: Mapping[str, Any]) -> tuple[str, str, str]:
    """(namespace, name, uid) of a watched object, whatever its metadata holds."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(meta, Mapping):
        return "", "", ""
    return _text(meta.get("namespace")), _text(meta.get("name")), _text(meta.get("uid"))


class Quarantine:
    """Objects held out of the view, by kind and key, and how many ever were."""

    def __init__(self) -> None:
        self._held: dict[tuple[str, str], Held] = {}
        self.total: dict[str, int] = {}
        """Objects held out since the process began, per kind (a counter)."""
        self.overflow = 0
        """Objects held out while MAX_HELD others already were (counted, not kept)."""

    def take(self, kind: str, obj: Mapping[str, Any], take_in: Callable[[Any], object]) -> bool:
        """``take_in(obj)``; True when it went in. An exception holds the object out (logged,
        counted, kept for its Event) and is never raised: one object must not stop a list."""
        try:
            take_in(obj)
        except Exception as exc:
            self._hold(kind, obj, exc)
            return False
        if self._held:
            namespace, name, _ = identity(obj)
            self._held.pop((kind, f"{namespace}/{name}" if namespace else name), None)
        return True

    def forget(self, kind: str, obj: Mapping[str, Any]) -> None:
        """The object was deleted: nothing of it is held any more."""
        if self._held:
            namespace, name, _ = identity(obj)
            self._held.pop((kind, f"{namespace}/{name}" if namespace else name), None)

    def _hold(self, kind: str, obj: Mapping[str, Any], exc: Exception) -> None:
        namespace, name, uid = identity(obj)
        error = f"{type(exc).__name__}: {str(exc)[:300]}"
        held = Held(kind, namespace, name, uid, error)
        self.total[kind] = self.total.get(kind, 0) + 1
        known = self._held.get((kind, held.key))
        if known is not None and known.error == error and known.uid == uid:
            return  # the same object failing the same way again (a resync): reported already
        if known is None and len(self._held) >= MAX_HELD:
            self.overflow += 1
            return
        self._held[(kind, held.key)] = held
        log.error(
            "object held out of the view: gpushare could not read it",
            extra={"kind": kind, "object": held.key, "error": error},
        )

    def held(self) -> list[Held]:
        """Every object held out now."""
        return list(self._held.values())

    def unreported(self) -> list[Held]:
        """Held objects whose Event has not been posted yet."""
        return [h for h in self._held.values() if not h.reported]

    def mark_reported(self, held: Held) -> None:
        key = (held.kind, held.key)
        if self._held.get(key) == held:
            self._held[key] = Held(
                held.kind, held.namespace, held.name, held.uid, held.error, reported=True
            )

    def counts(self) -> dict[str, int]:
        """Objects held out now, per kind."""
        out: dict[str, int] = {}
        for kind, _ in self._held:
            out[kind] = out.get(kind, 0) + 1
        return out
