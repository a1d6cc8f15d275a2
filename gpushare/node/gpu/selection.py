"""Which of a node's GPUs gpushare manages, so it can run beside NVIDIA's device plugin.

A GPU is left alone (not advertised, not exported, no MPS daemon) when it is not in the
agent's ``--gpus`` list, when MIG is enabled on it (gpushare shares whole GPUs through MPS; MIG
instances are NVIDIA's plugin's), or when another device plugin already advertises it
(``gpushare.node.coexistence`` finds those through the kubelet). ``select_gpus`` wraps the
backend so every part of the agent sees only the managed GPUs. See docs/coexistence.md.
"""

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpushare.api.errors import InvalidInputError
from gpushare.api.inventory import GpuInfo
from gpushare.api.names import LABEL_MANAGED_GPUS
from gpushare.node.gpu.backend import GpuBackend, GpuProcess, GpuSample, HealthEvent

GPUS_FIELD = "--gpus"
_GPUS_FIX = (
    'write "all", or GPU indexes and/or UUIDs separated by commas, e.g. "0,1" or '
    '"GPU-8d3c...,GPU-1f0a..."'
)
_UUID = re.compile(r"^(GPU|MIG)-[0-9A-Za-z-]+$")

REASON_NOT_SELECTED = "NotSelected"
REASON_MIG = "MigEnabled"
REASON_OTHER_PLUGIN = "AdvertisedByOtherPlugin"


@dataclass(frozen=True)
class GpuList:
    """GPUs named by index or UUID; ``None`` in place of a GpuList means every GPU."""

    indexes: frozenset[int]
    uuids: frozenset[str]

    def names(self, gpu: GpuInfo) -> bool:
        return gpu.index in self.indexes or gpu.uuid in self.uuids


def parse_gpu_list(text: str) -> GpuList | None:
    """``"all"`` (or empty) -> None; ``"0,2"`` / ``"GPU-...,1"`` -> a GpuList; anything else
    is refused naming the flag and the fix."""
    value = text.strip()
    if value in ("", "all"):
        return None
    indexes: set[int] = set()
    uuids: set[str] = set()
    for raw in value.split(","):
        item = raw.strip()
        if item.isdigit() and len(item) <= 3:
            indexes.add(int(item))
        elif _UUID.match(item):
            uuids.add(item)
        else:
            raise InvalidInputError(
                GPUS_FIELD, f"{item!r} is neither a GPU index nor a UUID", _GPUS_FIX
            )
    return GpuList(frozenset(indexes), frozenset(uuids))


def parse_gpu_label(value: str) -> GpuList | None:
    """The node label ``gpushare.io/managed-gpus``: ``all`` -> None, ``none`` -> no GPU,
    ``0_1`` -> GPUs 0 and 1 (label values cannot hold commas or UUIDs of that length)."""
    text = value.strip()
    if text == "all":
        return None
    if text == "none":
        return GpuList(frozenset(), frozenset())
    parts = text.replace(".", "_").split("_")
    if not all(p.isdigit() and len(p) <= 3 for p in parts):
        raise InvalidInputError(
            f"node label {LABEL_MANAGED_GPUS}",
            f"{value!r} is not a GPU index list",
            'write "all", "none", or GPU indexes joined by "_", e.g. "0_1"',
        )
    return GpuList(frozenset(int(p) for p in parts), frozenset())


@dataclass(frozen=True)
class SkippedGpu:
    """A GPU of the node gpushare leaves alone, and why (``reason`` is an Event reason)."""

    gpu: GpuInfo
    reason: str
    message: str


def mig_enabled(backend: GpuBackend, gpu: GpuInfo) -> bool:
    """MIG mode as the backend reports it (backends without MIG support report none)."""
    check = getattr(backend, "mig_enabled", None)
    return bool(check(gpu.uuid)) if check is not None else False


def skipped_gpus(
    backend: GpuBackend,
    *,
    wanted: GpuList | None,
    other_plugins: Mapping[str, str],
) -> list[SkippedGpu]:
    """Every GPU of the backend gpushare must not manage. ``other_plugins`` maps a GPU UUID to
    the resource another device plugin advertises it as."""
    skipped: list[SkippedGpu] = []
    for gpu in backend.inventory():
        name = f"GPU {gpu.index} ({gpu.model}, {gpu.uuid})"
        if wanted is not None and not wanted.names(gpu):
            message = (
                f"{name} is not among the GPUs gpushare manages here (--gpus, or the node "
                f"label {LABEL_MANAGED_GPUS}); it is left to other device plugins"
            )
            skipped.append(SkippedGpu(gpu, REASON_NOT_SELECTED, message))
        elif mig_enabled(backend, gpu):
            message = (
                f"{name} has MIG enabled; gpushare shares whole GPUs with MPS and leaves MIG "
                "instances to NVIDIA's device plugin. Disable MIG on it to share it with "
                "gpushare, or exclude it with --gpus to silence this"
            )
            skipped.append(SkippedGpu(gpu, REASON_MIG, message))
        elif gpu.uuid in other_plugins:
            message = (
                f"{name} is already advertised by another device plugin as "
                f"{other_plugins[gpu.uuid]}; advertising it too would let plain pods of that "
                "resource land on a shared GPU. Exclude it from that plugin (or from gpushare "
                "with --gpus) and restart the agent"
            )
            skipped.append(SkippedGpu(gpu, REASON_OTHER_PLUGIN, message))
    return skipped


class SelectedBackend:
    """The backend with only the managed GPUs visible; everything else passes through
    (optional methods such as ``set_load`` or ``device_paths`` included)."""

    def __init__(self, inner: GpuBackend, *, skip: set[str]) -> None:
        self.inner = inner
        self._skip = frozenset(skip)
        self._gpus = [g for g in inner.inventory() if g.uuid not in self._skip]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def simulated(self) -> bool:
        return self.inner.simulated

    def inventory(self) -> list[GpuInfo]:
        return list(self._gpus)

    def _require(self, uuid: str) -> None:
        if uuid in self._skip:
            raise KeyError(f"GPU {uuid} is not managed by gpushare on this node")

    def processes(self, uuid: str) -> list[GpuProcess]:
        self._require(uuid)
        return self.inner.processes(uuid)

    def sample(self, uuid: str) -> GpuSample:
        self._require(uuid)
        return self.inner.sample(uuid)

    def wait_health_events(self, timeout_s: float) -> list[HealthEvent]:
        return [e for e in self.inner.wait_health_events(timeout_s) if e.uuid not in self._skip]

    def close(self) -> None:
        self.inner.close()


def select_gpus(
    backend: GpuBackend,
    *,
    wanted: GpuList | None,
    other_plugins: Mapping[str, str],
) -> tuple[GpuBackend, list[SkippedGpu]]:
    """The backend the agent should use, and the GPUs it leaves alone (for logs and Events)."""
    skipped = skipped_gpus(backend, wanted=wanted, other_plugins=other_plugins)
    if not skipped:
        return backend, []
    return SelectedBackend(backend, skip={s.gpu.uuid for s in skipped}), skipped
