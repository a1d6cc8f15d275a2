"""Freezing and thawing a pod's containers through the kernel's cgroup freezer.

Each container's own cgroup is frozen, as ``runc pause`` does, not the pod's: runc (and so the
kubelet through containerd) then sees the container paused. An ``exec`` probe is refused
("cannot exec in a paused container": its result is thrown away, no restart) instead of
hanging inside a frozen parent until it times out, and a SIGKILL from the kubelet thaws the
container first (runc does so for a paused container), so a paused pod can still be deleted
(docs/node-agent.md, "Pausing a pod").

Two kernel interfaces, one per cgroup version:

- cgroup v2 (the GPU hosts): write ``1`` or ``0`` to ``cgroup.freeze``; the freeze is in effect
  once ``cgroup.events`` says ``frozen 1`` (tasks in uninterruptible sleep delay it).
- cgroup v1 (the freezer hierarchy, ``<root>/freezer``): write ``FROZEN`` or ``THAWED`` to
  ``freezer.state``, which reads ``FREEZING`` until every task stopped.

A container's cgroup is found from the pod's UID and QoS class under either kubelet cgroup
driver (gpushare.node.core.cgroups.pod_cgroup_dirs), or, for a kubelet with another
``--cgroup-root``, by a bounded search for the pod's directory.
"""

import logging
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from gpushare.node.core.cgroups import (
    container_cgroup_id,
    is_pod_cgroup_name,
    names_a_pod,
    pod_cgroup_dirs,
)
from gpushare.node.pausing.decisions import FreezeState

log = logging.getLogger(__name__)

V2_FREEZE: Final = "cgroup.freeze"
V2_EVENTS: Final = "cgroup.events"
V1_STATE: Final = "freezer.state"
SEARCH_DEPTH: Final = 4
"""How deep under the hierarchy's mount the pod's directory is looked for when it is in none
of the usual places (a kubelet run with ``--cgroup-root``, e.g. ``/kubelet/kubepods/...``)."""
SETTLE_S: Final = 5.0
"""How long a freeze or thaw may take to be in effect before it counts as failed."""


