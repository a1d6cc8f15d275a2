"""The DRA plugin's record of prepared claims, kept across kubelet and agent restarts.

The kubelet calls NodePrepareResources again after it restarts, and NodeUnprepareResources
for claims prepared by an earlier agent; both must give the answer of record without redoing
the work or forgetting the MPS limits the claims were given. So every prepare and unprepare
rewrites one JSON file in the plugin's directory atomically (temp file, fsync, rename); the
plugin loads it at start. An unreadable file is set aside (``.corrupt``) and logged, never
fatal: the kubelet then prepares its claims again.
"""

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "checkpoint.json"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class PreparedDevice:
    """One device of a prepared claim, as the response names it."""

    request: str
    pool: str
    device: str
    gpu_uuid: str


@dataclass(frozen=True)
class PreparedClaim:
    """What preparing a claim decided: devices, CDI IDs and the MPS settings."""

    uid: str
    namespace: str
    name: str
    pod: str
    devices: tuple[PreparedDevice, ...]
    cdi_ids: tuple[str, ...]
    mps: bool
    """True when the claim's processes go through one GPU's MPS daemon (a shared GPU)."""
    thread_percent: int
    memory_limit_bytes: int
    gpu_class: str
    edits: dict[str, Any] = field(default_factory=dict)
    """The CDI container edits, to write the spec again if the CDI directory was wiped."""
    tenancy: str = ""
    """The claim's tenancy (its namespace or sharing group; gpushare.packing.tenancy), empty
    without a boundary: claims of different tenancies never share a GPU's MPS server."""
    percent: int | None = None
    """The gpuPercent the claim consumes of each GPU (100 for whole GPUs): what it is
    guaranteed, beside ``thread_percent``, what it may use. None in checkpoints written before
    it was recorded."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def to_json(self) -> dict[str, Any]:
        return {
            "uid": self.uid,
            "namespace": self.namespace,
            "name": self.name,
            "pod": self.pod,
            "devices": [vars(d) for d in self.devices],
            "cdi_ids": list(self.cdi_ids),
            "mps": self.mps,
            "thread_percent": self.thread_percent,
            "memory_limit_bytes": self.memory_limit_bytes,
            "gpu_class": self.gpu_class,
            "edits": self.edits,
            "tenancy": self.tenancy,
            "percent": self.percent,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> "PreparedClaim":
        """Raises KeyError/TypeError/ValueError on a malformed entry."""
        return cls(
            uid=str(raw["uid"]),
            namespace=str(raw["namespace"]),
            name=str(raw["name"]),
            pod=str(raw["pod"]),
            devices=tuple(
                PreparedDevice(
                    request=str(d["request"]),
                    pool=str(d["pool"]),
                    device=str(d["device"]),
                    gpu_uuid=str(d["gpu_uuid"]),
                )
                for d in raw["devices"]
            ),
            cdi_ids=tuple(str(i) for i in raw["cdi_ids"]),
            mps=bool(raw["mps"]),
            thread_percent=int(raw["thread_percent"]),
            memory_limit_bytes=int(raw["memory_limit_bytes"]),
            gpu_class=str(raw["gpu_class"]),
            edits=dict(raw.get("edits") or {}),
            # Checkpoints written before tenancies were recorded: the namespace's own.
            tenancy=str(raw.get("tenancy", raw["namespace"])),
            percent=None if raw.get("percent") is None else int(raw["percent"]),
        )


class Checkpoint:
    """The checkpoint file: ``load`` at start, ``save`` after every change."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> dict[str, PreparedClaim]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        try:
            doc = json.loads(text)
            if not isinstance(doc, dict) or doc.get("version") != FORMAT_VERSION:
                raise ValueError(f"not a version {FORMAT_VERSION} checkpoint")
            claims = {uid: PreparedClaim.from_json(c) for uid, c in doc["claims"].items()}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            aside = self.path.with_name(self.path.name + ".corrupt")
            self.path.replace(aside)
            log.error(
                "DRA checkpoint %s is unreadable (%s); moved to %s, the kubelet prepares its "
                "claims again",
                self.path,
                exc,
                aside,
            )
            return {}
        log.info("DRA checkpoint: %d prepared claim(s) reloaded", len(claims))
        return claims

    def save(self, claims: Mapping[str, PreparedClaim]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "version": FORMAT_VERSION,
            "claims": {uid: c.to_json() for uid, c in sorted(claims.items())},
        }
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        with tmp.open("w") as out:
            json.dump(doc, out, indent=1, sort_keys=True)
            out.flush()
            os.fsync(out.fileno())
        tmp.replace(self.path)
