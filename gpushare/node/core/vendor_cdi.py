"""The NVIDIA CDI device names of this node's GPUs, for nodes where the container runtime
injects GPUs from CDI specs (docs/coexistence.md, "CDI nodes").

The GPU Operator >= v25.10 enables CDI by default: the ``nvidia`` runtime is no longer the
default one, so a container that only carries ``NVIDIA_VISIBLE_DEVICES`` gets neither the GPU's
device nodes nor the driver's libraries. The runtime injects them for a fully qualified CDI
device name such as ``nvidia.com/gpu=GPU-<uuid>`` (the specs the container toolkit writes to
``/var/run/cdi``, containerd >= 1.7 and CRI-O with CDI on). The device plugin API carries such
names in the Allocate answer (``cdi_devices``), the DRA API in each prepared device's CDI IDs;
gpushare adds them beside its own answer.

Modes (agent flag ``--vendor-cdi``): ``off``; ``auto`` (the default): read the node's CDI spec
directories and name a GPU by the device of kind ``nvidia.com/gpu`` named by its UUID, else by
its index, nothing when no spec has it; or a kind (``vendor/class``): always ``<kind>=<UUID>``.
The specs are re-read when a file changes (the toolkit may write them after the agent starts);
a file that is no spec (unreadable, not YAML or JSON, over 4 MiB) is skipped with a log line.
"""

import logging
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpushare.api.errors import InvalidInputError
from gpushare.api.inventory import GpuInfo

log = logging.getLogger(__name__)

NVIDIA_KIND = "nvidia.com/gpu"
SPEC_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))
"""Where container runtimes read CDI specs by default (the CDI specification's directories)."""
MAX_SPEC_BYTES = 4 << 20
_KIND = re.compile(
    r"^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?/[a-zA-Z0-9]([a-zA-Z0-9_.-]{0,61}[a-zA-Z0-9])?$"
)
_OWN_SPECS = "gpushare.io-"
"""gpushare's own claim specs (gpushare.node.dra.cdi), never another vendor's."""


def parse_mode(value: str) -> str:
    """``off``, ``auto`` or a CDI kind (``vendor/class``); refuses anything else, naming the
    flag."""
    if value in ("off", "auto") or _KIND.match(value):
        return value
    raise InvalidInputError(
        "--vendor-cdi",
        f"{value[:80]!r} is neither off, auto nor a CDI kind",
        f"use auto (read the node's CDI specs), off, or a kind such as {NVIDIA_KIND}",
    )


@dataclass(frozen=True)
class _Spec:
    kind: str
    names: frozenset[str]


def _read_spec(path: Path) -> _Spec | None:
    try:
        if path.stat().st_size > MAX_SPEC_BYTES:
            raise ValueError(f"over {MAX_SPEC_BYTES} bytes")
        doc: Any = yaml.safe_load(path.read_text())
        kind = doc["kind"]
        devices = doc.get("devices") or []
        if not isinstance(kind, str) or not isinstance(devices, list):
            raise ValueError("kind or devices of the wrong type")
        names = frozenset(
            str(d["name"])
            for d in devices
            if isinstance(d, dict) and isinstance(d.get("name"), str | int)
        )
    except (OSError, ValueError, yaml.YAMLError, KeyError, TypeError, AttributeError) as exc:
        log.warning("CDI spec %s skipped: not a spec gpushare can read (%s)", path, str(exc)[:200])
        return None
    return _Spec(kind=kind, names=names)


class VendorCdi:
    """The CDI device names the runtime needs for a GPU (``names``). Thread-safe."""

    def __init__(
        self, mode: str = "auto", *, dirs: Sequence[Path] = SPEC_DIRS, kind: str = NVIDIA_KIND
    ) -> None:
        self.mode = parse_mode(mode)
        self.dirs = tuple(dirs)
        self.kind = kind if mode in ("off", "auto") else mode
        self._lock = threading.Lock()
        self._stamp: tuple[tuple[str, int, int], ...] = ()
        self._specs: list[_Spec] = []
        self._told: dict[str, tuple[str, ...]] = {}

    def _files(self) -> Iterable[Path]:
        for root in self.dirs:
            try:
                entries = sorted(root.iterdir())
            except OSError:
                continue
            for path in entries:
                if path.suffix in (".json", ".yaml", ".yml") and not path.name.startswith(
                    (_OWN_SPECS, ".")
                ):
                    yield path

    def _current(self) -> list[_Spec]:
        stamp = []
        for path in self._files():
            try:
                st = path.stat()
            except OSError:
                continue
            stamp.append((str(path), st.st_mtime_ns, st.st_size))
        if tuple(stamp) != self._stamp:
            self._stamp = tuple(stamp)
            specs = (_read_spec(Path(p)) for p, _, _ in stamp)
            self._specs = [s for s in specs if s is not None and s.kind == self.kind]
        return self._specs

    def names(self, gpu: GpuInfo) -> tuple[str, ...]:
        """Fully qualified CDI device names that give a container this GPU; () when none."""
        if self.mode == "off":
            return ()
        if self.mode != "auto":
            return (f"{self.kind}={gpu.uuid}",)
        with self._lock:
            found: tuple[str, ...] = ()
            for spec in self._current():
                for name in (gpu.uuid, str(gpu.index)):
                    if name in spec.names:
                        found = (f"{self.kind}={name}",)
                        break
                if found:
                    break
            if self._told.get(gpu.uuid) != found:
                self._told[gpu.uuid] = found
                if found:
                    log.info("GPU %s: the runtime injects it as CDI device %s", gpu.uuid, found[0])
                else:
                    log.info(
                        "GPU %s: no CDI spec of kind %s names it in %s; containers get it "
                        "through the environment only (NVIDIA_VISIBLE_DEVICES: a runtime "
                        "class nvidia on CDI nodes)",
                        gpu.uuid,
                        self.kind,
                        ", ".join(str(d) for d in self.dirs),
                    )
            return found


def names_for(
    vendor: VendorCdi | None, gpus: Mapping[str, GpuInfo], uuids: Iterable[str]
) -> tuple[str, ...]:
    """The CDI device names of several GPUs, in order, without repeats."""
    if vendor is None:
        return ()
    out: list[str] = []
    for uuid in uuids:
        gpu = gpus.get(uuid)
        for name in vendor.names(gpu) if gpu is not None else ():
            if name not in out:
                out.append(name)
    return tuple(out)
