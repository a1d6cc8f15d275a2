"""Workloads that must run on a GPU of their own, published by node agents on their node.

A node agent that sees one workload involved in fatal GPU faults repeatedly, each time beside
different neighbours (each fault breaks every client of the GPU's MPS server, and the server's
log does not reliably name the client that faulted), lists the workload in the node annotation
``gpushare.io/exclusive-workloads``. The admission webhook reads every node's list and gives the
workload's new pods a whole GPU, which runs without MPS, so the faults stay its own.

A workload is the pod's controller (ReplicaSet, Job, StatefulSet, ...), named by its UID so a
recreated pod of the same controller is recognised; a bare pod is its own workload.
"""

import json
from dataclasses import asdict, dataclass

from gpushare.api.errors import InvalidInputError
from gpushare.api.names import ANN_NODE_EXCLUSIVE


@dataclass(frozen=True)
class ExclusiveWorkload:
    """One workload marked for an exclusive GPU."""

    uid: str
    """UID of the pod's controller (or of the pod itself when it has none)."""
    kind: str
    namespace: str
    name: str
    faults: int
    """Fatal GPU faults its clients were involved in (within the agent's window) when it was
    marked; the only workload common to all of them."""
    since: str
    """RFC 3339 time it was marked."""
    gpu_uuid: str = ""
    """GPU of the last fault."""

    @property
    def reason(self) -> str:
        return (
            f"{self.kind} {self.namespace}/{self.name} was involved in {self.faults} fatal GPU "
            "faults on shared GPUs, the only workload common to all of them (last on "
            f"{self.gpu_uuid or 'a GPU'}, marked {self.since})"
        )


def dump_exclusive(workloads: list[ExclusiveWorkload]) -> str:
    return json.dumps(
        [asdict(w) for w in sorted(workloads, key=lambda w: w.uid)],
        separators=(",", ":"),
        sort_keys=True,
    )


def load_exclusive(text: str) -> list[ExclusiveWorkload]:
    """Parse the node annotation; raises InvalidInputError naming it when malformed."""
    fix = "the node agent writes it; delete the annotation to clear every mark on the node"
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInputError(ANN_NODE_EXCLUSIVE, f"is not JSON ({exc.msg})", fix) from None
    if not isinstance(raw, list):
        raise InvalidInputError(ANN_NODE_EXCLUSIVE, "must be a JSON list of workloads", fix)
    out: list[ExclusiveWorkload] = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise InvalidInputError(f"{ANN_NODE_EXCLUSIVE}[{i}]", "must be an object", fix)
        try:
            out.append(
                ExclusiveWorkload(
                    uid=str(item["uid"]),
                    kind=str(item.get("kind", "")),
                    namespace=str(item.get("namespace", "")),
                    name=str(item.get("name", "")),
                    faults=int(item.get("faults", 0)),
                    since=str(item.get("since", "")),
                    gpu_uuid=str(item.get("gpu_uuid", "")),
                )
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidInputError(
                f"{ANN_NODE_EXCLUSIVE}[{i}]", f"bad or missing field {exc}", fix
            ) from None
        if not out[-1].uid:
            raise InvalidInputError(f"{ANN_NODE_EXCLUSIVE}[{i}].uid", "is empty", fix)
    return out
