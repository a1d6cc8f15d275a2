"""The reusable profile cache: profiles keyed by tenancy + image + command + GPU model (pure).

Stored as the data of one ConfigMap (``gpushare-profile-cache`` in the operator's namespace):
one key per tenancy, workload and GPU model, whose value is a JSON entry. ConfigMap keys allow
only ``[-._a-zA-Z0-9]``, so the key is a digest; the entry repeats tenancy, image, command and
model (shortened) so a human can read the cache with kubectl.

A profile belongs to the tenancy that measured it (its namespace, or the sharing group an admin
put the namespace in): another tenancy's pods are never sized from it (issue 67: one tenant's
idle run sized another tenant's ``fraction: auto`` share to 5% with a 4 GiB memory cap). Each
tenancy keeps at most ``per_tenancy`` entries and the cache at most ``keep`` and ``max_bytes``
(the oldest go first), and an entry holds at most :data:`MAX_ENTRY_CHARS`, so no tenant's
entries, however long their command lines, fill the ConfigMap past what it can store
(docs/security.md, "Profiles belong to a tenancy").
"""

import hashlib
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from gpushare.api.bounds import load_json
from gpushare.api.errors import InvalidInputError
from gpushare.api.profile import GpuProfile

log = logging.getLogger(__name__)

KEY_PREFIX = "profile-"
SHOWN_CHARS = 256
"""Image and each of the first arguments as repeated in an entry (the match is by digest)."""
SHOWN_ARGS = 8
MAX_ENTRY_CHARS = 4096
"""Longest entry read (a written one is about a kilobyte)."""
MAX_CACHE_BYTES = 768 * 1024
"""Entries kept in all (a ConfigMap holds at most 1 MiB, keys and metadata included)."""


@dataclass(frozen=True)
class CacheEntry:
    image: str
    command: tuple[str, ...]
    gpu_model: str
    profile: GpuProfile
    tenancy: str = ""
    """The namespace (or ``group:<name>``) whose pod was measured."""


def _workload_digest(tenancy: str, image: str, command: Sequence[str]) -> str:
    material = json.dumps([tenancy, image, list(command)], separators=(",", ":"))
    return hashlib.sha256(material.encode()).hexdigest()


def cache_key(*, image: str, command: Sequence[str], gpu_model: str, tenancy: str = "") -> str:
    """A ConfigMap-safe key; distinct tenancies, images, commands (argument boundaries
    included) or GPU models give distinct keys."""
    material = json.dumps([image, list(command), gpu_model], separators=(",", ":"))
    if tenancy:
        material = json.dumps([tenancy, material], separators=(",", ":"))
    return KEY_PREFIX + hashlib.sha256(material.encode()).hexdigest()[:40]


def encode_entry(entry: CacheEntry) -> str:
    return json.dumps(
        {
            "tenancy": entry.tenancy,
            "image": entry.image[:SHOWN_CHARS],
            "command": [c[:SHOWN_CHARS] for c in entry.command[:SHOWN_ARGS]],
            "workload": _workload_digest(entry.tenancy, entry.image, entry.command),
            "gpuModel": entry.gpu_model[:SHOWN_CHARS],
            "profile": entry.profile.to_status(),
        },
        sort_keys=True,
        separators=(",", ":"),
    )


@dataclass(frozen=True)
class _Decoded:
    tenancy: str
    workload: str
    """Digest of tenancy, image and command."""
    profile: GpuProfile


def _decode(text: str) -> _Decoded | None:
    """None (and a warning) for an entry that is not ours or is damaged: a bad cache entry
    costs one re-profiling, never a crash (nesting, length and digits bounded)."""
    try:
        raw = load_json(
            text, field="profile cache entry", fix="delete the entry", max_chars=MAX_ENTRY_CHARS
        )
        if not isinstance(raw, dict) or not isinstance(raw.get("profile"), dict):
            raise ValueError("not an entry object")
        command = raw.get("command")
        if not isinstance(command, list):
            raise ValueError("command is not a list")
        tenancy = str(raw.get("tenancy") or "")
        workload = raw.get("workload")
        if not isinstance(workload, str):  # an entry of before issue 67: no tenancy
            workload = _workload_digest(tenancy, str(raw["image"]), [str(c) for c in command])
        return _Decoded(tenancy, workload, GpuProfile.from_status(raw["profile"], path="profile"))
    except (ValueError, KeyError, TypeError, InvalidInputError) as exc:
        log.warning("ignoring damaged profile cache entry: %s", exc)
        return None


def decode_entry(text: str) -> CacheEntry | None:
    """The entry as written (image and command as shown in it); None when damaged."""
    decoded = _decode(text)
    if decoded is None:
        return None
    raw = json.loads(text)
    return CacheEntry(
        image=str(raw["image"]),
        command=tuple(str(c) for c in raw["command"]),
        gpu_model=str(raw["gpuModel"]),
        profile=decoded.profile,
        tenancy=decoded.tenancy,
    )


_NEVER = datetime.min.replace(tzinfo=UTC)


def lookup(
    data: Mapping[str, str],
    *,
    image: str,
    command: Sequence[str],
    gpu_models: Iterable[str],
    tenancy: str = "",
) -> GpuProfile | None:
    """The newest profile of this image + command on any of ``gpu_models`` that ``tenancy``
    measured (an entry of another tenancy never matches)."""
    found: list[GpuProfile] = []
    workload = _workload_digest(tenancy, image, command)
    for model in sorted(set(gpu_models)):
        key = cache_key(image=image, command=command, gpu_model=model, tenancy=tenancy)
        text = data.get(key)
        entry = _decode(text) if text is not None else None
        if entry is not None and entry.tenancy == tenancy and entry.workload == workload:
            found.append(entry.profile)
    return max(found, key=lambda p: p.time or _NEVER) if found else None


def evictable_keys(
    data: Mapping[str, str],
    *,
    keep: int,
    per_tenancy: int | None = None,
    max_bytes: int = MAX_CACHE_BYTES,
) -> list[str]:
    """Keys to drop: damaged entries, each tenancy's oldest past ``per_tenancy``, then the
    oldest until at most ``keep`` entries of at most ``max_bytes`` remain."""
    damaged: list[str] = []
    dated: list[tuple[datetime, str, str, int]] = []
    for key, text in data.items():
        if not key.startswith(KEY_PREFIX):
            continue
        entry = _decode(text) if len(text) <= MAX_ENTRY_CHARS else None
        if entry is None or entry.profile.time is None:
            damaged.append(key)
        else:
            dated.append((entry.profile.time, key, entry.tenancy, len(key) + len(text)))
    dated.sort()
    drop = set(damaged)
    if per_tenancy is not None:
        counts: dict[str, int] = {}
        for _, key, tenancy, _ in reversed(dated):  # newest first
            counts[tenancy] = counts.get(tenancy, 0) + 1
            if counts[tenancy] > per_tenancy:
                drop.add(key)
    left = [(key, size) for _, key, _, size in dated if key not in drop]
    count, total = len(left), sum(size for _, size in left)
    for key, size in left:  # oldest first
        if count <= keep and total <= max_bytes:
            break
        drop.add(key)
        count, total = count - 1, total - size
    return damaged + [key for _, key, _, _ in dated if key in drop]
