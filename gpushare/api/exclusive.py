"""Workloads that must run on a GPU of their own, published by node agents on their node.

A node agent that sees one workload involved in fatal GPU faults repeatedly, each time beside
different neighbours (each fault breaks every client of the GPU's MPS server, and the server's
log does not reliably name the client that faulted), lists the workload in the node annotation
``gpushare.io/exclusive-workloads``. The admission webhook reads every node's list and gives the
workload's new pods a whole GPU, which runs without MPS, so the faults stay its own.

Workloads that keep faulting *together* (nothing tells which one faults) are listed, in the same
format, in ``gpushare.io/separated-workloads``: the one moved, with the GPU where they faulted;
the webhook keeps its new pods off that GPU (``gpushare.io/avoid-gpus``), so the next fault,
beside other neighbours, tells.

A workload is the pod's controller (ReplicaSet, Job, StatefulSet, ...), named by its UID so a
recreated pod of the same controller is recognised; a bare pod is its own workload.
"""

import json
from dataclasses import asdict, dataclass

from gpushare.api.bounds import check_length, load_json
from gpushare.api.errors import InvalidInputError
from gpushare.api.names import ANN_AVOID_GPUS, ANN_NODE_EXCLUSIVE, ANN_NODE_SEPARATED


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


def load_exclusive(text: str, *, annotation: str = ANN_NODE_EXCLUSIVE) -> list[ExclusiveWorkload]:
    """Parse the node annotation (``annotation``: the exclusive or the separated list); raises
    InvalidInputError naming it when malformed."""
    fix = "the node agent writes it; delete the annotation to clear every mark on the node"
    raw = load_json(text, field=annotation, fix=fix, max_chars=256 * 1024)
    if not isinstance(raw, list):
        raise InvalidInputError(annotation, "must be a JSON list of workloads", fix)
    out: list[ExclusiveWorkload] = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise InvalidInputError(f"{annotation}[{i}]", "must be an object", fix)
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
                f"{annotation}[{i}]", f"bad or missing field {exc}", fix
            ) from None
        if not out[-1].uid:
            raise InvalidInputError(f"{annotation}[{i}].uid", "is empty", fix)
    return out


def load_separated(text: str) -> list[ExclusiveWorkload]:
    """Parse ``gpushare.io/separated-workloads`` (each entry: the workload moved, the GPU it
    keeps off in ``gpu_uuid``)."""
    return load_exclusive(text, annotation=ANN_NODE_SEPARATED)


def separation_reason(mark: ExclusiveWorkload) -> str:
    return (
        f"{mark.kind} {mark.namespace}/{mark.name} kept being involved in the same fatal GPU "
        f"faults as its neighbours ({mark.faults}, last on {mark.gpu_uuid}, {mark.since}); its "
        "new pods are kept off that GPU so the next fault, beside other neighbours, tells which "
        "one faults"
    )


def parse_avoid_gpus(text: str | None) -> frozenset[str]:
    """``gpushare.io/avoid-gpus``: comma-separated GPU UUIDs (``GPU-...``); empty when unset.
    Raises InvalidInputError naming the annotation and the bad entry."""
    if text is None or not text.strip():
        return frozenset()
    check_length(text, field=ANN_AVOID_GPUS, fix="list at most a few dozen GPU UUIDs", limit=8192)
    out = set()
    for part in text.split(","):
        uuid = part.strip()
        if not uuid.startswith("GPU-") or len(uuid) < 8 or any(c.isspace() for c in uuid):
            raise InvalidInputError(
                ANN_AVOID_GPUS,
                f"{uuid!r} is not a GPU UUID",
                'list GPU UUIDs as nvidia-smi -L prints them, e.g. "GPU-5f1e...,GPU-0a2b..."',
            )
        out.add(uuid)
    return frozenset(out)