class FreezeError(Exception):
    """A freeze or thaw that could not be done; ``reason`` is its short name in metrics."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


NO_CGROUP_FS: Final = "no-cgroup-fs"
NO_POD_CGROUP: Final = "no-pod-cgroup"
WRITE_FAILED: Final = "write-failed"
NOT_SETTLED: Final = "not-settled"


@dataclass(frozen=True)
class Hierarchy:
    """The cgroup hierarchy that holds the freezer: v2's unified one, or v1's freezer."""

    version: int
    root: Path

    def describe(self) -> str:
        return f"cgroup v{self.version} at {self.root}"


def find_hierarchy(cgroup_root: Path) -> Hierarchy | None:
    """The freezer's hierarchy under the host's cgroup mount: v2 when ``cgroup.controllers``
    is at its top, else v1's ``freezer`` hierarchy (also on hybrid hosts, whose unified
    hierarchy has no controllers); None when neither is there (the host's cgroup fs is not
    mounted where the agent looks)."""
    if (cgroup_root / "cgroup.controllers").is_file():
        return Hierarchy(2, cgroup_root)
    if (cgroup_root / "freezer" / "cgroup.procs").is_file():
        return Hierarchy(1, cgroup_root / "freezer")
    return None


class Freezer:
    """Freezes and thaws containers' cgroups under ``cgroup_root`` (the host's
    ``/sys/fs/cgroup``, mounted into the agent's container by the chart)."""

    def __init__(self, cgroup_root: Path, *, settle_s: float = SETTLE_S) -> None:
        self.cgroup_root = cgroup_root
        self.settle_s = settle_s
        self._hierarchy: Hierarchy | None = None
        self._pod_dirs: dict[str, Path] = {}

    def hierarchy(self) -> Hierarchy:
        if self._hierarchy is None:
            self._hierarchy = find_hierarchy(self.cgroup_root)
        if self._hierarchy is None:
            raise FreezeError(
                NO_CGROUP_FS,
                f"no cgroup freezer under {self.cgroup_root} (neither cgroup v2's "
                "cgroup.controllers nor cgroup v1's freezer hierarchy); fix: mount the host's "
                "/sys/fs/cgroup into the node agent and point --cgroup-root at it (the chart "
                "does)",
            )
        return self._hierarchy

    # --- finding a pod's containers ------------------------------------------------------

    def pod_dir(self, uid: str, qos: str | None) -> Path | None:
        """Pod ``uid``'s cgroup directory in the freezer's hierarchy; None when it has none
        (not started, or gone)."""
        root = self.hierarchy().root
        known = self._pod_dirs.get(uid)
        if known is not None and known.is_dir():
            return known
        found = next((root / d for d in pod_cgroup_dirs(uid, qos) if (root / d).is_dir()), None)
        if found is None:
            found = _search(root, uid, SEARCH_DEPTH)
        if found is not None:
            self._pod_dirs[uid] = found
        return found

    def containers(
        self, uid: str, *, qos: str | None, container_ids: Iterable[str]
    ) -> dict[str, Path]:
        """Container ID -> its cgroup directory, for each of ``container_ids`` (the pod's
        status names them; its sandbox is not among them) that has one now."""
        pod = self.pod_dir(uid, qos)
        if pod is None:
            return {}
        wanted = set(container_ids)
        out: dict[str, Path] = {}
        try:
            children = list(pod.iterdir())
        except OSError:
            return {}
        for child in children:
            cid = container_cgroup_id(child.name)
            if cid in wanted and child.is_dir():
                out[cid] = child
        return out

    def forget(self, keep: Iterable[str]) -> None:
        """Drop remembered pod directories of pods not in ``keep``."""
        kept = set(keep)
        for uid in [u for u in self._pod_dirs if u not in kept]:
            del self._pod_dirs[uid]

    # --- state ---------------------------------------------------------------------------

    def frozen(self, cgroup: Path) -> bool | None:
        """Whether ``cgroup`` is frozen (the freeze in effect, not only asked for); None when
        it is gone or unreadable."""
        try:
            if self.hierarchy().version == 2:
                events = _read(cgroup / V2_EVENTS)
                return _v2_frozen(events)
            return _read(cgroup / V1_STATE).strip() == "FROZEN"
        except OSError:
            return None

    def state(self, cgroups: Mapping[str, Path]) -> FreezeState:
        """The pod's state from its containers' cgroups."""
        seen = [f for f in (self.frozen(p) for p in cgroups.values()) if f is not None]
        if not seen:
            return FreezeState.NONE
        if all(seen):
            return FreezeState.FROZEN
        return FreezeState.THAWED if not any(seen) else FreezeState.PARTLY

    # --- changing it ---------------------------------------------------------------------

    def freeze(self, cgroups: Mapping[str, Path]) -> None:
        """Freeze every cgroup and wait until each is frozen. On failure the ones already
        asked are thawed again (a pod left half frozen may wait on itself forever) and
        FreezeError says why."""
        try:
            self._set(cgroups, frozen=True)
        except FreezeError:
            try:
                self._set(cgroups, frozen=False)
            except FreezeError as undo:
                log.warning("could not thaw again after a failed freeze: %s", undo)
            raise

    def thaw(self, cgroups: Mapping[str, Path]) -> None:
        """Thaw every cgroup and wait until none is frozen; FreezeError when one stays so."""
        self._set(cgroups, frozen=False)

    def _set(self, cgroups: Mapping[str, Path], *, frozen: bool) -> None:
        version = self.hierarchy().version
        for cid, cgroup in cgroups.items():
            self._write(cgroup, version=version, frozen=frozen, cid=cid)
        deadline = time.monotonic() + self.settle_s
        wait = 0.005
        while True:
            pending = {
                cid: p
                for cid, p in cgroups.items()
                if (state := self.frozen(p)) is not None and state != frozen
            }
            if not pending:
                return
            if time.monotonic() >= deadline:
                what = "frozen" if frozen else "thawed"
                raise FreezeError(
                    NOT_SETTLED,
                    f"container(s) {', '.join(c[:12] for c in sorted(pending))} not {what} "
                    f"within {self.settle_s:.0f} s ({self.hierarchy().describe()})",
                )
            if version == 1 and frozen:
                # FREEZING: asking again freezes the tasks that were busy the first time.
                for cid, cgroup in pending.items():
                    self._write(cgroup, version=version, frozen=True, cid=cid)
            time.sleep(wait)
            wait = min(wait * 2, 0.1)

    def _write(self, cgroup: Path, *, version: int, frozen: bool, cid: str) -> None:
        name, value = (
            (V2_FREEZE, "1" if frozen else "0")
            if version == 2
            else (V1_STATE, "FROZEN" if frozen else "THAWED")
        )
        try:
            _write(cgroup / name, value)
        except FileNotFoundError:
            return  # the container ended meanwhile: nothing left to freeze or thaw
        except OSError as exc:
            raise FreezeError(
                WRITE_FAILED,
                f"cannot write {name} of container {cid[:12]}: {exc.strerror or exc}; fix: the "
                "node agent needs the host's cgroup fs mounted writable (the chart mounts "
                "/sys/fs/cgroup at --cgroup-root)",
            ) from exc


def _search(root: Path, uid: str, depth: int) -> Path | None:
    """Breadth-first search for pod ``uid``'s directory under ``root``, ``depth`` levels deep."""
    level = [root]
    for _ in range(depth):
        below: list[Path] = []
        for parent in level:
            try:
                entries = list(os.scandir(parent))
            except OSError:
                continue
            for entry in entries:
                if not entry.is_dir(follow_symlinks=False):
                    continue
                if is_pod_cgroup_name(entry.name, uid):
                    return Path(entry.path)
                if not names_a_pod(entry.name) and container_cgroup_id(entry.name) is None:
                    below.append(Path(entry.path))
        level = below
    return None


def _v2_frozen(events: str) -> bool:
    for line in events.splitlines():
        key, _, value = line.partition(" ")
        if key == "frozen":
            return value.strip() == "1"
    raise OSError("cgroup.events has no 'frozen' line (a kernel before 5.2 has no freezer)")


def _read(path: Path) -> str:
    with open(path, encoding="ascii") as f:
        return f.read()


def _write(path: Path, value: str) -> None:
    # No O_CREAT: a cgroup control file that is not there is not ours to create (O_TRUNC as
    # runc opens them; the kernel ignores it).
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)
