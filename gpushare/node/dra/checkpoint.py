"""The DRA plugin's record of prepared claims, kept across kubelet and agent restarts.

The kubelet calls NodePrepareResources again after it restarts, and NodeUnprepareResources
for claims prepared by an earlier agent; both must give the answer of record without redoing
the work or forgetting the MPS limits the claims were given. So every prepare and unprepare
rewrites one JSON file in the plugin's directory atomically (temp file, fsync, rename); the
plugin loads it at start. The file is read like hostile input (issue #45: a crafted one
crashed the agent at start and could add a host mount to a claim's CDI spec): an unreadable
file is set aside (``.corrupt``) and logged, a bad entry is dropped on its own (logged, and
reported through ``on_dropped``), never fatal: the kubelet then prepares those claims again.
The CDI edits are never taken from the file: the driver writes what it would write for the
entry's devices and limits (gpushare.node.dra.driver).
"""

import json
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "checkpoint.json"
FORMAT_VERSION = 1
MAX_BYTES = 32 * 2**20
"""A checkpoint of every claim a node can hold is far smaller; a larger file is set aside."""
MAX_MEMORY_BYTES = 2**50
_UID = re.compile(r"^[0-9a-fA-F-]{1,64}$")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_FIELD = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_.:/]{0,252}$")


class BadEntryError(ValueError):
    """A checkpoint entry the agent would not have written; the message names the field."""


def _text(
    raw: Mapping[str, Any], key: str, pattern: re.Pattern[str], *, empty: bool = False
) -> str:
    value = raw[key]
    if not isinstance(value, str) or not (pattern.match(value) or (empty and value == "")):
        raise BadEntryError(f"{key}: {str(value)[:80]!r} is not what the agent writes")
    return value


def _int(raw: Mapping[str, Any], key: str, low: int, high: int) -> int:
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BadEntryError(f"{key}: {str(value)[:80]!r} is not an integer in {low}..{high}")
    return value


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

    @property
    def gpu_uuids(self) -> tuple[str, ...]:
        return tuple(d.gpu_uuid for d in self.devices)

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
        """Raises BadEntryError (or KeyError/TypeError) naming the field of an entry the agent
        would not have written. ``edits`` are kept only to compare: the driver rebuilds them."""
        if not isinstance(raw, Mapping):
            raise BadEntryError("the entry is not an object")
        devices = raw["devices"]
        if not isinstance(devices, list) or not 1 <= len(devices) <= 64:
            raise BadEntryError("devices: not a list of 1..64 devices")
        if not all(isinstance(d, Mapping) for d in devices):
            raise BadEntryError("devices: an entry is not an object")
        cdi_ids = raw["cdi_ids"]
        if not isinstance(cdi_ids, list) or not all(isinstance(i, str) for i in cdi_ids):
            raise BadEntryError("cdi_ids: not a list of strings")
        mps = raw["mps"]
        if not isinstance(mps, bool):
            raise BadEntryError("mps: not true or false")
        edits = raw.get("edits") or {}
        if not isinstance(edits, Mapping):
            raise BadEntryError("edits: not an object")
        namespace = _text(raw, "namespace", _NAME)
        tenancy = raw.get("tenancy", namespace)
        if not isinstance(tenancy, str) or len(tenancy) > 253:
            raise BadEntryError("tenancy: not a string of at most 253 characters")
        percent = raw.get("percent")
        return cls(
            uid=_text(raw, "uid", _UID),
            namespace=namespace,
            name=_text(raw, "name", _NAME),
            pod=_text(raw, "pod", _FIELD),
            devices=tuple(
                PreparedDevice(
                    request=_text(d, "request", _FIELD),
                    pool=_text(d, "pool", _FIELD),
                    device=_text(d, "device", _FIELD),
                    gpu_uuid=_text(d, "gpu_uuid", _FIELD),
                )
                for d in devices
            ),
            cdi_ids=tuple(cdi_ids),
            mps=mps,
            thread_percent=_int(raw, "thread_percent", 1, 100),
            memory_limit_bytes=_int(raw, "memory_limit_bytes", 0, MAX_MEMORY_BYTES),
            gpu_class=_text(raw, "gpu_class", _FIELD),
            edits=dict(edits),
            # Checkpoints written before tenancies were recorded: the namespace's own.
            tenancy=tenancy,
            percent=None if percent is None else _int(raw, "percent", 1, 100),
        )


class Checkpoint:
    """The checkpoint file: ``load`` at start, ``save`` after every change."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(
        self, *, on_dropped: Callable[[str, str], None] | None = None
    ) -> dict[str, PreparedClaim]:
        """The prepared claims of record. A file that is no checkpoint is set aside; an entry
        the agent would not have written is dropped, logged and passed to ``on_dropped`` (its
        key, why), and the others are kept."""
        try:
            with self.path.open("rb") as f:
                raw = f.read(MAX_BYTES + 1)
        except FileNotFoundError:
            return {}
        try:
            if len(raw) > MAX_BYTES:
                raise ValueError(f"larger than {MAX_BYTES} bytes")
            doc = json.loads(raw)
            if not isinstance(doc, dict) or doc.get("version") != FORMAT_VERSION:
                raise ValueError(f"not a version {FORMAT_VERSION} checkpoint")
            entries = doc["claims"]
            if not isinstance(entries, dict):
                raise ValueError("claims is not an object")
        except (ValueError, KeyError, RecursionError) as exc:  # UnicodeDecodeError: ValueError
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
        claims: dict[str, PreparedClaim] = {}
        for key, entry in entries.items():
            try:
                claim = PreparedClaim.from_json(entry)
                if claim.uid != key:
                    raise BadEntryError(f"uid: {claim.uid!r} is filed under {key[:80]!r}")
            except Exception as exc:  # any shape: hostile input never stops the agent
                why = f"{exc.__class__.__name__}: {str(exc)[:200]}"
                log.error(
                    "DRA checkpoint entry %s dropped (%s); the kubelet prepares it again",
                    key[:80],
                    why,
                )
                if on_dropped is not None:
                    on_dropped(key[:80], why)
                continue
            claims[key] = claim
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
