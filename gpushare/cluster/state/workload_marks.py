"""Workloads the node agents marked on their node (``gpushare.io/exclusive-workloads``,
``gpushare.io/separated-workloads``): a workload that must run on a GPU of its own, and one whose
new pods keep off the GPUs where it misbehaved (gpushare.api.exclusive)."""

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpushare.api.errors import InvalidInputError
from gpushare.api.exclusive import (
    ExclusiveWorkload,
    load_exclusive,
    load_separated,
    separation_reason,
)
from gpushare.api.names import ANN_NODE_EXCLUSIVE, ANN_NODE_SEPARATED

log = logging.getLogger(__name__)


class WorkloadMarks:
    """The marks of every node, by node and workload (controller) UID."""

    def __init__(self) -> None:
        self._exclusive: dict[str, dict[str, ExclusiveWorkload]] = {}
        self._separated: dict[str, dict[str, ExclusiveWorkload]] = {}

    def read(self, name: str, annotations: Mapping[str, Any]) -> None:
        """Take the marks of node ``name`` from its annotations."""
        _read(self._exclusive, name, annotations.get(ANN_NODE_EXCLUSIVE), load_exclusive)
        _read(self._separated, name, annotations.get(ANN_NODE_SEPARATED), load_separated)

    def keep_only(self, names: Iterable[str]) -> None:
        """A full list of nodes came in: forget the marks of nodes not in it."""
        seen = set(names)
        for marks in (self._exclusive, self._separated):
            for name in [n for n in marks if n not in seen]:
                del marks[name]

    def separation(
        self, workload_uid: str, namespace: str | None = None
    ) -> tuple[frozenset[str], str] | None:
        """(GPUs the workload's new pods keep off, why) when some node's agent separated it.
        With ``namespace``, only marks of pods of that namespace count: a pod's controller UID
        is its own word (#45)."""
        marks = [
            m
            for node in self._separated.values()
            if (m := node.get(workload_uid)) and namespace in (None, m.namespace)
        ]
        gpus = frozenset(m.gpu_uuid for m in marks if m.gpu_uuid)
        if not gpus:
            return None
        return gpus, separation_reason(marks[-1])

    def exclusive_reason(self, workload_uid: str, namespace: str | None = None) -> str | None:
        """Why the workload (a pod's controller UID) must run on a GPU of its own, if it must."""
        for marks in self._exclusive.values():
            mark = marks.get(workload_uid)
            if mark is not None and namespace in (None, mark.namespace):
                return mark.reason
        return None


def _read(
    into: dict[str, dict[str, ExclusiveWorkload]],
    name: str,
    text: object,
    load: Callable[[str], list[ExclusiveWorkload]],
) -> None:
    """One node's marks of one kind; an unreadable list keeps the last one read."""
    if not isinstance(text, str) or not text:
        into.pop(name, None)
        return
    try:
        into[name] = {w.uid: w for w in load(text)}
    except InvalidInputError as exc:
        log.warning("workload marks unreadable", extra={"node": name, "error": str(exc)})
