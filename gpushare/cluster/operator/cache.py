"""The reusable profile cache: profiles keyed by image + command + GPU model (pure).

Stored as the data of one ConfigMap (``gpushare-profile-cache`` in the operator's namespace):
one key per workload and GPU model, whose value is a JSON entry. ConfigMap keys allow only
``[-._a-zA-Z0-9]``, so the key is a digest; the entry repeats image, command and model so a
human can read the cache with kubectl.
"""

import hashlib
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from gpushare.api.errors import InvalidInputError
from gpushare.api.profile import GpuProfile

log = logging.getLogger(__name__)

KEY_PREFIX = "profile-"


@dataclass(frozen=True)
class CacheEntry:
    image: str
    command: tuple[str, ...]
    gpu_model: str
    profile: GpuProfile


def cache_key(*, image: str, command: Sequence[str], gpu_model: str) -> str:
    """A ConfigMap-safe key; distinct images, commands (argument boundaries included) or GPU
    models give distinct keys."""
    material = json.dumps([image, list(command), gpu_model], separators=(",", ":"))
    return KEY_PREFIX + hashlib.sha256(material.encode()).hexdigest()[:40]


def encode_entry(entry: CacheEntry) -> str:
    return json.dumps(
        {
            "image": entry.image,
            "command": list(entry.command),
            "gpuModel": entry.gpu_model,
            "profile": entry.profile.to_status(),
        },
        sort_keys=True,
        separators=(",", ":"),
    )


def decode_entry(text: str) -> CacheEntry | None:
    """None (and a warning) for an entry that is not ours or is damaged: a bad cache entry
    costs one re-profiling, never a crash."""
    try:
        raw = json.loads(text)
        if not isinstance(raw, dict) or not isinstance(raw.get("profile"), dict):
            raise ValueError("not an entry object")
        command = raw.get("command")
        if not isinstance(command, list):
            raise ValueError("command is not a list")
        return CacheEntry(
            image=str(raw["image"]),
            command=tuple(str(c) for c in command),
            gpu_model=str(raw["gpuModel"]),
            profile=GpuProfile.from_status(raw["profile"], path="profile"),
        )
    except (ValueError, KeyError, InvalidInputError) as exc:
        log.warning("ignoring damaged profile cache entry: %s", exc)
        return None


_NEVER = datetime.min.replace(tzinfo=UTC)


def lookup(
    data: Mapping[str, str],
    *,
    image: str,
    command: Sequence[str],
    gpu_models: Iterable[str],
) -> GpuProfile | None:
    """The newest cached profile of this image + command on any of ``gpu_models``."""
    found: list[GpuProfile] = []
    for model in sorted(set(gpu_models)):
        text = data.get(cache_key(image=image, command=command, gpu_model=model))
        entry = decode_entry(text) if text is not None else None
        if entry is not None and entry.image == image and entry.command == tuple(command):
            found.append(entry.profile)
    return max(found, key=lambda p: p.time or _NEVER) if found else None


def evictable_keys(data: Mapping[str, str], *, keep: int) -> list[str]:
    """Keys to drop so at most ``keep`` entries remain: damaged ones first, then the oldest."""
    dated: list[tuple[datetime | None, str]] = []
    for key, text in data.items():
        if not key.startswith(KEY_PREFIX):
            continue
        entry = decode_entry(text)
        dated.append((entry.profile.time if entry else None, key))
    excess = len(dated) - keep
    if excess <= 0:
        return []
    damaged = [key for moment, key in dated if moment is None]
    healthy = sorted(
        ((moment, key) for moment, key in dated if moment is not None), key=lambda mk: mk[0]
    )
    return (damaged + [key for _, key in healthy])[:excess]
